#include "server/dashboard.h"

namespace tierlm::server {

namespace {
// The page itself holds no data and is served without the key; every route it reads needs the key when the server
// has one. The key comes from the page's #key=... fragment (never sent in a request for the page) or from the
// prompt the page shows when the stream answers 401; it is kept in sessionStorage (this tab only) and sent as
// 'Authorization: Bearer' on the stream, read with fetch() so the key never goes into a URL.
constexpr std::string_view kPage = R"HTML(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>tierlm</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
  body { font: 14px/1.4 system-ui, sans-serif; margin: 0; background: #0f1419; color: #d8dee9; }
  header { padding: 12px 20px; background: #1b2129; display: flex; gap: 24px; align-items: baseline; flex-wrap: wrap; }
  header h1 { font-size: 18px; margin: 0; }
  .stat b { color: #fff; font-variant-numeric: tabular-nums; }
  main { display: grid; grid-template-columns: repeat(auto-fit, minmax(420px, 1fr)); gap: 16px; padding: 16px 20px; }
  section { background: #1b2129; border-radius: 6px; padding: 10px 12px; }
  section h2 { font-size: 14px; margin: 0 0 6px; font-weight: 600; }
  canvas { width: 100%; height: 200px; display: block; }
  .legend span { display: inline-block; margin-right: 12px; font-size: 12px; }
  .legend i { display: inline-block; width: 10px; height: 10px; margin-right: 4px; vertical-align: middle; }
  #status.down { color: #e06c75; }
  #key-form { display: flex; gap: 8px; align-items: baseline; }
  #key-form[hidden] { display: none; }
  #key-form input { background: #0f1419; color: #d8dee9; border: 1px solid #3b4252; border-radius: 4px; padding: 3px 6px; }
  #key-form button { background: #3b4252; color: #fff; border: 0; border-radius: 4px; padding: 4px 10px; cursor: pointer; }
  #key-note { color: #e5c07b; font-size: 12px; }
</style>
</head>
<body>
<header>
  <h1>tierlm</h1>
  <span class="stat">status <b id="status">connecting</b></span>
  <span class="stat">generation <b id="toks">0</b> tok/s</span>
  <span class="stat">prefill <b id="prefill">0</b> tok/s</span>
  <span class="stat">hit rate <b id="hit">0</b>%</span>
  <span class="stat">RSS <b id="rss">0</b></span>
  <span class="stat">ledger <b id="ram">0</b></span>
  <span class="stat">in flight <b id="inflight">0</b></span>
  <span class="stat">KV <b id="kv">0</b></span>
  <span class="stat">snapshots <b id="updates">0</b></span>
  <form id="key-form" hidden>
    <input id="api-key" type="password" placeholder="API key" autocomplete="off" aria-label="API key">
    <button type="submit">Connect</button>
    <span id="key-note"></span>
  </form>
</header>
<main>
  <section><h2>Memory by tier and account</h2><canvas id="memory"></canvas><div class="legend" id="memory-legend"></div></section>
  <section><h2>Throughput (tok/s)</h2><canvas id="throughput"></canvas>
    <div class="legend"><span><i style="background:#61afef"></i>generation</span><span><i style="background:#c678dd"></i>prefill</span></div></section>
  <section><h2>Expert cache hit rate</h2><canvas id="hitrate"></canvas><div class="legend" id="hit-note"></div></section>
</main>
<script>
"use strict";
const HISTORY = 120;
const samples = [];
const palette = ["#61afef", "#98c379", "#e5c07b", "#c678dd", "#56b6c2", "#e06c75", "#d19a66", "#abb2bf"];
function bytes(n) {
  if (n == null) return "n/a";
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return n.toFixed(i ? 1 : 0) + " " + u[i];
}
function setup(canvas) {
  const ratio = window.devicePixelRatio || 1;
  const w = canvas.clientWidth || 400, h = canvas.clientHeight || 200;
  if (canvas.width !== w * ratio) { canvas.width = w * ratio; canvas.height = h * ratio; }
  const ctx = canvas.getContext("2d");
  ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
  ctx.clearRect(0, 0, w, h);
  return { ctx, w, h };
}
function axes(c, max, format) {
  const { ctx, w, h } = c;
  ctx.strokeStyle = "#2c333d"; ctx.fillStyle = "#7f8894"; ctx.font = "11px system-ui";
  for (let i = 0; i <= 4; i++) {
    const y = 8 + (h - 24) * i / 4;
    ctx.beginPath(); ctx.moveTo(60, y); ctx.lineTo(w - 4, y); ctx.stroke();
    ctx.fillText(format(max * (4 - i) / 4), 2, y + 4);
  }
}
function xOf(c, i) { return 60 + (c.w - 64) * i / (HISTORY - 1); }
function yOf(c, v, max) { return 8 + (c.h - 24) * (1 - (max > 0 ? v / max : 0)); }
function line(c, values, max, color) {
  const { ctx } = c;
  const off = HISTORY - values.length;
  ctx.strokeStyle = color; ctx.lineWidth = 2; ctx.beginPath();
  values.forEach((v, i) => { const x = xOf(c, off + i), y = yOf(c, v, max); i ? ctx.lineTo(x, y) : ctx.moveTo(x, y); });
  ctx.stroke();
}
function drawMemory() {
  const c = setup(document.getElementById("memory"));
  const names = new Set();
  samples.forEach(s => Object.keys(s.memory || {}).forEach(k => names.add(k)));
  const accounts = [...names].sort();
  let max = 1;
  samples.forEach(s => {
    let sum = 0; accounts.forEach(a => sum += (s.memory[a] || 0));
    Object.entries(s.tiers || {}).forEach(([t, v]) => { if (t !== "ram") sum += v; });
    max = Math.max(max, sum, s.rss_bytes || 0);
  });
  axes(c, max * 1.1, bytes);
  const off = HISTORY - samples.length;
  const base = samples.map(() => 0);
  const layers = accounts.map(a => ({ name: "ram: " + a, values: samples.map(s => s.memory[a] || 0) }));
  const tiers = new Set();
  samples.forEach(s => Object.keys(s.tiers || {}).forEach(t => { if (t !== "ram") tiers.add(t); }));
  [...tiers].forEach(t => layers.push({ name: t, values: samples.map(s => (s.tiers || {})[t] || 0) }));
  layers.forEach((layer, li) => {
    const { ctx } = c;
    ctx.fillStyle = palette[li % palette.length]; ctx.globalAlpha = 0.75; ctx.beginPath();
    layer.values.forEach((v, i) => { const x = xOf(c, off + i), y = yOf(c, base[i] + v, max * 1.1); i ? ctx.lineTo(x, y) : ctx.moveTo(x, y); });
    for (let i = layer.values.length - 1; i >= 0; i--) ctx.lineTo(xOf(c, off + i), yOf(c, base[i], max * 1.1));
    ctx.closePath(); ctx.fill(); ctx.globalAlpha = 1;
    layer.values.forEach((v, i) => base[i] += v);
  });
  line(c, samples.map(s => s.rss_bytes || 0), max * 1.1, "#ffffff");
  document.getElementById("memory-legend").innerHTML =
    layers.map((l, i) => `<span><i style="background:${palette[i % palette.length]}"></i>${l.name}</span>`).join("") +
    `<span><i style="background:#fff"></i>RSS</span>`;
}
function drawThroughput() {
  const c = setup(document.getElementById("throughput"));
  const gen = samples.map(s => s.generation_tokens_per_second || 0);
  const pre = samples.map(s => s.prefill_tokens_per_second || 0);
  const max = Math.max(1, ...gen, ...pre) * 1.1;
  axes(c, max, v => v.toFixed(0));
  line(c, gen, max, "#61afef");
  line(c, pre, max, "#c678dd");
}
function drawHitRate() {
  const c = setup(document.getElementById("hitrate"));
  axes(c, 100, v => v.toFixed(0) + "%");
  line(c, samples.map(s => 100 * (s.hit_rate || 0)), 100, "#98c379");
  const last = samples[samples.length - 1];
  document.getElementById("hit-note").textContent = last && !last.tiering_available
    ? "no expert tier attached: hit rate and disk reads read zero" : "disk read: " + bytes(last ? last.disk_bytes_read : 0);
}
function update(s) {
  samples.push(s);
  if (samples.length > HISTORY) samples.shift();
  document.getElementById("status").textContent = "live";
  document.getElementById("status").className = "";
  document.getElementById("toks").textContent = (s.generation_tokens_per_second || 0).toFixed(1);
  document.getElementById("prefill").textContent = (s.prefill_tokens_per_second || 0).toFixed(1);
  document.getElementById("hit").textContent = (100 * (s.hit_rate || 0)).toFixed(1);
  document.getElementById("rss").textContent = bytes(s.rss_bytes);
  document.getElementById("ram").textContent = bytes((s.tiers || {}).ram || 0);
  document.getElementById("inflight").textContent = s.requests_in_flight;
  document.getElementById("kv").textContent = s.kv_positions_used + " / " + s.kv_positions_capacity;
  document.getElementById("updates").textContent = samples.length >= HISTORY ? HISTORY + "+" : String(samples.length);
  drawMemory(); drawThroughput(); drawHitRate();
}
function setStatus(text, down) {
  const st = document.getElementById("status");
  st.textContent = text;
  st.className = down ? "down" : "";
}
let key = new URLSearchParams(location.hash.slice(1)).get("key") || sessionStorage.getItem("tierlm-api-key") || "";
if (location.hash) {
  if (key) sessionStorage.setItem("tierlm-api-key", key);
  history.replaceState(null, "", location.pathname + location.search);  // the key leaves the address bar
}
const form = document.getElementById("key-form");
form.addEventListener("submit", e => {
  e.preventDefault();
  key = document.getElementById("api-key").value.trim();
  sessionStorage.setItem("tierlm-api-key", key);
  form.hidden = true;
  connect();
});
// Reads one text/event-stream body, calling update() with each event's JSON; returns when the stream ends.
async function readEvents(body) {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = event.split("\n").filter(l => l.startsWith("data:")).map(l => l.slice(5).trimStart()).join("\n");
      if (data) { try { update(JSON.parse(data)); } catch (err) { console.error(err); } }
    }
  }
}
// Keeps the telemetry stream open: reconnects with back-off when it drops, and asks for the key on 401.
let connecting = false;
async function connect() {
  if (connecting) return;
  connecting = true;
  let delay = 1000;
  try {
    for (;;) {
      let res = null;
      try {
        res = await fetch("/v1/telemetry", { headers: key ? { Authorization: "Bearer " + key } : {}, cache: "no-store" });
      } catch (err) { res = null; }
      if (res && res.status === 401) {
        setStatus("key needed", true);
        document.getElementById("key-note").textContent = key ? "that key was refused" : "this server needs its API key";
        form.hidden = false;
        document.getElementById("api-key").focus();
        return;
      }
      if (res && res.ok && res.body) {
        setStatus("connected");
        delay = 1000;
        try { await readEvents(res.body); } catch (err) { console.error(err); }
      }
      setStatus(res && !res.ok ? "reconnecting (HTTP " + res.status + ")" : "reconnecting", true);
      await new Promise(r => setTimeout(r, delay));
      delay = Math.min(2 * delay, 10000);
    }
  } finally {
    connecting = false;
  }
}
connect();
</script>
</body>
</html>
)HTML";
}  // namespace

std::string_view dashboard_html() { return kPage; }

}  // namespace tierlm::server
