// Assistants: stored agent definitions (`/api/assistants`). The list and one assistant with its
// versions, in a dialog of their own; the form that creates one or edits it (every edit is a new
// version); the names sessions show for the assistant they were created from.

import {call, problemText} from './api.js';
import {AuthenticationError, NotFoundError} from './ferryman-client.js';
import {$, h, json, when} from './dom.js';
import {FieldErrors, parseJson} from './fields.js';

const PAGE_SIZE = 50;

// `GET /api/assistants` answers a page; its rows under `assistants`.
const rowsOf = (page) => page.assistants || [];
const versionsOf = (answer) => (Array.isArray(answer) ? answer : answer.versions || []);

// An assistant's name by id, for the sessions created from it (null once it is deleted).
export class AssistantNames {
  constructor() {
    this.known = new Map(); // id -> Promise<assistant | null>
  }

  get(id) {
    if (!this.known.has(id)) {
      const found = call((f) => f.getAssistant(id)).catch((error) => {
        if (error instanceof NotFoundError) return null;
        this.known.delete(id); // a passing failure: asked again next time
        return undefined;
      });
      this.known.set(id, found);
    }
    return this.known.get(id);
  }

  put(assistant) {
    this.known.set(assistant.id, Promise.resolve(assistant));
  }

  forget(id) {
    this.known.set(id, Promise.resolve(null));
  }
}

// "Notes helper · v2", or what can be said of a deleted one.
export function assistantLabel(ref, assistant) {
  const version = ref.version ? ` · v${ref.version}` : '';
  if (assistant === null) return `deleted assistant ${String(ref.id).slice(0, 8)}${version}`;
  const name = assistant?.name || ref.name || String(ref.id).slice(0, 8);
  return `${name}${version}`;
}

export class AssistantsView {
  // onStart(assistant): the user wants a new session from it.
  constructor({names, onStart}) {
    this.names = names;
    this.onStart = onStart;
    this.dialog = $('assistants-dialog');
    this.rows = [];
    this.nextPageToken = null;
    this.openId = null;
    this.deleteArmed = false;
    this.generation = 0;
    this.form = new AssistantForm({onSaved: (assistant) => this.saved(assistant)});
    $('assistants-close').addEventListener('click', () => this.dialog.close());
    $('assistant-new').addEventListener('click', () => this.form.open(null));
    $('assistant-more').addEventListener('click', () => this.load(this.nextPageToken));
    let timer = null;
    $('assistant-search').addEventListener('input', () => {
      clearTimeout(timer);
      timer = setTimeout(() => this.load(null), 250);
    });
  }

  async show(id = null) {
    if (!this.dialog.open) this.dialog.showModal();
    await this.load(null);
    if (id) await this.select(id);
  }

  report(error) {
    $('assistants-problem').textContent = error ? problemText(error) : '';
  }

  async load(pageToken) {
    const generation = ++this.generation;
    const search = $('assistant-search').value.trim();
    let page;
    try {
      page = await call((f) => f.listAssistants({name: search || undefined, limit: PAGE_SIZE, pageToken}));
    } catch (error) {
      if (generation === this.generation && !(error instanceof AuthenticationError)) this.report(error);
      return;
    }
    if (generation !== this.generation) return;
    this.report(null);
    const rows = rowsOf(page);
    this.rows = pageToken ? [...this.rows, ...rows] : rows;
    for (const row of rows) this.names.put(row);
    this.nextPageToken = page.nextPageToken || null;
    this.renderList();
  }

  renderList() {
    $('assistant-list').replaceChildren(...this.rows.map((a) => h('li', {
      class: a.id === this.openId ? 'open' : null, dataset: {id: a.id},
    }, h('button', {class: 'row', type: 'button', onclick: () => this.select(a.id), 'aria-current': a.id === this.openId ? 'true' : null},
      h('span', {class: 'row-title', text: a.name}),
      h('span', {class: 'row-meta'},
        h('span', {class: 'tag', text: `v${a.version}`}),
        h('code', {text: a.model}))))));
    $('assistant-empty').hidden = this.rows.length > 0 || Boolean($('assistant-search').value.trim());
    $('assistant-more').hidden = !this.nextPageToken;
  }

  async select(id) {
    this.openId = id;
    this.deleteArmed = false;
    this.renderList();
    let assistant;
    let versions;
    try {
      [assistant, versions] = await Promise.all([
        call((f) => f.getAssistant(id)),
        call((f) => f.assistantVersions(id)).then(versionsOf),
      ]);
    } catch (error) {
      if (error instanceof NotFoundError) {
        this.rows = this.rows.filter((a) => a.id !== id);
        this.openId = null;
        this.renderList();
        this.renderDetail(null, []);
      }
      this.report(error);
      return;
    }
    if (id !== this.openId) return;
    this.report(null);
    this.names.put(assistant);
    this.renderDetail(assistant, versions);
  }

  renderDetail(assistant, versions) {
    const detail = $('assistant-detail');
    if (!assistant) {
      detail.replaceChildren(h('p', {class: 'hint', text: 'Pick an assistant to see it and its versions.'}));
      return;
    }
    const remove = h('button', {class: 'danger-ghost', type: 'button', id: 'assistant-delete', text: 'Delete'});
    remove.addEventListener('click', () => this.remove(assistant, remove));
    // replaceChildren would write a null as the text "null": only elements go in.
    detail.replaceChildren(...[
      h('header', {class: 'assistant-title'},
        h('h3', {id: 'assistant-name', text: assistant.name}),
        h('span', {class: 'badge', id: 'assistant-version', text: `version ${assistant.version}`})),
      assistant.description ? h('p', {class: 'assistant-description', text: assistant.description}) : null,
      definitionList(assistant),
      h('div', {class: 'actions'},
        h('button', {class: 'primary', type: 'button', id: 'assistant-start', text: 'New session from it', onclick: () => this.onStart(assistant)}),
        h('button', {type: 'button', id: 'assistant-edit', text: 'Edit', onclick: () => this.form.open(assistant)}),
        remove),
      h('h4', {text: 'Versions'}),
      h('p', {class: 'hint', text: 'Each edit is a new version; a session keeps the version it started with.'}),
      h('ol', {id: 'assistant-versions', class: 'assistant-versions'}, ...versions.map((v) => h('li', {dataset: {version: v.version}},
        h('details', {},
          h('summary', {},
            h('strong', {text: `v${v.version}`}), ` · ${v.name} · `,
            h('code', {text: v.model}), ` · ${when(v.createdAt)}`),
          definitionList(v))))),
    ].filter(Boolean));
  }

  async remove(assistant, button) {
    if (!this.deleteArmed) {
      // Asks once: the first click arms it, the second deletes.
      this.deleteArmed = true;
      button.textContent = 'Delete for good?';
      button.classList.add('armed');
      return;
    }
    try {
      await call((f) => f.deleteAssistant(assistant.id));
    } catch (error) {
      this.report(error);
      return;
    }
    this.names.forget(assistant.id);
    this.rows = this.rows.filter((a) => a.id !== assistant.id);
    this.openId = null;
    this.renderList();
    this.renderDetail(null, []);
  }

  async saved(assistant) {
    this.names.put(assistant);
    await this.load(null);
    await this.select(assistant.id);
  }
}

function definitionList(a) {
  const rows = [];
  const add = (label, value) => rows.push(h('div', {}, h('dt', {text: label}), h('dd', {}, value)));
  add('Model', h('code', {text: a.model}));
  if (a.instructions) add('Instructions', h('pre', {text: a.instructions}));
  if (a.modelSettings && Object.keys(a.modelSettings).length) add('Model settings', h('code', {text: json(a.modelSettings)}));
  add('Tools', a.tools ? (a.tools.length ? a.tools.join(', ') : 'none') : 'every tool');
  if (a.approvalRequired?.length) add('Ask first for', a.approvalRequired.join(', '));
  if (a.metadata && Object.keys(a.metadata).length) add('Metadata', h('code', {text: json(a.metadata)}));
  if (a.updatedAt) add('Updated', h('time', {datetime: a.updatedAt, text: when(a.updatedAt)}));
  return h('dl', {class: 'assistant-fields'}, ...rows);
}

const FIELDS = ['name', 'description', 'model', 'instructions', 'tools', 'approvalRequired', 'modelSettings', 'metadata'];

// Creates an assistant, or edits one: a PATCH of the fields that changed (a cleared one is
// null), which the server writes as a new version.
export class AssistantForm {
  constructor({onSaved}) {
    this.dialog = $('assistant-edit-dialog');
    this.form = $('assistant-form');
    this.onSaved = onSaved;
    this.editing = null;
    this.errors = new FieldErrors(this.form, $('assistant-form-problem'), FIELDS);
    this.form.addEventListener('submit', (event) => { event.preventDefault(); this.submit(); });
    $('assistant-form-cancel').addEventListener('click', () => this.dialog.close());
  }

  open(assistant) {
    this.editing = assistant;
    this.errors.clear();
    const f = this.form.elements;
    const a = assistant || {};
    f.name.value = a.name || '';
    f.description.value = a.description || '';
    f.model.value = a.model || '';
    f.instructions.value = a.instructions || '';
    f.tools.value = (a.tools || []).join(', ');
    f.approvalRequired.value = (a.approvalRequired || []).join(', ');
    f.modelSettings.value = a.modelSettings && Object.keys(a.modelSettings).length ? json(a.modelSettings, 2) : '';
    f.metadata.value = a.metadata && Object.keys(a.metadata).length ? json(a.metadata, 2) : '';
    $('assistant-edit-heading').textContent = assistant ? `Edit ${assistant.name}` : 'New assistant';
    $('assistant-edit-note').textContent = assistant
      ? `Saving writes version ${assistant.version + 1}; sessions already started keep the version they have.`
      : '';
    $('assistant-form-submit').textContent = assistant ? 'Save as a new version' : 'Create assistant';
    this.dialog.showModal();
    f.name.focus();
  }

  // Every field of the form, as the API takes it (null: left empty).
  values() {
    const f = this.form.elements;
    const text = (name) => f[name].value.trim() || null;
    const names = (name) => {
      const list = f[name].value.split(',').map((s) => s.trim()).filter(Boolean);
      return list.length ? list : null;
    };
    return {
      name: text('name'),
      description: text('description'),
      model: text('model'),
      instructions: f.instructions.value.trim() ? f.instructions.value : null,
      tools: names('tools'),
      approvalRequired: names('approvalRequired'),
      modelSettings: text('modelSettings') === null ? null : parseJson('modelSettings', f.modelSettings.value),
      metadata: text('metadata') === null ? null : parseJson('metadata', f.metadata.value),
    };
  }

  body() {
    const values = this.values();
    if (!this.editing) {
      return Object.fromEntries(Object.entries(values).filter(([, value]) => value !== null));
    }
    const before = this.editing;
    const same = (key) => json(values[key] ?? null) === json(emptyIsNull(before[key]));
    return Object.fromEntries(Object.entries(values).filter(([key]) => !same(key)));
  }

  async submit() {
    this.errors.clear();
    const button = $('assistant-form-submit');
    button.disabled = true;
    try {
      const body = this.body();
      if (this.editing && !Object.keys(body).length) {
        this.dialog.close(); // nothing changed: no new version
        return;
      }
      const assistant = this.editing
        ? await call((f) => f.updateAssistant(this.editing.id, body))
        : await call((f) => f.createAssistant(body));
      this.dialog.close();
      await this.onSaved(assistant);
    } catch (error) {
      this.errors.show(error);
    } finally {
      button.disabled = false;
    }
  }
}

function emptyIsNull(value) {
  if (value === undefined || value === null || value === '') return null;
  if (typeof value === 'object' && !Array.isArray(value) && Object.keys(value).length === 0) return null;
  if (Array.isArray(value) && value.length === 0) return null;
  return value;
}

// The create form's assistant picker: the owner's assistants, and the versions of the one picked.
export class AssistantPicker {
  constructor() {
    this.select = $('create-assistant');
    this.version = $('create-assistant-version');
    this.select.addEventListener('change', () => this.pickVersions());
  }

  async load(chosen = '') {
    let rows = [];
    try {
      rows = rowsOf(await call((f) => f.listAssistants({limit: 200})));
    } catch { /* no assistants to offer: the form still creates plain sessions */ }
    const keep = chosen || this.select.value;
    this.select.replaceChildren(h('option', {value: '', text: 'none: define the agent here'}),
      ...rows.map((a) => h('option', {value: a.id, text: `${a.name} (v${a.version})`})));
    this.select.value = rows.some((a) => a.id === keep) ? keep : '';
    await this.pickVersions();
  }

  async pickVersions() {
    const id = this.select.value;
    $('create-assistant-hint').hidden = !id;
    this.version.replaceChildren(h('option', {value: '', text: 'latest'}));
    this.version.disabled = !id;
    if (!id) return;
    try {
      const versions = versionsOf(await call((f) => f.assistantVersions(id)));
      if (this.select.value !== id) return;
      this.version.append(...versions.map((v) => h('option', {value: String(v.version), text: `v${v.version} · ${when(v.createdAt)}`})));
    } catch { /* latest only */ }
  }

  // The create body's fields for the choice.
  fields() {
    const id = this.select.value;
    if (!id) return {};
    const version = this.version.value;
    return version ? {assistantId: id, assistantVersion: Number(version)} : {assistantId: id};
  }
}
