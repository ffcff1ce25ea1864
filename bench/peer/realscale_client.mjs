// bench/peer/realscale_client.mjs — the user's side of bench/realscale.sh: the official openai SDK asks a running
// `tierlm serve` for streamed completions (one at a time), and /health is read when the first token arrives and
// after the last, so the tier's counters (disk bytes, hits, misses, prefetches, read stall) are split into decode
// alone. Prints one JSON line with per-request and total decode figures.
//
// Usage: node realscale_client.mjs BASE_URL PROMPT_FILE[,PROMPT_FILE...] MAX_TOKENS
import OpenAI from "openai";
import {readFileSync} from "node:fs";

const [baseURL, promptFiles, maxTokensArg] = process.argv.slice(2);
if (!maxTokensArg) {
    console.error("usage: node realscale_client.mjs BASE_URL PROMPT_FILE[,PROMPT_FILE...] MAX_TOKENS");
    process.exit(2);
}
const maxTokens = Number(maxTokensArg);
const client = new OpenAI({baseURL: `${baseURL}/v1`, apiKey: "unused", maxRetries: 0, timeout: 3600 * 1000});
const health = async () => (await (await fetch(`${baseURL}/health`)).json());
const counterNames = ["disk_bytes_read", "disk_reads", "cache_hits", "cache_misses", "prefetches", "prefetch_hits",
    "prefetch_wasted", "read_stall_seconds", "moe_seconds", "expert_compute_seconds", "inline_conversion_seconds",
    "conversion_wait_seconds"];
const tierOf = h => Object.fromEntries(counterNames.map(k => [k, Number(h.tiering?.[k] ?? 0)]));

const model = (await client.models.list()).data[0].id;
const requests = [];
const total = Object.fromEntries(counterNames.map(k => [k, 0]));
let decodeTokens = 0, decodeSeconds = 0;
for (const [i, file] of promptFiles.split(",").entries()) {
    const prompt = readFileSync(file, "utf8");
    const start = performance.now();
    let first = 0, last = 0, chunks = 0, usage = null, atFirst = null;
    const stream = await client.completions.create({
        model, prompt, max_tokens: maxTokens, temperature: 0.8, seed: 1000 + i, stream: true,
        stream_options: {include_usage: true}, ignore_eos: true
    });
    for await (const chunk of stream) {
        if (chunk.usage) usage = chunk.usage;
        if (!chunk.choices?.length || !chunk.choices[0].text) continue;
        last = performance.now();
        if (chunks++ === 0) {
            first = last;
            atFirst = tierOf(await health());
        }
    }
    const atEnd = tierOf(await health());
    const tokens = usage?.completion_tokens ?? chunks;
    const seconds = (last - first) / 1000;
    const delta = Object.fromEntries(counterNames.map(k => [k, atEnd[k] - atFirst[k]]));
    // The first token's own step ran before atFirst was read: decode covers tokens 2..n.
    requests.push({prompt: file.split("/").pop(), prompt_tokens: usage?.prompt_tokens, completion_tokens: tokens,
        ttft_s: +((first - start) / 1000).toFixed(3), decode_tps: +((tokens - 1) / seconds).toFixed(3), decode: delta});
    decodeTokens += tokens - 1;
    decodeSeconds += seconds;
    for (const k of counterNames) total[k] += delta[k];
}
const h = await health();
console.log(JSON.stringify({
    engine: "tierlm", decode_tokens: decodeTokens, decode_seconds: +decodeSeconds.toFixed(3),
    decode_tps: +(decodeTokens / decodeSeconds).toFixed(3), decode: total, requests,
    memory: h.memory, health_tiering: h.tiering, kv: h.kv ?? null
}));
