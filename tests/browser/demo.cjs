// The demo's web UI in a real browser (Debian Chromium driven by npm playwright-core), against the
// agent `make demo` runs (tests/testbed/demo.sh). Run by tests/suite/demo.rs:
//
//   NODE_PATH=.testbed/node/node_modules node tests/browser/demo.cjs '{"url": "http://127.0.0.1:PORT",
//     "token": "JWT", "pid": FRONTEND_PID, "hot": "Storefront.Recommendations.RecommendationEngine.",
//     "exception": "Storefront.Pricing.CouponServiceException", "slow": "Inventory reservation ",
//     "screenshot": "docs/webui.png", "chromium": "/usr/bin/chromium"}'
//
// Opens the page on the frontend's cpu profile of the last 5 minutes, gives it the token, and
// presses Refresh until the page shows the three things the demo is about: a function starting with
// `hot` as the first row of the top functions (by self time), `exception` in the process's recent
// exceptions, and a warning holding `slow` (the slow dependency's latency) in its logs. The
// last stdout line is a JSON report: when each showed, in ms since the page was first loaded, what
// the page showed and the timeline's rule markers. Then a screenshot of the page goes to
// `screenshot`. Anything missing after TIMEOUT_MS prints what the page showed and exits 1.
'use strict';

const { chromium } = require('playwright-core');

const config = JSON.parse(process.argv[2]);
const TIMEOUT_MS = 150000;
const REFRESH_MS = 5000;

/** What the page shows now of the three. */
async function shown(page) {
  return page.evaluate(({ exception, slow }) => ({
    top: [...document.querySelectorAll('#top-table tbody td.fn')].slice(0, 5).map((c) => c.textContent),
    exceptions: [...document.querySelectorAll('#signal-exceptions li')].map((li) => li.textContent)
      .filter((text) => text.includes(exception)).length,
    slow: [...document.querySelectorAll('#signal-logs li')].map((li) => li.textContent).filter((text) => text.includes(slow)),
    markers: (window.clrscope?.timeline.events ?? []).filter((e) => e.rule).map((e) => `${e.kind} ${e.rule} pid ${e.pid}`),
    status: document.getElementById('status').textContent,
  }), { exception: config.exception, slow: config.slow });
}

async function main() {
  const browser = await chromium.launch({
    executablePath: config.chromium,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking'],
  });
  try {
    const page = await (await browser.newContext({ viewport: { width: 1400, height: 1000 } })).newPage();
    page.setDefaultTimeout(90000); // the page and the agent share 2 busy cores with the services
    const errors = [];
    page.on('pageerror', (e) => errors.push(`page error: ${e.message}`));
    const opened = Date.now();
    await page.goto(`${config.url}/#type=cpu&service=storefront&pid=${config.pid}&window=5m`);
    await page.waitForSelector('#token-dialog[open]');
    await page.fill('#token-input', config.token);
    await page.click('#token-form button[type="submit"]');
    const seen = {};
    let now = {};
    while (Date.now() - opened < TIMEOUT_MS) {
      now = await shown(page);
      const at = Date.now() - opened;
      if (seen.hot === undefined && now.top[0]?.startsWith(config.hot)) seen.hot = at;
      if (seen.exceptions === undefined && now.exceptions > 0) seen.exceptions = at;
      if (seen.dependency === undefined && now.slow.length > 0) seen.dependency = at;
      if (Object.keys(seen).length === 3 && now.status === '') break;
      await page.waitForTimeout(REFRESH_MS);
      await page.click('#refresh');
    }
    if (Object.keys(seen).length < 3) throw new Error(`after ${TIMEOUT_MS} ms the page shows ${JSON.stringify(now)}; seen ${JSON.stringify(seen)}\n${errors.join('\n')}`);
    if (errors.length > 0) throw new Error(errors.join('\n'));
    await page.screenshot({ path: config.screenshot, fullPage: true });
    console.log(JSON.stringify({ seen_ms: seen, shown: now }));
  } finally {
    await browser.close();
  }
}

// Never outlive the test: exiting closes the browser Playwright started.
setTimeout(() => {
  console.error(`demo.cjs: gave up after ${TIMEOUT_MS + 30000} ms`);
  process.exit(2);
}, TIMEOUT_MS + 30000).unref();

main().catch((error) => {
  console.error(`demo.cjs: ${error.message}`);
  process.exit(1);
});
