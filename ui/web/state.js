// The page's state. It lives in the URL's fragment (#type=cpu&service=api&sel=…), so that what
// is shown can be bookmarked, shared and reloaded; every change goes through `update`, which
// rewrites the fragment and tells the listeners which keys changed.

const DEFAULTS = Object.freeze({
  view: 'profile', // 'profile', 'processes' or 'incidents'
  incident: '', // the incident the incidents view shows
  type: 'cpu',
  service: '',
  pid: '',
  labels: [], // ['host_name=node-1', …]: series label equalities beyond service and process
  trace_id: '',
  span_id: '',
  window: '5m', // '5m', '1h', '24h' (ending now) or 'custom' (`from`/`until`)
  from: null,
  until: null,
  sel: null, // {from, until}: the range the flame graph shows; null = the whole window
  compare: false,
  base: null, // {from, until} of a comparison
  new: null,
  layout: 'flame', // 'flame' (root at the bottom) or 'icicle' (root at the top)
  search: '',
});

const RANGES = ['sel', 'base', 'new'];
const listeners = [];

/** The current state; change it only with `update`. */
export const state = { ...DEFAULTS, ...parse(location.hash) };

function parse(hash) {
  const params = new URLSearchParams(hash.replace(/^#/, ''));
  const parsed = {};
  for (const [key, fallback] of Object.entries(DEFAULTS)) {
    if (key === 'labels') {
      const labels = params.getAll('label').filter((l) => l.includes('='));
      if (labels.length) parsed.labels = labels;
      continue;
    }
    const text = params.get(key);
    if (text === null) continue;
    if (RANGES.includes(key)) {
      const [from, until] = text.split('-').map(Number);
      if (from < until) parsed[key] = { from, until };
    } else if (key === 'from' || key === 'until') {
      if (Number.isFinite(Number(text))) parsed[key] = Number(text);
    } else if (typeof fallback === 'boolean') {
      parsed[key] = text === '1';
    } else {
      parsed[key] = text;
    }
  }
  return parsed;
}

function serialize() {
  const params = new URLSearchParams();
  for (const [key, fallback] of Object.entries(DEFAULTS)) {
    const value = state[key];
    if (key === 'labels') value.forEach((l) => params.append('label', l));
    else if (value === fallback || value === null || value === '') continue;
    else if (RANGES.includes(key)) params.set(key, `${value.from}-${value.until}`);
    else if (typeof value === 'boolean') params.set(key, value ? '1' : '0');
    else params.set(key, String(value));
  }
  return params.toString();
}

/** Merges `patch` into the state and notifies the listeners of the keys whose value changed. */
export function update(patch) {
  const changed = new Set();
  for (const [key, value] of Object.entries(patch)) {
    if (JSON.stringify(state[key]) !== JSON.stringify(value)) {
      state[key] = value;
      changed.add(key);
    }
  }
  if (!changed.size) return;
  // replaceState: the fragment follows the page without filling the history with every drag.
  history.replaceState(null, '', `#${serialize()}`);
  for (const listener of listeners) listener(changed);
}

/** Calls `listener(changedKeys)` after every change. */
export function onChange(listener) {
  listeners.push(listener);
}

// Someone edited the fragment by hand, or followed a link to another view of this page.
window.addEventListener('hashchange', () => {
  update({ ...DEFAULTS, ...parse(location.hash) });
});
