#!/usr/bin/env python3
"""bench/peer/realscale_summary.py — the Markdown of bench/realscale.sh from its results.jsonl and wisdom files.

Per cgroup limit: tierlm decode tok/s with prefetch on and off, llama.cpp mmap decode tok/s, the ratio, the bound
min(compute, disk) and the share of it reached, bytes read from disk per token, the expert cache's hit rate, prefetch
precision (prefetch reads that served a request / prefetch reads) and recall (requests served by a prefetch / requests
that needed a read: prefetch hits + misses), read stall per token, and the memory held (cgroup peak vs limit: page cache
included, so it reaches the limit whenever a process reads files through it; the process's RSS at the end; ledger peak
vs budget). The compute and disk rates come from the calibration of the same run (wisdom model profile timings
at the plan's thread count): compute = 1 / step_seconds; disk bandwidth = the run's disk_bound step (expert_disk_bound:
the tier's reads of the model's own expert extents, no conversion) when it has one, else expert read bytes /
miss_batch_seconds (calibrate's timing of top-k concurrent misses, which includes the tier's per-miss conversion);
both are shown when both exist.

Usage: realscale_summary.py RESULTS.jsonl WORK_DIR
       realscale_summary.py --reader WISDOM   (prints the plan's reader queue depth and block size)
"""
import json
import sys

GIB, MIB = float(1 << 30), float(1 << 20)


def find(node, keys):
    """The first dict (depth first) holding every key in keys."""
    if isinstance(node, dict):
        if all(k in node for k in keys):
            return node
        children = node.values()
    elif isinstance(node, list):
        children = node
    else:
        return None
    for child in children:
        hit = find(child, keys)
        if hit is not None:
            return hit
    return None


def rates(wisdom_path, threads):
    w = json.load(open(wisdom_path))
    entry = w["entries"][-1] if "entries" in w else w
    timing = min(find(entry, ["timings"])["timings"], key=lambda t: abs(t["threads"] - threads))
    read_bytes = find(entry, ["expert_read_bytes"])["expert_read_bytes"]
    compute = 1.0 / timing["step_seconds"]
    bandwidth = read_bytes / timing["miss_batch_seconds"]
    return compute, bandwidth, timing, read_bytes


def reader(wisdom_path):
    w = json.load(open(wisdom_path))
    r = find(w["entries"][-1] if "entries" in w else w, ["queue_depth", "block_size", "direct"])
    return r["queue_depth"], r["block_size"]


def gib(n):
    """A cgroup peak in GiB; "-" where the kernel keeps none (cgroup v2 without memory.peak)."""
    return "-" if n is None else f"{n / GIB:.2f}"


def load_flag(load):
    return f"{load[0]:.1f}/{load[1]:.1f}" + (" (>4)" if max(load) > 4 else "")


def main():
    if sys.argv[1] == "--reader":
        print(*reader(sys.argv[2]))
        return
    rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
    work = sys.argv[2]
    out = []
    routing = next((r["routing"] for r in rows if "routing" in r), None)
    limits = sorted({r["limit_gib"] for r in rows if "limit_gib" in r}, reverse=True)
    out.append("| cgroup | engine | decode tok/s | vs llama.cpp | bound tok/s (compute / disk) | of bound | "
               "disk MiB/token | hit rate | prefetch precision / recall | stall ms/token | cgroup peak | "
               "RSS / ledger peak / budget | load 1-min (start/end) |")
    out.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    notes = []
    for limit in limits:
        mine = [r for r in rows if r.get("limit_gib") == limit]
        llama = next((r for r in mine if r["step"] == "llama.cpp"), None)
        cal = next((r for r in mine if r["step"] == "calibrate"), None)
        measured = next((r for r in mine if r["step"] == "disk_bound"), None)
        llama_tps = llama["result"]["decode_tps"] if llama else None
        for r in [x for x in mine if x["step"] == "serve"]:
            res = r["result"]
            d = res["decode"]
            n = max(1, res["decode_tokens"])
            compute, tier_bandwidth, timing, read_bytes = rates(f"{work}/wisdom-{limit}g.json", r["threads"])
            bandwidth = measured["result"]["gb_per_s"] * 1e9 if measured else tier_bandwidth
            per_token = d["disk_bytes_read"] / n
            disk = bandwidth / per_token if per_token > 0 else float("inf")
            bound = min(compute, disk)
            lookups = d["cache_hits"] + d["cache_misses"]
            precision = d["prefetch_hits"] / d["prefetches"] if d["prefetches"] else 0.0
            recall = d["prefetch_hits"] / (d["prefetch_hits"] + d["cache_misses"]) if d["cache_misses"] else 0.0
            mem = res["memory"]
            out.append(
                f"| {limit} GiB | tierlm, prefetch {r['prefetch']} | {res['decode_tps']:.2f} | "
                + (f"{res['decode_tps'] / llama_tps:.2f}x" if llama_tps else "-") + f" | {bound:.2f} ({compute:.2f} / {disk:.2f}) | "
                f"{100 * res['decode_tps'] / bound:.0f}% | {per_token / MIB:.1f} | "
                f"{d['cache_hits'] / lookups if lookups else 0:.3f} | "
                + (f"{precision:.2f} / {recall:.2f}" if "off" not in r["prefetch"].split("+") else "-")
                + f" | {1e3 * d['read_stall_seconds'] / n:.0f} | {gib(r['cgroup_peak'])} / {limit} GiB | "
                f"{(mem.get('rss_bytes') or 0) / GIB:.2f} / {mem['ledger_peak_bytes'] / GIB:.2f} / "
                f"{mem['ledger_budget_bytes'] / GIB:.2f} GiB | "
                f"{load_flag(r['load'])} |")
            notes.append(f"{limit} GiB prefetch {r['prefetch']}: threads {r['threads']}, timing {timing}, disk "
                         f"bandwidth {bandwidth / 1e9:.3f} GB/s"
                         + (f" (expert_disk_bound; calibrate's miss timing gives {tier_bandwidth / 1e9:.3f} GB/s, "
                            f"disk bound {tier_bandwidth / per_token if per_token else 0:.2f} tok/s)" if measured else "")
                         + f" (expert read {read_bytes} B), "
                         f"decode {res['decode_tokens']} tokens over {len(res['requests'])} requests, per request "
                         + ", ".join(f"{q['decode_tps']:.2f}" for q in res["requests"]) + " tok/s")
            if d.get("moe_seconds"):
                # Where a decode token's time went (the forward thread's counters over the decode windows).
                ms = lambda key: 1e3 * d.get(key, 0.0) / n
                token = 1e3 * res["decode_seconds"] / n
                rest = ms("moe_seconds") - ms("expert_compute_seconds") - ms("read_stall_seconds") - \
                    ms("inline_conversion_seconds") - ms("conversion_wait_seconds")
                notes.append(f"{limit} GiB prefetch {r['prefetch']}: a token {token:.1f} ms = outside the MoE blocks "
                             f"{token - ms('moe_seconds'):.1f} + MoE {ms('moe_seconds'):.1f} (experts' compute "
                             f"{ms('expert_compute_seconds'):.1f}, read stall {ms('read_stall_seconds'):.1f}, inline "
                             f"conversion {ms('inline_conversion_seconds'):.1f}, conversion wait "
                             f"{ms('conversion_wait_seconds'):.1f}, routing and the rest {rest:.1f})")
        if llama:
            res = llama["result"]
            out.append(f"| {limit} GiB | llama.cpp mmap | {res['decode_tps']:.2f} | 1.00x | - | - | "
                       f"{res['decode_disk_bytes_per_token'] / MIB:.1f} | - | - | - | "
                       f"{gib(llama['cgroup_peak'])} / {limit} GiB | - | {load_flag(llama['load'])} |")
            notes.append(f"{limit} GiB llama.cpp: {res['decode_tokens']} tokens after a {res['prompt_tokens']}-token "
                         f"prompt, threads {res['threads']}, load {res['load_s']} s")
        if measured:
            b = measured["result"]
            notes.append(f"{limit} GiB disk bound: expert_disk_bound depth {measured['depth']}, block "
                         f"{measured['block']}, {b['seconds']:.0f} s: {b['gb_per_s']:.3f} GB/s, "
                         f"{b['experts_per_s']:.1f} experts/s of {b['bytes_per_expert']} B, cold bound (every routed "
                         f"expert a miss) {b['cold_bound_tok_s']:.3f} tok/s, load {load_flag(measured['load'])}")
        if cal:
            notes.append(f"{limit} GiB calibrate: {cal['seconds']:.0f} s, cgroup peak {gib(cal['cgroup_peak'])} GiB, "
                         f"load {load_flag(cal['load'])}")
    print("\n".join(out))
    print()
    for n in notes:
        print("- " + n)
    if routing:
        print("\nRouting of the synthetic model (routing_stats_bench, calibration prompts):\n")
        print(routing)


if __name__ == "__main__":
    main()
