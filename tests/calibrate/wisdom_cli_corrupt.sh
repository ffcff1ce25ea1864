#!/usr/bin/env bash
# A corrupt wisdom file through the CLI, in a temporary XDG_CACHE_HOME (never the user's cache).
#   show:        `tierlm wisdom show` and `tierlm run --on-missing-wisdom refuse` exit 1 with the file's name, what is
#                wrong and the command that rebuilds it (never a crash or a bare Boost.JSON message), and leave the file
#                as it was.
#   recalibrate: `tierlm run` (default --on-missing-wisdom calibrate) moves the corrupt file aside to
#                wisdom.json.corrupt-TIME, warns, calibrates quickly, runs, and `wisdom show` then renders the new plan.
# usage: wisdom_cli_corrupt.sh TIERLM_BINARY MODEL_DIR show|recalibrate
set -u
binary="$1"; model="$2"; mode="$3"
work="$(mktemp -d -t tierlm-wisdom-cli.XXXXXX)"
trap 'rm -rf "$work"' EXIT
export XDG_CACHE_HOME="$work/cache"
file="$work/wisdom.json"
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# Runs the command (stdin closed, bounded), keeping its output in $out and exit code in $status.
run() {
  out="$(timeout 300 "$@" 2>&1 </dev/null)"
  status=$?
}

expect_clear_error() {  # NAME: the last run must have exited 1 with the whole message and no crash
  local name="$1"
  [ "$status" -eq 1 ] || fail "$name: exit code $status, expected 1"
  printf '%s\n' "$out" | grep -qF "tierlm: error: wisdom file $file is corrupt" || fail "$name: no 'wisdom file $file is corrupt'"
  printf '%s\n' "$out" | grep -qF "tierlm calibrate --model" || fail "$name: no recalibrate command"
  printf '%s\n' "$out" | grep -qF "or delete $file" || fail "$name: no 'or delete $file'"
  if printf '%s\n' "$out" | grep -qiE 'terminate called|Segmentation|Aborted|AddressSanitizer|boost\.json'; then
    fail "$name: crashed or leaked a raw library error"
  fi
}

if [ "$mode" = show ]; then
  printf '' >"$work/empty"
  printf '{"schema":"tierlm-wisdom","schema_version":1,"entries":[{"created_at":"x","dev' >"$work/truncated"
  head -c 512 /dev/urandom >"$work/binary"; printf '\000' >>"$work/binary"
  printf '{"schema":"tierlm-wisdom","schema_version":"1","entries":[]}' >"$work/wrong-type"
  printf '{"schema":"tierlm-wisdom","schema_version":7,"entries":[]}' >"$work/future-version"
  printf '{"schema":"tierlm-wisdom","schema_version":1,"entries":[{"plan":{"threads":"four"}}]}' >"$work/bad-entry"
  for kind in empty truncated binary wrong-type future-version bad-entry; do
    cp "$work/$kind" "$file"
    run "$binary" wisdom show --wisdom "$file"
    printf -- '--- wisdom show, %s (exit %s):\n%s\n' "$kind" "$status" "$out"
    expect_clear_error "wisdom show ($kind)"
    run "$binary" wisdom show --wisdom "$file" --json --model "$model"
    expect_clear_error "wisdom show --json --model ($kind)"
    printf '%s\n' "$out" | grep -qF "tierlm calibrate --model $model --wisdom $file" ||
      fail "wisdom show --model ($kind): the command does not name the model and the file"
    run "$binary" run --model "$model" --wisdom "$file" --on-missing-wisdom refuse -n 1 --threads 1
    expect_clear_error "run --on-missing-wisdom refuse ($kind)"
    printf '%s\n' "$out" | grep -qF -- "--on-missing-wisdom calibrate" || fail "run refuse ($kind): no alternative flag"
    cmp -s "$file" "$work/$kind" || fail "$kind: the file was changed"
    ls "$work" | grep -q 'corrupt-' && fail "$kind: a reader moved the file aside"
  done
elif [ "$mode" = recalibrate ]; then
  mkdir -p "$XDG_CACHE_HOME/tierlm"
  file="$XDG_CACHE_HOME/tierlm/wisdom.json"  # the default path: run and serve's usual case
  printf '{"schema":"tierlm-wisdom","schema_version":1,"entries":[{"created_at":"x","dev' >"$file"
  cp "$file" "$work/original"
  run "$binary" run --model "$model" --prompt "Return the number of" -n 4 --threads 1
  printf -- '--- run over a corrupt wisdom file (exit %s):\n%s\n' "$status" "$out"
  [ "$status" -eq 0 ] || fail "run: exit code $status, expected 0"
  printf '%s\n' "$out" | grep -qF "$file is corrupt" || fail "run: no warning naming the corrupt file"
  aside="$(ls "$XDG_CACHE_HOME/tierlm" | grep '^wisdom\.json\.corrupt-' | head -n1)"
  [ -n "$aside" ] || fail "run: the corrupt file was not moved aside"
  [ -n "$aside" ] && { cmp -s "$XDG_CACHE_HOME/tierlm/$aside" "$work/original" || fail "run: the file kept aside differs"; }
  printf '%s\n' "$out" | grep -qF "kept it as $XDG_CACHE_HOME/tierlm/$aside" || fail "run: the warning does not say where it went"
  run "$binary" wisdom show --json
  [ "$status" -eq 0 ] || fail "wisdom show after recalibrating: exit code $status: $out"
  ls "$XDG_CACHE_HOME/tierlm" | grep -q '\.tmp\.' && fail "temporary files left behind"
else
  echo "usage: $0 TIERLM_BINARY MODEL_DIR show|recalibrate"; exit 2
fi
[ "$failures" -eq 0 ] && echo "wisdom_cli_corrupt $mode: ok" || echo "wisdom_cli_corrupt $mode: $failures failures"
[ "$failures" -eq 0 ]
