// bench/peer/llamacpp_peer.mjs — llama.cpp's side of bench/peer.sh, through node-llama-cpp's prebuilt CPU library:
// loads a GGUF with a thread count, prefills the same token-id prompt as tierlm_peer, decodes greedily, and prints
// one JSON line with the same fields (prefill and decode tok/s, the greedy tokens).
// Prefill time runs from the prompt's submission to the first generated token (as tierlm_peer counts it); decode
// tok/s is (tokens - 1) over the time from the first to the last token. A warm-up round runs first.
//
// Usage: node llamacpp_peer.mjs MODEL.gguf FORMAT THREADS PROMPT_TOKENS DECODE_TOKENS
import {getLlama, LlamaLogLevel} from "node-llama-cpp";

const [modelPath, format, threadsArg, promptArg, decodeArg] = process.argv.slice(2);
if (!decodeArg) {
    console.error("usage: node llamacpp_peer.mjs MODEL.gguf FORMAT THREADS PROMPT_TOKENS DECODE_TOKENS");
    process.exit(2);
}
const threads = Number(threadsArg), promptTokens = Number(promptArg), decodeTokens = Number(decodeArg);

const llama = await getLlama({gpu: false, build: "never", maxThreads: 0, logLevel: LlamaLogLevel.error});
const model = await llama.loadModel({modelPath, gpuLayers: 0});
const vocab = Number(model.fileInfo.metadata.llama.vocab_size);
// The same ids as tierlm_peer's prompt_ids().
const promptIds = n => Array.from({length: n}, (_, i) => 300 + (i * 7919) % (vocab - 300));
const context = await model.createContext({
    contextSize: promptTokens + decodeTokens + 64, batchSize: 512, threads, sequences: 1
});
const sequence = context.getSequence();

async function generate(prompt, n) {
    const tokens = [];
    const start = performance.now();
    let first = 0, last = 0;
    for await (const token of sequence.evaluate(prompt, {temperature: 0})) {
        last = performance.now();
        if (tokens.length === 0) first = last;
        tokens.push(token);
        if (tokens.length >= n) break;
    }
    await sequence.clearHistory();
    return {tokens, prefillSeconds: (first - start) / 1000, decodeSeconds: (last - first) / 1000};
}

await generate(promptIds(16), 4);
const run = await generate(promptIds(promptTokens), decodeTokens);
console.log(JSON.stringify({
    engine: "llama.cpp", format, threads: context.currentThreads, prompt_tokens: promptTokens,
    prefill_tps: +(promptTokens / run.prefillSeconds).toFixed(2),
    decode_tps: +((run.tokens.length - 1) / run.decodeSeconds).toFixed(2),
    tokens: run.tokens
}));
await context.dispose();
await model.dispose();
