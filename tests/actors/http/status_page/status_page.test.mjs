// The status page at / in headless Chromium (Debian's), driven by playwright-core: every request
// that is not to this machine is aborted and recorded, so the page is shown to work without
// network access. Run by status_page_test.sh, which starts the servers:
//   MQLM_HTTP_URL   a server without an API key, sampling every 250 ms
//   MQLM_KEYED_URL  a server with MQLM_API_KEY
//   MQLM_CHROMIUM   the browser; MQLM_SCREENSHOT: where to save one PNG of the page (optional)
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { chromium } from 'playwright-core';

let browser;

before(async () => {
  // Chromium's sandbox refuses to run as root, as CI's containers do.
  const args = process.getuid && process.getuid() === 0 ? ['--no-sandbox'] : [];
  browser = await chromium.launch({ executablePath: process.env.MQLM_CHROMIUM, headless: true, args });
});

after(async () => {
  await browser?.close();
});

// A page whose requests may reach this machine only; `outside` lists those it tried elsewhere.
async function offlinePage() {
  const context = await browser.newContext({ viewport: { width: 1280, height: 1000 } });
  const outside = [];
  const local = (url) => ['127.0.0.1', 'localhost', '[::1]'].includes(new URL(url).hostname);
  await context.route('**/*', (route) => {
    const url = route.request().url();
    if (url.startsWith('data:') || local(url)) return route.continue();
    outside.push(url);
    return route.abort('internetdisconnected');
  });
  const page = await context.newPage();
  const problems = [];
  page.on('pageerror', (error) => problems.push(`page error: ${error.message}`));
  // Script errors, and loads the policy refused or that failed on the network; not an answer's
  // status (a 503 from a server busy on a slow CI machine is the page's to show, not a fault).
  page.on('console', (message) => {
    const text = message.text();
    if (message.type() === 'error' && /Content Security Policy|Refused to|net::ERR|Uncaught/.test(text)) {
      problems.push(`console: ${text}`);
    }
  });
  page.on('request', (request) => {
    if (!request.url().startsWith('data:') && !local(request.url())) outside.push(request.url());
  });
  return { context, page, outside, problems };
}

// Completions sent from here (not through the page) until stopped; stop() gives the number
// answered, or throws the first failure.
function backgroundLoad(url, headers = {}) {
  let running = true;
  let answered = 0;
  const failures = [];
  const one = async () => {
    while (running) {
      const res = await fetch(`${url}/v1/completions`, {
        method: 'POST',
        headers: { 'Content-Type': 'application/json', ...headers },
        body: JSON.stringify({ model: 'demo', prompt: 'The status page shows', max_tokens: 24, temperature: 0 }),
      });
      const body = await res.text();
      assert.equal(res.status, 200, body);
      assert.ok(JSON.parse(body).choices.length > 0);
      answered++;
    }
  };
  const loops = [one(), one()].map((loop) => loop.catch((error) => {
    failures.push(error);
    running = false;
  }));
  return {
    async stop() {
      running = false;
      await Promise.all(loops);
      if (failures.length) throw failures[0];
      return answered;
    },
  };
}

const plotFigure = (page, id, key) =>
  page.$eval(id, (svg, k) => Number(svg.dataset[k] ?? 0), key);

test('the page shows models, plots that update under load, and loads nothing from outside', {
  skip: !process.env.MQLM_HTTP_URL,
}, async () => {
  const url = process.env.MQLM_HTTP_URL;
  const { context, page, outside, problems } = await offlinePage();
  const response = await page.goto(`${url}/`);
  assert.equal(response.status(), 200);
  assert.match(response.headers()['content-type'], /^text\/html; charset=utf-8/);
  assert.match(response.headers()['content-security-policy'], /default-src 'none'/);
  assert.equal(await page.title(), 'mqlm status');

  await page.waitForFunction(() => document.querySelector('#state').textContent === 'serving', null,
                             { timeout: 20000 });
  const models = await page.textContent('#models');
  assert.match(models, /demo/);
  assert.match(models, /loaded/);
  assert.match(await page.textContent('#cache'), /hot \(RAM\)|GPU prefix cache only/);
  const generatedBefore = await page.textContent('#generated');
  const pointsBefore = await plotFigure(page, '#plot-tokens', 'points');

  const load = backgroundLoad(url);
  try {
    // Tokens per second above 0 in the plot, and someone running in the requests plot.
    await page.waitForFunction(() => Number(document.querySelector('#plot-tokens').dataset.max) > 0, null,
                               { timeout: 30000 });
    await page.waitForFunction(() => Number(document.querySelector('#plot-requests').dataset.max) >= 1, null,
                               { timeout: 30000 });
    await page.waitForFunction((before) => document.querySelector('#generated').textContent !== before,
                               generatedBefore, { timeout: 30000 });
    const points = await plotFigure(page, '#plot-tokens', 'points');
    assert.ok(points > pointsBefore, `the tokens plot has ${points} points, had ${pointsBefore}`);
    // It keeps moving: new samples come in on the next polls.
    await page.waitForFunction((n) => Number(document.querySelector('#plot-tokens').dataset.points) !== n, points,
                               { timeout: 10000 });
    assert.ok((await page.$$('#plot-tokens polyline')).length >= 1);
    assert.ok((await page.$$('#plot-memory polyline')).length >= 1);
    assert.ok(await plotFigure(page, '#plot-memory', 'max') > 0);
  } finally {
    const answered = await load.stop();
    assert.ok(answered > 0, 'the background load was answered');
  }
  if (process.env.MQLM_SCREENSHOT) await page.screenshot({ path: process.env.MQLM_SCREENSHOT, fullPage: true });
  assert.deepEqual(outside, [], 'the page asked for nothing beyond this machine');
  assert.deepEqual(problems, [], 'no script error or blocked load in the console');
  await context.close();
});

test('with --api-key the page asks for the key, keeps it, and then works', {
  skip: !process.env.MQLM_KEYED_URL,
}, async () => {
  const url = process.env.MQLM_KEYED_URL;
  const key = process.env.MQLM_API_KEY;
  const { context, page, outside } = await offlinePage();
  const response = await page.goto(`${url}/`);
  assert.equal(response.status(), 200, 'the page itself is served without the key');
  await page.waitForSelector('#key-form.shown', { timeout: 10000 });
  assert.equal(await page.textContent('#state'), 'API key needed');

  await page.fill('#api-key', 'not-the-key');
  await page.click('#api-key-save');
  await page.waitForFunction(() => /refused/.test(document.querySelector('#key-note').textContent), null,
                             { timeout: 10000 });
  assert.ok(await page.isVisible('#key-form'));

  await page.fill('#api-key', key);
  await page.click('#api-key-save');
  await page.waitForFunction(() => document.querySelector('#state').textContent === 'serving', null,
                             { timeout: 20000 });
  assert.ok(!(await page.isVisible('#key-form')));
  assert.match(await page.textContent('#models'), /demo/);
  assert.equal(await page.evaluate(() => localStorage.getItem('mqlm-api-key')), key);

  // A reload remembers the key: no question, and the plots fill as before.
  await page.reload();
  await page.waitForFunction(() => document.querySelector('#state').textContent === 'serving', null,
                             { timeout: 20000 });
  assert.ok(!(await page.isVisible('#key-form')));
  const load = backgroundLoad(url, { Authorization: `Bearer ${key}` });
  try {
    await page.waitForFunction(() => Number(document.querySelector('#plot-tokens').dataset.max) > 0, null,
                               { timeout: 30000 });
  } finally {
    await load.stop();
  }
  assert.deepEqual(outside, []);
  await context.close();
});
