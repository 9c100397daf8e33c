// The page: wires the state (state.js) to the filter bar, the timeline, the single-range and
// compare views, export and the process list, and decides what to load when something changes.

import { ApiError, AuthRequired, getJson, isAbort, latestOnly, profileParams } from './api.js';
import { onTokenChange, setupTokenDialog } from './auth.js';
import { CompareView } from './compare.js';
import { byId } from './dom.js';
import { Export } from './export.js';
import { Filters } from './filters.js';
import { formatPercent, formatRange, formatSpan, formatValue } from './format.js';
import { IncidentsView } from './incidents.js';
import { ProcessesView } from './processes.js';
import { ProfileView } from './profileview.js';
import { SignalsView } from './signals.js';
import { onChange, state, update } from './state.js';
import { Timeline, stepFor } from './timeline.js';

const WINDOWS_MS = { '5m': 5 * 60e3, '1h': 3600e3, '24h': 86400e3 };
/** The agent's default sampling period: the shortest useful step when no process says. */
const DEFAULT_PERIOD_MS = 10000;
const FILTER_KEYS = ['type', 'service', 'pid', 'labels', 'trace_id', 'span_id'];
const WINDOW_KEYS = ['window', 'from', 'until'];

/** The window's absolute range, resolved from "last 5 min" etc. at the last refresh. */
let windowRange = resolveWindow();
/** The longest sampling period of the attached processes (see `stepFor`). */
let periodMs = DEFAULT_PERIOD_MS;

const filters = new Filters((patch) => update(patch));
const timeline = new Timeline(byId('timeline'), {
  onSelect: (kind, range) => {
    // A click clears the single range; in compare mode both ranges are always set.
    if (kind === 'sel') update({ sel: range });
    else if (range) update({ [kind]: range });
  },
});
const single = new ProfileView();
const compare = new CompareView();
const exporter = new Export(byId('export'), fail);
const processes = new ProcessesView({
  onProfile: (p) => update({ view: 'profile', service: p.service_name, pid: String(p.pid) }),
  onError: fail,
});
const signals = new SignalsView({
  onSpan: (traceId, spanId) => update({ trace_id: traceId, span_id: spanId }),
});
const incidents = new IncidentsView({
  // A span's flame graph: the profile view of its process over the hour around now.
  onSpan: (pid, traceId, spanId) => update({ view: 'profile', pid, trace_id: traceId, span_id: spanId, window: '1h', sel: null }),
  onOpen: (id) => update({ incident: id }),
});
const nextSignals = latestOnly();
const nextTimeline = latestOnly();
const nextProfile = latestOnly();

// For the browser's console and the browser tests: the live components.
window.clrscope = { state, timeline, single, compare, processes, signals, incidents };

function resolveWindow() {
  if (state.window === 'custom' && state.from < state.until) return { from: state.from, until: state.until };
  const until = Date.now();
  return { from: until - (WINDOWS_MS[state.window] ?? WINDOWS_MS['5m']), until };
}

function setStatus(text, isError = false) {
  const element = byId('status');
  element.textContent = text;
  element.classList.toggle('error', isError);
}

function fail(error) {
  if (isAbort(error)) return;
  if (error instanceof AuthRequired) {
    // Without a token nothing of the profiles stays on screen.
    single.clear();
    compare.clear();
    timeline.setData(null);
    timeline.setEvents([]);
    byId('timeline-summary').textContent = '';
  }
  setStatus(error.message, true);
}

/** Everything again: the choices, the attached processes, the timeline and the profile. */
async function refresh() {
  windowRange = resolveWindow();
  showControls();
  try {
    const attached = await getJson('/api/v1/processes');
    periodMs = Math.max(0, ...attached.map((p) => p.sampler.duty.period_ms)) || DEFAULT_PERIOD_MS;
    await filters.load(state, attached);
    filters.show(state);
  } catch (error) {
    fail(error);
    return;
  }
  loadTimeline();
  loadProfile();
  loadSignals();
}

/** The selected process's recent exceptions and error logs, beside its flame graph. */
async function loadSignals() {
  try {
    await signals.load(state.compare ? '' : state.pid, nextSignals());
  } catch (error) {
    fail(error);
  }
}

async function loadTimeline() {
  const signal = nextTimeline();
  const { from, until } = windowRange;
  const step = stepFor(until - from, periodMs);
  const params = profileParams(state);
  // An agent without the events route (or a later one with new kinds) still draws the series.
  const events = getJson('/api/v1/events', { query: params.query, from, until }, { signal }).catch((error) => {
    if (error instanceof ApiError && error.status === 404) return [];
    throw error;
  });
  const points = getJson('/api/v1/series', { ...params, from, until, step: `${step}ms` }, { signal });
  try {
    // Awaited together, so that an abort of both is one handled rejection, not one left over.
    const [series, marks] = await Promise.all([points, events]);
    timeline.setData({ ...series, from, until });
    timeline.setEvents(marks);
    const sum = series.points.reduce((total, [, value]) => total + value, 0);
    byId('timeline-summary').textContent = `${state.type}: ${formatValue(sum, series.unit)} in ${formatSpan(until - from)}, steps of ${formatSpan(series.step_ms)}`;
  } catch (error) {
    fail(error);
  }
}

async function loadProfile() {
  const signal = nextProfile();
  const params = profileParams(state);
  showControls();
  setStatus('Loading…');
  try {
    if (state.compare) {
      const diff = await compare.load(params, state.base, state.new, signal);
      setStatus(diff.total[0] > 0 || diff.baseTotal[0] > 0 ? '' : `No ${state.type} samples in either range.`);
    } else {
      const range = state.sel ?? windowRange;
      const tree = await single.load(params, range, signal);
      byId('shown-range').textContent = formatRange(range);
      setStatus(tree.total[0] > 0 ? '' : `No ${state.type} samples in ${formatRange(range)}.`);
    }
    showSearchResult();
  } catch (error) {
    fail(error);
  }
}

/** The view on screen. */
function view() {
  return state.compare ? compare : single;
}

function showSearchResult() {
  const covered = view().matchedShare();
  byId('search-result').textContent = covered === null ? '' : `matched: ${formatPercent(covered)} of the total`;
}

/** The controls' look from the state: pressed buttons, shown panels, ranges, export links. */
function showControls() {
  for (const button of document.querySelectorAll('[data-window]')) {
    button.ariaPressed = String(button.dataset.window === state.window);
  }
  byId('custom-range').hidden = state.window !== 'custom';
  for (const button of document.querySelectorAll('[data-layout]')) {
    button.ariaPressed = String(button.dataset.layout === state.layout);
  }
  byId('mode-single').ariaPressed = String(!state.compare);
  byId('mode-compare').ariaPressed = String(state.compare);
  byId('single').hidden = state.compare;
  byId('compare').hidden = !state.compare;
  byId('compare-picks').hidden = !state.compare;
  for (const button of document.querySelectorAll('[data-pick]')) {
    button.ariaPressed = String(button.dataset.pick === timeline.dragKind);
  }
  timeline.setRanges(
    state.compare
      ? [{ kind: 'base', ...state.base }, { kind: 'new', ...state.new }]
      : state.sel
        ? [{ kind: 'sel', ...state.sel }]
        : [],
  );
  const params = profileParams(state);
  if (state.compare) {
    const ranges = { base_from: state.base.from, base_until: state.base.until, from: state.new.from, until: state.new.until };
    exporter.update('/api/v1/diff', { ...params, ...ranges }, `${state.type}-diff`);
  } else {
    const range = state.sel ?? windowRange;
    // cpu-20251130T010800: the type and the range's start (UTC), safe in any file system.
    const start = new Date(range.from).toISOString().replace(/[-:]/g, '').slice(0, 15);
    exporter.update('/api/v1/profile', { ...params, from: range.from, until: range.until }, `${state.type}-${start}`);
  }
}

function showView() {
  const view = ['processes', 'incidents'].includes(state.view) ? state.view : 'profile';
  for (const name of ['profile', 'processes', 'incidents']) {
    byId(`${name}-view`).hidden = view !== name;
    byId(`nav-${name}`).ariaCurrent = view === name ? 'page' : null;
  }
  if (view !== 'processes') processes.stop();
  if (view === 'profile') refresh();
  else if (view === 'processes') processes.start();
  else loadIncidents();
}

async function loadIncidents() {
  setStatus('Loading…');
  try {
    await incidents.load(state.incident);
    setStatus('');
  } catch (error) {
    fail(error);
  }
}

/** Compare the selection's (or window's) first half with its second, to start from. */
function startCompare() {
  const range = state.sel ?? windowRange;
  const middle = Math.round((range.from + range.until) / 2);
  timeline.dragKind = 'new';
  update({ compare: true, base: { from: range.from, until: middle }, new: { from: middle, until: range.until } });
}

function toLocalInput(unixMs) {
  const d = new Date(unixMs - new Date(unixMs).getTimezoneOffset() * 60000);
  return d.toISOString().slice(0, 19);
}

function wireControls() {
  byId('nav-profile').addEventListener('click', () => update({ view: 'profile' }));
  byId('nav-processes').addEventListener('click', () => update({ view: 'processes' }));
  byId('nav-incidents').addEventListener('click', () => update({ view: 'incidents' }));
  for (const button of document.querySelectorAll('[data-window]')) {
    button.addEventListener('click', () => {
      const { window } = button.dataset;
      if (window === 'custom') {
        // Start from the window shown now, then let the inputs move it.
        update({ window, from: windowRange.from, until: windowRange.until, sel: null });
      } else {
        update({ window, from: null, until: null, sel: null });
      }
    });
  }
  for (const id of ['custom-from', 'custom-until']) {
    byId(id).addEventListener('change', () => {
      const from = new Date(byId('custom-from').value).getTime();
      const until = new Date(byId('custom-until').value).getTime();
      if (from < until) update({ window: 'custom', from, until, sel: null });
    });
  }
  byId('refresh').addEventListener('click', refresh);
  byId('mode-single').addEventListener('click', () => {
    timeline.dragKind = 'sel';
    update({ compare: false, base: null, new: null });
  });
  byId('mode-compare').addEventListener('click', () => {
    if (!state.compare) startCompare();
  });
  for (const button of document.querySelectorAll('[data-pick]')) {
    button.addEventListener('click', () => {
      timeline.dragKind = button.dataset.pick;
      showControls();
    });
  }
  for (const button of document.querySelectorAll('[data-layout]')) {
    button.addEventListener('click', () => update({ layout: button.dataset.layout }));
  }
  byId('reset-zoom').addEventListener('click', () => view().resetZoom());
  let typing = null;
  byId('search').addEventListener('input', (event) => {
    clearTimeout(typing);
    typing = setTimeout(() => update({ search: event.target.value }), 150);
  });
}

onChange((changed) => {
  const any = (keys) => keys.some((k) => changed.has(k));
  if (changed.has('view')) {
    showView();
    return;
  }
  if (state.view === 'incidents' && changed.has('incident')) loadIncidents();
  if (state.view === 'processes' || state.view === 'incidents') return;
  if (any(FILTER_KEYS) || any(WINDOW_KEYS)) {
    if (any(WINDOW_KEYS)) windowRange = resolveWindow();
    filters.show(state);
    byId('custom-from').value = toLocalInput(windowRange.from);
    byId('custom-until').value = toLocalInput(windowRange.until);
    loadTimeline();
    loadProfile();
    loadSignals();
  } else if (any(['sel', 'compare', 'base', 'new'])) {
    loadProfile();
  }
  if (changed.has('layout')) {
    showControls();
    single.setLayout(state.layout);
    compare.setLayout(state.layout);
  }
  if (changed.has('search')) {
    // Both views, so that switching modes keeps the search.
    single.setSearch(state.search);
    compare.setSearch(state.search);
    showSearchResult();
  }
});

onTokenChange(showView);
setupTokenDialog();
wireControls();
if (state.compare && !(state.base && state.new)) startCompare();
timeline.dragKind = state.compare ? 'new' : 'sel';
single.setLayout(state.layout);
compare.setLayout(state.layout);
byId('search').value = state.search;
byId('custom-from').value = toLocalInput(windowRange.from);
byId('custom-until').value = toLocalInput(windowRange.until);
showView();
