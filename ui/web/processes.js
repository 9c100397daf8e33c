// The process list: what the agent profiles now, each process's runtime and sampler, and the
// actions on it. Boost calls the API; trace, GC dump and dump are shown disabled until the
// dotnet-monitor-compatible API (which captures them) is served.

import { ApiError, getJson, request } from './api.js';
import { byId, h } from './dom.js';
import { formatDateTime, formatPercent, formatSpan } from './format.js';

const BOOST = '5m';
/** How often the open page asks again: boosts count down, processes come and go. */
const REFRESH_MS = 2000;
const LATER = 'comes with the dotnet-monitor API';

function samplerText({
  duty, window_ms: window, threads_per_tick: threads, boost_seconds_left: left,
  idle, idle_below_percent: idleBelow, idle_periods: idlePeriods,
}) {
  let cycle = `${window / 1000} s every ${duty.period_ms / 1000} s (${formatPercent(window / duty.period_ms)})`;
  if (window < duty.window_ms) cycle += `, shortened from ${duty.window_ms / 1000} s for ${threads} threads`;
  if (idle) cycle += `; idle (below ${idleBelow}% of a core): one period in ${idlePeriods}`;
  return left === null ? cycle : `boosted to 100%: ${formatSpan(left * 1000)} left; then ${cycle}`;
}

export class ProcessesView {
  /**
   * @param {{onProfile: (process: object) => void, onError: (error: Error) => void}} options
   *   onProfile shows a process's profile; onError shows a failed call
   */
  constructor({ onProfile, onError }) {
    this.onProfile = onProfile;
    this.onError = onError;
    this.timer = null;
  }

  start() {
    this.stop();
    this.refresh();
    this.timer = setInterval(() => this.refresh(), REFRESH_MS);
  }

  stop() {
    clearInterval(this.timer);
    this.timer = null;
  }

  async refresh() {
    try {
      this.render(await getJson('/api/v1/processes'));
    } catch (error) {
      this.stop();
      this.render([]);
      this.onError(error);
    }
  }

  async act(method, process) {
    const path = `/api/v1/processes/${process.pid}/boost`;
    try {
      await request(path, method === 'POST' ? { duration: BOOST } : {}, { method });
    } catch (error) {
      // A process that exited meanwhile is a 404: the refresh below drops it from the list.
      if (!(error instanceof ApiError && error.status === 404)) this.onError(error);
    }
    this.refresh();
  }

  render(processes) {
    byId('process-empty').hidden = processes.length > 0;
    byId('process-rows').replaceChildren(
      ...processes.map((p) => {
        const boosted = p.sampler.boost_seconds_left !== null;
        return h(
          'tr',
          { dataset: { pid: p.pid } },
          h('td', { className: 'num' }, String(p.pid)),
          h('td', { title: p.command_line }, p.name),
          h('td', {}, p.service_name),
          h('td', {}, p.runtime_version ?? '?'),
          h('td', {}, p.transport),
          h('td', {}, formatDateTime(p.attached_unix_ms)),
          h('td', { className: boosted ? 'boosted' : '' }, samplerText(p.sampler)),
          h(
            'td',
            { className: 'actions' },
            h('button', { type: 'button', onclick: () => this.onProfile(p) }, 'Profile'),
            boosted
              ? h('button', { type: 'button', onclick: () => this.act('DELETE', p) }, 'End boost')
              : h('button', { type: 'button', title: 'Sample without pause for 5 minutes', onclick: () => this.act('POST', p) }, 'Boost 5 min'),
            ...['Trace', 'GC dump', 'Dump'].map((label) => h('button', { type: 'button', disabled: true, title: LATER }, label)),
          ),
        );
      }),
    );
  }
}
