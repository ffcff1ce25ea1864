#!/usr/bin/env python3
"""bench/headline.sh's arithmetic (Python standard library only). Prints Markdown lines.

run-vs-bound CLIENT_JSON BOUND_JSON
    A served run against the disk bound measured on the same files: the request's own expert bytes read per
    generated token (prefill's share included, so the bound is conservative for decode) and the bound's GB/s give the
    bound tok/s = GB/s / bytes per token; the cold bound assumes every routed expert of every layer a miss.

qwen V1_WISDOM V3_WISDOM V4_WISDOM BOUND_JSON CLIENT_JSON CONFIG_JSON [FULL_LAYERS=48] [FULL_ATTENTION=12]
    Per-layer decode cost of Qwen3.5-122B-A10B. `calibrate`'s ModelTiming (one decode step with every routed expert
    in memory, fixed routing; a miss) is measured on variants of 1, 3 and 4 layers over the same shards (L, LLL,
    LLLF); decode is a stream of matvecs, so the 4-layer step's bytes (exact MLX sizes from the real shapes) over its
    time give the rate each layer kind's bytes are charged at: a Gated DeltaNet layer, a full-attention layer (each
    with its router, shared expert and 8 routed experts) and the 248k-row head. (The 1- and 3-layer steps are printed
    too; on the loaded machine their differences were noise.) A streamed expert costs miss_batch_seconds (calibrate:
    top_k misses of one layer requested together: read, conversion, acquire) or, at the disk bound, read bytes /
    bound GB/s. The full model at a budget B: its dense bytes (same formula), KV + recurrent state of batch 1 at 4096
    positions, scratch and staging as the 4-layer plan counts them; the rest holds experts; with uniform routing
    (random weights: no skew) the hit rate is that share of all 48 x 256 experts, so misses/token = 48 x 8 x (1 - hit).
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


def mlx_bytes(rows, cols, bits=4, group=64):
    """One MLX affine matrix as stored and streamed: packed words + bf16 scale and bias per group."""
    return rows * (cols * bits // 8 + cols // group * 4)


def qwen(v1, v3, v4, bound_path, client_path, config_path, full_layers=48, full_attention=12):
    e1, e3, e4 = entry(v1), entry(v3), entry(v4)
    t1, t3, t4 = timing(e1), timing(e3), timing(e4)
    b = json.load(open(bound_path))
    t = json.load(open(config_path))["text_config"]
    H, V, E, k = t["hidden_size"], t["vocab_size"], t["num_experts"], t["num_experts_per_tok"]
    I, Is, nh, nkv, hd = (t["moe_intermediate_size"], t["shared_expert_intermediate_size"], t["num_attention_heads"],
                          t["num_key_value_heads"], t["head_dim"])
    nk, dk, nv, dv = (t["linear_num_key_heads"], t["linear_key_head_dim"], t["linear_num_value_heads"],
                      t["linear_value_head_dim"])
    conv = 2 * nk * dk + nv * dv
    # Bytes each decode token streams per layer (4-bit, router and shared-expert gate 8-bit), from the real shapes.
    deltanet = mlx_bytes(conv + nv * dv + 2 * nv, H) + mlx_bytes(H, nv * dv)
    attention = mlx_bytes(2 * nh * hd + 2 * nkv * hd, H) + mlx_bytes(H, nh * hd)
    expert = 2 * mlx_bytes(I, H) + mlx_bytes(H, I)
    moe_fixed = mlx_bytes(E, H, 8) + 2 * mlx_bytes(Is, H) + mlx_bytes(H, Is) + mlx_bytes(1, H, 8)
    head = mlx_bytes(V, H)
    moe = moe_fixed + k * expert
    S = {n: x["step_seconds"] for n, x in (("S1", t1), ("S3", t3), ("S4", t4))}
    layers4 = e4["model"]["moe"]["moe_layers"]
    streamed4 = 3 * (deltanet + moe) + (attention + moe) + head
    gbs = streamed4 / S["S4"]  # the 4-layer step's effective rate (S1, S3: see the note on noise)
    D, F, M, Eh = (deltanet + moe) / gbs, (attention + moe) / gbs, moe / gbs, head / gbs
    miss = t4["miss_batch_seconds"]
    m = e4["model"]["moe"]
    read_bytes, block = m["expert_read_bytes"], m["expert_bytes"]
    disk_miss = read_bytes / (b["gb_per_s"] * 1e9)
    ms = lambda x: f"{x * 1e3:.1f} ms"
    print(f"- calibrate's decode step with every routed expert in memory (fixed routing), threads {e4['plan']['threads']}: "
          f"1 layer (L) {ms(S['S1'])}, 3 layers (LLL) {ms(S['S3'])}, 4 layers (LLLF) {ms(S['S4'])}; at 1 thread "
          f"{ms(e1['model']['timings'][0]['step_seconds'])} / {ms(e3['model']['timings'][0]['step_seconds'])} / "
          f"{ms(e4['model']['timings'][0]['step_seconds'])} (each from a 0.15 s window on a machine at load 11-17: "
          f"not monotone in the layer count, so per-layer costs are not taken from their differences)")
    print(f"- bytes a decode token streams: Gated DeltaNet mixer {deltanet / 1e6:.1f} MB, gated full-attention mixer "
          f"{attention / 1e6:.1f} MB, MoE {moe / 1e6:.1f} MB (router + shared expert {moe_fixed / 1e6:.1f} MB + 8 "
          f"experts x {expert / 1e6:.2f} MB), head {head / 1e6:.0f} MB; the 4-layer step streams {streamed4 / 1e6:.0f} MB "
          f"in {ms(S['S4'])} = {gbs / 1e9:.2f} GB/s")
    print(f"- **per layer, decode, at that rate: Gated DeltaNet layer {ms(D)}, full-attention layer {ms(F)} (each incl. "
          f"its MoE {ms(M)} with experts in memory), head {ms(Eh)}; MoE streamed: a missed expert costs {ms(miss)} in "
          f"the tier (calibrate: 8 misses of a layer together: read {read_bytes / 1e6:.2f} MB + MLX conversion + "
          f"acquire) vs {ms(disk_miss)} at the disk bound ({b['gb_per_s']:.3f} GB/s, same files)**")
    linear = full_layers - full_attention
    dense = 2 * head + linear * (deltanet + moe_fixed) + full_attention * (attention + moe_fixed)
    rec = [r for r in e4["model"].get("layer_recurrent_bytes", []) if r]
    kv = linear * (rec[0] if rec else 0) + full_attention * 2 * nkv * hd * 2 * 4096  # batch 1, f16, 4096 positions
    mem = e4["plan"]["prediction"]["memory"]
    other = mem.get("scratch", 0) + mem.get("expert_staging", 0)
    compute = linear * D + full_attention * F + Eh
    total_experts = full_layers * E
    print(f"- full model ({full_layers} layers: {linear} DeltaNet + {full_attention} full): dense weights "
          f"{dense / 2**30:.2f} GiB, experts {total_experts * block / 2**30:.1f} GiB ({block / 2**20:.2f} MiB each), "
          f"KV + recurrent state at batch 1 x 4096 (f16) {kv / 2**20:.0f} MiB, scratch + staging {other / 2**20:.0f} MiB; "
          f"compute per token with every expert in memory {ms(compute)} = {1 / compute:.2f} tok/s")
    print("")
    print("| budget | experts in memory | hit rate (uniform routing) | misses/token | tok/s (tier's miss cost) | "
          "tok/s (misses at the disk bound) | disk bound alone |")
    print("|---|---|---|---|---|---|---|")
    for gib in (16, 8):
        free = gib * 2**30 - dense - kv - other
        held = max(0, int(free // block))
        hit = min(1.0, held / total_experts)
        misses = full_layers * k * (1 - hit)
        tier = 1 / (compute + misses * miss)
        at_bound = 1 / (compute + misses * disk_miss)
        disk = b["gb_per_s"] * 1e9 / (misses * read_bytes) if misses > 0 else float("inf")
        print(f"| {gib} GiB | {held} of {total_experts} | {hit:.3f} | {misses:.0f} | {tier:.3f} | {at_bound:.3f} | "
              f"{disk:.3f} |")
    print("")
    try:
        c = json.load(open(client_path))
    except (OSError, ValueError):
        print(f"- (no served check: {client_path} missing)")
        return
    rt = c["request_tiering"]
    hits, misses_n = rt["cache_hits"], rt["cache_misses"]
    hit = hits / max(1, hits + misses_n)
    predicted = 1 / (S["S4"] + layers4 * k * (1 - hit) * miss)
    print(f"- check: the {layers4}-layer folder served at defaults (budget "
          f"{c['memory']['ledger_budget_bytes'] / 2**30:.2f} GiB) decoded {c['decode_tok_s']} tok/s at hit rate "
          f"{hit:.3f}; the same arithmetic predicts {predicted:.3f} tok/s")


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
