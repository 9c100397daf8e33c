// One range's profile: the flame graph and the top table side by side, and the sandwich of the
// function picked in the table (its callers above, its callees below).

import { getJson, MAX_NODES } from './api.js';
import { byId } from './dom.js';
import { FlameGraph } from './flamegraph.js';
import { TopTable } from './toptable.js';
import { callees, callers, flatten, matchFunctions, searchShare } from './tree.js';

export class ProfileView {
  constructor() {
    this.flame = new FlameGraph(byId('flame'));
    this.table = new TopTable(byId('top-table'), { onPick: (id) => this.openSandwich(id) });
    this.callers = new FlameGraph(byId('sandwich-callers'), { layout: 'flame' });
    this.callees = new FlameGraph(byId('sandwich-callees'), { layout: 'icicle' });
    this.tree = null;
    this.search = '';
    this.picked = -1;
    byId('sandwich-close').addEventListener('click', () => this.closeSandwich());
  }

  /** Loads and shows the profile of `params` over `range`; the caller handles errors. */
  async load(params, range, signal) {
    // The measure from asking to drawn is the flame graph's latency as a user sees it
    // (DevTools' Performance panel shows it; the browser test reads it).
    performance.mark('clrscope:profile-request');
    const json = await getJson('/api/v1/profile', { ...params, from: range.from, until: range.until, format: 'json', max_nodes: MAX_NODES }, { signal });
    const tree = flatten(json);
    const matched = matchFunctions(tree, this.search);
    this.tree = tree;
    this.flame.setTree(tree, matched);
    // Only the last load's entries are kept: a long session does not pile them up.
    performance.clearMeasures('clrscope:flamegraph');
    performance.measure('clrscope:flamegraph', 'clrscope:profile-request');
    performance.clearMarks('clrscope:profile-request');
    // The table and sandwich can wait for the next task: the flame graph is on screen first.
    await new Promise((resolve) => setTimeout(resolve));
    this.table.setTree(tree, matched);
    const picked = this.picked >= 0 ? this.functionNamed(this.pickedName) : -1;
    if (picked >= 0) this.openSandwich(picked);
    else this.closeSandwich();
    return tree;
  }

  clear() {
    this.tree = null;
    this.flame.setTree(null);
    this.table.setTree(null);
    this.closeSandwich();
  }

  /** Highlights the functions containing `text`. */
  setSearch(text) {
    this.search = text;
    if (!this.tree) return;
    const matched = matchFunctions(this.tree, text);
    this.flame.setSearch(matched);
    this.table.setSearch(matched);
  }

  /** The share of the total in functions matching the search, or null without a search. */
  matchedShare() {
    return this.tree ? searchShare(this.tree, this.search) : null;
  }

  setLayout(layout) {
    this.flame.setLayout(layout);
  }

  resetZoom() {
    this.flame.resetZoom();
    this.callers.resetZoom();
    this.callees.resetZoom();
  }

  /** The function of this name (the sandwich stays open across reloads by name), or -1. */
  functionNamed(name) {
    return this.tree.functions.findIndex((f) => f.name === name);
  }

  openSandwich(id) {
    const { name } = this.tree.functions[id];
    this.picked = id;
    this.pickedName = name;
    this.table.setPicked(id);
    byId('sandwich').hidden = false;
    byId('sandwich-name').textContent = name;
    this.callers.setTree(flatten(callers(this.tree, id)));
    this.callees.setTree(flatten(callees(this.tree, id)));
    byId('sandwich').scrollIntoView({ block: 'nearest' });
  }

  closeSandwich() {
    this.picked = -1;
    this.table.setPicked(-1);
    byId('sandwich').hidden = true;
  }
}
