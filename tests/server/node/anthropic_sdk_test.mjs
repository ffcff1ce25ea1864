// The official @anthropic-ai/sdk against a running `tierlm serve` (TIERLM_ROOT_URL) with the tierlm-tiny model:
// messages, streaming (the SDK checks the event sequence), a tool_use -> tool_result round trip, count_tokens,
// errors in Anthropic's shape, and the key sent as x-api-key. Exits non-zero on the first failed check.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import Anthropic from "@anthropic-ai/sdk";

const sdkVersion = JSON.parse(readFileSync(new URL("./node_modules/@anthropic-ai/sdk/package.json", import.meta.url))).version;
const baseURL = process.env.TIERLM_ROOT_URL;
assert.ok(baseURL, "TIERLM_ROOT_URL is not set");
// apiKey goes out as x-api-key (no Authorization header): the keyed run checks the server takes it.
const client = new Anthropic({ baseURL, apiKey: process.env.TIERLM_API_KEY ?? "unused", maxRetries: 0, timeout: 30000 });
const model = "tierlm-tiny";
let passed = 0;

async function check(name, fn) {
  const t0 = performance.now();
  await fn();
  passed++;
  console.log(`ok   ${name} (${(performance.now() - t0).toFixed(0)} ms)`);
}

const messages = [{ role: "user", content: "def add(a, b):" }];
let greedy;

await check("messages.create", async () => {
  const m = await client.messages.create({ model, max_tokens: 12, temperature: 0, system: "You write Python.", messages });
  assert.equal(m.type, "message");
  assert.equal(m.role, "assistant");
  assert.equal(m.model, model);
  assert.ok(m.id.startsWith("msg_"));
  assert.equal(m.content[0].type, "text");
  assert.ok(["end_turn", "max_tokens"].includes(m.stop_reason));
  assert.ok(m.usage.input_tokens > 0 && m.usage.output_tokens > 0);
  greedy = m;
});

await check("messages.stream: event sequence and final message equal the non-streamed one", async () => {
  const types = [];
  const raw = await client.messages.create({ model, max_tokens: 12, temperature: 0, system: "You write Python.",
                                             messages, stream: true });
  let text = "";
  for await (const ev of raw) {
    types.push(ev.type);
    if (ev.type === "content_block_delta" && ev.delta.type === "text_delta") text += ev.delta.text;
  }
  assert.equal(types[0], "message_start");
  assert.equal(types.at(-1), "message_stop");
  assert.equal(types.at(-2), "message_delta");
  assert.ok(types.includes("content_block_start") && types.includes("content_block_stop"));
  assert.equal(text, greedy.content[0].text);
  const final = await client.messages.stream({ model, max_tokens: 12, temperature: 0, system: "You write Python.",
                                               messages }).finalMessage();
  assert.equal(final.content[0].text, greedy.content[0].text);
  assert.equal(final.stop_reason, greedy.stop_reason);
  assert.equal(final.usage.output_tokens, greedy.usage.output_tokens);
});

const tools = [{ name: "get_weather", description: "Weather for a city",
                 input_schema: { type: "object", properties: { city: { type: "string" } }, required: ["city"] } }];
const roundTrip = (result) => [
  { role: "user", content: "Weather in Paris?" },
  { role: "assistant", content: [{ type: "text", text: "Checking." },
                                 { type: "tool_use", id: "toolu_01", name: "get_weather", input: { city: "Paris" } }] },
  { role: "user", content: [{ type: "tool_result", tool_use_id: "toolu_01", content: result }] },
];

await check("tool_use -> tool_result round trip reaches the template; count_tokens agrees", async () => {
  // The embedded model was never trained on tools: this asserts the protocol, not that it calls the tool.
  const m = await client.messages.create({ model, max_tokens: 8, temperature: 0, tools, messages: roundTrip("18 C") });
  assert.ok(["end_turn", "max_tokens", "tool_use"].includes(m.stop_reason));
  for (const block of m.content) assert.ok(["text", "tool_use"].includes(block.type));
  const short = await client.messages.countTokens({ model, tools, messages: roundTrip("18 C") });
  const long = await client.messages.countTokens({ model, tools,
                                                   messages: roundTrip("18 C, light rain, humidity 80 percent") });
  assert.equal(short.input_tokens, m.usage.input_tokens);
  assert.ok(long.input_tokens > short.input_tokens, "the tool result is in the prompt");
});

await check("stop_sequences end the message with stop_reason stop_sequence", async () => {
  const text = greedy.content[0].text;
  const stop = text.slice(3, 5);
  if (stop.length === 2 && text.indexOf(stop) >= 0) {
    const m = await client.messages.create({ model, max_tokens: 12, temperature: 0, system: "You write Python.",
                                             messages, stop_sequences: [stop] });
    assert.equal(m.stop_reason, "stop_sequence");
    assert.equal(m.stop_sequence, stop);
    assert.equal(m.content[0].text, text.slice(0, text.indexOf(stop)));
  }
});

await check("errors come back in Anthropic's shape as SDK exceptions", async () => {
  await assert.rejects(client.messages.create({ model: "not-a-model-here", max_tokens: 8, messages }), (e) => {
    assert.ok(e instanceof Anthropic.NotFoundError, String(e));
    assert.equal(e.error.type, "error");
    assert.equal(e.error.error.type, "not_found_error");
    return true;
  });
  await assert.rejects(client.messages.create({ model, max_tokens: 8, messages, service_tier: "auto" }), (e) => {
    assert.ok(e instanceof Anthropic.BadRequestError);
    assert.equal(e.error.error.type, "invalid_request_error");
    assert.match(e.error.error.message, /service_tier/);
    return true;
  });
  // tool_choice any: the grammar engine forces a tool_use whose input has the tool's schema's required keys (the
  // string is bounded: the embedded model was not trained on this tool, so its call must close within max_tokens).
  const bounded = [{ ...tools[0], input_schema: { type: "object", required: ["city"],
                                                  properties: { city: { type: "string", maxLength: 24 } } } }];
  const forced = await client.messages.create({ model, max_tokens: 100, messages, tools: bounded,
                                                tool_choice: { type: "any", disable_parallel_tool_use: true } });
  assert.equal(forced.stop_reason, "tool_use", JSON.stringify(forced.content));
  const use = forced.content.find((b) => b.type === "tool_use");
  assert.equal(use.name, "get_weather");
  assert.equal(typeof use.input.city, "string");
  if (process.env.TIERLM_API_KEY) {
    const wrong = new Anthropic({ baseURL, apiKey: "wrong-key", maxRetries: 0 });
    await assert.rejects(wrong.messages.create({ model, max_tokens: 8, messages }), (e) => {
      assert.ok(e instanceof Anthropic.AuthenticationError);
      assert.equal(e.error.error.type, "authentication_error");
      return true;
    });
  }
});

console.log(`@anthropic-ai/sdk ${sdkVersion}: ${passed} checks passed`);
