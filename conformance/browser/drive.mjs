// Drives headless Chromium (Debian's, through puppeteer-core: no browser download) through the
// pages of a plan, and fails on anything a real front end would trip over: console errors (CORS
// blocks are reported there), uncaught page errors, failed requests, HTTP errors, any "[ag-ui]..."
// client warning, a rejected run, or an unexpected outcome.
//
// Usage: node browser/drive.mjs < plan.json
//   {"timeoutMs": 120000, "pages": [
//     {"name": "allowed", "page": "http://127.0.0.1:A/", "config": {url, token, threadId,
//      forwardedProps, messages}, "expect": ["interrupt", "success", "success"]},
//     {"name": "blocked", "page": "http://127.0.0.1:B/", "config": {...}, "expect": "blocked"},
//     {"name": "reattach", "page": ..., "config": {..., "mode": "reattach", "dropAfter": 5},
//      "expect": ["success"], "dropsStream": true}]}
// "expect" lists the outcome of every run, resumes included; "blocked" means the browser must
// refuse the page's first call (an origin the gateway does not allow).
// Prints one JSON report line on stdout; exit status 0 only when every check passed.

import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import puppeteer from "puppeteer-core";

async function readStdin() {
  const chunks = [];
  for await (const c of process.stdin) chunks.push(c);
  return JSON.parse(Buffer.concat(chunks).toString("utf8"));
}

const plan = await readStdin();
const timeoutMs = plan.timeoutMs ?? 120000;
const problems = [];
const report = { pages: [] };

async function visit(browser, spec) {
  // A fresh context per page: no preflight cache or storage carried from one page to the next.
  const context = await browser.createBrowserContext();
  const page = await context.newPage();
  const seen = { name: spec.name, console: [], pageErrors: [], failedRequests: [], badResponses: [], preflights: [], eventsResponses: [], clicks: 0, agui: null };
  page.on("console", (m) => seen.console.push({ type: m.type(), text: m.text() }));
  page.on("pageerror", (e) => seen.pageErrors.push(String(e?.message ?? e)));
  page.on("requestfailed", (r) => seen.failedRequests.push(`${r.method()} ${r.url()}: ${r.failure()?.errorText}`));
  page.on("response", (r) => {
    // Chromium reports CORS preflights too: the report shows the bearer token really caused them.
    if (r.request().method() === "OPTIONS") seen.preflights.push(`${r.status()} ${r.url()}`);
    if (r.status() >= 400) seen.badResponses.push(`${r.status()} ${r.request().method()} ${r.url()}`);
    // The statuses of a re-attaching page's `GET …/events` requests, in order.
    if (r.request().method() === "GET" && new URL(r.url()).pathname.endsWith("/events")) seen.eventsResponses.push(r.status());
  });
  const url = `${spec.page}?cfg=${encodeURIComponent(JSON.stringify(spec.config))}`;
  const deadline = Date.now() + timeoutMs;
  try {
    await page.goto(url, { waitUntil: "load", timeout: timeoutMs });
    // Click "Allow" whenever the page shows a pending interrupt, until the page says it is done.
    for (;;) {
      await page.waitForFunction(
        () => window.__agui?.done || document.querySelector("button.allow:not([disabled])"),
        { polling: 100, timeout: Math.max(1, deadline - Date.now()) },
      );
      if (await page.evaluate(() => window.__agui?.done === true)) break;
      await page.click("button.allow:not([disabled])");
      seen.clicks++;
    }
    seen.agui = await page.evaluate(() => window.__agui);
  } catch (e) {
    problems.push(`${spec.name}: ${e?.name}: ${e?.message}`);
    seen.agui = await page.evaluate(() => window.__agui ?? null).catch(() => null);
  }
  await context.close();
  return seen;
}

function checkAllowed(spec, seen) {
  const p = (m) => problems.push(`${spec.name}: ${m}`);
  for (const c of seen.console) {
    if (c.type === "error") p(`console error: ${c.text}`);
    else if (c.text.startsWith("[ag-ui]")) p(`client warning: ${c.text}`);
    else if (/CORS/i.test(c.text)) p(`CORS: ${c.text}`);
  }
  for (const e of seen.pageErrors) p(`page error: ${e}`);
  for (const r of seen.failedRequests) {
    // A page that drops its own stream on purpose (re-attach) aborts that one request.
    if (spec.dropsStream && r.startsWith("POST ") && r.endsWith("net::ERR_ABORTED")) continue;
    // An `EventSource` closes itself on the 204 that tells it the run is over; Chromium may
    // report that request as cancelled, when it cancels before the empty answer completes.
    if (spec.dropsStream && r.startsWith("GET ") && r.endsWith("net::ERR_ABORTED")
        && seen.eventsResponses.at(-1) === 204) continue;
    p(`request failed: ${r}`);
  }
  for (const r of seen.badResponses) p(`HTTP error: ${r}`);
  const runs = seen.agui?.runs ?? [];
  const outcomes = runs.map((r) => r.outcome);
  if (JSON.stringify(outcomes) !== JSON.stringify(spec.expect)) {
    p(`expected outcomes ${JSON.stringify(spec.expect)}, got ${JSON.stringify(outcomes)}`);
  }
  runs.forEach((r, i) => {
    if (r.error) p(`run ${i}: runAgent rejected: ${r.error}`);
    if (r.types[0] !== "RUN_STARTED") p(`run ${i}: first event is ${r.types[0]}`);
    const terminals = r.types.filter((t) => t === "RUN_FINISHED" || t === "RUN_ERROR").length;
    if (terminals !== 1 || !["RUN_FINISHED", "RUN_ERROR"].includes(r.types.at(-1))) {
      p(`run ${i}: expected exactly one terminal event as the last event: ${r.types.join(",")}`);
    }
    if (r.runStarted && r.runStarted.threadId !== spec.config.threadId) p(`run ${i}: foreign threadId ${r.runStarted.threadId}`);
  });
  const interrupts = spec.expect.filter((o) => o === "interrupt").length;
  if (seen.clicks !== interrupts) p(`clicked Allow ${seen.clicks} times for ${interrupts} interrupted runs`);
}

function checkBlocked(spec, seen) {
  const p = (m) => problems.push(`${spec.name}: ${m}`);
  const runs = seen.agui?.runs ?? [];
  if (runs.length !== 1 || !runs[0].error || runs[0].types.length !== 0) {
    p(`expected one run rejected by the browser before any event, got ${JSON.stringify(runs)}`);
  }
  // The refusal must be the browser's CORS decision, not some other failure.
  if (!seen.console.some((c) => c.type === "error" && /CORS policy/.test(c.text))) {
    p(`no CORS error in the console: ${JSON.stringify(seen.console)}`);
  }
  for (const e of seen.pageErrors) p(`page error: ${e}`);
}

const profile = await mkdtemp(join(tmpdir(), "agui-chromium-"));
let browser;
try {
  browser = await puppeteer.launch({
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    headless: true, // --headless=new
    userDataDir: profile,
    // The background-networking flags keep Chromium from dialling out (refused on a closed
    // network); puppeteer passes some of them too, they are repeated here on purpose.
    // `chromiumArgs`: the plan's own (such as trusting a test's certificate by its key).
    args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
      "--disable-background-networking", "--disable-component-update", "--disable-sync",
      ...(plan.chromiumArgs ?? [])],
    timeout: 60000,
  });
  report.browser = await browser.version();
  for (const spec of plan.pages) {
    const seen = await visit(browser, spec);
    report.pages.push(seen);
    if (spec.expect === "blocked") checkBlocked(spec, seen);
    else checkAllowed(spec, seen);
  }
} catch (e) {
  problems.push(`driver: ${e?.name}: ${e?.message}`);
} finally {
  await browser?.close().catch(() => {});
  await rm(profile, { recursive: true, force: true });
}

report.ok = problems.length === 0;
report.problems = problems;
process.stdout.write(JSON.stringify(report) + "\n");
process.exit(report.ok ? 0 : 1);
