// A flame graph (root at the bottom) or icicle (root at the top) of a FlatTree, on a canvas.
// One loop over the pre-order arrays draws it: a frame narrower than half a pixel is skipped
// with its whole subtree, so the cost follows what is visible, not the profile's size.
// Hover shows a tooltip; a click zooms into a frame (a click on the root, or `resetZoom`, goes
// back); `setSearch` highlights the matching functions and greys out the rest. A diff tree
// (with base values) is coloured by each frame's change of share: red grew, green shrank.

import { formatPercent, formatPoints, formatValue } from './format.js';
import { h, hideTooltip, showTooltip, sizeCanvas } from './dom.js';
import { share } from './tree.js';

const ROW = 18;
const FONT = '12px ui-monospace, SFMono-Regular, Menlo, Consolas, "DejaVu Sans Mono", monospace';
/** Frames narrower than this many CSS pixels are not drawn, nor is anything they call. */
const MIN_PX = 0.5;
/** Browsers refuse canvases taller than about 32 000 device pixels. */
const MAX_CANVAS_PX = 30000;

/**
 * `#rrggbb` of an HSL colour (saturation and lightness in percent): the canvas parses a colour
 * string on every frame it fills, and hex is the cheapest to parse.
 */
function hsl(hue, saturation, lightness) {
  const s = saturation / 100;
  const l = lightness / 100;
  const channel = (n) => {
    const k = (n + hue / 30) % 12;
    const value = l - s * Math.min(l, 1 - l) * Math.max(-1, Math.min(k - 3, 9 - k, 1));
    return Math.round(value * 255).toString(16).padStart(2, '0');
  };
  return `#${channel(0)}${channel(8)}${channel(4)}`;
}

const ROOT_COLOR = hsl(220, 10, 78);
const MATCH_COLOR = hsl(320, 80, 62);
const DIMMED_COLOR = hsl(0, 0, 84);
/** Diff colours from "only in base" (green) through unchanged (grey) to "only in new" (red). */
const DIFF_STEPS = 10;
const DIFF_COLORS = Array.from({ length: 2 * DIFF_STEPS + 1 }, (_, k) => {
  const t = (k - DIFF_STEPS) / DIFF_STEPS;
  return hsl(t < 0 ? 125 : 5, Math.abs(t) * 70, 82 - Math.abs(t) * 27);
});

/** FNV-1a over at most the last `limit` characters: the method end of a name differs most. */
function hash(text, limit = text.length) {
  let value = 2166136261;
  for (let k = Math.max(0, text.length - limit); k < text.length; k++) {
    value = Math.imul(value ^ text.charCodeAt(k), 16777619);
  }
  return value >>> 0;
}

const moduleHues = new Map();
const palette = new Map();

/**
 * Frames of one module share a hue, so an assembly's code reads as one band of colour; the
 * name varies the lightness. Hues and colours are remembered: a large profile has thousands of
 * frames of a few modules and shades.
 */
function functionColor({ name, module }) {
  let hue = moduleHues.get(module);
  if (hue === undefined) {
    hue = 10 + (hash(module || name) % 50); // reds through yellows, like flamegraph.pl
    moduleHues.set(module, hue);
  }
  const lightness = 58 + (hash(name, 32) % 14);
  const key = hue * 100 + lightness;
  let color = palette.get(key);
  if (color === undefined) {
    color = hsl(hue, 78, lightness);
    palette.set(key, color);
  }
  return color;
}

export class FlameGraph {
  /**
   * @param {HTMLElement} host  the element the canvas fills (it scrolls when the graph is tall)
   * @param {{layout?: 'flame'|'icicle'}} options
   */
  constructor(host, { layout = 'flame' } = {}) {
    this.host = host;
    this.canvas = h('canvas', { className: 'flame-canvas' });
    host.replaceChildren(this.canvas);
    this.tree = null;
    this.layout = layout;
    this.zoom = 0;
    this.matched = null;
    this.colors = [];
    /** Indices of the frames drawn last, in pre-order. */
    this.visible = [];
    this.width = 0;
    this.rowCount = 0;
    this.canvas.addEventListener('mousemove', (e) => this.hover(e));
    this.canvas.addEventListener('mouseleave', hideTooltip);
    this.canvas.addEventListener('click', (e) => this.click(e));
    new ResizeObserver(() => {
      if (!this.tree) return;
      if (this.host.clientWidth !== this.width) this.draw();
      // A flame graph grows up from its root: keep the root in view as the box changes.
      if (this.layout === 'flame') this.host.scrollTop = this.host.scrollHeight;
    }).observe(host);
  }

  /**
   * Shows `tree` (a FlatTree, or null for nothing), unzoomed, highlighting the functions
   * `matched` marks (see `setSearch`).
   */
  setTree(tree, matched = null) {
    this.tree = tree;
    this.zoom = 0;
    this.matched = matched;
    this.recolor();
    this.draw();
    if (this.layout === 'flame') this.host.scrollTop = this.host.scrollHeight;
  }

  setLayout(layout) {
    this.layout = layout;
    this.draw();
    this.host.scrollTop = layout === 'flame' ? this.host.scrollHeight : 0;
  }

  /** Highlights the functions `matched` marks (a Uint8Array over functions), or none. */
  setSearch(matched) {
    this.matched = matched;
    this.recolor();
    this.draw();
  }

  resetZoom() {
    this.zoom = 0;
    this.draw();
  }

  /**
   * Forgets the colours: they are computed as frames are drawn (`colorOf`), so that a profile
   * of 50 000 functions pays only for the few thousand frames wide enough to show.
   */
  recolor() {
    this.colors = [];
  }

  /** A frame's colour: per function, or per node in a diff (it depends on the node's change). */
  colorOf(i) {
    const { tree, matched } = this;
    if (i === 0) return ROOT_COLOR;
    const key = tree.baseTotal ? i : tree.fn[i];
    let color = this.colors[key];
    if (color === undefined) {
      if (matched) {
        color = matched[tree.fn[i]] ? MATCH_COLOR : DIMMED_COLOR;
      } else if (tree.baseTotal) {
        const now = share(tree.total[i], tree.total[0]);
        const before = share(tree.baseTotal[i], tree.baseTotal[0]);
        const change = now === before ? 0 : (now - before) / Math.max(now, before);
        color = DIFF_COLORS[Math.round(change * DIFF_STEPS) + DIFF_STEPS];
      } else {
        color = functionColor(tree.functions[tree.fn[i]]);
      }
      this.colors[key] = color;
    }
    return color;
  }

  functionOf(i) {
    return i === 0 ? this.tree.root : this.tree.functions[this.tree.fn[i]];
  }

  nameOf(i) {
    return this.functionOf(i).name;
  }

  /** How many rows fit in a canvas the browser will draw; deeper frames are left out. */
  rows() {
    const ratio = window.devicePixelRatio || 1;
    return Math.min(this.tree.maxDepth + 1, Math.floor(MAX_CANVAS_PX / ratio / ROW));
  }

  /** The top of a row, once `draw` has counted the rows. */
  rowTop(depth) {
    return this.layout === 'icicle' ? depth * ROW : (this.rowCount - 1 - depth) * ROW;
  }

  /** Pixels per width unit, and the width unit at the canvas's left edge. */
  scale() {
    const { tree, zoom } = this;
    return { k: this.width / tree.width[zoom], left: tree.start[zoom] };
  }

  draw() {
    const { tree } = this;
    this.width = this.host.clientWidth;
    this.visible = [];
    if (!tree || tree.width[0] <= 0) {
      sizeCanvas(this.canvas, this.width, 0);
      return;
    }
    const rows = this.rows();
    this.rowCount = rows;
    const ctx = sizeCanvas(this.canvas, this.width, rows * ROW);
    ctx.font = FONT;
    ctx.textBaseline = 'middle';
    const charWidth = ctx.measureText('M').width;
    const { k, left } = this.scale();
    const W = this.width;
    const { start, width, depth, end, n } = tree;
    // Rectangles are gathered per colour and filled as one path each: tens of thousands of
    // fillRect calls with a colour change each cost several times more.
    const paths = new Map();
    const labels = [];
    for (let i = 0; i < n; ) {
      const x = (start[i] - left) * k;
      const w = width[i] * k;
      if (w < MIN_PX || x >= W || x + w <= 0 || depth[i] >= rows) {
        i = end[i];
        continue;
      }
      // The zoomed frame's ancestors reach past both edges: draw what is on the canvas.
      const x0 = Math.max(0, x);
      const x1 = Math.min(W, x + w);
      const y = this.rowTop(depth[i]);
      const color = this.colorOf(i);
      let path = paths.get(color);
      if (!path) paths.set(color, (path = new Path2D()));
      // A pixel of gap between neighbours once frames are wide enough to spare it.
      path.rect(x0, y, x1 - x0 > 3 ? x1 - x0 - 1 : x1 - x0, ROW - 1);
      const chars = Math.floor((x1 - x0 - 6) / charWidth);
      if (chars >= 3) labels.push(i, x0, y, chars);
      this.visible.push(i);
      i++;
    }
    for (const [color, path] of paths) {
      ctx.fillStyle = color;
      ctx.fill(path);
    }
    ctx.fillStyle = '#1b1b1b';
    for (let l = 0; l < labels.length; l += 4) {
      const [i, x0, y, chars] = labels.slice(l, l + 4);
      const name = this.nameOf(i);
      ctx.fillText(name.length <= chars ? name : `${name.slice(0, chars - 1)}…`, x0 + 3, y + ROW / 2);
    }
  }

  /** The frame under canvas point (x, y), or -1: walk down from the root along the column. */
  frameAt(x, y) {
    const { tree } = this;
    if (!tree || tree.width[0] <= 0) return -1;
    const row = Math.floor(y / ROW);
    const target = this.layout === 'icicle' ? row : this.rowCount - 1 - row;
    if (target < 0 || target >= this.rowCount) return -1;
    const { k, left } = this.scale();
    const at = left + x / k;
    let i = 0;
    while (tree.depth[i] < target) {
      let child = -1;
      for (let c = i + 1; c < tree.end[i]; c = tree.end[c]) {
        if (tree.start[c] <= at && at < tree.start[c] + tree.width[c]) {
          child = c;
          break;
        }
      }
      if (child < 0) return -1;
      i = child;
    }
    return tree.width[i] * k >= MIN_PX ? i : -1;
  }

  /** The frames drawn, with their place on the canvas (CSS pixels): for tests and the console. */
  rects() {
    const { k, left } = this.scale();
    return this.visible.map((i) => {
      const x = Math.max(0, (this.tree.start[i] - left) * k);
      const w = Math.min(this.width, (this.tree.start[i] - left + this.tree.width[i]) * k) - x;
      return { name: this.nameOf(i), depth: this.tree.depth[i], x, y: this.rowTop(this.tree.depth[i]), w, h: ROW - 1, color: this.colorOf(i) };
    });
  }

  pointer(event) {
    const box = this.canvas.getBoundingClientRect();
    return this.frameAt(event.clientX - box.left, event.clientY - box.top);
  }

  hover(event) {
    const i = this.pointer(event);
    this.canvas.style.cursor = i >= 0 ? 'pointer' : 'default';
    if (i < 0) {
      hideTooltip();
      return;
    }
    const { tree } = this;
    const f = this.functionOf(i);
    const lines = [h('div', { className: 'tip-name' }, f.name)];
    if (f.module) lines.push(h('div', { className: 'muted' }, f.module));
    const value = (v, of) => `${formatValue(v, tree.unit)} (${formatPercent(share(v, of))})`;
    if (tree.baseTotal) {
      const now = share(tree.total[i], tree.total[0]);
      const before = share(tree.baseTotal[i], tree.baseTotal[0]);
      lines.push(
        h('div', {}, `new: ${value(tree.total[i], tree.total[0])}`),
        h('div', {}, `base: ${value(tree.baseTotal[i], tree.baseTotal[0])}`),
        h('div', {}, `change: ${formatPoints(now - before)} of the total`),
      );
    } else {
      lines.push(
        h('div', {}, `total: ${value(tree.total[i], tree.total[0])}`),
        h('div', {}, `self: ${value(tree.self[i], tree.total[0])}`),
      );
    }
    lines.push(h('div', { className: 'muted' }, i === this.zoom && i > 0 ? 'click: zoom out' : 'click: zoom in'));
    showTooltip(event, ...lines);
  }

  click(event) {
    const i = this.pointer(event);
    if (i < 0) return;
    // A click on the zoomed frame goes one level out, so repeated clicks climb back to the root.
    this.zoom = i === this.zoom ? Math.max(0, this.tree.parent[i]) : i;
    this.draw();
  }
}
