// An incident's page in the web UI (Debian Chromium, npm playwright-core), against a running
// `clrscope agent` with authentication on. Run by tests/suite/incidents.rs:
//
//   NODE_PATH=.testbed/node/node_modules node tests/browser/incident.cjs '{"url": "http://127.0.0.1:PORT",
//     "token": "JWT", "incident": 1, "artifacts": "/tmp/dir", "chromium": "/usr/bin/chromium"}'
//
// Opens the incidents view on the incident, gives the token, waits for the page to settle and
// prints (last stdout line, JSON) what it shows: the diff's rows as shown (function, share
// before and during), the exceptions table's rows (type, before, during, where; with
// `"exceptions": true` it waits for one), the slowest spans' rows (with `"spans": true` it waits
// for one), the causes' triggers, the timeline's charts (type, mean before and
// during), the page's errors, and the bundle it downloaded (path). A screenshot goes to
// `artifacts/incident.png`.
'use strict';

const path = require('path');
const { chromium } = require('playwright-core');

const config = JSON.parse(process.argv[2]);
const TIMEOUT_MS = 60000;

(async () => {
  const browser = await chromium.launch({ executablePath: config.chromium, args: ['--no-sandbox'] });
  const errors = [];
  try {
    const context = await browser.newContext({ acceptDownloads: true, viewport: { width: 1400, height: 1000 } });
    const page = await context.newPage();
    page.on('pageerror', (e) => errors.push(`page error: ${e.message}`));
    page.on('console', (m) => {
      if (m.type() === 'error' && !m.text().includes('401')) errors.push(`console: ${m.text()}`);
    });
    await page.goto(`${config.url}/#view=incidents&incident=${config.incident}`, { timeout: TIMEOUT_MS });
    await page.waitForSelector('#token-dialog[open]', { timeout: TIMEOUT_MS });
    await page.fill('#token-input', config.token);
    await page.click('#token-form button[type="submit"]');
    await page.waitForFunction(
      () => document.querySelectorAll('#incident-diff tr.diff-row').length > 0
        && document.querySelectorAll('#incident-timeline figure').length > 0
        && document.getElementById('status').textContent === '',
      null,
      { timeout: TIMEOUT_MS },
    );
    if (config.exceptions) {
      await page.waitForFunction(() => document.querySelectorAll('#incident-exceptions tr').length > 0, null, { timeout: TIMEOUT_MS });
    }
    if (config.spans) {
      await page.waitForFunction(() => document.querySelectorAll('#incident-spans tr.span-row').length > 0, null, { timeout: TIMEOUT_MS });
    }
    const shown = await page.evaluate(() => ({
      title: document.getElementById('incident-title').textContent,
      triggers: [...document.querySelectorAll('#incident-causes td.trigger')].map((td) => td.textContent),
      diff: [...document.querySelectorAll('#incident-diff tr.diff-row')].map((tr) => ({
        function: tr.querySelector('.function').textContent,
        share_before: tr.querySelector('.share-before').textContent,
        share_during: tr.querySelector('.share-during').textContent,
      })),
      exceptions: [...document.querySelectorAll('#incident-exceptions tr')].map((tr) => [...tr.cells].map((td) => td.textContent)),
      spans: [...document.querySelectorAll('#incident-spans tr.span-row')].map((tr) => ({
        name: tr.querySelector('.span-name').textContent,
        duration_ms: tr.querySelector('.span-duration').textContent,
        tags: tr.querySelector('.span-tags').textContent,
      })),
      charts: [...document.querySelectorAll('#incident-timeline figure')].map((f) => ({
        type: f.dataset.type,
        before: f.querySelector('.before-mean').textContent,
        during: f.querySelector('.during-mean').textContent,
      })),
    }));
    await page.screenshot({ path: path.join(config.artifacts, 'incident.png'), fullPage: true });
    const [download] = await Promise.all([page.waitForEvent('download', { timeout: TIMEOUT_MS }), page.click('#incident-bundle')]);
    const bundle = path.join(config.artifacts, 'incident-page-bundle.html');
    await download.saveAs(bundle);
    console.log(JSON.stringify({ ...shown, bundle, errors }));
  } finally {
    await browser.close();
  }
})().catch((error) => {
  console.log(`failed: ${error.stack}`);
  process.exit(1);
});
