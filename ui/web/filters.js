// The filter bar: profile type, service, process, further series labels and trace/span ids.
// Each control changes the page state; `load` fills the choices from the API.

import { getJson } from './api.js';
import { byId, h } from './dom.js';

/** Labels with controls of their own, not offered again as "more labels". */
const OWN_CONTROLS = ['service_name', 'process_id'];

function fill(select, choices, current, allLabel) {
  const values = choices.map((c) => c.value);
  // A value from the URL that the store does not list (yet) stays selectable.
  if (current && !values.includes(current)) choices = [...choices, { value: current, label: current }];
  select.replaceChildren(
    ...(allLabel === null ? [] : [h('option', { value: '' }, allLabel)]),
    ...choices.map((c) => h('option', { value: c.value }, c.label)),
  );
  select.value = current;
}

export class Filters {
  /** @param {(patch: object) => void} onChange */
  constructor(onChange) {
    this.onChange = onChange;
    this.labels = [];
    byId('f-type').addEventListener('change', (e) => onChange({ type: e.target.value }));
    byId('f-service').addEventListener('change', (e) => onChange({ service: e.target.value }));
    byId('f-pid').addEventListener('change', (e) => onChange({ pid: e.target.value }));
    for (const id of ['trace_id', 'span_id']) {
      byId(`f-${id}`).addEventListener('change', (e) => onChange({ [id]: e.target.value.trim() }));
    }
    byId('f-label-name').addEventListener('change', () => this.loadLabelValues());
    byId('f-label-add').addEventListener('click', () => {
      const name = byId('f-label-name').value;
      const value = byId('f-label-value').value;
      if (name && value && !this.labels.includes(`${name}=${value}`)) {
        onChange({ labels: [...this.labels, `${name}=${value}`] });
      }
    });
  }

  /** Fills the choices; `processes` (`/api/v1/processes`) names the attached pids. */
  async load(state, processes) {
    const [types, names, services, pids] = await Promise.all([
      getJson('/api/v1/profile-types'),
      getJson('/api/v1/labels'),
      getJson('/api/v1/labels/service_name/values'),
      getJson('/api/v1/labels/process_id/values'),
    ]);
    fill(byId('f-type'), types.map((t) => ({ value: t.name, label: t.name })), state.type, null);
    fill(byId('f-service'), services.map((s) => ({ value: s, label: s })), state.service, 'all services');
    const nameOf = new Map(processes.map((p) => [String(p.pid), p.name]));
    const byPid = (a, b) => Number(a) - Number(b);
    fill(
      byId('f-pid'),
      pids.sort(byPid).map((pid) => ({ value: pid, label: nameOf.has(pid) ? `${pid} ${nameOf.get(pid)}` : pid })),
      state.pid,
      'all processes',
    );
    const others = names.filter((n) => !OWN_CONTROLS.includes(n));
    fill(byId('f-label-name'), others.map((n) => ({ value: n, label: n })), '', 'label…');
    byId('f-label-value').replaceChildren();
  }

  async loadLabelValues() {
    const name = byId('f-label-name').value;
    const values = name ? await getJson(`/api/v1/labels/${encodeURIComponent(name)}/values`) : [];
    fill(byId('f-label-value'), values.map((v) => ({ value: v, label: v })), values[0] ?? '', null);
  }

  /** Shows the state's values in the controls. */
  show(state) {
    byId('f-type').value = state.type;
    byId('f-service').value = state.service;
    byId('f-pid').value = state.pid;
    byId('f-trace_id').value = state.trace_id;
    byId('f-span_id').value = state.span_id;
    this.labels = state.labels;
    byId('f-labels').replaceChildren(
      ...state.labels.map((label) =>
        h(
          'span',
          { className: 'chip' },
          label.replace('=', ' = '),
          h('button', { type: 'button', title: 'Remove this filter', onclick: () => this.onChange({ labels: this.labels.filter((l) => l !== label) }) }, '×'),
        ),
      ),
    );
  }
}
