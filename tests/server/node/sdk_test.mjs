// The official openai SDK against a running `tierlm serve` (TIERLM_BASE_URL, e.g. http://127.0.0.1:5413/v1) with the
// tierlm-tiny model. Exits non-zero on the first failed check.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import OpenAI from "openai";

const sdkVersion = JSON.parse(readFileSync(new URL("./node_modules/openai/package.json", import.meta.url))).version;

const baseURL = process.env.TIERLM_BASE_URL;
assert.ok(baseURL, "TIERLM_BASE_URL is not set");
const client = new OpenAI({ baseURL, apiKey: process.env.TIERLM_API_KEY ?? "unused", maxRetries: 0, timeout: 30000 });
const model = "tierlm-tiny";
const results = [];

async function check(name, fn) {
  const t0 = performance.now();
  await fn();
  results.push(`ok   ${name} (${(performance.now() - t0).toFixed(0)} ms)`);
  console.log(results[results.length - 1]);
}

const messages = [
  { role: "system", content: "You write short Python functions." },
  { role: "user", content: "def add(a, b):" },
];

await check("models.list", async () => {
  const list = await client.models.list();
  const ids = [];
  for await (const m of list) ids.push(m.id);
  assert.deepEqual(ids, [model]);
});

let greedyText;
await check("chat.completions.create (non-streaming)", async () => {
  const r = await client.chat.completions.create({ model, messages, max_tokens: 16, temperature: 0 });
  assert.equal(r.object, "chat.completion");
  assert.equal(r.model, model);
  assert.equal(r.choices.length, 1);
  assert.equal(r.choices[0].message.role, "assistant");
  assert.equal(typeof r.choices[0].message.content, "string");
  assert.ok(["stop", "length"].includes(r.choices[0].finish_reason));
  assert.ok(r.usage.prompt_tokens > 0);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
  greedyText = r.choices[0].message.content;
});

await check("chat.completions.create (streaming, include_usage) equals non-streaming", async () => {
  const stream = await client.chat.completions.create({
    model, messages, max_tokens: 16, temperature: 0, stream: true, stream_options: { include_usage: true },
  });
  let text = "", role = null, finish = null, usage = null, chunks = 0;
  for await (const chunk of stream) {
    chunks++;
    assert.equal(chunk.object, "chat.completion.chunk");
    if (chunk.usage) usage = chunk.usage;
    if (!chunk.choices.length) continue;
    const c = chunk.choices[0];
    if (c.delta.role) role = c.delta.role;
    if (c.delta.content) text += c.delta.content;
    if (c.finish_reason) finish = c.finish_reason;
  }
  assert.equal(role, "assistant");
  assert.equal(text, greedyText);
  assert.ok(finish === "stop" || finish === "length");
  assert.ok(usage && usage.completion_tokens > 0, "usage chunk");
  assert.ok(chunks >= 3);
});

await check("chat with every role (system, user, assistant, tool) and the helper stream API", async () => {
  const runner = client.chat.completions.stream({
    model, max_completion_tokens: 8, temperature: 0,
    messages: [
      { role: "system", content: "sys" },
      { role: "user", content: [{ type: "text", text: "call the tool" }] },
      { role: "assistant", content: null, tool_calls: [{ id: "call_1", type: "function", function: { name: "f", arguments: "{\"x\":1}" } }] },
      { role: "tool", tool_call_id: "call_1", content: "42" },
    ],
  });
  const final = await runner.finalChatCompletion();
  assert.equal(final.choices[0].message.role, "assistant");
  assert.ok(final.usage === undefined || final.usage === null || final.usage.completion_tokens <= 8);
});

await check("completions.create (non-streaming and streaming)", async () => {
  const prompt = "def fibonacci(n):";
  const r = await client.completions.create({ model, prompt, max_tokens: 12, temperature: 0, logprobs: 2 });
  assert.equal(r.object, "text_completion");
  assert.equal(r.usage.completion_tokens, r.choices[0].logprobs.tokens.length);
  assert.equal(r.choices[0].logprobs.tokens.join(""), r.choices[0].text);
  const s = await client.completions.create({ model, prompt, max_tokens: 12, temperature: 0, stream: true });
  let text = "";
  for await (const chunk of s) text += chunk.choices[0]?.text ?? "";
  assert.equal(text, r.choices[0].text);
});

await check("sampling: seed reproducible, stop strings, penalties, top_k/min_p", async () => {
  const req = { model, messages, max_tokens: 20, temperature: 0.9, top_p: 0.95, seed: 1234, presence_penalty: 0.5,
                frequency_penalty: 0.3 };
  const a = await client.chat.completions.create(req);
  const b = await client.chat.completions.create(req);
  assert.equal(a.choices[0].message.content, b.choices[0].message.content);
  const extra = await client.chat.completions.create({ ...req, top_k: 20, min_p: 0.05 });
  assert.equal(typeof extra.choices[0].message.content, "string");
  const full = greedyText;
  const stop = full.slice(3, 5);
  if (stop.length === 2) {
    const r = await client.chat.completions.create({ model, messages, max_tokens: 16, temperature: 0, stop: [stop] });
    assert.equal(r.choices[0].message.content, full.slice(0, full.indexOf(stop)));
    assert.equal(r.choices[0].finish_reason, "stop");
  }
});

await check("errors surface as SDK exceptions with OpenAI bodies", async () => {
  await assert.rejects(client.chat.completions.create({ model, messages, n: 2 }), (e) => {
    assert.ok(e instanceof OpenAI.BadRequestError);
    assert.equal(e.status, 400);
    assert.equal(e.param, "n");
    return true;
  });
  await assert.rejects(client.chat.completions.create({ model: "gpt-4o", messages }), (e) => {
    assert.ok(e instanceof OpenAI.NotFoundError);
    assert.equal(e.code, "model_not_found");
    return true;
  });
  await assert.rejects(client.completions.create({ model, prompt: "x", max_tokens: 100000 }), (e) => {
    assert.equal(e.status, 400);
    assert.equal(e.code, "context_length_exceeded");
    return true;
  });
});

await check("aborting a stream cancels the generation on the server", async () => {
  const metric = async () => {
    const text = await (await fetch(baseURL.replace(/\/v1$/, "") + "/metrics", {
      headers: { Authorization: `Bearer ${process.env.TIERLM_API_KEY ?? ""}` },
    })).text();
    return Number(/^tierlm_sequences_cancelled_total (\S+)$/m.exec(text)[1]);
  };
  const before = await metric();
  const controller = new AbortController();
  const stream = await client.completions.create(
    { model, prompt: "x", max_tokens: 900, stream: true, ignore_eos: true }, { signal: controller.signal });
  let n = 0;
  try {
    for await (const chunk of stream) {
      void chunk;
      if (++n === 2) controller.abort();
    }
  } catch (e) {
    assert.ok(e instanceof OpenAI.APIUserAbortError || e.name === "AbortError", String(e));
  }
  let after = before;
  for (let i = 0; i < 200 && after === before; i++) {
    await new Promise((r) => setTimeout(r, 10));
    after = await metric();
  }
  assert.equal(after, before + 1);
});

console.log(`openai SDK ${sdkVersion}: ${results.length} checks passed`);
