// Building elements. Text always goes in as text (text nodes, textContent): nothing from the
// server is ever parsed as HTML. The page's Content-Security-Policy enforces it (Trusted Types).

export const $ = (id) => document.getElementById(id);

// h('button', {class: 'x', onclick: fn, disabled: true}, 'text', child, ...)
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name === 'class') el.className = value;
    else if (name === 'text') el.textContent = value;
    else if (name === 'dataset') Object.assign(el.dataset, value);
    else if (name.startsWith('on')) el.addEventListener(name.slice(2), value);
    else if (value === true) el.setAttribute(name, '');
    else el.setAttribute(name, String(value));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    if (Array.isArray(child)) append(el, child);
    else el.append(child instanceof Node ? child : String(child));
  }
}

export function show(el, visible) {
  el.hidden = !visible;
}

const relative = new Intl.RelativeTimeFormat(undefined, {numeric: 'auto', style: 'short'});

export function ago(iso, now = Date.now()) {
  const then = Date.parse(iso);
  if (!Number.isFinite(then)) return '';
  const s = Math.round((then - now) / 1000);
  const abs = Math.abs(s);
  if (abs < 45) return 'just now';
  if (abs < 3600) return relative.format(Math.round(s / 60), 'minute');
  if (abs < 86400) return relative.format(Math.round(s / 3600), 'hour');
  return relative.format(Math.round(s / 86400), 'day');
}

export function when(iso) {
  const then = Date.parse(iso);
  return Number.isFinite(then) ? new Date(then).toLocaleString() : '—';
}

export function json(value, indent = 0) {
  try { return JSON.stringify(value, null, indent); } catch { return String(value); }
}
