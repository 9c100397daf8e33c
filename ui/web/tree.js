// Profile trees. The API's JSON tree ({name, module, self, total, children}, plus base_self and
// base_total in a diff) is flattened into typed arrays in pre-order, so that drawing,
// hit-testing, searching and aggregating 50 000 nodes are loops over numbers, not walks over
// objects. Node 0 is the root ("total"); node i's subtree is i .. end[i]-1.

/**
 * @typedef {object} FlatTree
 * @property {number} n                nodes
 * @property {{name: string, module: string}[]} functions  distinct (name, module) pairs
 * @property {{name: string, module: string}} root  "total", or the function a sandwich is of
 * @property {Int32Array} fn           function of each node (-1 for the root)
 * @property {Int32Array} depth
 * @property {Int32Array} parent       (-1 for the root)
 * @property {Int32Array} end          one past the node's last descendant
 * @property {Float64Array} self
 * @property {Float64Array} total
 * @property {Float64Array|null} baseSelf   diff trees only
 * @property {Float64Array|null} baseTotal  diff trees only
 * @property {Float64Array} start      left edge, in width units
 * @property {Float64Array} width      total, or in a diff the sum of both sides' shares
 * @property {number} maxDepth
 * @property {string} unit
 */

/** Flattens the API's `{unit, total, [base_total], root}`. */
export function flatten(json) {
  const diff = json.base_total !== undefined;
  const n = countNodes(json.root);
  const tree = {
    n,
    functions: [],
    root: { name: json.root.name, module: json.root.module ?? '' },
    fn: new Int32Array(n),
    depth: new Int32Array(n),
    parent: new Int32Array(n),
    end: new Int32Array(n),
    self: new Float64Array(n),
    total: new Float64Array(n),
    baseSelf: diff ? new Float64Array(n) : null,
    baseTotal: diff ? new Float64Array(n) : null,
    start: new Float64Array(n),
    width: new Float64Array(n),
    maxDepth: 0,
    unit: json.unit,
  };
  const newTotal = json.root.total;
  const baseTotal = diff ? json.root.base_total : 0;
  // Function ids by module, then name: no key strings to build per node.
  const functionIds = new Map();
  // Where the next child of each node starts: children are laid left to right in API order.
  const cursor = new Float64Array(n);
  // The walk's stack as parallel arrays: no small array per node for the collector to sweep.
  const nodes = [json.root];
  const parents = [-1];
  for (let i = 0; nodes.length; i++) {
    const node = nodes.pop();
    const parent = parents.pop();
    const depth = parent < 0 ? 0 : tree.depth[parent] + 1;
    tree.parent[i] = parent;
    tree.depth[i] = depth;
    tree.self[i] = node.self;
    tree.total[i] = node.total;
    if (diff) {
      tree.baseSelf[i] = node.base_self;
      tree.baseTotal[i] = node.base_total;
      // Both sides as shares of their own total, so that ranges of different lengths compare,
      // and a function that vanished still has room to show in green.
      tree.width[i] = share(node.total, newTotal) + share(node.base_total, baseTotal);
    } else {
      tree.width[i] = node.total;
    }
    if (parent < 0) {
      tree.fn[i] = -1;
    } else {
      const module = node.module ?? '';
      let byName = functionIds.get(module);
      if (!byName) functionIds.set(module, (byName = new Map()));
      let id = byName.get(node.name);
      if (id === undefined) {
        id = tree.functions.length;
        byName.set(node.name, id);
        tree.functions.push({ name: node.name, module });
      }
      tree.fn[i] = id;
      tree.start[i] = cursor[parent];
      cursor[parent] += tree.width[i];
    }
    cursor[i] = tree.start[i];
    if (depth > tree.maxDepth) tree.maxDepth = depth;
    for (let c = node.children.length - 1; c >= 0; c--) {
      nodes.push(node.children[c]);
      parents.push(i);
    }
  }
  // In pre-order a node's subtree ends where its last descendant's does.
  for (let k = 0; k < n; k++) tree.end[k] = k + 1;
  for (let k = n - 1; k > 0; k--) {
    const p = tree.parent[k];
    if (tree.end[k] > tree.end[p]) tree.end[p] = tree.end[k];
  }
  return tree;
}

function countNodes(root) {
  let count = 0;
  const stack = [root];
  while (stack.length) {
    const { children } = stack.pop();
    count++;
    for (let c = 0; c < children.length; c++) stack.push(children[c]);
  }
  return count;
}

export function share(value, total) {
  return total > 0 ? value / total : 0;
}

/**
 * Calls `visit(i)` for every node that is not inside another node of the same function, so
 * that a recursive function's time counts once, at its outermost call.
 */
function forOutermost(tree, accept, visit) {
  const onPath = new Int32Array(tree.functions.length);
  const open = [];
  for (let i = 1; i < tree.n; i++) {
    while (open.length && tree.end[open[open.length - 1]] <= i) onPath[tree.fn[open.pop()]]--;
    const f = tree.fn[i];
    if (accept(f) && onPath[f] === 0) visit(i);
    onPath[f]++;
    open.push(i);
  }
}

/** Self and total per function (total counted once per stack, however deep it recurses). */
export function functionTotals(tree) {
  const count = tree.functions.length;
  const totals = { self: new Float64Array(count), total: new Float64Array(count) };
  for (let i = 1; i < tree.n; i++) totals.self[tree.fn[i]] += tree.self[i];
  forOutermost(tree, () => true, (i) => {
    totals.total[tree.fn[i]] += tree.total[i];
  });
  return totals;
}

/** Which functions' names contain `text`, ignoring case; null for an empty search. */
export function matchFunctions(tree, text) {
  const needle = text.trim().toLowerCase();
  if (!needle) return null;
  return Uint8Array.from(tree.functions, (f) => (f.name.toLowerCase().includes(needle) ? 1 : 0));
}

/**
 * The share of the total in samples passing through a function whose name contains `text`
 * (each sample counted once), or null for an empty search.
 */
export function searchShare(tree, text) {
  const matched = matchFunctions(tree, text);
  if (!matched) return null;
  let sum = 0;
  for (let i = 1; i < tree.n; ) {
    if (matched[tree.fn[i]]) {
      sum += tree.total[i];
      i = tree.end[i];
    } else {
      i++;
    }
  }
  return share(sum, tree.total[0]);
}

/** A tree node under construction: children merged by function. */
function mergeNode(tree, f) {
  const { name, module } = tree.functions[f];
  return { name, module, self: 0, total: 0, children: [], byFunction: new Map() };
}

function mergeChild(tree, node, f) {
  let child = node.byFunction.get(f);
  if (!child) {
    child = mergeNode(tree, f);
    node.byFunction.set(f, child);
    node.children.push(child);
  }
  return child;
}

/** Children by total, largest first, as the API sends them. */
function sortChildren(root) {
  const stack = [root];
  while (stack.length) {
    const node = stack.pop();
    node.children.sort((a, b) => b.total - a.total || (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
    stack.push(...node.children);
  }
}

/** What `f` calls: every outermost call of `f` merged into one tree rooted at `f`. */
export function callees(tree, f) {
  const root = mergeNode(tree, f);
  const merged = new Array(tree.n);
  forOutermost(tree, (g) => g === f, (i) => {
    merged[i] = root;
    root.self += tree.self[i];
    root.total += tree.total[i];
    for (let j = i + 1; j < tree.end[i]; j++) {
      const child = mergeChild(tree, merged[tree.parent[j]], tree.fn[j]);
      child.self += tree.self[j];
      child.total += tree.total[j];
      merged[j] = child;
    }
  });
  sortChildren(root);
  return { unit: tree.unit, total: root.total, root };
}

/**
 * Who calls `f`: the stacks through `f` turned upside down, `f` at the root and its callers as
 * children. A node's self is the value of the stacks that start at it.
 */
export function callers(tree, f) {
  const root = mergeNode(tree, f);
  forOutermost(tree, (g) => g === f, (i) => {
    const value = tree.total[i];
    root.total += value;
    let node = root;
    for (let p = tree.parent[i]; p > 0; p = tree.parent[p]) {
      node = mergeChild(tree, node, tree.fn[p]);
      node.total += value;
    }
    node.self += value;
  });
  sortChildren(root);
  return { unit: tree.unit, total: root.total, root };
}
