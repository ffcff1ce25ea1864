// The official openai SDK against a running `tierlm serve` (TIERLM_BASE_URL, e.g. http://127.0.0.1:5413/v1) with the
// tierlm-tiny model. Exits non-zero on the first failed check.
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
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
  await assert.rejects(client.chat.completions.create({ model, messages, n: 17 }), (e) => {
    assert.ok(e instanceof OpenAI.BadRequestError);
    assert.equal(e.status, 400);
    assert.equal(e.param, "n");
    return true;
  });
  // A field the server does not implement is refused by name, never ignored.
  await assert.rejects(client.chat.completions.create({ model, messages, store: true }), (e) => {
    assert.equal(e.status, 400);
    assert.equal(e.param, "store");
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

const tools = [{
  type: "function",
  function: { name: "get_weather", description: "Weather for a city",
              parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] } },
}];

await check("tools: a tool result reaches the template, the reply round-trips (streamed == not)", async () => {
  // A tool call written by the client in history: this asserts the protocol (the result reaches the prompt).
  const convo = (result) => [
    { role: "user", content: "What is the weather in Paris?" },
    { role: "assistant", content: null,
      tool_calls: [{ id: "call_1", type: "function", function: { name: "get_weather", arguments: "{\"city\":\"Paris\"}" } }] },
    { role: "tool", tool_call_id: "call_1", content: result },
  ];
  const short = await client.chat.completions.create({ model, messages: convo("18 C"), tools, max_tokens: 8, temperature: 0 });
  const long = await client.chat.completions.create({
    model, messages: convo("18 C, light rain from the west, humidity 80 percent"), tools, max_tokens: 8, temperature: 0 });
  assert.ok(long.usage.prompt_tokens > short.usage.prompt_tokens, "the tool result is in the prompt");
  const m = short.choices[0].message;
  assert.ok(["stop", "length", "tool_calls"].includes(short.choices[0].finish_reason));
  assert.ok(m.tool_calls === undefined || Array.isArray(m.tool_calls));
  const stream = await client.chat.completions.create({
    model, messages: convo("18 C"), tools, max_tokens: 8, temperature: 0, stream: true });
  let content = "", calls = 0, finish = null;
  for await (const chunk of stream) {
    const c = chunk.choices[0];
    if (!c) continue;
    content += c.delta.content ?? "";
    calls += (c.delta.tool_calls ?? []).length;
    if (c.finish_reason) finish = c.finish_reason;
  }
  assert.equal(content, m.content ?? "");
  assert.equal(calls, (m.tool_calls ?? []).length);
  assert.equal(finish, short.choices[0].finish_reason);
});

// The embedded default model is trained on tool dialogs (tools/train_default_model.py): with tool_choice auto it
// decides to call the tool by itself, and answers from the tool's result once the test has run the tool.
await check("tool loop on the trained default model: it calls get_weather, the result comes back, it answers", async () => {
  const weather = [{ type: "function", function: { name: "get_weather", description: "Get the current weather in a city",
    parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] } } }];
  const ask = [{ role: "user", content: "What is the weather in Paris?" }];
  const first = await client.chat.completions.create({ model, messages: ask, tools: weather, max_tokens: 64, temperature: 0 });
  const c = first.choices[0];
  assert.equal(c.finish_reason, "tool_calls", JSON.stringify(c.message));
  assert.equal(c.message.tool_calls.length, 1);
  const call = c.message.tool_calls[0];
  assert.equal(call.function.name, "get_weather");
  assert.deepEqual(JSON.parse(call.function.arguments), { city: "Paris" });
  const stream = await client.chat.completions.create({ model, messages: ask, tools: weather, max_tokens: 64,
                                                         temperature: 0, stream: true });
  let args = "", name = "", finish = null;
  for await (const chunk of stream) {
    const d = chunk.choices[0];
    if (!d) continue;
    for (const t of d.delta.tool_calls ?? []) { name += t.function?.name ?? ""; args += t.function?.arguments ?? ""; }
    if (d.finish_reason) finish = d.finish_reason;
  }
  assert.equal(finish, "tool_calls");
  assert.equal(name, "get_weather");
  assert.deepEqual(JSON.parse(args), { city: "Paris" });
  // The tool runs here; its result goes back as a tool message and the model answers from it. The result is written
  // as the training dialogs wrote results (Python's json.dumps: ", " and ": "): this 5 M-parameter model does not
  // generalize to other spellings (with JSON.stringify's compact form it answered "It is 1 degrees and sun in Paris.").
  const result = '{"temperature": 18, "condition": "sunny"}';
  const second = await client.chat.completions.create({ model, tools: weather, max_tokens: 64, temperature: 0,
    messages: [...ask, c.message, { role: "tool", tool_call_id: call.id, content: result }] });
  const answer = second.choices[0];
  assert.equal(answer.finish_reason, "stop", JSON.stringify(answer.message));
  assert.ok(!answer.message.tool_calls?.length, JSON.stringify(answer.message));
  assert.match(answer.message.content, /18/, "the answer uses the tool's result");
  assert.match(answer.message.content, /Paris/);
});

// The oracle for constrained arguments: python3-jsonschema (the validator tests/server/structured_output_test.py uses).
function assertValidates(schema, instance) {
  const script = "import json, sys, jsonschema\nd = json.load(sys.stdin)\njsonschema.validate(d['instance'], d['schema'])";
  const r = spawnSync("python3", ["-c", script], { input: JSON.stringify({ schema, instance }), encoding: "utf8" });
  assert.equal(r.status, 0, `${JSON.stringify(instance)} fails its parameters schema: ${r.stderr}`);
}

// The embedded model was not trained on these tools: its strings are bounded so that a forced call always closes.
const weatherTool = { type: "function",
  function: { name: "get_weather", description: "Weather for a city",
              parameters: { type: "object", properties: { city: { type: "string", maxLength: 24 } }, required: ["city"] } } };
const forcedTools = [
  weatherTool,
  { type: "function",
    function: { name: "book_table", description: "Book a restaurant table",
                parameters: { type: "object", additionalProperties: false, required: ["restaurant", "guests", "time"],
                              properties: { restaurant: { type: "string", maxLength: 40 },
                                            guests: { type: "integer" },
                                            time: { type: "string", enum: ["18:00", "19:30", "21:00"] },
                                            notes: { type: "array", items: { type: "string", maxLength: 20 },
                                                     maxItems: 2 } } } } },
];
const schemaOf = (name) => forcedTools.find((t) => t.function.name === name).function.parameters;

async function streamedCalls(request) {
  const stream = await client.chat.completions.create({ ...request, stream: true });
  const calls = [];
  let content = "", finish = null;
  for await (const chunk of stream) {
    const c = chunk.choices[0];
    if (!c) continue;
    content += c.delta.content ?? "";
    for (const d of c.delta.tool_calls ?? []) {
      calls[d.index] ??= { name: "", arguments: "" };
      calls[d.index].name += d.function?.name ?? "";
      calls[d.index].arguments += d.function?.arguments ?? "";
    }
    if (c.finish_reason) finish = c.finish_reason;
  }
  return { calls, content, finish };
}

await check("tool_choice required / named: constrained calls whose arguments validate (streamed == not)", async () => {
  const ask = [{ role: "user", content: "Book a table for four at Chez Paul tonight." }];
  const cases = [
    { tool_choice: "required", parallel_tool_calls: false, names: forcedTools.map((t) => t.function.name) },
    { tool_choice: "required", names: forcedTools.map((t) => t.function.name) },
    { tool_choice: { type: "function", function: { name: "book_table" } }, names: ["book_table"] },
    { tool_choice: { type: "function", function: { name: "get_weather" } }, names: ["get_weather"] },
  ];
  for (const { names, ...choice } of cases) {
    const request = { model, messages: ask, tools: forcedTools, ...choice, max_tokens: 300, temperature: 0 };
    const r = await client.chat.completions.create(request);
    const c = r.choices[0];
    const what = JSON.stringify(choice);
    assert.equal(c.finish_reason, "tool_calls", `${what}: ${JSON.stringify(c.message)}`);
    assert.ok(c.message.tool_calls.length >= 1, what);
    if (choice.parallel_tool_calls === false || typeof choice.tool_choice === "object")
      assert.equal(c.message.tool_calls.length, 1, what);
    for (const call of c.message.tool_calls) {
      assert.ok(names.includes(call.function.name), `${what}: called ${call.function.name}`);
      assertValidates(schemaOf(call.function.name), JSON.parse(call.function.arguments));
    }
    const s = await streamedCalls(request);
    assert.equal(s.finish, "tool_calls", what);
    assert.equal(s.content, c.message.content ?? "");
    assert.deepEqual(s.calls, c.message.tool_calls.map((t) => ({ name: t.function.name, arguments: t.function.arguments })));
  }
  // Two constraints at once, and a tool_choice naming no offered tool, are refused.
  await assert.rejects(client.chat.completions.create({ model, messages: ask, tools, tool_choice: "required",
                                                        response_format: { type: "json_object" } }),
                       (e) => e.status === 400 && e.param === "response_format");
  await assert.rejects(client.chat.completions.create({ model, messages: ask, tools,
                                                        tool_choice: { type: "function", function: { name: "nope" } } }),
                       (e) => e.status === 400 && e.param === "tool_choice");
});

await check("tool loop: a forced call, the tool's result sent back, a final answer", async () => {
  const convo = [{ role: "user", content: "What is the weather in Oslo?" }];
  const first = await client.chat.completions.create({
    model, messages: convo, tools: [weatherTool], tool_choice: { type: "function", function: { name: "get_weather" } },
    max_tokens: 100, temperature: 0 });
  const call = first.choices[0].message.tool_calls[0];
  assert.equal(call.function.name, "get_weather");
  const args = JSON.parse(call.function.arguments);
  assertValidates(weatherTool.function.parameters, args);
  convo.push(first.choices[0].message);
  convo.push({ role: "tool", tool_call_id: call.id, content: `${args.city}: 4 C, snow` });
  const final = await client.chat.completions.create({ model, messages: convo, tools: [weatherTool], max_tokens: 60,
                                                       temperature: 0 });
  const m = final.choices[0].message;
  assert.ok(["stop", "length"].includes(final.choices[0].finish_reason), JSON.stringify(final.choices[0]));
  assert.ok(m.tool_calls === undefined || m.tool_calls.length === 0, JSON.stringify(m));
  assert.ok(typeof m.content === "string" && m.content.trim().length > 0, JSON.stringify(m));
  console.log(`  tool loop: ${call.function.name}(${call.function.arguments}) -> ${JSON.stringify(m.content)}`);
});

await check("n > 1: choices batched, seeded, streamed chunks reassemble each choice", async () => {
  const req = { model, messages, max_tokens: 10, temperature: 1, seed: 77, n: 3 };
  const r = await client.chat.completions.create(req);
  assert.deepEqual(r.choices.map((c) => c.index), [0, 1, 2]);
  const texts = r.choices.map((c) => c.message.content);
  const s = await client.chat.completions.create({ ...req, stream: true });
  const streamed = ["", "", ""];
  for await (const chunk of s) for (const c of chunk.choices) streamed[c.index] += c.delta.content ?? "";
  assert.deepEqual(streamed, texts);
  assert.ok(r.usage.completion_tokens >= 3);
});

await check("logit_bias forces a token; logprobs bytes are the tokens' raw bytes", async () => {
  const plain = await client.chat.completions.create({ model, messages, max_tokens: 6, temperature: 0, logprobs: true });
  const lp = plain.choices[0].logprobs.content;
  const bytes = Buffer.from(lp.flatMap((t) => t.bytes));
  assert.equal(bytes.toString("utf8"), plain.choices[0].message.content);
  const forced = await client.chat.completions.create({
    model, messages, max_tokens: 6, temperature: 0, logprobs: true, logit_bias: { "300": 100 } });
  const toks = forced.choices[0].logprobs.content.map((t) => t.token);
  assert.equal(toks.length, 6);
  assert.ok(toks.every((t) => t === toks[0]), JSON.stringify(toks));
  assert.notEqual(forced.choices[0].message.content, plain.choices[0].message.content);
  await assert.rejects(client.chat.completions.create({ model, messages, logit_bias: { "99999999": 1 } }),
                       (e) => e.status === 400 && e.param === "logit_bias");
});

await check("models.retrieve: the model, 404 for any other id", async () => {
  const m = await client.models.retrieve(model);
  assert.equal(m.id, model);
  assert.equal(m.object, "model");
  await assert.rejects(client.models.retrieve("gpt-4o"), (e) => {
    assert.ok(e instanceof OpenAI.NotFoundError);
    assert.equal(e.code, "model_not_found");
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
