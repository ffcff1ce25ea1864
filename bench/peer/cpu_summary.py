#!/usr/bin/env python3
"""bench/peer/cpu_summary.py — the table of bench/peer/cpu_peer_device.sh's JSON lines: per shape, threads and
format, tierlm's and llama.cpp's prefill and decode tok/s and their ratio for each round (each pair ran back to back),
then the median of the per-round ratios (q4k: tierlm q4 against Q4_K). Usage: cpu_summary.py cpu-peer.jsonl"""
import json
import statistics
import sys

rows = {}
for line in open(sys.argv[1]):
    line = line.strip()
    if not line.startswith("{"):
        continue
    d = json.loads(line)
    key = (d["shape"], d["threads"], d["format"], d["round"])
    r = rows.setdefault(key, {})
    if d["engine"] == "tierlm":
        r["t_pre"], r["t_dec"] = d["prefill_tps"], d["decode_tps"]
    else:
        r["l_pre" if d["kind"] == "prefill" else "l_dec"] = d["tps"]

print("| shape | threads | format | tierlm prefill | llama.cpp prefill | prefill ratio | tierlm decode | llama.cpp decode |"
      " decode ratio |")
print("|---|---|---|---|---|---|---|---|---|")
groups = {}
for key in sorted(rows, key=lambda k: (k[0], -k[1], ["f16", "q8_0", "q4", "q4k"].index(k[2]), k[3])):
    r = rows[key]
    if len(r) < 4:
        continue
    groups.setdefault(key[:3], []).append(r)
for (shape, threads, fmt), rs in groups.items():
    pre = [r["t_pre"] / r["l_pre"] for r in rs]
    dec = [r["t_dec"] / r["l_dec"] for r in rs]
    cell = lambda k: " / ".join(f"{r[k]:.1f}" for r in rs)
    print(f"| {shape} | {threads} | {fmt} | {cell('t_pre')} | {cell('l_pre')} | "
          f"{' / '.join(f'{x:.2f}' for x in pre)} (median {statistics.median(pre):.2f}x) | {cell('t_dec')} | "
          f"{cell('l_dec')} | {' / '.join(f'{x:.2f}' for x in dec)} (median {statistics.median(dec):.2f}x) |")
