// The top table: one row per function with its self and total value, sortable by either (or
// by name), narrowed by the search; a click on a row picks the function (for the sandwich).

import { h } from './dom.js';
import { formatPercent, formatValue } from './format.js';
import { functionTotals, share } from './tree.js';

/** Rows shown at most: the table is for the hottest functions; the search finds the rest. */
const MAX_ROWS = 300;

const COLUMNS = [
  { key: 'name', label: 'Function' },
  { key: 'self', label: 'Self' },
  { key: 'total', label: 'Total' },
];

export class TopTable {
  /** @param {{onPick: (functionId: number) => void}} options */
  constructor(host, { onPick }) {
    this.onPick = onPick;
    this.sortKey = 'self';
    this.tree = null;
    this.totals = null;
    this.matched = null;
    this.picked = -1;
    this.head = h('tr', {});
    this.body = h('tbody', {});
    this.footer = h('p', { className: 'muted table-note' });
    host.replaceChildren(h('table', { className: 'top-table' }, h('thead', {}, this.head), this.body), this.footer);
    this.renderHead();
  }

  /** Lists the functions of `tree` (or none), narrowed to those `matched` marks, if given. */
  setTree(tree, matched = null) {
    this.tree = tree;
    this.totals = tree ? functionTotals(tree) : null;
    this.matched = matched;
    this.picked = -1;
    this.render();
  }

  setSearch(matched) {
    this.matched = matched;
    this.render();
  }

  setPicked(functionId) {
    this.picked = functionId;
    this.render();
  }

  renderHead() {
    this.head.replaceChildren(
      ...COLUMNS.map(({ key, label }) =>
        h(
          'th',
          {
            className: key === 'name' ? '' : 'num',
            ariaSort: key === this.sortKey ? (key === 'name' ? 'ascending' : 'descending') : 'none',
            onclick: () => {
              this.sortKey = key;
              this.renderHead();
              this.render();
            },
          },
          label + (key === this.sortKey ? (key === 'name' ? ' ▲' : ' ▼') : ''),
        ),
      ),
    );
  }

  render() {
    const { tree, totals, matched } = this;
    if (!tree) {
      this.body.replaceChildren();
      this.footer.textContent = '';
      return;
    }
    const ids = [];
    for (let id = 0; id < tree.functions.length; id++) {
      if (!matched || matched[id]) ids.push(id);
    }
    const name = (id) => tree.functions[id].name;
    const byKey = {
      // Code-point order: localeCompare is many times slower over tens of thousands of names.
      name: (a, b) => (name(a) < name(b) ? -1 : name(a) > name(b) ? 1 : 0),
      self: (a, b) => totals.self[b] - totals.self[a] || totals.total[b] - totals.total[a],
      total: (a, b) => totals.total[b] - totals.total[a] || totals.self[b] - totals.self[a],
    };
    ids.sort(byKey[this.sortKey]);
    const all = tree.total[0];
    const cell = (value) =>
      h('td', { className: 'num' }, formatValue(value, tree.unit), h('span', { className: 'muted' }, ` ${formatPercent(share(value, all))}`));
    this.body.replaceChildren(
      ...ids.slice(0, MAX_ROWS).map((id) =>
        h(
          'tr',
          {
            className: id === this.picked ? 'picked' : '',
            title: `${tree.functions[id].module}\nclick: callers and callees (sandwich)`,
            onclick: () => this.onPick(id),
          },
          h('td', { className: 'fn' }, name(id)),
          cell(totals.self[id]),
          cell(totals.total[id]),
        ),
      ),
    );
    const hidden = ids.length - MAX_ROWS;
    this.footer.textContent = hidden > 0 ? `${hidden} more functions: search to narrow the list.` : '';
  }
}
