#!/usr/bin/env python3
"""bench/peer/summarize.py — turns peer.sh's JSON lines into the peer table: median prefill / decode tok/s per
engine, format and thread count, and tierlm's ratio to llama.cpp; plus whether both engines' greedy tokens agree on
the f16 check run. Markdown on stdout, the same figures as JSON in OUT."""
import json
import statistics
import sys


def main(lines_path, out_path, shape, layers):
    runs, checks = [], []
    with open(lines_path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            row = json.loads(line)
            (checks if row.get("check") else runs).append(row)
    check = {r["engine"]: r["tokens"] for r in checks}
    same = check.get("tierlm") is not None and check.get("tierlm") == check.get("llama.cpp")
    table = []
    order = ["f16", "q8_0", "q4", "q4k"]  # q4k: tierlm's q4 against llama.cpp's Q4_K
    keys = sorted({(r["threads"], r["format"]) for r in runs},
                  key=lambda k: (k[0], order.index(k[1]) if k[1] in order else 9))
    for threads, fmt in keys:
        def med(engine, field):
            v = [r[field] for r in runs if r["engine"] == engine and r["threads"] == threads and r["format"] == fmt]
            return statistics.median(v) if v else None, len(v)
        row = {"threads": threads, "format": fmt}
        for engine in ("tierlm", "llama.cpp"):
            for field in ("prefill_tps", "decode_tps"):
                row[f"{engine}_{field}"], row["rounds"] = med(engine, field)
        for field in ("prefill_tps", "decode_tps"):
            a, b = row[f"tierlm_{field}"], row[f"llama.cpp_{field}"]
            row[f"{field}_ratio"] = round(a / b, 3) if a and b else None
        table.append(row)
    summary = {"shape": shape, "layers": int(layers), "same_greedy_tokens_f16": same, "check": check, "rows": table}
    with open(out_path, "w") as f:
        json.dump(summary, f, indent=1)
    print(f"shape {shape} (layers {layers or 'all'}); f16 greedy tokens equal: {same}"
          f" (tierlm {check.get('tierlm')}, llama.cpp {check.get('llama.cpp')})")
    print()
    print("| threads | format | tierlm prefill | llama.cpp prefill | prefill ratio | tierlm decode | llama.cpp decode |"
          " decode ratio | rounds |")
    print("|---|---|---|---|---|---|---|---|---|")
    def tps(v):  # a median of an even count is a mean of two: print tok/s to 0.01, not float noise
        return "-" if v is None else f"{v:.2f}"

    for r in table:
        print(f"| {r['threads']} | {r['format']} | {tps(r['tierlm_prefill_tps'])} |"
              f" {tps(r['llama.cpp_prefill_tps'])} | {r['prefill_tps_ratio']}x | {tps(r['tierlm_decode_tps'])} |"
              f" {tps(r['llama.cpp_decode_tps'])} | {r['decode_tps_ratio']}x | {r['rounds']} |")


if __name__ == "__main__":
    main(*sys.argv[1:5])
