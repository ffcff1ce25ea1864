#!/usr/bin/env bash
# `tierlm serve` fits the calibrated plan to the flags it is given (issue 14, item 2). The plan is made for the default
# batch (8) at context 256 within a small budget, on a synthetic MoE model whose experts fill that budget:
#  - `--max-batch 32` needs more KV than the plan holds: serve starts, says on stderr that the expert cache shrinks,
#    and /health shows 32 KV slots with the ledger within the budget;
#  - `--max-batch 1024` cannot fit even with the smallest KV codec: serve exits 1 with the numbers and what fits
#    ("What fits: --max-batch N ..."), never a bare ledger error;
#  - the N it names is right: `--max-batch N` starts and `--max-batch N+1` is refused.
# usage: serve_fits_flags.sh TIERLM_BINARY WRITE_MOE_FIXTURE_BINARY
set -euo pipefail
bin="$1"
writer="$2"
work="$(mktemp -d)"
pid=""
cleanup() {
  if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*"
  for f in "$work"/*.log; do [ -f "$f" ] && { echo "--- $f"; tail -n 30 "$f"; }; done
  exit 1
}
model="$work/model"
"$writer" "$model" 4 32 4 256 512 >/dev/null
export XDG_CACHE_HOME="$work/cache"
budget_gib=0.04  # 41 MiB: about 7 of dense weights, the rest KV, scratch and experts (28 MiB of them on disk)
"$bin" calibrate --model "$model" --quick --budget "$budget_gib" --context 256 >"$work/plan.txt" 2>"$work/calibrate.log" ||
  fail "calibrate"

# Starts serve with the given flags; on success leaves it running in $pid with its port in $port.
start_serve() {
  local log="$1"; shift
  "$bin" serve --model "$model" --port 0 --threads 1 "$@" >"$log" 2>&1 &
  pid=$!
  port=""
  for _ in $(seq 1 600); do
    port="$(sed -n 's/.*listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$log" | head -n1)"
    [ -n "$port" ] && return 0
    if ! kill -0 "$pid" 2>/dev/null; then
      local status=0
      wait "$pid" || status=$?
      pid=""
      return "$status"
    fi
    sleep 0.1
  done
  fail "no port after 60 s ($*)"
}
stop_serve() { kill "$pid"; wait "$pid" 2>/dev/null || true; pid=""; }

# Shrink: more slots than planned.
start_serve "$work/shrink.log" --max-batch 32 || fail "serve --max-batch 32 did not start"
grep -q "expert cache shrinks" "$work/shrink.log" || fail "no note that the expert cache shrinks"
grep "expert cache shrinks" "$work/shrink.log"
python3 - "$port" <<'PY' || fail "health after the shrink"
import http.client, json, sys
c = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1]), timeout=30)
c.request("GET", "/health")
h = json.loads(c.getresponse().read())
m = h["memory"]
assert h["kv"]["slots"] == 32 and h["kv"]["context"] == 256, h["kv"]
assert 0 < m["ledger_used_bytes"] <= m["ledger_budget_bytes"], m
print(f"--max-batch 32: {h['kv']['slots']} slots x {h['kv']['context']}, ledger {m['ledger_used_bytes'] >> 20} of "
      f"{m['ledger_budget_bytes'] >> 20} MiB")
PY
stop_serve

# Refusal: far more than fits.
status=0
start_serve "$work/refuse.log" --max-batch 1024 || status=$?
[ "$status" = 1 ] || fail "serve --max-batch 1024: exit $status, expected 1"
grep -q "memory budget exceeded" "$work/refuse.log" && fail "a bare ledger error"
grep -q -- "--max-batch 1024 --context 256 does not fit" "$work/refuse.log" || fail "the refusal does not say what was asked"
grep -q -- "raise --mem-budget" "$work/refuse.log" || fail "the refusal names no flag to change"
grep "does not fit" "$work/refuse.log"
fits="$(sed -n 's/.*What fits: --max-batch \([0-9]*\) at --context 256.*/\1/p' "$work/refuse.log")"
[ -n "$fits" ] || fail "the refusal does not say which --max-batch fits"

# What it said fits does, and one more does not.
start_serve "$work/fits.log" --max-batch "$fits" || fail "serve --max-batch $fits (said to fit) did not start"
stop_serve
status=0
start_serve "$work/over.log" --max-batch "$((fits + 1))" || status=$?
[ "$status" = 1 ] || fail "serve --max-batch $((fits + 1)) (one more than fits): exit $status, expected 1"
echo "serve fits its flags: --max-batch 32 shrinks the expert cache, 1024 is refused, $fits fits and $((fits + 1)) does not"
