// A form's errors at their fields: each error of a 422 (or of the page's own checks) beside the
// control it names, and the whole message in the form's problem line.

import {problemText} from './api.js';
import {FerrymanError, UnprocessableEntityError} from './ferryman-client.js';
import {h} from './dom.js';

export class FieldErrors {
  // `fields`: the paths the form has a control for (`data-field`), as the API names them.
  constructor(form, problem, fields) {
    this.form = form;
    this.problem = problem;
    this.fields = fields;
  }

  clear() {
    this.problem.textContent = '';
    for (const el of this.form.querySelectorAll('[aria-invalid]')) el.removeAttribute('aria-invalid');
    for (const el of this.form.querySelectorAll('.field-error')) el.remove();
  }

  show(error) {
    this.problem.textContent = problemText(error);
    for (const {field, message} of (error instanceof FerrymanError ? error.errors : [])) {
      const target = this.element(field);
      if (!target) continue;
      target.setAttribute('aria-invalid', 'true');
      const folded = target.closest('details');
      if (folded) folded.open = true;
      target.closest('label, fieldset')?.append(h('p', {class: 'field-error', text: `${field}: ${message}`}));
    }
  }

  // The form control a field path points at: the longest known prefix of it.
  element(path) {
    const parts = String(path).split('.');
    while (parts.length) {
      const name = parts.join('.');
      if (this.fields.includes(name)) return this.form.querySelector(`[data-field="${CSS.escape(name)}"]`);
      parts.pop();
    }
    return null;
  }
}

export function parseJson(field, text) {
  try {
    return JSON.parse(text);
  } catch (error) {
    throw fieldError(field, `is not valid JSON (${error.message})`);
  }
}

// An error of the page's own checks, shaped as the API's 422.
export function fieldError(field, message) {
  return new UnprocessableEntityError(422, {code: 'VALIDATION_ERROR', errors: [{field, message, type: 'client'}]});
}
