// Drives the chat page in Debian's Chromium: ask for the menu, see its choices as buttons, tap
// one, and see it asked and answered like a typed question.
// Usage: node choices.mjs BASE_URL. Prints one JSON line with what it saw.
import { chromium } from "playwright-core";

const [base] = process.argv.slice(2);
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"],
});
try {
  const page = await browser.newPage({ viewport: { width: 390, height: 760 } });
  await page.goto(base + "/");
  await page.fill("#question", "menu");
  await page.click("#send");
  await page.waitForSelector("button.choice", { timeout: 20000 });
  const buttons = await page.evaluate(() => [...document.querySelectorAll("button.choice")].map((b) => b.textContent));
  await page.click("button.choice >> text=Check my balance");
  await page.waitForFunction(() => [...document.querySelectorAll("#log li:not(.me):not(.status):not(.choices)")].length >= 2,
    null, { timeout: 20000 });
  const seen = await page.evaluate(() => ({
    mine: [...document.querySelectorAll("#log li.me")].map((li) => li.textContent),
    answers: [...document.querySelectorAll("#log li:not(.me):not(.status):not(.choices)")].map((li) => li.textContent),
    left: document.querySelectorAll("button.choice").length,
  }));
  console.log(JSON.stringify({ buttons, ...seen }));
} finally {
  await browser.close();
}
