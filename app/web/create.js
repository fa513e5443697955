// The "new session" form: every option of the create body, and errors shown at their field.

import {call, problemText} from './api.js';
import {AssistantPicker} from './assistants.js';
import {$, h} from './dom.js';
import {FieldErrors, fieldError, parseJson} from './fields.js';

export const EXAMPLE_SCRIPT = [
  {text: 'Let me note that down.', toolCalls: [{name: 'put_note', arguments: {key: 'plan', text: 'ship it'}}]},
  {text: 'Thinking it over for a moment.', toolCalls: [{name: 'sleep', arguments: {seconds: 3}}]},
  {text: 'Done: the note is saved and I have rested. Anything else?', chunks: 12, delayMs: 1500},
];

// The form's fields, by the path the API names them with in a 422 (`modelSettings.topP`).
const FIELDS = ['assistantId', 'assistantVersion', 'prompt', 'title', 'model', 'instructions', 'script', 'tools', 'approvalRequired',
  'modelSettings.temperature', 'modelSettings.topP', 'modelSettings.maxTokens',
  'modelSettings.toolChoice', 'modelSettings.parallelToolCalls', 'modelSettings.stop',
  'modelSettings.reasoningEffort', 'modelSettings', 'body'];

export class CreateForm {
  constructor({onCreated}) {
    this.dialog = $('create-dialog');
    this.form = $('create-form');
    this.onCreated = onCreated;
    this.tools = null;
    this.errors = new FieldErrors(this.form, $('create-problem'), FIELDS);
    this.picker = new AssistantPicker();
    this.form.addEventListener('submit', (event) => { event.preventDefault(); this.submit(); });
    $('create-cancel').addEventListener('click', () => this.dialog.close());
    $('script-example').addEventListener('click', () => {
      this.form.elements.script.value = JSON.stringify(EXAMPLE_SCRIPT, null, 2);
    });
    this.form.elements.allTools.addEventListener('change', () => this.syncTools());
  }

  // `assistantId`: the assistant to start from (picked in the form otherwise).
  async show(assistantId = '') {
    this.errors.clear();
    this.dialog.showModal();
    this.form.elements.prompt.focus();
    // Again each time: workers come and go with their tools, and assistants change.
    await Promise.all([this.loadTools(), this.picker.load(assistantId)]);
  }

  async loadTools() {
    const list = $('tool-list');
    let catalog;
    try {
      catalog = await call((f) => f.listTools());
    } catch (error) {
      list.replaceChildren(h('p', {class: 'hint', text: `Tools could not be listed: ${problemText(error)}`}));
      return;
    }
    this.tools = catalog.tools;
    const workers = catalog.workers;
    // The catalog is the live workers' tools: one only some of them offer makes a session
    // that names it wait for one of those.
    const partial = (tool) => {
      if (workers === 0 || tool.workers >= workers) return null;
      const text = tool.workers === 0 ? 'no worker has it' : `${tool.workers} of ${workers} workers`;
      return h('span', {
        class: 'partial', text,
        title: 'A session that names it runs only on a worker that has it.',
      });
    };
    const idle = workers === 0
      ? [h('p', {class: 'hint wide', text: 'No worker is running: a session waits in the queue until one starts.'})]
      : [];
    list.replaceChildren(...idle,
      ...this.tools.map((tool) => h('div', {class: 'tool-option', dataset: {tool: tool.name}},
      h('label', {title: tool.description},
        h('input', {type: 'checkbox', name: 'tool', value: tool.name, checked: true}),
        h('code', {text: tool.name}), partial(tool)),
      h('label', {class: 'approval', title: 'Every call waits for a person'},
        h('input', {
          type: 'checkbox', name: 'approval', value: tool.name,
          checked: tool.requiresApproval, disabled: tool.requiresApproval,
        }),
        'ask first'))));
    this.syncTools();
  }

  syncTools() {
    const all = this.form.elements.allTools.checked;
    for (const box of this.form.querySelectorAll('input[name=tool]')) box.disabled = all;
  }

  // The create body from the form; throws a 422 of the page's own naming a field for bad input.
  body() {
    const f = this.form.elements;
    const body = {...this.picker.fields(), prompt: f.prompt.value};
    const text = (name) => f[name].value.trim();
    if (text('title')) body.title = text('title');
    if (text('model')) body.model = text('model');
    if (f.instructions.value.trim()) body.instructions = f.instructions.value;
    if (text('script')) body.script = parseJson('script', f.script.value);
    if (!f.allTools.checked) {
      body.tools = [...this.form.querySelectorAll('input[name=tool]:checked')].map((b) => b.value);
    }
    // Tools the server's config already guards are checked and fixed; the others are the choice.
    const approval = [...this.form.querySelectorAll('input[name=approval]:checked:not(:disabled)')];
    if (approval.length) body.approvalRequired = approval.map((b) => b.value);
    const settings = {};
    const number = (name, key, integer = false) => {
      const raw = text(name);
      if (!raw) return;
      const value = Number(raw);
      if (!Number.isFinite(value) || (integer && !Number.isInteger(value))) {
        throw fieldError(`modelSettings.${key}`, integer ? 'must be a whole number' : 'must be a number');
      }
      settings[key] = value;
    };
    number('temperature', 'temperature');
    number('topP', 'topP');
    number('maxTokens', 'maxTokens', true);
    if (text('toolChoice')) settings.toolChoice = text('toolChoice');
    if (f.parallelToolCalls.value) settings.parallelToolCalls = f.parallelToolCalls.value === 'true';
    if (f.reasoningEffort.value) settings.reasoningEffort = f.reasoningEffort.value;
    const stop = f.stop.value.split('\n').map((s) => s.trim()).filter(Boolean);
    if (stop.length) settings.stop = stop;
    if (Object.keys(settings).length) body.modelSettings = settings;
    return body;
  }

  async submit() {
    this.errors.clear();
    const button = $('create-submit');
    button.disabled = true;
    try {
      const session = await call((f) => f.createSession(this.body()));
      this.dialog.close();
      this.form.elements.prompt.value = '';
      this.form.elements.title.value = '';
      this.onCreated(session);
    } catch (error) {
      this.errors.show(error);
    } finally {
      button.disabled = false;
    }
  }
}
