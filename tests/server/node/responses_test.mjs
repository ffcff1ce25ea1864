// The official openai SDK's Responses API (client.responses.create / .stream) against a running `tierlm serve`
// (TIERLM_BASE_URL) with the tierlm-tiny model: plain, streamed (the SDK's strict stream accumulator checks every
// event's order and identity), text.format json_schema, and a function-call round trip. Exits non-zero on the first
// failed check.
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import OpenAI from "openai";
import { checker, packageVersion } from "./check.mjs";

const baseURL = process.env.TIERLM_BASE_URL;
assert.ok(baseURL, "TIERLM_BASE_URL is not set");
const client = new OpenAI({ baseURL, apiKey: process.env.TIERLM_API_KEY ?? "unused", maxRetries: 0, timeout: 30000 });
const model = "tierlm-tiny";
const { check, passed } = checker();

// The oracle for constrained output: python3-jsonschema.
function assertValidates(schema, instance) {
  const script = "import json, sys, jsonschema\nd = json.load(sys.stdin)\njsonschema.validate(d['instance'], d['schema'])";
  const r = spawnSync("python3", ["-c", script], { input: JSON.stringify({ schema, instance }), encoding: "utf8" });
  assert.equal(r.status, 0, `${JSON.stringify(instance)} fails its schema: ${r.stderr}`);
}

// Every event of a raw stream, checked against the order OpenAI sends them in: created, in_progress, then each
// output item added -> (content part added -> deltas -> done -> part done) -> item done, and one terminal event.
async function collect(request) {
  const stream = await client.responses.create({ ...request, stream: true });
  const events = [];
  for await (const e of stream) events.push(e);
  assert.deepEqual(events.map((e) => e.sequence_number), events.map((_, i) => i), "sequence numbers");
  assert.equal(events[0].type, "response.created");
  assert.equal(events[1].type, "response.in_progress");
  const last = events[events.length - 1];
  assert.ok(["response.completed", "response.incomplete"].includes(last.type), last.type);
  let open = null;  // the output index being streamed
  let next = 0;
  for (const e of events.slice(2, -1)) {
    if (e.type === "response.output_item.added") {
      assert.equal(open, null, "an item opens while another is open");
      assert.equal(e.output_index, next++);
      open = e.output_index;
    } else {
      assert.equal(e.output_index, open, `${e.type} outside its item`);
      if (e.type === "response.output_item.done") open = null;
    }
  }
  assert.equal(open, null, "an item never closed");
  return { events, response: last.response };
}

const input = "def add(a, b):";
const instructions = "You write short Python functions.";
let plain;
await check("responses.create: a response object with output_text and usage", async () => {
  plain = await client.responses.create({ model, input, instructions, max_output_tokens: 16, temperature: 0 });
  assert.equal(plain.object, "response");
  assert.equal(plain.model, model);
  assert.ok(plain.id.startsWith("resp_"));
  assert.ok(["completed", "incomplete"].includes(plain.status));
  if (plain.status === "incomplete") assert.equal(plain.incomplete_details.reason, "max_output_tokens");
  assert.equal(plain.output[0].type, "message");
  assert.equal(plain.output[0].role, "assistant");
  assert.equal(typeof plain.output_text, "string");
  assert.ok(plain.output_text.length > 0);
  assert.equal(plain.instructions, instructions);
  assert.ok(plain.usage.input_tokens > 0);
  assert.equal(plain.usage.total_tokens, plain.usage.input_tokens + plain.usage.output_tokens);
  assert.ok(plain.usage.output_tokens <= 16);
});

await check("responses.create stream: events in OpenAI's order, deltas join to the non-streamed text", async () => {
  const { events, response } = await collect({ model, input, instructions, max_output_tokens: 16, temperature: 0 });
  const text = events.filter((e) => e.type === "response.output_text.delta").map((e) => e.delta).join("");
  assert.equal(text, plain.output_text);
  const done = events.find((e) => e.type === "response.output_text.done");
  assert.equal(done.text, plain.output_text);
  assert.equal(response.status, plain.status);
  assert.equal(response.output[0].content[0].text, plain.output_text);
  assert.equal(response.usage.output_tokens, plain.usage.output_tokens);
});

await check("responses.stream helper: the SDK's accumulator builds the same response", async () => {
  const stream = client.responses.stream({ model, input, instructions, max_output_tokens: 16, temperature: 0 });
  let deltas = "";
  stream.on("response.output_text.delta", (e) => { deltas += e.delta; });
  const final = await stream.finalResponse();
  assert.equal(final.output_text, plain.output_text);
  assert.equal(deltas, plain.output_text);
});

await check("text.format json_schema: the output validates", async () => {
  const schema = { type: "object", additionalProperties: false, required: ["name", "year"],
                   properties: { name: { type: "string", maxLength: 20 }, year: { type: "integer" } } };
  const request = { model, input: "A Python release as JSON.", max_output_tokens: 200, temperature: 0,
                    text: { format: { type: "json_schema", name: "release", schema, strict: true } } };
  const r = await client.responses.create(request);
  assert.equal(r.status, "completed", JSON.stringify(r.output));
  assertValidates(schema, JSON.parse(r.output_text));
  const { response } = await collect(request);
  assert.equal(response.output[0].content[0].text, r.output_text);
});

const weather = { type: "function", name: "get_weather", description: "Weather for a city",
                  parameters: { type: "object", properties: { city: { type: "string", maxLength: 24 } },
                                required: ["city"] } };

await check("function-call round trip: forced call, its output sent back, a final answer (streamed == not)", async () => {
  const convo = [{ role: "user", content: "What is the weather in Oslo?" }];
  const request = { model, input: convo, tools: [weather], tool_choice: { type: "function", name: "get_weather" },
                    max_output_tokens: 100, temperature: 0 };
  const first = await client.responses.create(request);
  assert.equal(first.status, "completed");
  const calls = first.output.filter((o) => o.type === "function_call");
  assert.equal(calls.length, 1, JSON.stringify(first.output));
  const call = calls[0];
  assert.equal(call.name, "get_weather");
  assert.ok(call.call_id.length > 0);
  const args = JSON.parse(call.arguments);
  assertValidates(weather.parameters, args);
  // Streamed: the same call, its arguments in function_call_arguments events.
  const { events, response } = await collect(request);
  const streamedCall = response.output.find((o) => o.type === "function_call");
  assert.equal(streamedCall.name, call.name);
  assert.equal(streamedCall.arguments, call.arguments);
  const deltas = events.filter((e) => e.type === "response.function_call_arguments.delta").map((e) => e.delta);
  assert.equal(deltas.join(""), call.arguments);
  assert.equal(events.find((e) => e.type === "response.function_call_arguments.done").arguments, call.arguments);
  // The SDK's accumulator over the same stream.
  const helper = await client.responses.stream(request).finalResponse();
  assert.equal(helper.output.find((o) => o.type === "function_call").arguments, call.arguments);
  // The round trip: the previous output items go back as input, with the call's output.
  const next = [...convo, ...first.output, { type: "function_call_output", call_id: call.call_id,
                                             output: `${args.city}: 4 C, snow` }];
  const final = await client.responses.create({ model, input: next, tools: [weather], max_output_tokens: 60,
                                                temperature: 0 });
  assert.ok(["completed", "incomplete"].includes(final.status));
  assert.equal(final.output.filter((o) => o.type === "function_call").length, 0, JSON.stringify(final.output));
  assert.ok(final.output_text.trim().length > 0, JSON.stringify(final.output));
  assert.ok(final.usage.input_tokens > first.usage.input_tokens, "the call and its output are in the prompt");
  console.log(`  round trip: ${call.name}(${call.arguments}) -> ${JSON.stringify(final.output_text)}`);
});

await check("no server-side storage, unknown fields and hosted tools: 400 naming the field", async () => {
  const refused = async (extra, param) =>
    assert.rejects(client.responses.create({ model, input, max_output_tokens: 4, ...extra }), (e) => {
      assert.ok(e instanceof OpenAI.BadRequestError, String(e));
      assert.equal(e.param, param);
      return true;
    });
  await refused({ store: true }, "store");
  await refused({ previous_response_id: "resp_123" }, "previous_response_id");
  await refused({ include: ["reasoning.encrypted_content"] }, "include");
  await refused({ tools: [{ type: "web_search" }] }, "tools[0].type");
  await assert.rejects(client.responses.create({ model: "gpt-4o", input }), (e) => e.status === 404);
});

console.log(`openai SDK ${packageVersion("openai")} responses: ${passed()} checks passed`);
