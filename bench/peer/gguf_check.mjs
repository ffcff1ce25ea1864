// bench/peer/gguf_check.mjs — llama.cpp as the oracle of gguf_export's encodings: the reference GGUF (F16) writes a
// greedy continuation of a short prompt, then every GGUF (the reference too) scores that same sequence position by
// position (teacher forcing, node-llama-cpp's controlledEvaluate with the full next-token probabilities). Per file:
// the mean KL divergence from the reference's distribution (nats), the share of positions whose top token is the
// reference's, and the top token's mean probability. An encoding llama.cpp reads differently from what gguf_export
// meant is noise here (KL of nats, top-1 agreement near chance); a faithful 4-bit one sits near Q4_0's.
// One JSON line per file on stdout.
//
// Usage: node gguf_check.mjs REFERENCE.gguf OTHER.gguf... [--tokens N] [--threads T]
import {getLlama, LlamaLogLevel} from "node-llama-cpp";

const args = process.argv.slice(2);
const option = (name, fallback) => {
    const i = args.indexOf(name);
    if (i < 0) return fallback;
    const v = Number(args[i + 1]);
    args.splice(i, 2);
    return v;
};
const length = option("--tokens", 96), threads = option("--threads", 2);
if (args.length < 2) {
    console.error("usage: node gguf_check.mjs REFERENCE.gguf OTHER.gguf... [--tokens N] [--threads T]");
    process.exit(2);
}
const llama = await getLlama({gpu: false, build: "never", logLevel: LlamaLogLevel.error});

async function withModel(path, f) {
    const model = await llama.loadModel({modelPath: path, gpuLayers: 0});
    const context = await model.createContext({contextSize: length + 64, batchSize: length + 64, threads, sequences: 1});
    try {
        return await f(model, context.getSequence());
    } finally {
        await context.dispose();
        await model.dispose();
    }
}

// The reference's greedy continuation of a fixed prompt: text the model itself finds likely.
const prompt = [1, 5, 9, 17, 33];
const sequenceTokens = await withModel(args[0], async (model, sequence) => {
    const out = [...prompt];
    for await (const token of sequence.evaluate(prompt, {temperature: 0})) {
        out.push(token);
        if (out.length >= length) break;
    }
    return out;
});

async function distributions(path) {
    return withModel(path, async (model, sequence) => {
        const input = sequenceTokens.map(t => [t, {generateNext: {probabilities: true}}]);
        const outputs = await sequence.controlledEvaluate(input);
        return outputs.slice(prompt.length - 1, -1).map(o => o.next.probabilities);
    });
}

const reference = await distributions(args[0]);
for (const path of args) {
    const other = path === args[0] ? reference : await distributions(path);
    let kl = 0, agree = 0, top = 0;
    for (let i = 0; i < reference.length; ++i) {
        const p = reference[i], q = other[i];
        let best = -1, bestP = -1, bestQ = -1, bestQp = -1;
        for (const [token, pv] of p) {
            if (pv > bestP) bestP = pv, best = token;
            const qv = q.get(token) ?? 1e-12;
            if (pv > 0) kl += pv * Math.log(pv / Math.max(qv, 1e-12));
        }
        for (const [token, qv] of q) if (qv > bestQp) bestQp = qv, bestQ = token;
        agree += best === bestQ ? 1 : 0;
        top += bestQp;
    }
    const n = reference.length;
    console.log(JSON.stringify({file: path, positions: n, mean_kl_nats: +(kl / n).toFixed(5),
                                top1_agreement: +(agree / n).toFixed(4), mean_top_probability: +(top / n).toFixed(4)}));
}
