// An incident bundle in Chromium, offline: every request but the file itself is refused and
// recorded. Run by tests/suite/incidents.rs:
//
//   NODE_PATH=.testbed/node/node_modules node tests/browser/bundle.cjs '{"file": "/path/bundle.html",
//     "chromium": "/usr/bin/chromium"}'
//
// The last stdout line is JSON: the first row of the first diff table (function, share_before,
// share_during as shown) and the URLs the page tried to reach.
'use strict';

const { chromium } = require('playwright-core');

const config = JSON.parse(process.argv[2]);

(async () => {
  const browser = await chromium.launch({ executablePath: config.chromium, args: ['--no-sandbox'] });
  try {
    const context = await browser.newContext({ offline: true });
    const requests = [];
    const url = `file://${config.file}`;
    await context.route('**/*', (route) => {
      const wanted = route.request().url();
      if (wanted === url) return route.continue();
      requests.push(wanted);
      return route.abort();
    });
    const page = await context.newPage();
    await page.goto(url, { timeout: 60000 });
    const row = page.locator('table.diff tr').nth(1);
    const shown = {
      function: await row.locator('code.function').textContent(),
      share_before: await row.locator('td.share-before').textContent(),
      share_during: await row.locator('td.share-during').textContent(),
      requests,
    };
    console.log(JSON.stringify(shown));
  } finally {
    await browser.close();
  }
})().catch((error) => {
  console.log(`failed: ${error.stack}`);
  process.exit(1);
});
