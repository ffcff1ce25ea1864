// bench/peer/realscale_llamacpp.mjs — llama.cpp's side of bench/realscale.sh through node-llama-cpp's prebuilt CPU
// library: the GGUF memory-mapped (llama.cpp's default; the page cache of the cgroup it runs in holds what it can),
// a token-id prompt of the length tierlm's prompt had, then MAX_TOKENS sampled tokens (temperature 0.8, as the
// tierlm client asks). Decode tok/s is (tokens - 1) over the time from the first to the last token; the bytes this
// process read from the block device during decode come from /proc/self/io (read_bytes: page-cache misses).
// Prints one JSON line.
//
// Usage: node realscale_llamacpp.mjs MODEL.gguf THREADS PROMPT_TOKENS MAX_TOKENS
import {getLlama, LlamaLogLevel} from "node-llama-cpp";
import {readFileSync} from "node:fs";

const [modelPath, threadsArg, promptArg, maxArg] = process.argv.slice(2);
if (!maxArg) {
    console.error("usage: node realscale_llamacpp.mjs MODEL.gguf THREADS PROMPT_TOKENS MAX_TOKENS");
    process.exit(2);
}
const threads = Number(threadsArg), promptTokens = Number(promptArg), maxTokens = Number(maxArg);
const readBytes = () => Number(/read_bytes: (\d+)/.exec(readFileSync("/proc/self/io", "utf8"))[1]);

const loadStart = performance.now();
const llama = await getLlama({gpu: false, build: "never", maxThreads: 0, logLevel: LlamaLogLevel.error});
const model = await llama.loadModel({modelPath, gpuLayers: 0, useMmap: true, useMlock: false});
const context = await model.createContext({contextSize: promptTokens + maxTokens + 64, batchSize: 512, threads,
    sequences: 1});
const loadSeconds = (performance.now() - loadStart) / 1000;
const sequence = context.getSequence();
const prompt = Array.from({length: promptTokens}, (_, i) => 300 + (i * 7919) % 150000);

const start = performance.now();
let first = 0, last = 0, tokens = 0, bytesAtFirst = 0;
for await (const token of sequence.evaluate(prompt, {temperature: 0.8, seed: 1000})) {
    last = performance.now();
    if (tokens++ === 0) {
        first = last;
        bytesAtFirst = readBytes();
    }
    if (tokens >= maxTokens) break;
}
const decodeBytes = readBytes() - bytesAtFirst;
console.log(JSON.stringify({
    engine: "llama.cpp", mmap: true, threads: context.currentThreads, prompt_tokens: promptTokens,
    load_s: +loadSeconds.toFixed(2), ttft_s: +((first - start) / 1000).toFixed(3),
    decode_tokens: tokens - 1, decode_seconds: +((last - first) / 1000).toFixed(3),
    decode_tps: +((tokens - 1) / ((last - first) / 1000)).toFixed(3),
    decode_disk_bytes_per_token: Math.round(decodeBytes / Math.max(1, tokens - 1))
}));
await context.dispose();
await model.dispose();
