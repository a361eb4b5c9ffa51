// Drives the chat page in Debian's Chromium through a hand-off: ask for a person, a person
// replies through the admin API, the reply shows on the open page without a reload, and the
// visitor's next message goes to that person. Records every console error and failed request.
// Usage: node handoff.mjs BASE_URL ADMIN_TOKEN SCREENSHOT_PATH. Prints one JSON line.
import { chromium } from "playwright-core";

const [base, token, screenshot] = process.argv.slice(2);
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"],
});
const admin = async (method, path, body) => {
  const res = await fetch(base + path, {
    method, headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
    body: body ? JSON.stringify(body) : undefined,
  });
  return res.json();
};
try {
  const page = await browser.newPage({ viewport: { width: 390, height: 760 } });
  const errors = [];
  page.on("console", (m) => { if (m.type() === "error" || m.type() === "warning") errors.push(`${m.text()} ${m.location().url || ""}`.trim()); });
  page.on("pageerror", (e) => errors.push(String(e)));
  page.on("response", (r) => { if (r.status() >= 400) errors.push(`${r.status()} ${r.url()}`); });
  await page.goto(base + "/");

  await page.fill("#question", "I want to talk to a person");
  await page.click("#send");
  await page.waitForFunction(() => [...document.querySelectorAll("#log li.status.error")].length >= 1, null, { timeout: 20000 });
  const handedOff = await page.evaluate(() => document.querySelector("#log li.status.error").textContent);

  // A person answers at the desk's API; the open page shows it without a reload.
  const queue = await admin("GET", "/admin/review");
  const item = queue.items.find((i) => i.channel === "webchat");
  const started = Date.now();
  await admin("POST", `/admin/review/${item.id}/reply`, { text: "Hello, I am Ada from the team." });
  await page.waitForFunction(() => [...document.querySelectorAll("#log li.person")].length >= 1, null, { timeout: 10000 });
  const shownAfterMs = Date.now() - started;
  const seen = await page.evaluate(() => ({
    person: [...document.querySelectorAll("#log li.person")].map((li) => li.textContent),
    joined: [...document.querySelectorAll("#log li.joined")].map((li) => li.textContent),
  }));

  // The visitor answers back: it goes to the person.
  await page.fill("#question", "My order 1234 never came");
  await page.click("#send");
  await page.waitForFunction(() => [...document.querySelectorAll("#log li.status")].some((li) => li.textContent === "Sent to our team."), null, { timeout: 20000 });
  await page.screenshot({ path: screenshot, fullPage: true });
  console.log(JSON.stringify({
    handedOff, shownAfterMs, ...seen, item: item.id, errors,
  }));
} finally {
  await browser.close();
}
