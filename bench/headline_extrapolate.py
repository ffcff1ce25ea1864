#!/usr/bin/env python3
"""bench/headline.sh's arithmetic (Python standard library only). Prints Markdown lines.

run-vs-bound CLIENT_JSON BOUND_JSON
    A served run against the disk bound measured on the same files: the request's own expert bytes read per
    generated token (prefill's share included, so the bound is conservative for decode) and the bound's GB/s give the
    bound tok/s = GB/s / bytes per token; the cold bound assumes every routed expert of every layer a miss.

qwen V1_WISDOM V3_WISDOM V4_WISDOM BOUND_JSON CLIENT_JSON CONFIG_JSON [FULL_LAYERS=48] [FULL_ATTENTION=12]
    Per-layer decode cost of Qwen3.5-122B-A10B from `calibrate`'s model timings (ModelTiming: one decode step with
    every routed expert in memory, one expert on one row, one router, a miss) on variants of 1, 3 and 4 layers over
    the same shards (layer types L, LLL, LLLF):
        S1 = E + D, S3 = E + 3 D, S4 = E + 3 D + F
    with D a Gated DeltaNet layer, F a gated full-attention layer (each with its norms, shared expert, router and 8
    routed experts computed from memory) and E the embedding + final norm + 248k-row head. The routed-MoE part of a
    layer is 8 x expert_seconds + router_seconds. A streamed expert costs miss_batch_seconds (calibrate: top_k misses
    of one layer requested together: read, conversion, acquire) or, at the disk bound, read bytes / bound GB/s.
    The full model at a budget B: dense bytes G + 36 d_lin + 12 d_full (solved from the three profiles' dense bytes the
    same way), KV + recurrent state of batch 1 at 4096 positions, scratch and staging as the 4-layer plan counts them;
    the rest holds experts; with uniform routing (random weights: no skew) the hit rate is that share of all
    48 x 256 experts, so misses/token = 48 x 8 x (1 - hit).
        tok/s = 1 / (36 D + 12 F + E + misses x miss cost)      disk bound = GB/s / (misses x read bytes)
    The same model checked on the 4-layer folder served at defaults (CLIENT_JSON): its measured hit rate gives the
    predicted tok/s to set beside the measured one.

kv CLIENT_JSON WISDOM_JSON
    /health's kv accounts of a served context (one slot): the bytes held, the part in sliding-window rings, what the
    same context would hold with full attention on the windowed layers (kv.bytes_without_windows); for recurrent
    models, the fixed states (the profile's layer_recurrent_bytes) against the KV the same layers would hold as the
    model's full-attention layers (the per-layer KV of the full layers /health reports, times the layer count).
"""
import json
import sys


def entry(path):
    w = json.load(open(path))

    def find(o):
        if isinstance(o, dict):
            if "model" in o and "plan" in o:
                return o
            for v in o.values():
                r = find(v)
                if r:
                    return r
        if isinstance(o, list):
            for v in o:
                r = find(v)
                if r:
                    return r
        return None

    e = find(w)
    if e is None:
        raise SystemExit(f"{path}: no wisdom entry with model and plan")
    return e


def timing(e):
    threads = e["plan"]["threads"]
    ts = e["model"]["timings"]
    t = next((t for t in ts if t["threads"] == threads), ts[-1])
    return t


def dense_bytes(e):
    return sum(c["bytes"] for c in e["model"]["weight_classes"] if c["name"] != "experts")


def run_vs_bound(client_path, bound_path):
    c, b = json.load(open(client_path)), json.load(open(bound_path))
    rt, u = c["request_tiering"], c["usage"]
    tokens = u["completion_tokens"]
    per_token = rt["disk_bytes_read"] / max(1, tokens)
    gbps = b["gb_per_s"]
    bound = gbps * 1e9 / per_token if per_token > 0 else float("inf")
    hits, misses = rt["cache_hits"], rt["cache_misses"]
    print(f"- decode {c['decode_tok_s']} tok/s ({tokens} tokens, first chunk after {c['first_chunk_s']} s); "
          f"request: {rt['disk_bytes_read'] / 1e9:.2f} GB read in {rt['disk_reads']} reads, "
          f"{misses} misses / {hits} hits (hit rate {hits / max(1, hits + misses):.3f}), "
          f"read stall {rt['read_stall_seconds']:.1f} s")
    print(f"- disk bound (same files, plan's reader): {gbps:.3f} GB/s, {b['experts_per_s']:.1f} experts/s "
          f"({b['bytes_per_expert'] / 1e6:.2f} MB each); at this run's {per_token / 1e6:.1f} MB read per token: "
          f"{bound:.3f} tok/s -> run = {100 * c['decode_tok_s'] / bound:.0f}% of the bound; "
          f"cold bound (every routed expert a miss): {b['cold_bound_tok_s']:.3f} tok/s")


def qwen(v1, v3, v4, bound_path, client_path, config_path, full_layers=48, full_attention=12):
    e1, e3, e4 = entry(v1), entry(v3), entry(v4)
    t1, t3, t4 = timing(e1), timing(e3), timing(e4)
    b = json.load(open(bound_path))
    S1, S3, S4 = t1["step_seconds"], t3["step_seconds"], t4["step_seconds"]
    D = (S3 - S1) / 2
    F = S4 - S3
    E = S1 - D
    moe = 8 * t4["expert_seconds"] + t4["router_seconds"]
    miss = t4["miss_batch_seconds"]
    m = e4["model"]["moe"]
    read_bytes, block = m["expert_read_bytes"], m["expert_bytes"]
    disk_miss = read_bytes / (b["gb_per_s"] * 1e9)
    print(f"- calibrate timings at {e4['plan']['threads']} threads: step S1 {S1 * 1e3:.1f} ms (L), S3 {S3 * 1e3:.1f} ms "
          f"(LLL), S4 {S4 * 1e3:.1f} ms (LLLF); expert {t4['expert_seconds'] * 1e6:.0f} us/row, router "
          f"{t4['router_seconds'] * 1e6:.0f} us, miss alone {t4['miss_seconds'] * 1e3:.2f} ms, miss in a batch of 8 "
          f"{miss * 1e3:.2f} ms")
    print(f"- per layer, decode, experts in memory: Gated DeltaNet layer {D * 1e3:.2f} ms, gated full-attention "
          f"layer {F * 1e3:.2f} ms (each incl. norms, shared expert and its routed-MoE part {moe * 1e3:.2f} ms = 8 "
          f"experts + router); embedding + head {E * 1e3:.2f} ms")
    print(f"- MoE streamed: a missed expert costs {miss * 1e3:.2f} ms in the tier (read {read_bytes / 1e6:.2f} MB + "
          f"conversion, calibrate's batch of 8) vs {disk_miss * 1e3:.2f} ms at the disk bound "
          f"({b['gb_per_s']:.3f} GB/s, same files)")
    g1, g3, g4 = dense_bytes(e1), dense_bytes(e3), dense_bytes(e4)
    d_lin = (g3 - g1) / 2
    d_full = g4 - g3
    G = g1 - d_lin
    linear = full_layers - full_attention
    dense = G + linear * d_lin + full_attention * d_full
    mem = e4["plan"]["prediction"]["memory"]
    kv4 = mem.get("kv", 0)
    # KV at batch 1: the 4-layer plan holds 3 recurrent states + 1 full layer at its batch and context
    batch = max(1, e4["plan"]["batch"])
    rec = e4["model"].get("layer_recurrent_bytes", [])
    rec_one = max(rec) if rec else 0
    full_kv_one = (kv4 / batch - 3 * rec_one) if kv4 else 0
    kv = linear * rec_one + full_attention * full_kv_one
    other = sum(v for k, v in mem.items() if k in ("scratch", "expert_staging"))
    compute = linear * D + full_attention * F + E
    total_experts = full_layers * m["experts"]
    print(f"- full model ({full_layers} layers: {linear} DeltaNet + {full_attention} full): dense {dense / 2**30:.2f} GiB "
          f"(global {G / 2**30:.2f}, {d_lin / 2**20:.0f} MiB per DeltaNet layer, {d_full / 2**20:.0f} MiB per full "
          f"layer), experts {total_experts * block / 2**30:.1f} GiB ({block / 2**20:.2f} MiB each), KV+state at batch 1 "
          f"x {e4['plan']['context']} {kv / 2**20:.0f} MiB, scratch+staging {other / 2**20:.0f} MiB; compute per token "
          f"(all experts in memory) {compute * 1e3:.0f} ms = {1 / compute:.2f} tok/s")
    print("")
    print("| budget | experts in memory | hit (uniform) | misses/token | tok/s (tier miss cost) | tok/s (disk-bound miss cost) | disk bound |")
    print("|---|---|---|---|---|---|---|")
    for gib in (16, 8):
        free = gib * 2**30 - dense - kv - other
        held = max(0, int(free // block))
        hit = min(1.0, held / total_experts)
        misses = full_layers * 8 * (1 - hit)
        tier = 1 / (compute + misses * miss)
        at_bound = 1 / (compute + misses * disk_miss)
        disk = b["gb_per_s"] * 1e9 / (misses * read_bytes) if misses > 0 else float("inf")
        print(f"| {gib} GiB | {held} of {total_experts} | {hit:.3f} | {misses:.0f} | {tier:.3f} | {at_bound:.3f} | "
              f"{disk:.3f} |")
    print("")
    c = json.load(open(client_path))
    rt = c["request_tiering"]
    hits, misses_n = rt["cache_hits"], rt["cache_misses"]
    hit = hits / max(1, hits + misses_n)
    layers4 = e4["model"]["moe"]["moe_layers"]
    predicted = 1 / (S4 + layers4 * 8 * (1 - hit) * miss)
    print(f"- check on the {layers4}-layer folder served at defaults (budget "
          f"{c['memory']['ledger_budget_bytes'] / 2**30:.2f} GiB): measured {c['decode_tok_s']} tok/s at hit rate "
          f"{hit:.3f}; the per-layer model predicts {predicted:.3f} tok/s")


def kv(client_path, wisdom_path):
    c, e = json.load(open(client_path)), entry(wisdom_path)
    k = c["kv"]
    mib = lambda b: f"{b / 2**20:,.0f} MiB"
    slots, ctx = k["slots"], k["context"]
    print(f"- /health kv at {slots} slot x {ctx} positions: bytes {mib(k['bytes'])} (windowed layers "
          f"{mib(k['windowed_bytes'])}); with full attention on the windowed layers: "
          f"{mib(k['bytes_without_windows'])} -> windows save {mib(k['bytes_without_windows'] - k['bytes'])} "
          f"({100 * (1 - k['bytes'] / k['bytes_without_windows']):.0f}%); codecs {k.get('bytes_by_codec')}")
    rec = e["model"].get("layer_recurrent_bytes", [])
    if any(rec):
        states = slots * sum(rec)
        n_rec = sum(1 for r in rec if r)
        n_full = len(rec) - n_rec
        full = (k["bytes"] - states) / n_full if n_full else 0
        print(f"- recurrent: {n_rec} Gated DeltaNet layers hold {mib(states)} of fixed state ({mib(states / n_rec)} each, "
              f"whatever the context); {n_full} full-attention layer(s) hold {mib(full)} each at {ctx} positions; "
              f"the DeltaNet layers as full attention would hold {mib(n_rec * full)} -> the fixed state is "
              f"{100 * states / (n_rec * full):.1f}% of it")
    print(f"- memory: ledger used {mib(c['memory']['ledger_used_bytes'])}, peak {mib(c['memory']['ledger_peak_bytes'])} "
          f"of {mib(c['memory']['ledger_budget_bytes'])}; accounts "
          + ", ".join(f"{n} {mib(a['bytes'])}" for n, a in c["memory"]["accounts"].items()))


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "run-vs-bound":
        run_vs_bound(sys.argv[2], sys.argv[3])
    elif len(sys.argv) >= 4 and sys.argv[1] == "kv":
        kv(sys.argv[2], sys.argv[3])
    elif len(sys.argv) >= 8 and sys.argv[1] == "qwen":
        qwen(*sys.argv[2:8], *[int(x) for x in sys.argv[8:10]])
    else:
        raise SystemExit(__doc__)
