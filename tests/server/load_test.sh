#!/usr/bin/env bash
# Bounded load test on loopback (run through with_server.sh): wrk with 16 connections for 8 s of short completions.
# Passes when every response was 2xx (no 5xx, no 429 at this concurrency) and there were no socket errors; prints
# p50/p99 latency and requests/s. Skips (77) when wrk is not installed.
set -euo pipefail
command -v wrk >/dev/null 2>&1 || { echo "SKIP: wrk is not installed (apt-get install wrk; tools/setup.sh installs it)"; exit 77; }
case "$TIERLM_ROOT_URL" in http://127.0.0.1:*) ;; *) echo "load test only runs against 127.0.0.1"; exit 1;; esac
out="$(wrk --threads 2 --connections "${LOAD_CONNECTIONS:-16}" --duration "${LOAD_SECONDS:-8}s" --timeout 10s \
  --script "$(dirname "$0")/load_test.lua" "$TIERLM_ROOT_URL/v1/completions")"
echo "$out"
line="$(echo "$out" | grep '^LOAD ')"
get() { echo "$line" | tr ' ' '\n' | sed -n "s/^$1=//p"; }
[ "$(get requests)" -gt 0 ] || { echo "FAIL: no requests completed"; exit 1; }
[ "$(get 5xx)" -eq 0 ] || { echo "FAIL: $(get 5xx) responses were 5xx"; exit 1; }
[ "$(get 4xx)" -eq 0 ] || { echo "FAIL: $(get 4xx) responses were 4xx"; exit 1; }
[ "$(get socket_errors)" -eq 0 ] || { echo "FAIL: $(get socket_errors) socket errors"; exit 1; }
echo "ok   load: $(get requests) requests, p50 $(get p50_ms) ms, p99 $(get p99_ms) ms, $(get rps) req/s, zero 5xx"
