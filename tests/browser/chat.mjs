// Drives the chat page in Debian's Chromium: type a question, see the stages and the answer;
// double-click send on a second question, and check it was asked once; reload, and see both
// again from the history.
// Usage: node chat.mjs BASE_URL SCREENSHOT_PATH. Prints one JSON line with what it saw.
import { chromium } from "playwright-core";

const [base, screenshot] = process.argv.slice(2);
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"],
});
try {
  const page = await browser.newPage({ viewport: { width: 390, height: 760 } });
  await page.goto(base + "/");

  // Record every status line the page shows while it waits.
  await page.evaluate(() => {
    window.seen = [];
    new MutationObserver(() => {
      for (const el of document.querySelectorAll("#log li.status")) {
        if (el.textContent && !window.seen.includes(el.textContent)) window.seen.push(el.textContent);
      }
    }).observe(document.getElementById("log"), { subtree: true, childList: true, characterData: true });
  });

  await page.fill("#question", "I wan check my balance");
  await page.click("#send");
  await page.waitForFunction(() => [...document.querySelectorAll("#log li:not(.me):not(.status)")].length >= 1, null, { timeout: 20000 });
  const first = await page.evaluate(() => ({
    answers: [...document.querySelectorAll("#log li:not(.me):not(.status)")].map((li) => li.textContent),
    seen: window.seen,
  }));

  await page.fill("#question", "Where is my order?");
  await page.dblclick("#send");
  await page.waitForFunction(() => [...document.querySelectorAll("#log li:not(.me):not(.status)")].length >= 2, null, { timeout: 20000 });
  const mine = await page.evaluate(() => document.querySelectorAll("#log li.me").length);
  const session = await page.evaluate(() => localStorage.getItem("sabi-session"));
  const history = await (await fetch(`${base}/chat/history?session_id=${encodeURIComponent(session)}`)).json();
  // A reload shows the conversation again from the history (read a page at a time).
  await page.reload();
  await page.waitForFunction(() => document.querySelectorAll("#log li.me").length >= 2, null, { timeout: 20000 });
  const reloaded = await page.evaluate(() => ({
    mine: [...document.querySelectorAll("#log li.me")].map((li) => li.textContent),
    answers: [...document.querySelectorAll("#log li:not(.me):not(.status)")].map((li) => li.textContent),
  }));
  await page.screenshot({ path: screenshot, fullPage: true });
  console.log(JSON.stringify({ first, mine, asked: history.messages.length, reloaded }));
} finally {
  await browser.close();
}
