// The incidents: a list, and one incident's page for the retrospective. What fired and why
// (each cause with its trigger as configured and the window it judged), a timeline of the window
// from the series the store holds (CPU, allocation as the GC heap's growth, exceptions, lock
// waits) with "before" and "during" marked, the flame-graph diff ranked by growth of share
// (`/api/v1/incidents/{id}/diff`), the exception types that are new or grew in the window as the
// store counted them (`/api/v1/incidents/{id}/exceptions`) and the warning+ logs the agent keeps
// that did, each linked to its span's flame graph, the slowest spans of the window
// (`/api/v1/incidents/{id}/spans`), and the bundle to download.

import { ApiError, getJson, request } from './api.js';
import { byId, h, sizeCanvas } from './dom.js';
import { formatDateTime, formatRange, formatSpan } from './format.js';

/** Functions the diff table lists. */
const DIFF_ROWS = 30;
/** Exception types the exceptions table lists. */
const EXCEPTION_ROWS = 20;
/** Slowest spans the spans table lists. */
const SPAN_ROWS = 20;
/** Signals asked of the agent per process (it keeps the newest). */
const SIGNALS = 1000;
/** Points of a timeline chart at most. */
const MAX_POINTS = 240;
/** The timeline's charts: a stored profile type, per second of the step, in the unit shown. */
const CHARTS = [
  { type: 'cpu', title: 'CPU', unit: 'cores', per: (v, stepMs) => v / 1e6 / stepMs },
  { type: 'alloc_size', title: 'Allocated (GC heap growth)', unit: 'MiB/s', per: (v, stepMs) => (v / 2 ** 20) * (1000 / stepMs) },
  { type: 'exception', title: 'Exceptions thrown', unit: '/s', per: (v, stepMs) => v * (1000 / stepMs) },
  { type: 'lock_time', title: 'Lock waits', unit: 'ms/s', per: (v, stepMs) => v / 1e6 / (stepMs / 1000) },
];

const fixed = (n) => (Number.isFinite(n) ? n.toFixed(2) : '–');

/** The step of a timeline of `span` ms: whole seconds, at most `MAX_POINTS` points. */
function stepFor(span) {
  return Math.max(1000, Math.ceil(span / MAX_POINTS / 1000) * 1000);
}

/**
 * Counts per key before and during: `[key, before, during, example]`, new or grown first (by
 * growth of the rate per minute), those that did not grow left out.
 */
export function grown(records, keyOf, timeOf, ranges) {
  const counts = new Map();
  for (const record of records) {
    const t = timeOf(record);
    const side = t >= ranges.during.from && t < ranges.during.until ? 1 : t >= ranges.before.from && t < ranges.before.until ? 0 : -1;
    if (side < 0) continue;
    const key = keyOf(record);
    const entry = counts.get(key) ?? [key, 0, 0, record];
    entry[1 + side] += 1;
    if (side === 1) entry[3] = record;
    counts.set(key, entry);
  }
  const perMinute = (n, range) => (n * 60000) / Math.max(1, range.until - range.from);
  const growth = ([, before, during]) => perMinute(during, ranges.during) - perMinute(before, ranges.before);
  return [...counts.values()].filter((e) => growth(e) > 0).sort((a, b) => growth(b) - growth(a));
}

export class IncidentsView {
  /**
   * @param {{onSpan: (pid: string, traceId: string, spanId: string) => void, onOpen: (id: string) => void}} options
   *   onSpan shows a span's flame graph; onOpen shows an incident
   */
  constructor({ onSpan, onOpen }) {
    this.onSpan = onSpan;
    this.onOpen = onOpen;
  }

  /** The list, and incident `id` when given. */
  async load(id) {
    const incidents = await getJson('/api/v1/incidents');
    this.renderList(incidents, id);
    const detail = byId('incident-detail');
    const incident = incidents.find((i) => String(i.id) === String(id));
    detail.hidden = !incident;
    if (incident) await this.show(incident);
  }

  renderList(incidents, current) {
    byId('incident-empty').hidden = incidents.length > 0;
    byId('incident-rows').replaceChildren(
      ...incidents.map((i) => h(
        'tr',
        { dataset: { id: i.id }, className: String(i.id) === String(current) ? 'current' : '' },
        h('td', { className: 'num' }, h('button', { type: 'button', className: 'link', onclick: () => this.onOpen(String(i.id)) }, `#${i.id}`)),
        h('td', {}, formatDateTime(i.first_cause_unix_ms)),
        h('td', {}, i.rules.join(', ') || 'mark'),
        h('td', {}, i.processes.map((p) => `${p.service_name} (${p.pid})`).join(', ')),
        h('td', {}, formatRange({ from: i.from_unix_ms, until: i.until_unix_ms })),
      )),
    );
  }

  async show(incident) {
    const now = Date.now();
    const ranges = {
      before: { from: incident.from_unix_ms, until: incident.onset_unix_ms },
      during: { from: incident.onset_unix_ms, until: Math.min(incident.until_unix_ms, now) },
    };
    const pid = String(incident.processes[0].pid);
    byId('incident-title').textContent = `Incident #${incident.id}: ${incident.processes.map((p) => `${p.service_name} (pid ${p.pid})`).join(', ')}`;
    byId('incident-window').textContent = `before ${formatRange(ranges.before)}; during ${formatRange(ranges.during)}`
      + (incident.until_unix_ms > now ? ' (still open)' : '');
    const bundle = byId('incident-bundle');
    bundle.onclick = () => this.download(incident.id);
    this.renderCauses(incident);
    await Promise.all([
      this.loadTimeline(pid, incident, ranges),
      this.loadDiff(incident.id, pid),
      this.loadSignals(incident.id, pid, ranges),
      this.loadSpans(incident.id, pid),
    ]);
  }

  /** The bundle through the API (with the token), saved by the browser. */
  async download(id) {
    const response = await request(`/api/v1/incidents/${id}/bundle`, {});
    const url = URL.createObjectURL(await response.blob());
    const link = h('a', { href: url, download: `clrscope-incident-${id}.html` });
    document.body.append(link);
    link.click();
    link.remove();
    setTimeout(() => URL.revokeObjectURL(url), 60000);
  }

  renderCauses(incident) {
    byId('incident-causes').replaceChildren(
      ...incident.causes.map((c) => h(
        'tr',
        {},
        h('td', {}, formatDateTime(c.unix_ms)),
        h('td', {}, c.kind.replace('_', ' ')),
        h('td', {}, c.rule ?? c.note ?? ''),
        h('td', { className: 'trigger' }, c.trigger ?? ''),
        h('td', {}, c.trigger_from_unix_ms ? `from ${formatDateTime(c.trigger_from_unix_ms)} (${formatSpan(c.unix_ms - c.trigger_from_unix_ms)})` : ''),
        h('td', {}, c.processes.map((p) => `${p.service_name} (${p.pid})`).join(', ')),
      )),
    );
    byId('incident-causes-dropped').textContent = incident.causes_dropped
      ? `${incident.causes_dropped} later causes are counted, not listed.`
      : '';
  }

  async loadTimeline(pid, incident, ranges) {
    const types = new Set((await getJson('/api/v1/profile-types')).map((t) => t.name));
    const from = ranges.before.from;
    const until = ranges.during.until;
    const step = stepFor(until - from);
    const charts = [];
    for (const chart of CHARTS.filter((c) => types.has(c.type))) {
      const series = await getJson('/api/v1/series', {
        type: chart.type, query: `{process_id="${pid}"}`, from, until, step: `${step}ms`,
      });
      charts.push(this.chart(chart, series, { from, until, onset: incident.onset_unix_ms, causes: incident.causes }));
    }
    byId('incident-timeline').replaceChildren(...charts);
  }

  /** One chart: the series per second, "before" shaded, the onset and each cause marked. */
  chart(chart, series, { from, until, onset, causes }) {
    const values = series.points.map(([t, v]) => [t, chart.per(v, series.step_ms)]);
    const peak = Math.max(0, ...values.map(([, v]) => v));
    const mean = (range) => {
      const inside = values.filter(([t]) => t >= range[0] && t < range[1]);
      return inside.length ? inside.reduce((s, [, v]) => s + v, 0) / inside.length : NaN;
    };
    const canvas = h('canvas', { className: 'incident-chart' });
    const figure = h(
      'figure',
      { className: 'chart', dataset: { type: chart.type } },
      h('figcaption', {}, `${chart.title}: `, h('span', { className: 'before-mean' }, fixed(mean([from, onset]))),
        ` → `, h('span', { className: 'during-mean' }, fixed(mean([onset, until]))), ` ${chart.unit} (mean before → during; peak ${fixed(peak)})`),
      canvas,
    );
    requestAnimationFrame(() => {
      const width = Math.max(300, figure.clientWidth - 4);
      const height = 70;
      const ctx = sizeCanvas(canvas, width, height);
      const x = (t) => ((t - from) / Math.max(1, until - from)) * width;
      const y = (v) => height - 4 - (peak > 0 ? (v / peak) * (height - 10) : 0);
      ctx.fillStyle = '#eef2f7';
      ctx.fillRect(0, 0, x(onset), height);
      ctx.strokeStyle = 'rgb(40, 110, 220)';
      ctx.beginPath();
      values.forEach(([t, v], i) => (i ? ctx.lineTo(x(t), y(v)) : ctx.moveTo(x(t), y(v))));
      ctx.stroke();
      ctx.strokeStyle = 'rgb(230, 120, 20)';
      for (const t of [onset, ...causes.map((c) => c.unix_ms)]) {
        ctx.beginPath();
        ctx.moveTo(x(t), 0);
        ctx.lineTo(x(t), height);
        ctx.stroke();
      }
    });
    return figure;
  }

  async loadDiff(id, pid) {
    const diff = await getJson(`/api/v1/incidents/${id}/diff`, { type: 'cpu', pid, limit: DIFF_ROWS });
    byId('incident-diff-caption').textContent = `cpu of pid ${pid}: ${formatRange({ from: diff.before_from_unix_ms, until: diff.before_until_unix_ms })} before, against ${formatRange({ from: diff.during_from_unix_ms, until: diff.during_until_unix_ms })} during`;
    byId('incident-diff').replaceChildren(
      ...diff.functions.map((f, rank) => h(
        'tr',
        { className: 'diff-row' },
        h('td', { className: 'num' }, String(rank + 1)),
        h('td', { className: 'fn function', title: f.module }, f.function),
        h('td', { className: 'num share-before' }, fixed(f.total_before)),
        h('td', { className: 'num share-during' }, fixed(f.total_during)),
        h('td', { className: `num ${f.total_during >= f.total_before ? 'grew' : 'shrank'}` }, `${f.total_during >= f.total_before ? '+' : '−'}${fixed(Math.abs(f.total_during - f.total_before))}`),
        h('td', { className: 'num' }, fixed(f.self_before)),
        h('td', { className: 'num' }, fixed(f.self_during)),
      )),
    );
  }

  spanLink(pid, traceId, spanId) {
    if (!traceId || !spanId) return null;
    return h('button', { type: 'button', className: 'link', title: `trace ${traceId}`, onclick: () => this.onSpan(pid, traceId, spanId) }, `span ${spanId}`);
  }

  /**
   * Exceptions counted by the store (every throw, by type: `/api/v1/incidents/{id}/exceptions`),
   * with the message and span of the newest one the agent still keeps; warning+ logs from what
   * the agent keeps.
   */
  async loadSignals(id, pid, ranges) {
    let answer;
    try {
      answer = await getJson(`/api/v1/processes/${pid}/signals`, { level: 'Warning', limit: SIGNALS });
    } catch (error) {
      if (!(error instanceof ApiError && error.status === 404)) throw error;
      answer = null;
    }
    const counted = await getJson(`/api/v1/incidents/${id}/exceptions`, { pid, limit: EXCEPTION_ROWS });
    const newest = new Map((answer?.exceptions ?? []).map((e) => [e.typeName, e]));
    const logs = answer ? grown(answer.logs, (r) => `${r.LogLevel} ${r.Category}[${r.EventId}]`, (r) => Math.floor(r.UnixNanos / 1e6), ranges) : [];
    const row = (key, before, during, link, detail) => h(
      'tr',
      {},
      h('td', { className: 'fn signal-key' }, key),
      h('td', { className: 'num' }, String(before)),
      h('td', { className: 'num' }, String(during)),
      h('td', {}, detail, ' ', link),
    );
    byId('incident-exceptions').replaceChildren(
      ...counted.exceptions.map((c) => {
        const e = newest.get(c.type_name);
        const detail = `${c.new ? 'new; ' : ''}thrown at ${c.thrown_at} (${c.thrown_at_count} there)${e ? `: ${e.message}` : ''}`;
        return row(c.type_name, c.before, c.during, e ? this.spanLink(pid, e.traceId, e.spanId) : null, detail);
      }),
    );
    byId('incident-logs').replaceChildren(
      ...logs.map(([key, before, during, r]) => row(key, before, during, this.spanLink(pid, r.TraceId, r.SpanId), r.Message)),
    );
    byId('incident-signals-note').textContent = 'Exceptions: every throw the store counted, by type, new or grown first. '
      + (answer
        ? 'Logs: from what the agent keeps now (the last 30 s), new or grown first.'
        : 'The process is no longer attached: its logs and exception messages are gone with it.');
  }

  /** The slowest spans of the window (`/api/v1/incidents/{id}/spans`), each linked to its flame graph. */
  async loadSpans(id, pid) {
    const answer = await getJson(`/api/v1/incidents/${id}/spans`, { pid, limit: SPAN_ROWS });
    const slowestBefore = answer.before.spans[0]?.duration_ms;
    byId('incident-spans-note').textContent = !answer.attached
      ? 'The process is no longer attached: its spans are gone with it.'
      : `${answer.during.seen} spans ended during (${answer.before.seen} before; the agent keeps the ${answer.kept_per_minute} slowest of each minute, with spans exported)`
        + (slowestBefore === undefined ? '' : `; the slowest before took ${fixed(slowestBefore)} ms`);
    byId('incident-spans').replaceChildren(
      ...answer.during.spans.map((s, rank) => h(
        'tr',
        { className: 'span-row' },
        h('td', { className: 'num' }, String(rank + 1)),
        h('td', { className: 'fn span-name', title: s.source }, s.name),
        h('td', {}, s.kind),
        h('td', { className: 'num span-duration' }, fixed(s.duration_ms)),
        h('td', {}, formatDateTime(s.start_unix_ms)),
        h('td', { className: 'span-tags' }, Object.entries(s.tags).map(([k, v]) => `${k}=${v}`).join(' ')),
        h('td', {}, this.spanLink(pid, s.trace_id, s.span_id)),
      )),
    );
  }
}

