#!/usr/bin/env python3
"""`tierlm fit --budgets 8,16,32,64` on the published shapes of profiles/fit-configs/ (sparse shards written by
write_shards.py: headers only), on a fixed device profile so the answer does not depend on this machine.

Checks the table's shape (one row per budget, budgets in order, the printed table has a header and a row per
budget) and invariants the planner must keep: a budget that fits stays fitting with more memory; more budget never
predicts slower decode or prefill, a shorter largest context or more streamed experts; the stored bytes are the
published checkpoint's (within 3%); Qwen3-30B-A3B (61 GB of bf16) streams nothing at 64 GiB and streams at 32 GiB;
Qwen3.5-122B-A10B (MLX 4-bit; its Gated DeltaNet layers hold fixed state, only 12 of 48 layers keep KV) fits at every
budget with its whole 262144-token context; an architecture tierlm cannot run yet is named as such, without a device
probe.

usage: fit_table_test.py TIERLM [--markdown OUT]   (OUT: the tables as Markdown, for bench/results/)
"""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.dirname(os.path.dirname(HERE))
CONFIGS = os.path.join(SOURCE, "profiles", "fit-configs")
sys.path.insert(0, CONFIGS)
import write_shards  # noqa: E402

DEVICE = os.path.join(SOURCE, "profiles", "devices", "server-64gb.json")
BUDGETS = [8, 16, 32, 64]
# Published checkpoint sizes (GB, as the hub lists the safetensors), for the shape check.
PUBLISHED_GB = {"qwen3-30b-a3b": 61.1, "gpt-oss-20b": 13.8, "gpt-oss-120b": 65.3, "deepseek-v3": 688.6, "deepseek-v2-lite": 31.4,
                "gemma-4-26b-a4b": 51.6, "qwen3.5-122b-a10b-mlx-4bit": 69.6}
failures = []


def check(condition, message):
    if not condition:
        failures.append(message)
        print("FAIL: " + message)


def fit(tierlm, folder, json_out):
    args = [tierlm, "fit", "--model", folder, "--budgets", ",".join(map(str, BUDGETS)), "--device", DEVICE]
    r = subprocess.run(args + (["--json"] if json_out else []), capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, HOME=tempfile.gettempdir()))
    if r.returncode != 0:
        raise SystemExit("fit %s exited %d: %s" % (folder, r.returncode, r.stderr[-2000:]))
    return json.loads(r.stdout) if json_out else r.stdout


def check_supported(name, answer, text):
    rows = answer["budgets"]
    check([r["budget_gib"] for r in rows] == BUDGETS, "%s: one row per budget in order" % name)
    lines = [l for l in text.splitlines() if l.strip()]
    header = [i for i, l in enumerate(lines) if l.startswith("budget")]
    check(len(header) == 1 and len(lines) >= header[0] + 1 + len(BUDGETS),
          "%s: printed table shape:\n%s" % (name, text))
    fitted = False
    previous = None
    for row in rows:
        if fitted:
            check(row["fits"], "%s: fits at a smaller budget but not at %s GiB" % (name, row["budget_gib"]))
        fitted = fitted or row["fits"]
        if row["fits"] and previous is not None and previous["fits"]:
            a, b = previous["predicted"], row["predicted"]
            for key in ("decode_tokens_per_second", "prefill_tokens_per_second"):
                check(b[key] >= a[key] * 0.999, "%s: %s drops from %.3f at %s GiB to %.3f at %s GiB" %
                      (name, key, a[key], previous["budget_gib"], b[key], row["budget_gib"]))
            check(b["streamed_expert_fraction"] <= a["streamed_expert_fraction"] + 1e-9,
                  "%s: more streamed at %s GiB than at %s GiB" % (name, row["budget_gib"], previous["budget_gib"]))
        if previous is not None:
            check(row["largest_context"] >= previous["largest_context"],
                  "%s: largest context shrinks at %s GiB" % (name, row["budget_gib"]))
        previous = row
    return rows


def markdown(name, answer, text):
    out = ["### %s" % name, ""]
    if not answer["supported"]:
        return out + [text.strip(), ""]
    out += ["```", text.rstrip(), "```", ""]
    return out


def main():
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    tierlm = sys.argv[1]
    md_out = sys.argv[3] if len(sys.argv) > 3 and sys.argv[2] == "--markdown" else None
    md = ["# `tierlm fit` on published shapes at 8 / 16 / 32 / 64 GiB", "",
          "Made by `tests/calibrate/fit_table_test.py build/tierlm --markdown bench/results/fit-table.md`: each "
          "model of profiles/fit-configs/ (sources in its README) as a folder of sparse shards whose headers list the "
          "published tensors, `tierlm fit --budgets 8,16,32,64 --device profiles/devices/server-64gb.json` (a "
          "32-core, 64 GiB server with NVMe; the context is fit's default 4096, TTFT for a 512-token prompt).", ""]
    with tempfile.TemporaryDirectory() as tmp:
        for name in sorted(os.listdir(CONFIGS)):
            config_dir = os.path.join(CONFIGS, name)
            if not os.path.isfile(os.path.join(config_dir, "config.json")):
                continue
            folder = os.path.join(tmp, name)
            stored = write_shards.write(config_dir, folder)
            answer = fit(tierlm, folder, True)
            text = fit(tierlm, folder, False)
            print("== %s (%.1f GB stored)\n%s" % (name, stored / 1e9, text))
            check(abs(answer["stored_bytes"] / 1e9 / PUBLISHED_GB[name] - 1) < 0.03,
                  "%s: stored %.1f GB, published %.1f GB" % (name, answer["stored_bytes"] / 1e9, PUBLISHED_GB[name]))
            md += markdown(name, answer, text.replace(tmp + "/", "").replace(SOURCE + "/", ""))
            if not answer["supported"]:
                check("is not supported by tierlm yet" in text and answer["model_type"] in text,
                      "%s: the unsupported architecture is named: %s" % (name, text))
                continue
            rows = check_supported(name, answer, text)
            if name == "qwen3.5-122b-a10b-mlx-4bit":  # DeltaNet state is fixed: 12 of 48 layers grow with context
                check(all(r["fits"] for r in rows) and rows[0]["largest_context"] == 262144,
                      "qwen3.5-122b: fits at every budget, the whole 262144 context at 8 GiB: %s" %
                      [(r["fits"], r["largest_context"]) for r in rows])
            if name == "qwen3-30b-a3b":
                by = {r["budget_gib"]: r for r in rows}
                check(by[64]["fits"] and by[64]["predicted"]["streamed_expert_fraction"] == 0,
                      "qwen3-30b-a3b: 61 GB fits in RAM at 64 GiB and streams nothing: %s" % by[64].get("predicted"))
                check(by[32]["fits"] and by[32]["predicted"]["streamed_expert_fraction"] > 0.3,
                      "qwen3-30b-a3b: streams at 32 GiB")
                check(by[64]["predicted"]["decode_tokens_per_second"] > by[8]["predicted"]["decode_tokens_per_second"],
                      "qwen3-30b-a3b: in RAM is faster than streamed")
                # A GPU capped at 8 GiB (fit --gpu-memory, on the 80 GB GPU server's profile): every layer on the GPU,
                # the hottest experts in VRAM within the cap, the others on the CPU in decode (hybrid placement).
                r = subprocess.run([tierlm, "fit", "--model", folder, "--gpu-memory", "8", "--json", "--device",
                                    os.path.join(SOURCE, "profiles", "devices", "gpu-server-80gb.json")],
                                   capture_output=True, text=True, timeout=600,
                                   env=dict(os.environ, HOME=tempfile.gettempdir()))
                check(r.returncode == 0, "fit --gpu-memory 8 exited %d: %s" % (r.returncode, r.stderr[-1000:]))
                if r.returncode == 0:
                    plan = json.loads(r.stdout)["plan"]
                    gpu = plan["gpu"]
                    resident = sum(len(layer) for layer in gpu["resident_experts"])
                    vram = sum(plan["prediction"]["vram"].values())
                    check(plan["gpu_layers"] == 48 and gpu["budget_bytes"] == 8 << 30 and vram <= 8 << 30,
                          "qwen3-30b-a3b --gpu-memory 8: 48 GPU layers within 8 GiB: %s layers, budget %s, vram %s" %
                          (plan["gpu_layers"], gpu["budget_bytes"], vram))
                    check(0 < resident < 48 * 128 and gpu["cpu_expert_rows"] > 0,
                          "qwen3-30b-a3b --gpu-memory 8: some experts in VRAM, the others on the CPU: %d, rows %s" %
                          (resident, gpu["cpu_expert_rows"]))
    if md_out:
        with open(md_out, "w") as f:
            f.write("\n".join(md) + "\n")
    if failures:
        raise SystemExit("%d failures" % len(failures))
    print("fit table: all invariants hold")


if __name__ == "__main__":
    main()
