#!/usr/bin/env bash
# bench/soak.sh [MINUTES] [soak_client.py flags...] — a bounded loopback soak of `tierlm serve` (default 20 minutes):
# calibrates quickly into a temporary XDG_CACHE_HOME, then bench/soak_client.py starts the server on the embedded
# default model at 127.0.0.1 (port 0), keeps it at capacity with a mix of streamed, cancelled, malformed, oversized,
# slow and keep-alive requests, samples RSS, fds and /health every 10 s, checks zero 5xx, RSS flat within 5% after
# warm-up, fds and KV back to idle, then kills it with SIGKILL mid-load and restarts it on the same wisdom. Prints a
# summary and `soak: N passed, M failed`; exits non-zero on failure (the server log is kept then).
# TIERLM_BINARY overrides build/tierlm. Traffic goes to 127.0.0.1 only. Run it niced on a shared machine.
set -uo pipefail
minutes="${1:-20}"
shift || true
root="$(cd "$(dirname "$0")/.." && pwd)"
binary="${TIERLM_BINARY:-$root/build/tierlm}"
model="$root/profiles/models/tierlm-tiny"
[ -x "$binary" ] || { echo "soak: no $binary (cmake --build build --target tierlm)"; exit 2; }
command -v python3 >/dev/null || { echo "soak: python3 is required"; exit 2; }
work="$(mktemp -d -t tierlm-soak.XXXXXX)"
export XDG_CACHE_HOME="$work/cache"  # never the user's wisdom
export NO_PROXY="127.0.0.1" no_proxy="127.0.0.1"

echo "soak: quick calibration into $XDG_CACHE_HOME/tierlm/wisdom.json"
if ! "$binary" calibrate --model "$model" --quick >"$work/calibrate.log" 2>&1; then
  cat "$work/calibrate.log"; echo "soak: calibration failed (kept $work)"; exit 1
fi
python3 "$root/bench/soak_client.py" --binary "$binary" --model "$model" \
  --cache-dir "$XDG_CACHE_HOME" --log "$work/serve.log" --minutes "$minutes" "$@"
status=$?
if [ $status -eq 0 ]; then
  rm -rf "$work"
else
  echo "--- last lines of the server log ($work/serve.log, kept) ---"
  tail -n 30 "$work/serve.log"
fi
exit $status
