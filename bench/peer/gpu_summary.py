#!/usr/bin/env python3
"""bench/peer/gpu_summary.py — the Markdown table of a GPU peer run (bench/peer/llamacpp_cuda.sh's device script):
reads the JSON lines of gpu_bench --model (tierlm) and llama-bench -o jsonl (llama.cpp) from one file, in the order
they ran, and prints per shape and format the median of each engine's rounds (for llama.cpp, of its repetitions): prefill tok/s at each prompt length,
decode tok/s, tierlm's decode fraction of the d2d roofline measured in the same run, and the tierlm / llama.cpp ratios.

Usage: gpu_summary.py PEER.jsonl   (lines that are not JSON, e.g. '=== tierlm 1b-l0 at 12 s', set the shape)
"""
import json
import re
import statistics
import sys

LLAMA_TYPE = {"F16": "f16", "Q8_0": "q8_0", "Q4_0": "q4"}


def main(path):
    shape, device, d2d = None, None, None
    runs = {}  # (shape, format, engine, metric) -> [tok/s]
    for line in open(path):
        line = line.strip()
        m = re.match(r"=== \S+ (\S+)", line)
        if m:
            shape = m.group(1)
            continue
        if not line.startswith("{"):
            continue
        d = json.loads(line)
        if "device" in d:
            device = d["device"]
            d2d = (d2d or []) + [d["d2d_gbps"]]
        elif d.get("engine") == "tierlm":
            for k, v in d.items():
                if re.fullmatch(r"(pp|tg)\d+", k):
                    runs.setdefault((shape, d["format"], "tierlm", k), []).append(v)
            runs.setdefault((shape, d["format"], "tierlm", "of_roofline"), []).append(d["of_roofline"])
        elif "avg_ts" in d:
            fmt = LLAMA_TYPE.get(d["model_type"].split()[-1], d["model_type"])
            key = f"tg{d['n_gen']}" if d["n_gen"] else f"pp{d['n_prompt']}"
            # the median of llama-bench's repetitions (its mean weighs in a slow first repetition, seen at pp180)
            runs.setdefault((shape, fmt, "llama.cpp", key), []).append(statistics.median(d["samples_ts"]))
    print(f"device: {device}, d2d roofline {', '.join(f'{v:.0f}' for v in d2d or [])} GB/s (each tierlm process "
          "measures its own; medians of the rounds)\n")
    metrics = sorted({k[3] for k in runs if k[3] != "of_roofline"}, key=lambda m: (m[:2] == "tg", int(m[2:])))
    head = "| shape | format | " + " | ".join(f"{m} tierlm / llama.cpp (ratio)" for m in metrics)
    print(head + " | tierlm decode of roofline |")
    print("|" + "---|" * (3 + len(metrics)))
    for shape, fmt in sorted({(k[0], k[1]) for k in runs}, key=lambda k: (k[0], ["f16", "q8_0", "q4"].index(k[1]))):
        cells = []
        for m in metrics:
            t, l = runs.get((shape, fmt, "tierlm", m)), runs.get((shape, fmt, "llama.cpp", m))
            ts = f"{statistics.median(t):,.0f}" if t else "-"
            ls = f"{statistics.median(l):,.0f}" if l else "-"
            ratio = f" ({statistics.median(t) / statistics.median(l):.2f}x)" if t and l else ""
            cells.append(f"{ts} / {ls}{ratio}")
        roof = runs.get((shape, fmt, "tierlm", "of_roofline"))
        roof_cell = f"{100 * statistics.median(roof):.1f}%" if roof else "-"
        print(f"| {shape} | {fmt} | " + " | ".join(cells) + f" | {roof_cell} |")


if __name__ == "__main__":
    main(sys.argv[1])
