// Drives the review desk's broadcasts in Debian's Chromium: see a broadcast's progress, pause
// it, and see it paused. Usage: node desk.mjs BASE_URL TOKEN SCREENSHOT_PATH. Prints one JSON
// line with what it saw.
import { chromium } from "playwright-core";

const [base, token, screenshot] = process.argv.slice(2);
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"],
});
try {
  const page = await browser.newPage({ viewport: { width: 900, height: 760 } });
  // The desk asks for the token once a session: it is already there.
  await page.addInitScript((t) => sessionStorage.setItem("sabi-admin-token", t), token);
  await page.goto(base + "/desk");
  await page.waitForSelector("#broadcasts progress", { timeout: 20000 });
  const before = await page.evaluate(() => ({
    card: document.querySelector("#broadcasts > li").textContent,
    progress: document.querySelector("#broadcasts progress").getAttribute("aria-label"),
  }));
  await page.click("#broadcasts button:text('Pause')");
  await page.waitForSelector("#broadcasts .state.paused", { timeout: 20000 });
  const after = await page.evaluate(() => ({
    card: document.querySelector("#broadcasts > li").textContent,
    buttons: [...document.querySelectorAll("#broadcasts button")].map((b) => b.textContent),
  }));
  await page.screenshot({ path: screenshot, fullPage: true });
  console.log(JSON.stringify({ before, after }));
} finally {
  await browser.close();
}
