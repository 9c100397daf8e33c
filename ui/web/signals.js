// Beside one process's flame graph: its recent exceptions and its warning and error logs (what the
// agent keeps, `/api/v1/processes/{pid}/signals`), each linked to the flame graph of the span it
// happened in. Warnings too: a slow dependency or a retry is often logged only as one.

import { ApiError, getJson } from './api.js';
import { byId, h } from './dom.js';
import { formatDateTime } from './format.js';

/** How many of each kind the panel lists. */
const LIMIT = 20;

export class SignalsView {
  /** @param {{onSpan: (traceId: string, spanId: string) => void}} options onSpan shows a span's flame graph */
  constructor({ onSpan }) {
    this.onSpan = onSpan;
  }

  /** Shows `pid`'s signals; an empty pid (several processes selected) hides the panel. */
  async load(pid, signal) {
    const panel = byId('signals');
    if (!pid) {
      panel.hidden = true;
      return;
    }
    let answer;
    try {
      answer = await getJson(`/api/v1/processes/${pid}/signals`, { level: 'Warning', limit: LIMIT }, { signal });
    } catch (error) {
      // A process no longer attached (or an agent without the route) has nothing to show.
      if (error instanceof ApiError && error.status === 404) {
        panel.hidden = true;
        return;
      }
      throw error;
    }
    panel.hidden = false;
    this.render(answer);
  }

  spanLink(traceId, spanId) {
    if (!traceId || !spanId) return null;
    return h('button', { type: 'button', className: 'link', title: `trace ${traceId}`, onclick: () => this.onSpan(traceId, spanId) }, `span ${spanId}`);
  }

  render({ exceptions, logs, logs_collected: collected }) {
    byId('signal-exceptions').replaceChildren(
      ...exceptions.map((e) => h(
        'li',
        {},
        h('span', { className: 'muted' }, formatDateTime(Date.parse(e.timestamp))), ' ',
        h('span', { className: 'fn' }, e.typeName), ': ', e.message, ' ',
        this.spanLink(e.traceId, e.spanId),
        e.stack.frames.length ? h('div', { className: 'muted fn' }, `at ${e.stack.frames[0].fullName}`) : null,
      )),
    );
    byId('signal-exceptions-empty').hidden = exceptions.length > 0;
    byId('signal-logs').replaceChildren(
      ...logs.map((r) => h(
        'li',
        {},
        h('span', { className: 'muted' }, formatDateTime(Math.floor(r.UnixNanos / 1e6))), ' ',
        h('span', { className: 'fn' }, `${r.LogLevel} ${r.Category}[${r.EventId}]`), ': ', r.Message, ' ',
        this.spanLink(r.TraceId, r.SpanId),
      )),
    );
    byId('signal-logs-empty').textContent = collected
      ? 'No warnings or errors kept (the agent keeps the last 30 s).'
      : 'The agent collects no logs (start it with --logs LEVEL).';
    byId('signal-logs-empty').hidden = logs.length > 0;
  }
}
