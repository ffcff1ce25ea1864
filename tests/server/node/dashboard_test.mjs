// Loads the dashboard (GET /) of a running `tierlm serve` (TIERLM_ROOT_URL) in headless Chromium, drives it over the
// DevTools protocol (--remote-debugging-pipe: no port, no extra packages), sends some completions meanwhile, and
// checks that the page shows live numbers from the telemetry stream: status "live", snapshots arriving every
// second, a non-zero tok/s while generating, RSS and ledger bytes. With TIERLM_API_KEY set (the server was started
// with that key too) it first checks that only /health/live and the static page answer without the key, that the
// page asks for the key (status "key needed"), refuses a wrong one, and goes live once the right one is typed in.
// Saves a screenshot when DASHBOARD_SCREENSHOT is set. Exits 77 (skip) with a reason when Chromium is not installed.
import { spawn, execFileSync } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import assert from "node:assert/strict";

const root = process.env.TIERLM_ROOT_URL;
assert.ok(root, "TIERLM_ROOT_URL is not set");
const apiKey = process.env.TIERLM_API_KEY || "";
const auth = apiKey ? { Authorization: "Bearer " + apiKey } : {};
const browser = ["chromium", "chromium-browser", "google-chrome"].find((b) => {
  try { execFileSync("which", [b], { stdio: "ignore" }); return true; } catch { return false; }
});
if (!browser) {
  console.log("SKIP: chromium is not installed (apt-get install chromium; tools/setup.sh installs it)");
  process.exit(77);
}

const profile = mkdtempSync(join(tmpdir(), "tierlm-chromium-"));
const chrome = spawn(browser, [
  "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run",
  "--disable-dev-shm-usage", `--user-data-dir=${profile}`, "--remote-debugging-pipe", "--window-size=1280,900",
  "about:blank",
], { stdio: ["ignore", "ignore", "pipe", "pipe", "pipe"] });
let stderr = "";
chrome.stderr.on("data", (d) => { stderr += d; });
const deadline = setTimeout(() => { console.error("dashboard test: timed out\n" + stderr.slice(-2000)); finish(1); }, 60000);

// CDP over the pipe: JSON messages separated by NUL bytes; fd 3 is Chromium's input, fd 4 its output.
let nextId = 1, buffer = "";
const pending = new Map();
chrome.stdio[4].on("data", (chunk) => {
  buffer += chunk.toString("utf8");
  let nul;
  while ((nul = buffer.indexOf("\0")) >= 0) {
    const message = JSON.parse(buffer.slice(0, nul));
    buffer = buffer.slice(nul + 1);
    const p = pending.get(message.id);
    if (p) {
      pending.delete(message.id);
      message.error ? p.reject(new Error(JSON.stringify(message.error))) : p.resolve(message.result);
    }
  }
});
function send(method, params = {}, sessionId) {
  const id = nextId++;
  chrome.stdio[3].write(JSON.stringify({ id, method, params, ...(sessionId ? { sessionId } : {}) }) + "\0");
  return new Promise((resolve, reject) => pending.set(id, { resolve, reject }));
}
function finish(code) {
  clearTimeout(deadline);
  try { chrome.kill("SIGKILL"); } catch {}
  try { rmSync(profile, { recursive: true, force: true }); } catch {}
  process.exit(code);
}
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

try {
  if (apiKey) {
    for (const path of ["/health", "/metrics", "/v1/models", "/v1/telemetry?limit=1"]) {
      const r = await fetch(root + path);
      assert.equal(r.status, 401, `${path} without the key`);
      assert.match(r.headers.get("www-authenticate") || "", /^Bearer/, `${path}: WWW-Authenticate`);
    }
    const live = await fetch(root + "/health/live");
    assert.equal(live.status, 200);
    assert.deepEqual(await live.json(), { status: "ok" });
    assert.equal((await fetch(root + "/")).status, 200, "the static page loads without the key");
    assert.equal((await fetch(root + "/health", { headers: auth })).status, 200);
    console.log("ok   with --api-key only /health/live and the page answer without the key");
  }
  const { targetId } = await send("Target.createTarget", { url: root + "/" });
  const { sessionId } = await send("Target.attachToTarget", { targetId, flatten: true });
  const evaluate = async (expression) =>
    (await send("Runtime.evaluate", { expression, returnByValue: true }, sessionId)).result.value;
  const read = async () => JSON.parse(await evaluate(
    `JSON.stringify(Object.fromEntries(["status","toks","prefill","hit","rss","ram","inflight","kv","updates","key-note"]
      .map(id => [id, (document.getElementById(id) || {}).textContent])))`) ?? "{}");
  const waitFor = async (pred, what) => {
    let last = {};
    for (let i = 0; i < 80; i++) {
      last = await read();
      if (pred(last)) return last;
      await sleep(125);
    }
    throw new Error(`dashboard never showed ${what}: ${JSON.stringify(last)}`);
  };
  if (apiKey) {
    await waitFor((s) => s.status === "key needed", "the key prompt");
    assert.equal(await evaluate(`document.getElementById("key-form").hidden`), false, "the key form is shown");
    const typeKey = (k) => evaluate(`document.getElementById("api-key").value = ${JSON.stringify(k)};
      document.getElementById("key-form").requestSubmit(); true`);
    await typeKey("not-the-key");
    await waitFor((s) => s.status === "key needed" && s["key-note"] === "that key was refused", "a refused key");
    await typeKey(apiKey);
    console.log("ok   the page asked for the key and refused a wrong one");
  }
  // Traffic so the throughput chart has something to show.
  let generating = true;
  const traffic = (async () => {
    while (generating) {
      await fetch(root + "/v1/completions", {
        method: "POST", headers: { "Content-Type": "application/json", ...auth },
        body: JSON.stringify({ prompt: "def f(x):", max_tokens: 64, ignore_eos: true }),
      });
    }
  })();
  let last = {}, maxToks = 0, seen = [];
  for (let i = 0; i < 80; i++) {
    await sleep(250);
    last = await read();
    maxToks = Math.max(maxToks, parseFloat(last.toks) || 0);
    if (seen[seen.length - 1] !== last.updates) seen.push(last.updates);
    if (last.status === "live" && parseInt(last.updates) >= 4 && maxToks > 0) break;
  }
  generating = false;
  await traffic;
  console.log("dashboard shows:", JSON.stringify(last), "max tok/s seen:", maxToks, "snapshot counter went", seen.join(" -> "));
  if (process.env.DASHBOARD_SCREENSHOT) {
    const shot = await send("Page.captureScreenshot", { format: "png" }, sessionId);
    writeFileSync(process.env.DASHBOARD_SCREENSHOT, Buffer.from(shot.data, "base64"));
    console.log("screenshot:", process.env.DASHBOARD_SCREENSHOT);
  }
  assert.equal(last.status, "live", "the telemetry stream connected");
  assert.ok(parseInt(last.updates) >= 4, "at least 4 snapshots arrived (one per second)");
  assert.ok(maxToks > 0, "a non-zero generation tok/s was displayed while requests ran");
  assert.match(last.rss, /[KMG]iB$/, "RSS is shown in bytes units");
  assert.match(last.ram, /[KMG]iB$/, "ledger total is shown");
  assert.match(last.kv, /^\d+ \/ \d+$/, "KV positions used / capacity");
  console.log(`ok   dashboard shows live telemetry${apiKey ? " (server with an API key)" : ""}`);
  finish(0);
} catch (e) {
  console.error(e, stderr.slice(-2000));
  finish(1);
}
