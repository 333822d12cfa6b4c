// Opens a cove preview URL in headless Chromium (Debian's, via playwright-core's
// executablePath) and prints what the page saw as JSON. Usage:
//   node preview.mjs URL WS_URL   (env CHROMIUM: the browser; HOST_RULES: --host-resolver-rules)
import { chromium } from 'playwright-core';

const [url, wsUrl] = process.argv.slice(2);
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  args: ['--no-sandbox', `--host-resolver-rules=${process.env.HOST_RULES || ''}`],
});
const out = {};
try {
  const page = await browser.newPage();
  const resp = await page.goto(url, { waitUntil: 'load', timeout: 60000 });
  out.status = resp.status();
  // the page fetches 'headers' (relative): only the cookie set on the first answer carries
  // the token now
  await page.waitForFunction(() => document.title.startsWith('loaded '), null, { timeout: 60000 });
  out.title = await page.title();
  out.heading = await page.textContent('#msg');
  out.documentCookie = await page.evaluate(() => document.cookie);
  out.cookies = (await page.context().cookies()).map(c => ({ name: c.name, httpOnly: c.httpOnly, path: c.path, domain: c.domain }));
  out.echo = await page.evaluate((u) => new Promise((resolve, reject) => {
    const ws = new WebSocket(u);
    ws.onopen = () => ws.send('hello from chromium');
    ws.onmessage = (m) => { resolve(m.data); ws.close(); };
    ws.onerror = () => reject(new Error('websocket error'));
  }), wsUrl);
  // a second page load with no token in the URL: the cookie alone opens it
  const again = await page.goto(url.split('?')[0], { waitUntil: 'load', timeout: 60000 });
  out.againStatus = again.status();
} finally {
  await browser.close();
}
console.log(JSON.stringify(out));
