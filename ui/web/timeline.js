// The timeline: the selected series' total per step over the window, as bars, with the ranges
// the flame graphs show laid over it and the events (processes attaching and detaching; rule
// firings when the agent reports them) as markers. Dragging selects a range; a click without
// dragging clears it.

import { h, hideTooltip, showTooltip, sizeCanvas } from './dom.js';
import { formatClock, formatRange, formatValue } from './format.js';

const HEIGHT = 120;
const MARGIN = { left: 64, right: 8, top: 8, bottom: 20 };
/** The steps a timeline uses, so that bars line up with clock times people read. */
const STEPS_MS = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 43200, 86400].map((s) => s * 1000);
/** Bars per window we aim for at most: enough to see a spike, few enough to read. */
const MAX_BARS = 240;
const RANGE_COLORS = {
  sel: ['rgba(40, 110, 220, 0.18)', 'rgb(40, 110, 220)'],
  base: ['rgba(40, 110, 220, 0.18)', 'rgb(40, 110, 220)'],
  new: ['rgba(230, 120, 20, 0.2)', 'rgb(230, 120, 20)'],
};
const EVENT_COLORS = {
  attached: 'rgb(30, 150, 70)',
  detached: 'rgb(200, 50, 40)',
  collection_rule_triggered: 'rgb(230, 120, 20)',
  collection_rule_throttled: 'rgb(150, 150, 150)',
};

/**
 * The step for a window of `spanMs`: the smallest of STEPS_MS giving at most MAX_BARS bars and
 * no shorter than `minStepMs`. The agent samples 1 s out of every period (10 s by default), so a
 * step shorter than the period would show the duty cycle as spikes rather than the load.
 */
export function stepFor(spanMs, minStepMs) {
  const least = Math.max(minStepMs, spanMs / MAX_BARS);
  return STEPS_MS.find((s) => s >= least) ?? STEPS_MS[STEPS_MS.length - 1];
}

/** What an event marker says. */
function describeEvent(event) {
  const who = `${event.name ?? event.service_name ?? 'process'} (pid ${event.pid})`;
  const rule = event.rule ? ` (rule ${event.rule})` : '';
  return `${formatClock(event.unix_ms)} ${who} ${event.kind.replaceAll('_', ' ')}${rule}`;
}

export class Timeline {
  /**
   * @param {{onSelect: (kind: string, range: {from: number, until: number} | null) => void}} options
   *   called with the kind of range a drag sets (see `dragKind`) and the range, null on a click
   */
  constructor(canvas, { onSelect }) {
    this.canvas = canvas;
    this.onSelect = onSelect;
    /** What a drag selects: 'sel' (the flame graph's range), or 'base' / 'new' to compare. */
    this.dragKind = 'sel';
    this.data = null;
    this.events = [];
    this.ranges = [];
    this.drag = null;
    /** The pending animation frame of `draw`, or 0. */
    this.frame = 0;
    canvas.addEventListener('mousedown', (e) => this.startDrag(e));
    window.addEventListener('mousemove', (e) => this.moveDrag(e));
    window.addEventListener('mouseup', (e) => this.endDrag(e));
    canvas.addEventListener('mousemove', (e) => this.hover(e));
    canvas.addEventListener('mouseleave', hideTooltip);
    new ResizeObserver(() => this.draw()).observe(canvas.parentElement);
  }

  /** `{from, until, step_ms, unit, points: [[unix_ms, value], …]}`, or null while loading. */
  setData(data) {
    this.data = data;
    this.draw();
  }

  /** Markers: `[{unix_ms, kind, …}]` as `/api/v1/events` answers. */
  setEvents(events) {
    this.events = events;
    this.draw();
  }

  /** The ranges to lay over the bars: `[{kind: 'sel'|'base'|'new', from, until}]`. */
  setRanges(ranges) {
    this.ranges = ranges;
    this.draw();
  }

  plotWidth() {
    return this.canvas.parentElement.clientWidth - MARGIN.left - MARGIN.right;
  }

  xOf(unixMs) {
    const { from, until } = this.data;
    return MARGIN.left + ((unixMs - from) / (until - from)) * this.plotWidth();
  }

  timeAt(x) {
    const { from, until } = this.data;
    const fraction = Math.min(1, Math.max(0, (x - MARGIN.left) / this.plotWidth()));
    return Math.round(from + fraction * (until - from));
  }

  /**
   * Draws at the next frame: data, events and ranges often change together (and while a large
   * flame graph is being built), so they are drawn once.
   */
  draw() {
    if (this.frame) return;
    this.frame = requestAnimationFrame(() => {
      this.frame = 0;
      this.paint();
    });
  }

  paint() {
    const width = this.canvas.parentElement.clientWidth;
    const ctx = sizeCanvas(this.canvas, width, HEIGHT);
    const { data } = this;
    if (!data) return;
    const plotHeight = HEIGHT - MARGIN.top - MARGIN.bottom;
    const bottom = MARGIN.top + plotHeight;
    const max = Math.max(0, ...data.points.map(([, v]) => v));
    ctx.font = '11px system-ui, sans-serif';
    ctx.fillStyle = '#666';
    ctx.textBaseline = 'middle';
    ctx.textAlign = 'right';
    ctx.fillText(formatValue(max, data.unit), MARGIN.left - 6, MARGIN.top + 4);
    ctx.fillText('0', MARGIN.left - 6, bottom);
    ctx.strokeStyle = '#ccc';
    ctx.beginPath();
    ctx.moveTo(MARGIN.left, bottom + 0.5);
    ctx.lineTo(width - MARGIN.right, bottom + 0.5);
    ctx.stroke();

    ctx.fillStyle = 'rgb(235, 120, 50)';
    for (const [t, v] of data.points) {
      if (v <= 0) continue;
      const x0 = this.xOf(t);
      const x1 = this.xOf(Math.min(t + data.step_ms, data.until));
      const barHeight = (v / max) * plotHeight;
      ctx.fillRect(x0, bottom - barHeight, Math.max(1, x1 - x0 - 1), barHeight);
    }

    // Time labels, about every 100 px, at step boundaries.
    ctx.fillStyle = '#666';
    ctx.textAlign = 'center';
    ctx.textBaseline = 'top';
    const span = data.until - data.from;
    const labelStep = stepFor(span, (span * 100) / this.plotWidth());
    const short = labelStep >= 60000;
    for (let t = Math.ceil(data.from / labelStep) * labelStep; t <= data.until; t += labelStep) {
      ctx.fillText(formatClock(t, short), this.xOf(t), bottom + 4);
    }

    for (const event of this.events) {
      const x = Math.round(this.xOf(event.unix_ms)) + 0.5;
      ctx.strokeStyle = EVENT_COLORS[event.kind] ?? 'rgb(130, 60, 200)';
      ctx.setLineDash([3, 3]);
      ctx.beginPath();
      ctx.moveTo(x, MARGIN.top);
      ctx.lineTo(x, bottom);
      ctx.stroke();
      ctx.setLineDash([]);
      ctx.fillStyle = ctx.strokeStyle;
      ctx.beginPath();
      ctx.moveTo(x - 4, MARGIN.top);
      ctx.lineTo(x + 4, MARGIN.top);
      ctx.lineTo(x, MARGIN.top + 6);
      ctx.fill();
    }

    const ranges = this.drag ? [this.drag.range] : this.ranges;
    for (const range of ranges) {
      const [fill, edge] = RANGE_COLORS[range.kind];
      const x0 = this.xOf(range.from);
      const x1 = this.xOf(range.until);
      ctx.fillStyle = fill;
      ctx.fillRect(x0, MARGIN.top, x1 - x0, plotHeight);
      ctx.fillStyle = edge;
      ctx.fillRect(x0, MARGIN.top, 1, plotHeight);
      ctx.fillRect(x1 - 1, MARGIN.top, 1, plotHeight);
    }
  }

  localX(event) {
    return event.clientX - this.canvas.getBoundingClientRect().left;
  }

  startDrag(event) {
    if (!this.data || event.button !== 0) return;
    event.preventDefault();
    const x = this.localX(event);
    const at = this.timeAt(x);
    this.drag = { x, moved: false, range: { kind: this.dragKind, from: at, until: at } };
  }

  moveDrag(event) {
    if (!this.drag) return;
    const x = this.localX(event);
    const [a, b] = [this.timeAt(this.drag.x), this.timeAt(x)].sort((p, q) => p - q);
    this.drag.range = { kind: this.drag.range.kind, from: a, until: b };
    this.drag.moved = Math.abs(x - this.drag.x) >= 4;
    this.draw();
  }

  endDrag(event) {
    if (!this.drag) return;
    this.moveDrag(event);
    const { range, moved } = this.drag;
    this.drag = null;
    this.draw();
    this.onSelect(range.kind, moved && range.until > range.from ? { from: range.from, until: range.until } : null);
  }

  hover(event) {
    if (!this.data || this.drag) return;
    const x = this.localX(event);
    const near = this.events.filter((e) => Math.abs(this.xOf(e.unix_ms) - x) <= 4);
    if (near.length) {
      showTooltip(event, ...near.map((e) => h('div', {}, describeEvent(e))));
      return;
    }
    const t = this.timeAt(x);
    const point = this.data.points.find(([start]) => start <= t && t < start + this.data.step_ms);
    if (!point || x < MARGIN.left) {
      hideTooltip();
      return;
    }
    const range = { from: point[0], until: Math.min(point[0] + this.data.step_ms, this.data.until) };
    showTooltip(event, h('div', {}, formatRange(range)), h('div', {}, formatValue(point[1], this.data.unit)), h('div', { className: 'muted' }, 'drag to select a range'));
  }
}
