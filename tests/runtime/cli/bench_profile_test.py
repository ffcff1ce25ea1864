#!/usr/bin/env python3
"""`tierlm bench profile` on a small synthetic MoE (write_moe_fixture: 4 layers x 32 experts of 4-bit, top-4) at two
short contexts and the four configurations. Checks what the matrix must show, against the ledger and the files:
every cell ran; the JSON, Markdown and the table list the same cells; in RAM every expert is resident and nothing is
read from disk after load, while streamed cells keep about a quarter resident, miss, and read expert bytes; turbo3 KV
peaks below f16 KV at the same context (the ledger's kv account, and by the codec's size ratio); the streamed
budget is below the in-RAM one; the SVG is well-formed XML with a bar per cell and panel.

usage: bench_profile_test.py TIERLM WRITE_MOE_FIXTURE
"""
import json
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET


def main():
    tierlm, writer = sys.argv[1], sys.argv[2]
    failures = []

    def check(cond, msg):
        if not cond:
            failures.append(msg)
            print("FAIL: " + msg)

    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "model")
        subprocess.run([writer, model, "4", "32", "4", "256", "512"], check=True, capture_output=True)
        out = os.path.join(tmp, "out")
        env = dict(os.environ, HOME=tmp, XDG_CACHE_HOME=os.path.join(tmp, "cache"))
        device = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "profiles", "devices",
                              "laptop-8gb.json")
        r = subprocess.run([tierlm, "bench", "profile", "--model", model, "--contexts", "128,512",
                            "--decode-tokens", "4", "--threads", "1", "--out", out, "--device", device],
                           capture_output=True, text=True, env=env, timeout=600)
        print(r.stdout)
        if r.returncode != 0:
            raise SystemExit("bench profile exited %d: %s" % (r.returncode, r.stderr[-3000:]))
        report = json.load(open(os.path.join(out, "profile.json")))
        cells = report["cells"]
        configs = ["in_ram", "streamed", "turbo_kv", "streamed_turbo_kv"]
        check([(c["context"], c["configuration"]) for c in cells] ==
              [(x, k) for x in (128, 512) for k in configs], "one cell per context x configuration, in order")
        by = {(c["context"], c["configuration"]): c for c in cells}
        for c in cells:
            name = "%d %s" % (c["context"], c["configuration"])
            check(c["ok"], name + ": ran (" + c["error"] + ")")
            if not c["ok"]:
                continue
            check(c["prompt_tokens"] + 4 < c["context"] and c["prompt_tokens"] >= c["context"] - 8,
                  name + ": the prompt fills the context")
            check(c["decode_tokens_per_second"] > 0 and c["prefill_tokens_per_second"] > 0, name + ": speeds")
            check(abs(c["time_to_first_token_seconds"] * c["prefill_tokens_per_second"] - c["prompt_tokens"]) <
                  0.01 * c["prompt_tokens"], name + ": TTFT is the prefill of the prompt")
            check(c["peak_rss_bytes"] > sum(c["ledger_peak_bytes"].values()) / 2, name + ": peak RSS measured")
            ledger = c["ledger_peak_bytes"]
            check(sum(ledger.values()) > 0 and ledger.get("kv", 0) > 0, name + ": ledger accounts")
            streamed = c["configuration"].startswith("streamed")
            if streamed:
                check(0.6 < c["streamed_expert_fraction"] < 0.9, name + ": about three quarters streamed: %.2f" %
                      c["streamed_expert_fraction"])
                check(c["expert_hit_rate"] < 1 and c["expert_bytes_read"] > 0, name + ": misses read from disk")
            else:
                check(c["streamed_expert_fraction"] == 0 and c["expert_hit_rate"] == 1, name + ": all in RAM")
                check(c["resident_experts"] == 4 * 32, name + ": every expert resident")
            check(c["kv_codec"] == ("turbo3" if "turbo" in c["configuration"] else "f16"), name + ": codec")
        for x in (128, 512):
            for plain, turbo in (("in_ram", "turbo_kv"), ("streamed", "streamed_turbo_kv")):
                a, b = by[(x, plain)]["ledger_peak_bytes"]["kv"], by[(x, turbo)]["ledger_peak_bytes"]["kv"]
                check(b < a * 0.5, "%d: turbo3 KV %d bytes vs f16 %d" % (x, b, a))
            check(by[(x, "streamed")]["budget_bytes"] < by[(x, "in_ram")]["budget_bytes"], "%d: streamed budget" % x)
        md = open(os.path.join(out, "profile.md")).read()
        rows = [l for l in md.splitlines() if l.startswith("| ") and not l.startswith(("| context", "| ---"))]
        check(len(rows) == len(cells), "markdown: a row per cell")
        check(len([l for l in r.stdout.splitlines() if l.split()[:1] in (["128"], ["512"])]) == len(cells),
              "table: a row per cell")
        svg = ET.parse(os.path.join(out, "profile.svg")).getroot()
        titled = "{http://www.w3.org/2000/svg}title"
        rects = [e for e in svg.iter() if e.tag.endswith("rect") and e.find(titled) is not None]
        check(len(rects) == 3 * len(cells), "svg: a bar per cell and panel (%d)" % len(rects))
    if failures:
        raise SystemExit("%d failures" % len(failures))
    print("bench profile: all checks hold")


if __name__ == "__main__":
    main()
