// Drives a real VS Code (code-server, already running with the quickdraft
// extension installed) in headless Chromium: opens a file, types, waits for
// the inline suggestion (ghost text), screenshots it, accepts it with Tab and
// saves. Prints one JSON line: {ok, ghost, status, timings, error?}.
// The caller (tests/integration/test_vscode_real.py) reads the saved file.
//
//   node ghost_text.mjs '{"url": "http://127.0.0.1:PORT/?folder=/ws", "file": "point.py",
//                         "path": "/ws/point.py", "type": ["    def __eq__(self, other):\n"],
//                         "screenshot": "/tmp/x.png"}'
import fs from 'node:fs';
import { chromium } from 'playwright-core';

const args = JSON.parse(process.argv[2]);
const timeoutMs = args.timeoutMs ?? 60000;
const t0 = Date.now();
const timings = {};
const mark = (name) => { timings[name] = (Date.now() - t0) / 1000; };

function chromiumPath() {
  const candidates = [process.env.QUICKDRAFT_CHROMIUM, '/usr/lib/chromium/chromium', '/usr/bin/chromium',
    '/usr/bin/chromium-browser', '/usr/bin/google-chrome'];
  const found = candidates.find((p) => p && fs.existsSync(p));
  if (!found) throw new Error(`no Chromium: tried ${candidates.filter(Boolean).join(', ')}`);
  return found;
}

// The ghost text as the editor draws it: the inline part after the cursor
// (.ghost-text-decoration) and the lines below it (.ghost-text, in a view
// zone), joined in screen order: the DOM order of view lines is not the line
// order. Leaves only, so a container does not count its text twice.
const GHOST = '.monaco-editor .ghost-text-decoration, .monaco-editor .ghost-text, .monaco-editor .ghost-text-decoration-preview';

function readGhost(selector) {
  const all = [...document.querySelectorAll(selector)];
  const parts = all.filter((el) => !all.some((other) => other !== el && el.contains(other)))
    .map((el) => { const r = el.getBoundingClientRect(); return { y: Math.round(r.top), x: r.left, text: el.textContent.replace(/\u00a0/g, ' ') }; })
    .filter((p) => p.text.length > 0)
    .sort((a, b) => a.y - b.y || a.x - b.x);
  const lines = [];
  let lastY = null;
  for (const p of parts) {
    if (lastY !== null && Math.abs(p.y - lastY) < 3) lines[lines.length - 1] += p.text;
    else lines.push(p.text);
    lastY = p.y;
  }
  return lines.join('\n');
}

function statusText(page) {
  return page.evaluate(() => [...document.querySelectorAll('.part.statusbar .statusbar-item')]
    .map((el) => el.getAttribute('aria-label') || el.textContent).filter((t) => /quickdraft/i.test(t || '')).join(' | '));
}

const out = { ok: false, ghost: '', status: '', timings };
let browser;
try {
  browser = await chromium.launch({ executablePath: chromiumPath(), headless: true, args: ['--no-sandbox', '--disable-gpu'] });
  const page = await browser.newPage({ viewport: { width: args.width ?? 900, height: args.height ?? 420 } });
  await page.goto(args.url, { timeout: timeoutMs });
  await page.waitForSelector('.monaco-workbench .part.statusbar', { timeout: timeoutMs });
  mark('workbench');

  // Open the file through Quick Open, as a user would.
  await page.keyboard.press('Control+P');
  await page.waitForSelector('.quick-input-widget input', { state: 'visible', timeout: timeoutMs });
  await page.keyboard.type(args.file);
  await page.waitForSelector(`.quick-input-list .monaco-list-row[aria-label*="${args.file}"]`, { timeout: timeoutMs });
  await page.keyboard.press('Enter');
  await page.waitForSelector(`.tabs-container .tab.active[aria-label*="${args.file}"]`, { timeout: timeoutMs });
  await page.waitForSelector('.editor-instance .monaco-editor .view-lines', { state: 'attached', timeout: timeoutMs });
  mark('opened');

  // The extension is up once its status bar item shows the sparkle (the
  // language server said "up": it reached the completion server).
  await page.waitForSelector('.part.statusbar [id="quickdraft.quickdraft-vscode"] .codicon-sparkle', { timeout: timeoutMs })
    .catch(async () => { throw new Error(`the quickdraft status bar item never showed "up": ${await statusText(page)}`); });
  out.status = await statusText(page);
  mark('extension_up');

  await page.locator('.editor-instance .monaco-editor .view-lines').first().click({ force: true });
  await page.keyboard.press('Control+End');
  for (const chunk of args.type) {
    await page.keyboard.type(chunk, { delay: 20 });
  }
  mark('typed');
  await page.waitForFunction((sel) => [...document.querySelectorAll(sel)]
    .some((el) => el.textContent.replace(/\u00a0/g, ' ').trim().length > 0), GHOST, { timeout: timeoutMs })
    .catch(() => { throw new Error('no ghost text appeared after typing'); });
  mark('ghost_shown');
  // Accept what is on screen: wait until the suggestion has stayed the same for half a second.
  let stable = 0;
  for (let i = 0; stable < 5; i++) {
    if (i > 100) throw new Error(`the ghost text never settled: last ${JSON.stringify(out.ghost)}`);
    await page.waitForTimeout(100);
    const now = await page.evaluate(readGhost, GHOST);
    stable = now === out.ghost && now.trim() ? stable + 1 : 0;
    out.ghost = now;
  }
  mark('ghost');
  if (args.screenshot) {
    await page.screenshot({ path: args.screenshot, clip: args.clip });
  }

  await page.keyboard.press('Tab');
  // Accepted: the suggestion is now text of the editor (its drawn lines without the ghost text in them).
  const squash = (t) => t.replace(/\s+/g, '');
  await page.waitForFunction((want) => [...document.querySelectorAll('.editor-instance .monaco-editor .view-lines .view-line')]
    .map((line) => {
      const copy = line.cloneNode(true);
      copy.querySelectorAll('[class*="ghost-text"]').forEach((ghost) => ghost.remove());
      return copy.textContent;
    }).join('').replace(/\s+/g, '').includes(want), squash(out.ghost), { timeout: 5000 })
    .catch(async () => {
      const focus = await page.evaluate(() => { const a = document.activeElement; return a ? `${a.tagName}.${a.className}` : 'none'; });
      if (args.failureScreenshot) await page.screenshot({ path: args.failureScreenshot });
      throw new Error(`Tab did not accept the ghost text (focus on ${focus}; ghost now ${JSON.stringify(await page.evaluate(readGhost, GHOST))})`);
    });
  mark('accepted');
  const before = fs.readFileSync(args.path, 'utf8');
  await page.keyboard.press('Control+S');
  // The tab stops looking modified before code-server has written the file:
  // wait for the disk to change, then to hold still.
  let disk = before;
  let still = 0;
  for (let i = 0; disk === before || still < 3; i++) {
    if (i > timeoutMs / 100) throw new Error('the save never reached the disk');
    await page.waitForTimeout(100);
    const now = fs.readFileSync(args.path, 'utf8');
    still = now === disk ? still + 1 : 0;
    disk = now;
  }
  mark('saved');
  out.ok = true;
} catch (err) {
  out.error = String(err && err.stack ? err.stack : err);
} finally {
  if (browser) await browser.close().catch(() => {});
}
process.stdout.write(JSON.stringify(out) + '\n');
process.exit(out.ok ? 0 : 1);
