#!/usr/bin/env bash
# bench/mlxslot.sh — decode of an MLX MoE folder on small RAM, one binary against another on the same plan
# (bench/results/mlx-slot.md: the expert miss path before and after the MLX slot repack).
# For one model folder, in a cgroup v1 memory group of LIMIT_MIB:
#   ROUNDS x, interleaved, for each binary in BINS: drop caches, the disk bound on the model's own expert extents with
#   the plan's reader (tools/peer/expert_disk_bound, BOUND_SECONDS), drop caches, `BIN serve --model M --wisdom W
#   --port 0` in a fresh group, bench/headline_client.py asks one greedy streamed completion of TOKENS tokens; decode
#   tok/s, the request's and decode's tier counters (misses, disk bytes, read stall, conversion time where the binary
#   has the counter), and the bound = min(compute: 1 / calibrate's all-in-memory decode step at the plan's threads,
#   disk: the bound's GB/s / the decode's bytes read per generated token).
# The plan W is made beforehand (`tierlm calibrate --model M --wisdom W` in the same group) and shared by every run,
# so the binaries differ only in their code. `uptime` load is printed beside every step.
# BINS entries are NAME:BINARY or NAME:BINARY:MODEL_DIR (another folder of the same model, e.g. one holding a
# `tierlm pack` experts.tierlm beside symlinks to the safetensors; W then needs an entry for that folder carrying the
# same plan, or serve calibrates it anew and the runs no longer share a plan).
# Usage: MODEL=DIR WISDOM=W BINS="before:/path/tierlm after:/path/tierlm" BOUND=/path/expert_disk_bound
#        [LIMIT_MIB=1024 TOKENS=24 ROUNDS=2 OUT=DIR] bench/mlxslot.sh      (root: cgroup v1 + drop_caches)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
: "${MODEL:?}" "${WISDOM:?}" "${BINS:?}" "${BOUND:?}"
LIMIT_MIB="${LIMIT_MIB:-1024}"; TOKENS="${TOKENS:-24}"; ROUNDS="${ROUNDS:-2}"; OUT="${OUT:-$(dirname "$MODEL")/mlxslot}"
mkdir -p "$OUT"
group=/sys/fs/cgroup/memory/tierlm_mlxslot_$$
pid=""
. "$here/bench_lib.sh"  # load, say, drop_caches, cleanup, reader_of_wisdom
trap cleanup EXIT
fresh_group() {
  [ -d "$group" ] && rmdir "$group"
  mkdir "$group"
  echo $((LIMIT_MIB << 20)) >"$group/memory.limit_in_bytes"
  echo 0 >"$group/memory.swappiness"
}
reader=$(reader_of_wisdom <"$WISDOM")
read -r depth block <<<"$reader"
for round in $(seq 1 "$ROUNDS"); do
  for entry in $BINS; do
    name="${entry%%:*}" bin="${entry#*:}" model="$MODEL"
    if [[ "$bin" == *:* ]]; then model="${bin#*:}" bin="${bin%%:*}"; fi
    fresh_group
    drop_caches
    # The disk bound just before each run (it moves with the host's load): the model's own expert extents, read the
    # way the tier reads them, with the plan's reader.
    (echo "$BASHPID" >"$group/cgroup.procs" && exec "$BOUND" "$MODEL" --seconds "${BOUND_SECONDS:-10}" --depth "$depth" \
      --block "$block") >"$OUT/bound-$name-$round.json"
    drop_caches
    log="$OUT/serve-$name-$round.log"
    (echo "$BASHPID" >"$group/cgroup.procs" && exec "$bin" serve --model "$model" --wisdom "$WISDOM" --port 0) >"$log" 2>&1 &
    pid=$!
    port=""
    for _ in $(seq 1 6000); do
      port="$(sed -n 's/.*listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$log" | head -n1)"
      [ -n "$port" ] && break
      kill -0 "$pid" 2>/dev/null || { tail -n 20 "$log"; say "$name: serve exited at start"; exit 1; }
      sleep 0.1
    done
    l0=$(load)
    python3 "$here/headline_client.py" "$port" "$pid" "$TOKENS" >"$OUT/client-$name-$round.json"
    kill "$pid"; wait "$pid" 2>/dev/null || true; pid=""
    python3 - "$OUT/client-$name-$round.json" "$name" "$round" "$l0" "$(load)" "$(cat "$group/memory.max_usage_in_bytes")" \
      "$(grep '^oom_kill ' "$group/memory.oom_control" | cut -d' ' -f2)" "$OUT/bound-$name-$round.json" "$WISDOM" "$model" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
t, d = c["request_tiering"], c["decode_tiering"]
bound = json.load(open(sys.argv[8]))
import os
entries = json.load(open(sys.argv[9]))["entries"]  # the entry of the folder served (serve found it the same way)
entry = [e for e in entries if os.path.abspath(e["model"]["path"]) == os.path.abspath(sys.argv[10])][0]
threads = entry["plan"]["threads"]
step = [x["step_seconds"] for x in entry["model"]["timings"] if x["threads"] == threads][0]
# bound = min(compute: 1 / calibrate's decode step with every expert in memory, disk: the bound's GB/s over the bytes
# this run read per generated token during decode)
per_token = d["disk_bytes_read"] / (c["usage"]["completion_tokens"] - 1)
compute_tok_s, disk_tok_s = 1 / step, bound["gb_per_s"] * 1e9 / per_token
print(json.dumps({"binary": sys.argv[2], "round": int(sys.argv[3]), "decode_tok_s": c["decode_tok_s"],
                  "bound_tok_s": round(min(compute_tok_s, disk_tok_s), 3), "compute_tok_s": round(compute_tok_s, 3),
                  "disk_tok_s": round(disk_tok_s, 3), "disk_gb_s": bound["gb_per_s"],
                  "of_bound": round(c["decode_tok_s"] / min(compute_tok_s, disk_tok_s), 3),
                  "decode_mib_per_token": round(per_token / 2**20, 1),
                  "completion_tokens": c["usage"]["completion_tokens"], "prompt_tokens": c["usage"]["prompt_tokens"],
                  "misses": t["cache_misses"], "hits": t["cache_hits"], "disk_bytes_read": t["disk_bytes_read"],
                  "read_stall_s": round(t["read_stall_seconds"], 3), "decode": c["decode_tiering"],
                  "conversion_s": c.get("request_conversion", {}).get("conversion_seconds"),
                  "ledger_peak": c["memory"]["ledger_peak_bytes"], "ledger_budget": c["memory"]["ledger_budget_bytes"],
                  "vm_hwm": c["vm_hwm_bytes"],
                  "cgroup_peak": int(sys.argv[6]), "oom_kill": int(sys.argv[7]), "load_start": sys.argv[4],
                  "load_end": sys.argv[5]}))
PY
  done
done
