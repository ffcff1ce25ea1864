// An agent framework from npm pointed at tierlm by base URL: the Vercel AI SDK (`ai`) with its
// @ai-sdk/openai-compatible provider runs a tool loop against a running `tierlm serve` (TIERLM_BASE_URL) with the
// tierlm-tiny model: step 1 must call the tool (toolChoice names it; the SDK validates the arguments against the
// zod schema and runs `execute`), step 2 sends the result back and gets a text answer. Streamed too. Exits non-zero
// on the first failed check.
import assert from "node:assert/strict";
import { generateText, streamText, stepCountIs, tool } from "ai";
import { createOpenAICompatible } from "@ai-sdk/openai-compatible";
import { z } from "zod";
import { checker, packageVersion } from "./check.mjs";

const baseURL = process.env.TIERLM_BASE_URL;
assert.ok(baseURL, "TIERLM_BASE_URL is not set");
const tierlm = createOpenAICompatible({ name: "tierlm", baseURL, apiKey: process.env.TIERLM_API_KEY ?? "unused" });
const model = tierlm.chatModel("tierlm-tiny");
const { check, passed } = checker();

const calls = [];
// The untrained tiny model's strings are bounded so that a forced call always closes.
const tools = {
  get_weather: tool({
    description: "Weather for a city",
    inputSchema: z.object({ city: z.string().max(24) }),
    execute: async ({ city }) => {
      calls.push(city);
      return `${city}: 4 C, snow`;
    },
  }),
};
// Step 0 must call get_weather; later steps may answer.
const prepareStep = ({ stepNumber }) =>
  stepNumber === 0 ? { toolChoice: { type: "tool", toolName: "get_weather" } } : { toolChoice: "auto" };

await check("generateText: a forced tool call, the SDK runs it, the result goes back, a final answer", async () => {
  calls.length = 0;
  const result = await generateText({
    model, tools, prepareStep, stopWhen: stepCountIs(2), maxOutputTokens: 60, temperature: 0, maxRetries: 0,
    prompt: "What is the weather in Oslo?",
  });
  assert.ok(result.steps.length >= 2, `steps: ${result.steps.length}`);
  const first = result.steps[0];
  assert.equal(first.finishReason, "tool-calls");
  assert.equal(first.toolCalls.length, 1);
  assert.equal(first.toolCalls[0].toolName, "get_weather");
  assert.equal(typeof first.toolCalls[0].input.city, "string");
  assert.deepEqual(calls, [first.toolCalls[0].input.city]);
  assert.equal(first.toolResults[0].output, `${calls[0]}: 4 C, snow`);
  assert.ok(result.text.trim().length > 0, JSON.stringify(result.steps.map((s) => s.finishReason)));
  assert.ok(result.totalUsage.inputTokens > first.usage.inputTokens, "the tool result is in the second prompt");
  console.log(`  ${first.toolCalls[0].toolName}(${JSON.stringify(first.toolCalls[0].input)}) -> ${JSON.stringify(result.text)}`);
});

await check("streamText: the same loop streamed, the same call and answer", async () => {
  const plain = await generateText({
    model, tools, prepareStep, stopWhen: stepCountIs(2), maxOutputTokens: 60, temperature: 0, maxRetries: 0,
    prompt: "What is the weather in Bergen?",
  });
  const streamed = streamText({
    model, tools, prepareStep, stopWhen: stepCountIs(2), maxOutputTokens: 60, temperature: 0, maxRetries: 0,
    prompt: "What is the weather in Bergen?",
  });
  let text = "";
  for await (const part of streamed.textStream) text += part;
  const steps = await streamed.steps;
  assert.equal(steps[0].toolCalls.length, 1);
  assert.deepEqual(steps[0].toolCalls[0].input, plain.steps[0].toolCalls[0].input);
  assert.equal(text, plain.text);
});

console.log(`ai ${packageVersion("ai")} with @ai-sdk/openai-compatible: ${passed()} checks passed`);
