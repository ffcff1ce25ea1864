#!/usr/bin/env bash
# stdout carries only the product: on a machine with no wisdom yet (a fresh, empty XDG cache), `run` calibrates
# first and says so on stderr, while stdout holds exactly the prompt and its completion; `calibrate --json` and
# `wisdom show --json` print one JSON document that parses; `serve` prints nothing on stdout.
# usage: stdout_is_product.sh TIERLM_BINARY MODEL_DIR
set -euo pipefail
bin="$1" model="$2"
XDG_CACHE_HOME="$(mktemp -d)"
export XDG_CACHE_HOME
work="$(mktemp -d)"
trap 'rm -rf "$XDG_CACHE_HOME" "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# 1. First run: no wisdom, so a quick calibration runs; its notice must be on stderr only.
"$bin" run --model "$model" --prompt "Return the number of" -n 8 --threads 1 >"$work/out" 2>"$work/err"
grep -qi "calibrat" "$work/err" || fail "the first run did not report its calibration on stderr"
[ "$(wc -l <"$work/out")" = 1 ] || { cat "$work/out"; fail "stdout has more than the completion's one line"; }
grep -q "^Return the number of" "$work/out" || { cat "$work/out"; fail "stdout does not start with the prompt"; }
[ -s "$XDG_CACHE_HOME/tierlm/wisdom.json" ] || fail "no wisdom written under the test's own XDG_CACHE_HOME"

# 2. A second run (wisdom now present) prints the same completion, byte for byte.
"$bin" run --model "$model" --prompt "Return the number of" -n 8 --threads 1 >"$work/out2" 2>/dev/null
cmp -s "$work/out" "$work/out2" || fail "the second run's stdout differs from the first's"

# 3. JSON output is one parseable document.
"$bin" calibrate --model "$model" --quick --json >"$work/calibrate.json" 2>"$work/err"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert "plan" in d' "$work/calibrate.json" ||
  fail "calibrate --json stdout is not one JSON document"
"$bin" wisdom show --model "$model" --json >"$work/wisdom.json" 2>"$work/err"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["entries"]' "$work/wisdom.json" ||
  fail "wisdom show --json stdout is not one JSON document"

# 4. serve: the listening line and logs go to stderr; stdout stays empty.
"$bin" serve --model "$model" --host 127.0.0.1 --port 0 --threads 1 >"$work/serve.out" 2>"$work/serve.err" &
pid=$!
for _ in $(seq 1 300); do
  grep -q "listening on" "$work/serve.err" && break
  kill -0 "$pid" 2>/dev/null || { cat "$work/serve.err"; fail "serve exited"; }
  sleep 0.1
done
kill "$pid"; wait "$pid" || true
grep -q "listening on" "$work/serve.err" || fail "serve did not report its address on stderr"
[ ! -s "$work/serve.out" ] || { cat "$work/serve.out"; fail "serve wrote to stdout"; }
echo "stdout carries only the product"
