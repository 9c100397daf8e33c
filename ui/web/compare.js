// Two ranges compared: the base and the new range's flame graphs side by side, and below them
// the diff flame graph, each frame as wide as its share of both ranges together and coloured
// by how its share changed.

import { getJson, MAX_NODES } from './api.js';
import { byId } from './dom.js';
import { FlameGraph } from './flamegraph.js';
import { formatRange } from './format.js';
import { flatten, matchFunctions, searchShare } from './tree.js';

export class CompareView {
  constructor() {
    this.graphs = {
      base: new FlameGraph(byId('flame-base')),
      new: new FlameGraph(byId('flame-new')),
      diff: new FlameGraph(byId('flame-diff')),
    };
    this.diff = null;
    this.search = '';
  }

  /** Loads the three trees of `params` for ranges `base` and `next`; the caller handles errors. */
  async load(params, base, next, signal) {
    const profile = (range) => getJson('/api/v1/profile', { ...params, from: range.from, until: range.until, format: 'json', max_nodes: MAX_NODES }, { signal });
    const [baseJson, newJson, diffJson] = await Promise.all([
      profile(base),
      profile(next),
      getJson('/api/v1/diff', { ...params, base_from: base.from, base_until: base.until, from: next.from, until: next.until, format: 'json' }, { signal }),
    ]);
    byId('base-range').textContent = formatRange(base);
    byId('new-range').textContent = formatRange(next);
    const show = (graph, json) => {
      const tree = flatten(json);
      graph.setTree(tree, matchFunctions(tree, this.search));
      return tree;
    };
    show(this.graphs.base, baseJson);
    show(this.graphs.new, newJson);
    this.diff = show(this.graphs.diff, diffJson);
    return this.diff;
  }

  clear() {
    this.diff = null;
    for (const graph of Object.values(this.graphs)) graph.setTree(null);
  }

  /** Highlights the functions containing `text` in all three graphs. */
  setSearch(text) {
    this.search = text;
    for (const graph of Object.values(this.graphs)) {
      if (graph.tree) graph.setSearch(matchFunctions(graph.tree, text));
    }
  }

  /** The share of the new range's total in functions matching the search, or null. */
  matchedShare() {
    return this.diff ? searchShare(this.diff, this.search) : null;
  }

  setLayout(layout) {
    for (const graph of Object.values(this.graphs)) graph.setLayout(layout);
  }

  resetZoom() {
    for (const graph of Object.values(this.graphs)) graph.resetZoom();
  }
}
