// Drives cove's operator console in headless Chromium (Debian's, via playwright-core's
// executablePath) and prints what it saw as JSON: tests/integration/test_console.py.
// Usage: node console.mjs BASE_URL SANDBOX_ID EARLY_SNAPSHOT_ID SHOT_DIR
//   (env CHROMIUM: the browser; COVE_KEY: the admin API key)
import { chromium } from 'playwright-core';

const [base, sid, early, shots] = process.argv.slice(2);
const browser = await chromium.launch({ executablePath: process.env.CHROMIUM || '/usr/bin/chromium', args: ['--no-sandbox'] });
let page = null;
const out = { offOrigin: [], csp: {}, errors: [] };
const shot = (page, n) => page.screenshot({ path: `${shots}/${n}.png`, fullPage: true });
try {
  // first load: bytes and time of everything the login page loads, in a fresh context
  const ctx0 = await browser.newContext();
  const p0 = await ctx0.newPage();
  const t0 = Date.now();
  await p0.goto(`${base}/ui`, { waitUntil: 'load' });
  await p0.waitForSelector('#login:not([hidden])');
  const ms = Date.now() - t0;
  out.firstLoad = await p0.evaluate(() => { const e = [...performance.getEntriesByType('navigation'), ...performance.getEntriesByType('resource')];
    return { bytes: e.reduce((n, x) => n + x.encodedBodySize, 0), files: e.length }; });
  out.firstLoad.ms = ms;
  await ctx0.close();

  page = await browser.newPage();
  page.on('dialog', (d) => d.accept());
  page.on('pageerror', (e) => out.errors.push(String(e)));
  page.on('request', (r) => { if (!r.url().startsWith(base)) out.offOrigin.push(r.url()); });
  page.on('response', (r) => { if (r.url().includes('/ui')) out.csp[new URL(r.url()).pathname] = r.headers()['content-security-policy'] || null; });
  await page.goto(`${base}/ui`, { waitUntil: 'load' });
  // CSP: a load from another origin (a closed loopback port: nothing leaves the machine) is refused
  out.cspBlocked = await page.evaluate(() => new Promise((resolve) => {
    document.addEventListener('securitypolicyviolation', (e) => resolve(e.blockedURI), { once: true });
    const s = document.createElement('script'); s.src = 'http://127.0.0.2:9/x.js'; document.body.append(s);
    setTimeout(() => resolve(null), 10000);
  }));
  await page.fill('#key', process.env.COVE_KEY);
  await page.click('#login button');
  await page.waitForSelector(`a.sbx:text("${sid}")`, { timeout: 60000 });
  // live usage: the memory column of the sandbox's row fills in
  await page.waitForFunction((id) => [...document.querySelectorAll('tr')].some((r) => r.textContent.includes(id) && /\d/.test(r.querySelector('.mem')?.textContent || '')), sid, { timeout: 60000 });
  out.usageRow = await page.$eval(`tr:has(a.sbx:text("${sid}")) .mem`, (e) => e.textContent);
  // an admin sees every tenant's sandboxes: the other tenant's row, with its tenant
  await page.waitForSelector(`tr:has-text("${process.env.OTHER_SANDBOX}")`, { timeout: 60000 });
  out.otherRow = await page.textContent(`tr:has-text("${process.env.OTHER_SANDBOX}")`);
  out.keyInSession = await page.evaluate(() => sessionStorage.getItem('cove_key') === null ? 'missing' : 'kept');
  await shot(page, '1-sandboxes');

  await page.click(`a.sbx:text("${sid}")`);
  await page.waitForSelector('#timeline', { timeout: 60000 });
  await page.click('#termstart');
  await page.waitForSelector('#term[data-pid]', { timeout: 60000 });
  await page.click('#term');
  await page.keyboard.type('echo console-$((6*7))\r');
  const termText = () => page.evaluate(() => { const b = window.coveTerm.buffer.active; const l = [];
    for (let i = 0; i < b.length; i++) l.push(b.getLine(i).translateToString(true)); return l.join('\n'); });
  await page.waitForFunction(() => { const b = window.coveTerm.buffer.active;
    for (let i = 0; i < b.length; i++) if (b.getLine(i).translateToString(true).trim() === 'console-42') return true; return false; }, null, { timeout: 60000 });
  out.terminal = await termText();
  await shot(page, '2-terminal');

  // the timeline: set the slider to the early snapshot, diff it against now, fork from it
  const idx = await page.$eval('#timeline', (el) => el.max);
  for (let i = 0; i <= +idx; i++) {
    await page.$eval('#timeline', (el, v) => { el.value = v; el.dispatchEvent(new Event('input')); }, i);
    if ((await page.textContent('.snapid')) === early) break;
  }
  out.selected = await page.textContent('.snapid');
  await page.click('#diffnow');
  await page.waitForSelector('#diff', { timeout: 60000 });
  out.diff = await page.textContent('#diff');
  await page.click('a.diffpath:text("/root/added.txt")');
  await page.waitForFunction(() => document.querySelector('#filediff').textContent.includes('+added in the console test'), null, { timeout: 30000 });
  out.fileDiff = await page.textContent('#filediff');
  await shot(page, '3-diff');
  await page.click('#fork');
  await page.waitForSelector('.forked a', { timeout: 120000 });
  out.fork = await page.textContent('.forked a');
  await shot(page, '4-fork');

  // egress and audit: approve the pending lease, see the denied attempt, verify the chain
  await page.click('a[href="#/audit"]');
  await page.waitForSelector('button.approve', { timeout: 60000 });
  await page.click('button.approve');
  await page.waitForFunction(() => !document.querySelector('button.approve'), null, { timeout: 60000 });
  await page.waitForSelector('.verdict.deny', { timeout: 60000 });
  out.denied = await page.$$eval('tr', (rows) => rows.filter((r) => r.querySelector('.verdict.deny')).map((r) => r.textContent));
  await page.click('#verify');
  await page.waitForSelector('#verifyout', { timeout: 60000 });
  out.verify = await page.textContent('#verifyout');
  await shot(page, '5-audit');
} catch (e) {
  out.failure = String(e && e.stack || e);
  try { out.terminalAtFailure = await page.evaluate(() => window.coveTerm && [...Array(window.coveTerm.buffer.active.length).keys()].map(i => window.coveTerm.buffer.active.getLine(i).translateToString(true)).join('\n')); } catch (_) { /* no page */ }
} finally {
  await browser.close();
}
console.log(JSON.stringify(out));
