// A person's path through the console, in headless Chromium (Debian's, through puppeteer-core):
// sign in, set the preset, send a turn, watch it stream, answer its permission interrupt with a
// click, find the run's session once in the thread's header (no chat line), cancel its execution through the extension, see the raw frames and export them, reload
// and find the thread with its history and state, rename and archive it; sending and answering by keyboard, and
// axe-core's check of the page (no serious or critical finding) twice on the way. Any
// console error, page error, failed request, HTTP error or Content-Security-Policy violation
// fails the run. Screenshots (the chat with an open interrupt, the raw frames) are written to
// `artifacts` and checked for being more than one colour.
//
// Usage: node e2e/drive.mjs < plan.json
//   {"url": "http://127.0.0.1:P/console/", "token": "…", "cwd": "/…", "prompt": "…",
//    "artifacts": "/dir", "timeoutMs": 120000}
// Prints one JSON report line; exit status 0 only when every check passed.

import { mkdir, mkdtemp, readFile, readdir, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import puppeteer from "puppeteer-core";

const chunks = [];
for await (const c of process.stdin) chunks.push(c);
const plan = JSON.parse(Buffer.concat(chunks).toString("utf8"));
const timeout = plan.timeoutMs ?? 120000;
const problems = [];
const report = { steps: [], console: [], csp: [] };
const step = (s) => report.steps.push(s);

/** How many distinct colours a PNG has (drawn in a blank page of the browser itself). */
async function colours(browser, png) {
  const page = await browser.newPage();
  try {
    return await page.evaluate(async (b64) => {
      const img = new Image();
      img.src = `data:image/png;base64,${b64}`;
      await img.decode();
      const c = document.createElement("canvas");
      c.width = img.width;
      c.height = img.height;
      const ctx = c.getContext("2d");
      ctx.drawImage(img, 0, 0);
      const d = ctx.getImageData(0, 0, c.width, c.height).data;
      const seen = new Set();
      for (let i = 0; i < d.length && seen.size < 64; i += 4 * 97) seen.add((d[i] << 16) | (d[i + 1] << 8) | d[i + 2]);
      return seen.size;
    }, png.toString("base64"));
  } finally {
    await page.close();
  }
}

async function shoot(browser, page, name) {
  const png = Buffer.from(await page.screenshot({ type: "png", fullPage: false }));
  await writeFile(join(plan.artifacts, name), png);
  const n = await colours(browser, png);
  report[name] = { bytes: png.length, colours: n };
  if (n < 4) problems.push(`${name} looks blank (${n} colours)`);
}

/** axe-core's serious and critical findings on the page as it is now. */
async function accessibility(page, when) {
  const source = await readFile(new URL("../node_modules/axe-core/axe.min.js", import.meta.url), "utf8");
  // Evaluated by the browser's debugging protocol, which the page's policy does not judge.
  await page.evaluate(source);
  const found = await page.evaluate(async () => {
    const r = await window.axe.run(document, { resultTypes: ["violations"] });
    return r.violations.map((v) => ({ id: v.id, impact: v.impact, help: v.help, nodes: v.nodes.map((n) => n.target.join(" ")).slice(0, 5) }));
  });
  report[`axe ${when}`] = found;
  for (const v of found) {
    if (v.impact === "serious" || v.impact === "critical") problems.push(`accessibility (${when}): ${v.id} ${v.help}: ${v.nodes.join(", ")}`);
  }
}

async function signIn(page) {
  await page.waitForSelector("#settings:not([hidden])", { timeout });
  await page.type("#token", plan.token);
  const cwd = await page.$eval("#cwd", (e) => e.value);
  if (!cwd) await page.type("#cwd", plan.cwd);
  await page.click("#settings button[type=submit]");
  await page.waitForSelector("#settings", { hidden: true, timeout });
}

const profile = await mkdtemp(join(tmpdir(), "console-chromium-"));
const downloads = await mkdtemp(join(tmpdir(), "console-downloads-"));
let browser;
try {
  await mkdir(plan.artifacts, { recursive: true });
  browser = await puppeteer.launch({
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    headless: true,
    userDataDir: profile,
    args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
      "--disable-background-networking", "--disable-component-update", "--disable-sync"],
    defaultViewport: { width: 1400, height: 900 },
    timeout: 60000,
  });
  const page = await browser.newPage();
  const origin = new URL(plan.url).origin;
  page.on("console", (m) => report.console.push({ type: m.type(), text: m.text() }));
  page.on("pageerror", (e) => problems.push(`page error: ${e?.message ?? e}`));
  page.on("requestfailed", (r) => {
    // A reload drops the running run's stream on purpose (re-attach); nothing else may fail.
    const aborted = r.failure()?.errorText === "net::ERR_ABORTED";
    const dropped = (plan.mode === "reattach" && r.method() === "POST" && aborted)
      || (plan.mode === "follow" && r.method() === "GET" && new URL(r.url()).pathname.endsWith("/connect") && aborted);
    if (!dropped) problems.push(`request failed: ${r.method()} ${r.url()}: ${r.failure()?.errorText}`);
  });
  page.on("request", (r) => {
    const u = r.url();
    if (!u.startsWith(origin) && !u.startsWith("data:") && !u.startsWith("blob:")) problems.push(`a request left the origin: ${u}`);
  });
  page.on("response", (r) => {
    if (r.status() >= 400) problems.push(`HTTP ${r.status()} ${r.request().method()} ${r.url()}`);
  });
  // Violations of the page's policy, as the page itself sees them (the listener is installed
  // by the browser, not by a script the policy would judge).
  await page.evaluateOnNewDocument(() => {
    window.__csp = [];
    document.addEventListener("securitypolicyviolation", (e) => window.__csp.push(`${e.violatedDirective} ${e.blockedURI}`));
  });
  const cdp = await page.createCDPSession();
  await cdp.send("Browser.setDownloadBehavior", { behavior: "allow", downloadPath: downloads });

  await page.goto(plan.url, { waitUntil: "load", timeout });
  await signIn(page);
  step("signed in");
  if (plan.mode === "reattach") {
    await reattach(page);
  } else if (plan.mode === "follow") {
    await follow(page);
  } else {
    await wholePath(page);
  }
  report.csp = await page.evaluate(() => window.__csp);
  for (const v of report.csp) problems.push(`CSP violation: ${v}`);
} catch (e) {
  problems.push(`driver: ${e?.name}: ${e?.message}`);
  report.status = await browser?.pages().then((p) => p.at(-1)?.$eval("#run-status", (e) => e.textContent)).catch(() => null);
  report.chat = await browser?.pages().then((p) => p.at(-1)?.$eval("#messages", (e) => e.textContent.slice(-400))).catch(() => null);
} finally {
  for (const c of report.console) {
    if (c.type === "error") problems.push(`console error: ${c.text}`);
    else if (c.text.startsWith("[ag-ui]")) problems.push(`client warning: ${c.text}`);
  }
  await browser?.close().catch(() => {});
  await rm(profile, { recursive: true, force: true });
  await rm(downloads, { recursive: true, force: true });
}
report.ok = problems.length === 0;
report.problems = problems;
process.stdout.write(JSON.stringify(report) + "\n");
process.exit(report.ok ? 0 : 1);

/**
 * The session (`iac-code.session.v1`, several a run: after RUN_STARTED and again as the task and
 * session ids become known) is the thread's, shown once in its header: no chat line, the
 * header naming the last event's ids (the execution, task and session), every event still a frame.
 */
async function session(page) {
  const seen = await page.evaluate(() => {
    const s = window.__console.session ?? {};
    const chat = document.querySelector("main.chat").innerText;
    const count = (id) => (id ? chat.split(id).length - 1 : -1);
    return {
      header: document.getElementById("thread-session")?.textContent ?? null,
      lines: [...document.querySelectorAll("#messages li")].map((li) => li.textContent).filter((t) => /^session /.test(t)),
      // How often each id appears in the chat column (the header included): once each.
      shown: { executionId: count(s.executionId), taskId: count(s.taskId), sessionId: count(s.sessionId) },
      frames: [...document.querySelectorAll("#frame-rows tr td:nth-child(4)")].filter((td) => td.textContent.includes("iac-code.session.v1")).length,
    };
  });
  report.session = seen;
  if (seen.lines.length > 0) problems.push(`session lines in the chat: ${JSON.stringify(seen.lines)}`);
  if (seen.header === null) problems.push("no session in the thread's header");
  for (const [k, n] of Object.entries(seen.shown)) if (n !== 1) problems.push(`the session's ${k} shown ${n} times in the chat column, not once`);
  // Two runs (the turn and its answer), each with its session event and at least one more.
  if (seen.frames < 4) problems.push(`${seen.frames} session frames`);
  step("session in the header");
}

/** Content frames seen so far. */
function contentFrames(page) {
  return page.$$eval("#frame-rows tr td:nth-child(4)", (l) => l.filter((td) => td.textContent === "TEXT_MESSAGE_CONTENT").length);
}

/**
 * A run left by a reload (the gateway keeps it going, `--detach-grace`) is found running in the
 * thread list and followed again: the thread's history, then the rest of the run, to its end.
 */
async function reattach(page) {
  await page.type("#prompt", plan.prompt);
  await page.click("#send");
  await page.waitForFunction(() => [...document.querySelectorAll("#frame-rows tr td:nth-child(4)")]
    .filter((td) => td.textContent === "TEXT_MESSAGE_CONTENT").length >= 3, { timeout });
  report.before = await contentFrames(page);
  await page.reload({ waitUntil: "load", timeout });
  await signIn(page);
  await page.waitForSelector("button.thread", { timeout });
  report.listed = await page.$eval("button.thread", (b) => b.textContent);
  if (!report.listed.includes("running")) problems.push(`the thread is not listed as running: ${report.listed}`);
  await page.click("button.thread");
  await page.waitForFunction(() => (window.__console?.runs ?? []).length > 0, { timeout });
  report.runs = await page.evaluate(() => window.__console.runs);
  if (JSON.stringify(report.runs) !== JSON.stringify([{ how: "connect", outcome: "success" }])) problems.push(`runs: ${JSON.stringify(report.runs)}`);
  const types = await page.$$eval("#frame-rows tr td:nth-child(4)", (l) => l.map((td) => td.textContent));
  report.connectTypes = types;
  // The snapshot run, then the running run from its start.
  if (types.filter((t) => t === "RUN_STARTED").length < 2 || !types.includes("MESSAGES_SNAPSHOT")) problems.push(`connect frames: ${types.join(",")}`);
  const text = await page.$$eval("#messages .assistant .text", (l) => l.map((e) => e.textContent).join(""));
  if (!text.includes(plan.lastWords)) problems.push(`the run's end is not in the chat: ${text.slice(-200)}`);
  step("re-attached");
}

/**
 * A thread followed: opened with "Follow later runs", it shows a run another client starts on
 * it, until Stop.
 */
async function follow(page) {
  await page.type("#prompt", plan.prompt);
  await page.click("#send");
  await page.waitForFunction(() => (window.__console?.runs ?? []).length === 1, { timeout });
  step("first run over");
  await page.click("#follow");
  await page.waitForSelector("button.thread", { timeout });
  await page.click("button.thread");
  await page.waitForFunction(() => [...document.querySelectorAll("#frame-rows tr td:nth-child(4)")]
    .some((td) => td.textContent === "MESSAGES_SNAPSHOT"), { timeout });
  const threadId = await page.evaluate(() => window.__console.threadId);
  step("following");
  // Another client's turn on the thread (the same token, invocation and workspace).
  const r = await fetch(new URL("../", plan.url), {
    method: "POST",
    headers: { Authorization: `Bearer ${plan.token}`, "Content-Type": "application/json", Accept: "text/event-stream" },
    body: JSON.stringify({
      threadId, runId: crypto.randomUUID(), state: {}, tools: [], context: [],
      forwardedProps: { iacCode: { schemaVersion: 1, rosInvocationId: `console-${threadId}`, cwd: plan.cwd } },
      messages: [{ id: crypto.randomUUID(), role: "user", content: plan.second }],
    }),
  });
  const stream = await r.text();
  if (!r.ok || !stream.includes("RUN_FINISHED")) problems.push(`the other client's turn: HTTP ${r.status}: ${stream.slice(-300)}`);
  step("the other client's run over");
  await page.waitForFunction((words) => [...document.querySelectorAll("#messages .assistant .text")]
    .some((e) => e.textContent.includes(words)), { timeout }, plan.followedWords);
  report.following = await page.evaluate(() => window.__console.running);
  if (report.following !== true) problems.push("the thread was not followed");
  await page.click("#stop");
  await page.waitForFunction(() => window.__console.running === false, { timeout });
  step("followed");
}

async function wholePath(page) {
  // By keyboard: the message sent with Ctrl+Enter, the interrupt answered with Enter.

  await page.type("#prompt", plan.prompt);
  await page.keyboard.down("Control");
  await page.keyboard.press("Enter");
  await page.keyboard.up("Control");
  await page.waitForSelector(".interrupt button.choice", { timeout });
  step("interrupt shown");
  await accessibility(page, "with an open interrupt");
  await page.waitForFunction(() => document.querySelectorAll("#frame-rows tr").length > 0, { timeout });
  await shoot(browser, page, "console-interrupt.png");
  const allow = await page.$$eval(".interrupt button.choice", (bs) => bs.findIndex((b) => b.dataset.payload.includes("allow_once")));
  if (allow < 0) throw new Error("no Allow button");
  await (await page.$$(".interrupt button.choice"))[allow].focus();
  await page.keyboard.press("Enter");
  await page.waitForFunction(() => (window.__console?.runs ?? []).some((r) => r.how === "run" && r.outcome !== "interrupt"), { timeout });
  const runs = await page.evaluate(() => window.__console.runs);
  report.runs = runs;
  if (JSON.stringify(runs.map((r) => r.outcome)) !== JSON.stringify(["interrupt", "success"])) problems.push(`runs: ${JSON.stringify(runs)}`);
  step("answered");
  await session(page);
  // The extension's cancellation of the run's execution: over by now, so "already_terminal".
  await page.click("#cancel-execution");
  await page.waitForFunction(() => /^execution /.test(document.getElementById("run-status").textContent), { timeout });
  report.cancelled = await page.$eval("#run-status", (e) => e.textContent);
  if (!/already_terminal|cancelled/.test(report.cancelled)) problems.push(`cancel execution: ${report.cancelled}`);
  report.tools = await page.$$eval("#messages .tool", (l) => l.length);
  if (report.tools < 1) problems.push("no tool call in the chat");
  report.frames = await page.$$eval("#frame-rows tr", (l) => l.length);
  const types = await page.$$eval("#frame-rows tr td:nth-child(4)", (l) => l.map((td) => td.textContent));
  for (const t of ["RUN_STARTED", "TEXT_MESSAGE_CONTENT", "RUN_FINISHED"]) if (!types.includes(t)) problems.push(`no ${t} frame`);
  await page.click("#frame-rows tr");
  await page.waitForFunction(() => document.getElementById("frame-detail").textContent.includes("RUN_STARTED"), { timeout });
  await shoot(browser, page, "console-frames.png");
  await page.click("#export-frames");
  for (let i = 0; i < 50 && (await readdir(downloads)).filter((f) => f.endsWith(".ndjson")).length === 0; i++) {
    await new Promise((r) => setTimeout(r, 100));
  }
  const file = (await readdir(downloads)).find((f) => f.endsWith(".ndjson"));
  if (!file) problems.push("no NDJSON export");
  else {
    const lines = (await readFile(join(downloads, file), "utf8")).trim().split("\n").map((l) => JSON.parse(l));
    report.exported = lines.length;
    if (lines.length !== report.frames || lines[0].type !== "RUN_STARTED") problems.push(`export: ${lines.length} lines, first ${lines[0]?.type}`);
  }
  step("frames exported");

  // A reload: the token is gone (memory only), the preset stays; the thread is in the list and
  // its history comes back from the gateway.
  await page.reload({ waitUntil: "load", timeout });
  await signIn(page);
  await page.waitForSelector("button.thread", { timeout });
  report.threadsListed = await page.$$eval("button.thread", (l) => l.map((b) => b.textContent));
  await page.click("button.thread");
  await page.waitForFunction((text) => [...document.querySelectorAll("#messages .user")].some((li) => li.textContent.includes(text)),
    { timeout }, plan.prompt);
  await page.waitForFunction(() => document.querySelectorAll("#messages .tool").length > 0, { timeout });
  step("history after a reload");
  report.threadState = await page.$eval("#thread-state", (e) => e.textContent);
  if (!/last run success/.test(report.threadState)) problems.push(`thread state: ${report.threadState}`);
  await page.type("#new-title", "Renamed in the console");
  await page.click("#rename button[type=submit]");
  await page.waitForFunction(() => [...document.querySelectorAll("button.thread")].some((b) => b.textContent.startsWith("Renamed in the console")), { timeout });
  step("renamed");
  await page.click("#archive-thread");
  await page.waitForFunction(() => document.getElementById("run-status").textContent === "thread archived"
    && document.querySelectorAll("button.thread").length === 0, { timeout });
  await page.click("#show-archived");
  await page.waitForFunction(() => [...document.querySelectorAll("button.thread")].some((b) => b.textContent.startsWith("Renamed in the console")), { timeout });
  step("archived");
  // The operations strip: /health as the signed-in caller reads it, and the metrics link where
  // the listener serves /metrics (its target fetched as a person's click would).
  report.health = await page.$eval("#health", (e) => e.textContent);
  if (!/kernel ready/.test(report.health)) problems.push(`health: ${report.health}`);
  report.metricsLink = await page.$eval("#metrics-link", (a) => (a.hidden ? null : a.href));
  if (report.metricsLink) {
    const m = await fetch(report.metricsLink);
    report.metricsStatus = m.status;
    if (!(await m.text()).includes("agui_")) problems.push("the metrics link shows no gateway metric");
  }
  await accessibility(page, "at the end");
}
