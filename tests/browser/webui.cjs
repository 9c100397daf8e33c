// The web UI in a real browser (Debian Chromium driven by npm playwright-core), against a
// running `clrscope agent` that profiles CpuHot --split 60,30,10. Run by tests/webui.rs:
//
//   NODE_PATH=.testbed/node/node_modules node tests/browser/webui.cjs '{"phase": "acceptance",
//     "url": "http://127.0.0.1:PORT", "token": "JWT", "from": UNIX_MS, "until": UNIX_MS,
//     "artifacts": "target/webui", "chromium": "/usr/bin/chromium"}'
//
// The agent has authentication on; `token` is its key's bearer token (from `clrscope
// generatekey`). `phase` is `acceptance` (the token prompt, then the page against the agent's
// data, every API call checked to carry the token) or `benchmark` (50 000-node flame graphs;
// run once CpuHot no longer takes a core of the two).
// `from`/`until` bound the agent's data, for a custom window the timeline fills. Screenshots
// and the downloaded pprof go to `artifacts`. The last stdout line is a JSON report (checks
// passed, benchmark timings), also written to `artifacts/PHASE.json`; any failed check throws,
// prints the reason and exits 1.
'use strict';

const fs = require('fs');
const http = require('http');
const path = require('path');
const { chromium } = require('playwright-core');

const config = JSON.parse(process.argv[2]);
const TIMEOUT_MS = 90000;
const MATCH_RGB = [236, 81, 184]; // flamegraph.js MATCH_COLOR, hsl(320, 80%, 62%)
const report = { checks: [], benchmark: {} };
/** What the pages logged or failed to load: any entry fails the run. */
const errors = [];

function check(condition, what, detail = '') {
  if (!condition) throw new Error(`${what}${detail ? `: ${detail}` : ''}`);
  report.checks.push(what);
}

async function shot(page, name) {
  await page.screenshot({ path: path.join(config.artifacts, `${name}.png`), fullPage: true });
}

/** Waits until `condition` holds in the page; a timeout names `what` and the page's status. */
async function waitFor(page, condition, what) {
  await page.waitForFunction(condition, null, { timeout: 20000 }).catch(async (error) => {
    const status = await page.textContent('#status').catch(() => '?');
    throw new Error(`waiting for ${what}: ${error.message.split('\n')[0]} (page status: "${status}")\n${errors.join('\n')}`);
  });
}

/** Waits until the page's status line is empty: no load running, no error shown. */
async function settled(page) {
  await waitFor(page, () => document.getElementById('status').textContent === '', 'the page to settle');
}

/** Drags across the timeline's plot from `a` to `b`, fractions of its width. */
async function dragTimeline(page, a, b) {
  const box = await page.locator('#timeline').boundingBox();
  const left = box.x + 64; // timeline.js MARGIN.left
  const width = box.width - 64 - 8;
  const y = box.y + box.height / 2;
  await page.mouse.move(left + a * width, y);
  await page.mouse.down();
  await page.mouse.move(left + ((a + b) / 2) * width, y, { steps: 4 });
  await page.mouse.move(left + b * width, y, { steps: 4 });
  await page.mouse.up();
}

/** The page over the custom window of the agent's data; a new `load` is a new document. */
function pageUrl(extra = '', load = 0) {
  return `${config.url}/?load=${load}#window=custom&from=${config.from}&until=${config.until}${extra}`;
}

async function newPage(context) {
  const page = await context.newPage();
  page.on('pageerror', (e) => errors.push(`page error: ${e.message}`));
  page.on('requestfailed', (r) => {
    // Loads the page aborts itself (a newer query replaces an older one) are not failures.
    if (r.failure()?.errorText !== 'net::ERR_ABORTED') errors.push(`request failed: ${r.url()}: ${r.failure()?.errorText}`);
  });
  page.on('console', (m) => {
    // A 401 is logged by the browser itself as a failed resource: that one is expected.
    if (m.type() === 'error' && !m.text().includes('401')) errors.push(`console: ${m.text()}`);
  });
  return page;
}

/**
 * The page against an agent with authentication on: it asks for the token and shows nothing
 * without it, refuses a wrong one, and once given the right one sends it with every API call
 * (downloads included) for the rest of the browser session.
 */
async function acceptance(context) {
  const page = await newPage(context);
  const apiCalls = [];
  page.on('request', (r) => {
    if (new URL(r.url()).pathname.startsWith('/api/')) apiCalls.push({ url: r.url(), auth: r.headers().authorization ?? '' });
  });
  await page.goto(pageUrl());
  await page.waitForSelector('#token-dialog[open]');
  let shown = await page.evaluate(() => ({ tree: clrscope.single.tree, timeline: clrscope.timeline.data }));
  check(shown.tree === null && shown.timeline === null && apiCalls.length > 0 && apiCalls.every((c) => c.auth === ''), 'with auth on and no token the page asks for one and shows no data', JSON.stringify(apiCalls.slice(0, 3)));
  await shot(page, '00-token-prompt');

  await page.fill('#token-input', `${config.token.slice(0, -4)}AAAA`);
  await page.click('#token-form button[type="submit"]');
  await waitFor(page, () => document.getElementById('token-dialog').open && /signature/.test(document.getElementById('token-reason').textContent), 'the refusal of a wrong token');
  shown = await page.evaluate(() => ({ tree: clrscope.single.tree, timeline: clrscope.timeline.data }));
  check(shown.tree === null && shown.timeline === null, 'a wrong token is refused, saying why, and shows no data', await page.textContent('#token-reason'));

  const withToken = apiCalls.length;
  await page.fill('#token-input', config.token);
  await page.click('#token-form button[type="submit"]');
  await waitFor(page, () => window.clrscope?.timeline.data?.points.some(([, v]) => v > 0), 'timeline data after the token');
  await page.reload();
  await waitFor(page, () => window.clrscope?.timeline.data?.points.some(([, v]) => v > 0), 'timeline data after a reload');
  check(!(await page.evaluate(() => document.getElementById('token-dialog').open)), 'the token is asked once per browser session (a reload does not ask again)');
  await settled(page);
  const timelineTotal = await page.evaluate(() => clrscope.timeline.data.points.reduce((s, [, v]) => s + v, 0));
  check(timelineTotal > 0, 'the timeline has data', `${timelineTotal} ns`);
  const events = await page.evaluate(() => clrscope.timeline.events);
  check(events.some((e) => e.kind === 'attached' && e.name === 'CpuHot'), 'the timeline marks CpuHot attaching', JSON.stringify(events));
  await shot(page, '01-loaded');

  await dragTimeline(page, 0.03, 0.97);
  await settled(page);
  const sel = await page.evaluate(() => clrscope.state.sel);
  check(sel && sel.until > sel.from, 'a drag on the timeline selects a range', JSON.stringify(sel));
  check(page.url().includes('sel='), 'the selected range is in the URL');

  // Below the threads' entry frames (how deep depends on the compiler's lambdas and the runtime's
  // thread start), the spin methods: SpinAlpha, designed 60 %, is the widest of them.
  const frames = await page.evaluate(() => clrscope.single.flame.rects());
  const spins = frames.filter((f) => f.name.startsWith('CpuHot.Program.Spin')).sort((a, b) => b.w - a.w);
  check(spins[0]?.name.startsWith('CpuHot.Program.SpinAlpha'), 'the widest spin method is SpinAlpha', spins.slice(0, 3).map((f) => `${f.name}@${f.depth}`).join(', '));
  const alpha = spins[0];
  const canvas = await page.locator('#flame canvas').boundingBox();
  await page.mouse.move(canvas.x + alpha.x + alpha.w / 2, canvas.y + alpha.y + alpha.h / 2);
  const tip = await page.textContent('#tooltip');
  check(/SpinAlpha/.test(tip) && /total: .*%/.test(tip) && /self: .*%/.test(tip), 'hovering a frame shows its self and total with shares', tip);
  await shot(page, '02-selected-hover');

  await page.mouse.click(canvas.x + alpha.x + alpha.w / 2, canvas.y + alpha.y + alpha.h / 2);
  const zoomed = await page.evaluate(() => clrscope.single.flame.rects().find((f) => f.name.startsWith('CpuHot.Program.SpinAlpha')));
  check(zoomed && zoomed.w > canvas.width - 2, 'a click zooms the frame to the full width', JSON.stringify(zoomed));
  await page.click('#reset-zoom');

  await page.fill('#search', 'SpinAlpha');
  await waitFor(page, () => /matched: /.test(document.getElementById('search-result').textContent), 'the search result');
  const matched = await page.textContent('#search-result');
  const percent = Number(/matched: ([\d.]+)%/.exec(matched)[1]);
  check(percent > 40 && percent < 80, 'the search shows the matched share (designed 60%)', matched);
  const pixel = await page.evaluate(({ x, y }) => {
    const c = document.querySelector('#flame canvas');
    const ratio = c.width / c.getBoundingClientRect().width;
    return Array.from(c.getContext('2d').getImageData(Math.round(x * ratio), Math.round(y * ratio), 1, 1).data.slice(0, 3));
    // The frame's right end, top row: beside its label's text.
  }, { x: alpha.x + alpha.w - 2, y: alpha.y + 1 });
  check(pixel.every((v, k) => Math.abs(v - MATCH_RGB[k]) <= 3), 'the search highlights SpinAlpha on the canvas', `pixel ${pixel}`);
  const rows = await page.$$eval('#top-table tbody td.fn', (cells) => cells.map((c) => c.textContent));
  check(rows.length >= 1 && rows.every((r) => r.includes('SpinAlpha')), 'the search narrows the top table', rows.join(' | '));
  await shot(page, '03-search');

  await page.click('#top-table tbody tr');
  await page.waitForSelector('#sandwich:not([hidden])');
  const sandwich = await page.evaluate(() => ({
    callers: clrscope.single.callers.rects().map((f) => f.name),
    callees: clrscope.single.callees.rects().map((f) => f.name),
  }));
  check(sandwich.callers[0].startsWith('CpuHot.Program.SpinAlpha') && sandwich.callers.some((n) => n.startsWith('CpuHot.Program.<')) /* the thread's entry lambda, as the compiler names it */, 'the sandwich shows SpinAlpha with its caller', sandwich.callers.join(', '));
  await shot(page, '04-sandwich');
  await page.click('#sandwich-close');
  await page.fill('#search', '');

  await page.click('[data-layout="icicle"]');
  const icicleRoot = await page.evaluate(() => clrscope.single.flame.rects().find((f) => f.depth === 0));
  check(icicleRoot.y === 0, 'icicle mode puts the root on top');
  await page.click('[data-layout="flame"]');

  await filters(page);

  await page.click('#mode-compare');
  await page.click('[data-pick="base"]');
  await dragTimeline(page, 0.03, 0.5);
  await page.click('[data-pick="new"]');
  await dragTimeline(page, 0.5, 0.97);
  await settled(page);
  const diff = await page.evaluate(() => ({
    base: clrscope.compare.diff.baseTotal[0],
    now: clrscope.compare.diff.total[0],
    frames: clrscope.compare.graphs.diff.rects().length,
    sides: [clrscope.compare.graphs.base.rects().length, clrscope.compare.graphs.new.rects().length],
    state: [clrscope.state.base, clrscope.state.new],
  }));
  check(diff.base > 0 && diff.now > 0 && diff.frames > 3 && diff.sides.every((n) => n > 3), 'compare mode renders both ranges and their diff', JSON.stringify(diff));
  const diffExport = await page.getAttribute('.export-link[data-format="pprof"]', 'href');
  check(diffExport.startsWith('/api/v1/diff?') && diffExport.includes('base_from='), 'in compare mode the export is the diff', diffExport);
  await shot(page, '06-compare');

  await page.click('#mode-single');
  await settled(page);
  const [download] = await Promise.all([page.waitForEvent('download'), page.click('.export-link[data-format="pprof"]')]);
  const pprof = path.join(config.artifacts, 'cpu.pb.gz');
  await download.saveAs(pprof);
  report.pprof = pprof;
  check(fs.statSync(pprof).size > 0, 'export downloads a pprof', download.suggestedFilename());

  await page.click('#nav-processes');
  const row = page.locator('#process-rows tr').first();
  await row.waitFor();
  await row.locator('button', { hasText: 'Boost 5 min' }).click();
  await waitFor(page, () => /boosted to 100%/.test(document.getElementById('process-rows').textContent), 'the boost');
  check(true, 'the process list boosts a sampler');
  await shot(page, '07-processes');
  await row.locator('button', { hasText: 'End boost' }).click();
  await waitFor(page, () => !/boosted/.test(document.getElementById('process-rows').textContent), 'the boost to end');
  const after = apiCalls.slice(withToken);
  const bare = after.filter((c) => c.auth !== `Bearer ${config.token}`);
  check(after.length > 20 && bare.length === 0, 'with the token every API call sends it, the pprof download included', `${after.length} calls, without it: ${bare.map((c) => c.url).join(', ')}`);
  check(after.some((c) => c.url.includes('format=pprof')), 'the download went through the API with the token');
  const stored = await page.evaluate(() => sessionStorage.getItem('clrscope.token'));
  check(stored === config.token, 'the token is kept in sessionStorage');
  await page.close();
}

/** The filter bar: each control narrows the selector or the sample filters of every query. */
async function filters(page) {
  const profileQueries = [];
  const record = (request) => {
    if (request.url().includes('/api/v1/profile?')) profileQueries.push(decodeURIComponent(request.url()));
  };
  page.on('request', record);
  const last = () => profileQueries[profileQueries.length - 1] ?? '';
  const pid = await page.$eval('#f-pid', (select) => [...select.options].map((o) => o.value).find((v) => v));
  await page.selectOption('#f-pid', pid);
  await settled(page);
  check(last().includes(`process_id="${pid}"`), 'the process filter selects by process_id', last());

  await page.selectOption('#f-label-name', 'host_name');
  await waitFor(page, () => document.getElementById('f-label-value').options.length > 0, 'host_name values');
  await page.click('#f-label-add');
  await settled(page);
  check(/host_name="[^"]+"/.test(last()) && (await page.textContent('#f-labels')).includes('host_name'), 'a label filter joins the selector', last());

  await page.fill('#f-span_id', 'no-such-span');
  await page.press('#f-span_id', 'Enter');
  await waitFor(page, () => /^No cpu samples/.test(document.getElementById('status').textContent), 'the empty result');
  check(last().includes('span_id=no-such-span'), 'a span filter goes along and can leave nothing', last());
  await shot(page, '05-filters');
  await page.fill('#f-span_id', '');
  await page.press('#f-span_id', 'Enter');
  await settled(page);
  await page.click('#f-labels button');
  await page.selectOption('#f-pid', '');
  await settled(page);
  page.off('request', record);
}

/** A deterministic pseudo-random generator (mulberry32), so every run draws the same tree. */
function random(seed) {
  return () => {
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** The API's JSON tree from `parents[i]` (node 0 the root) and each node's self value. */
function apiTree(parents, selfs, names) {
  const nodes = parents.map((_, i) => ({ name: names(i), module: `Bench.Module${i % 17}.dll`, self: selfs[i], total: selfs[i], children: [] }));
  nodes[0].name = 'total';
  delete nodes[0].module;
  for (let i = nodes.length - 1; i > 0; i--) {
    nodes[parents[i]].children.push(nodes[i]);
    nodes[parents[i]].total += nodes[i].total;
  }
  for (const node of nodes) node.children.sort((a, b) => b.total - a.total);
  return JSON.stringify({ unit: 'nanoseconds', total: nodes[0].total, root: nodes[0] });
}

/**
 * Two shapes of 50 000 nodes: "random" grows each node under a recent one with heavy-tailed
 * self values, as real profiles look (most frames are narrower than a pixel and skipped);
 * "all-visible" is 1000 equal call chains 50 deep, every frame about a pixel wide and drawn.
 */
function benchmarkTrees(count) {
  const next = random(42);
  // About 4000 distinct functions, as a large service's profile has.
  const functionName = (i) => `Bench.Service${i % 23}.Handler${i % 97}.Process${i % 4001}(Bench.Request, System.Threading.CancellationToken)`;
  const parents = [-1];
  for (let i = 1; i < count; i++) parents.push(next() < 0.75 ? Math.max(0, i - 1 - Math.floor(next() * 8)) : Math.floor(next() * i));
  const selfs = parents.map((_, i) => (i === 0 ? 0 : Math.floor(1e6 / (next() + 0.001))));
  const chains = [-1];
  for (let i = 1; i < count; i++) chains.push((i - 1) % 50 === 0 ? 0 : i - 1);
  const leaf = chains.map((_, i) => (i > 0 && (i % 50 === 0 || i === count - 1) ? 1e6 : 0));
  return { random: apiTree(parents, selfs, functionName), 'all-visible': apiTree(chains, leaf, functionName) };
}

/**
 * Serves `bodies` (name → JSON text) on a loopback port, as the agent serves a profile, so that
 * the benchmark's profile comes over real HTTP (answering through Playwright's interception
 * instead would time the test harness: its protocol moves 8 MB in about a second).
 */
async function serveJson(bodies) {
  const server = http.createServer((request, response) => {
    const body = bodies[request.url.slice(1)];
    response.writeHead(body ? 200 : 404, { 'Content-Type': 'application/json', 'Access-Control-Allow-Origin': '*' });
    response.end(body ?? '{}');
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  return server;
}

/** Request to drawn for each shape, three runs each. */
async function benchmark(context) {
  const NODES = 50000;
  const trees = benchmarkTrees(NODES);
  const server = await serveJson(trees);
  const { port } = server.address();
  try {
    for (const shape of Object.keys(trees)) {
      const page = await newPage(context);
      // The token, as if typed earlier in this browser session.
      await page.addInitScript((token) => sessionStorage.setItem('clrscope.token', token), config.token);
      await page.route('**/api/v1/profile?*', (route) =>
        route.request().url().includes('format=json') ? route.continue({ url: `http://127.0.0.1:${port}/${shape}` }) : route.continue(),
      );
      const runs = [];
      for (let run = 0; run < 3; run++) {
        await page.goto(pageUrl('', run));
        await waitFor(page, () => performance.getEntriesByName('clrscope:flamegraph').length > 0, `the ${shape} flame graph`);
        await settled(page);
        runs.push(
          await page.evaluate(() => {
            const flame = clrscope.single.flame;
            const redraws = [];
            for (let k = 0; k < 5; k++) {
              const t = performance.now();
              flame.draw();
              redraws.push(performance.now() - t);
            }
            return {
              nodes: clrscope.single.tree.n,
              drawn: flame.visible.length,
              loadMs: performance.getEntriesByName('clrscope:flamegraph')[0].duration,
              redrawMs: redraws.sort((a, b) => a - b)[2],
            };
          }),
        );
      }
      check(runs.every((r) => r.nodes === NODES), `the ${shape} benchmark tree has ${NODES} nodes`, runs.map((r) => r.nodes).join(', '));
      if (shape === 'random') await shot(page, '09-benchmark-50k');
      const median = (key) => runs.map((r) => r[key]).sort((a, b) => a - b)[1];
      const best = Math.min(...runs.map((r) => r.loadMs));
      report.benchmark[shape] = {
        nodes: NODES,
        drawn: runs[0].drawn,
        load_ms: runs.map((r) => Math.round(r.loadMs)),
        best_load_ms: Math.round(best),
        median_load_ms: Math.round(median('loadMs')),
        median_redraw_ms: Math.round(median('redrawMs')),
      };
      // The best of three: the machine is shared (the test suite's other processes, other
      // builds), and what is measured is what the page costs, not what others take from it.
      check(best < 1000, `a ${NODES}-node flame graph (${shape}) renders in under 1 s`, `${Math.round(best)} ms`);
      await page.close();
    }
  } finally {
    server.close();
  }
}

async function main() {
  fs.mkdirSync(config.artifacts, { recursive: true });
  const browser = await chromium.launch({
    executablePath: config.chromium,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking'],
  });
  try {
    const context = await browser.newContext({ viewport: { width: 1400, height: 1000 }, acceptDownloads: true });
    if (config.phase === 'acceptance') {
      await acceptance(context);
    } else {
      await benchmark(context);
    }
    check(errors.length === 0, 'the page logged no errors', errors.join('\n'));
  } finally {
    await browser.close();
  }
  fs.writeFileSync(path.join(config.artifacts, `${config.phase}.json`), JSON.stringify(report, null, 2));
  console.log(JSON.stringify(report));
}

// Never outlive the test: exiting closes the browser Playwright started.
setTimeout(() => {
  console.error(`webui.cjs: gave up after ${TIMEOUT_MS} ms; passed so far: ${report.checks.join('; ')}`);
  process.exit(2);
}, TIMEOUT_MS).unref();

main().catch((error) => {
  console.error(`webui.cjs: ${error.message}\npassed so far: ${report.checks.join('; ')}`);
  process.exit(1);
});
