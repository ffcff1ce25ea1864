#!/usr/bin/env bash
# Runs every libFuzzer harness (tests/fuzz/) for SECONDS each (default 600) and prints, per harness, executions,
# exec/s, coverage (edges and features), corpus growth and crashes. tools/test.sh runs it for ~30 s each in CI.
#   bash bench/fuzz.sh [SECONDS] [HARNESS...]
# Builds build-fuzz first (clang, ASan + UBSan + libFuzzer; -DTIERLM_FUZZ=ON). Harnesses run FUZZ_JOBS at a time
# (default: the number of cores), each over its committed corpus (tests/fuzz/corpus/NAME, regressions included) and
# its dictionary, with -timeout (an input running over FUZZ_TIMEOUT s, default 10, is a hang) and -rss_limit_mb (a
# process over FUZZ_RSS_MB MiB, default 1024, or one malloc that large, is a bug: no small input may allocate that).
# New corpus entries go to a temporary folder (kept, and named at the end, when FUZZ_KEEP=1 or something failed);
# the committed corpus is never written. Exit status 1 when any harness found a crash, leak, hang or OOM: each
# reproducer is listed with the command that replays it; commit it under tests/fuzz/corpus/NAME/regressions/
# once fixed.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-600}
shift || true
jobs=${FUZZ_JOBS:-$(nproc)}
build=${FUZZ_BUILD:-build-fuzz}

if [ ! -f "$build/CMakeCache.txt" ]; then
  mkdir -p "$build"
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=None -DTIERLM_FUZZ=ON -DCMAKE_C_COMPILER=clang \
        -DCMAKE_CXX_COMPILER=clang++ > "$build/configure.log" 2>&1 || { cat "$build/configure.log"; exit 1; }
fi
start=$(date +%s)
cmake --build "$build" -j"$jobs" > "$build/build.log" 2>&1 || { tail -n 60 "$build/build.log"; exit 1; }
echo "fuzz: harnesses built in $(( $(date +%s) - start )) s"

work=$(mktemp -d -t tierlm-fuzz.XXXXXX)
names=()
while read -r name binary corpus dict; do
  if [ $# -gt 0 ] && ! printf '%s\n' "$@" | grep -qx "$name"; then continue; fi
  names+=("$name")
  mkdir -p "$work/$name/new" "$work/$name/artifacts"
  printf '%s\n' "$binary" "$corpus" "$dict" > "$work/$name/args"
done < "$build/fuzz_harnesses.txt"
[ ${#names[@]} -gt 0 ] || { echo "fuzz: no harness matches: $*"; exit 1; }

run_one() {
  local name=$1 dir="$work/$1" binary corpus dict status
  { read -r binary; read -r corpus; read -r dict; } < "$dir/args"
  # ASan's leak check runs at exit and per input (libFuzzer -detect_leaks); UBSan reports abort (built with
  # -fno-sanitize-recover); the first corpus folder receives new inputs, the committed one is only read.
  ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} \
  nice -n 10 "$binary" -max_total_time="$seconds" -timeout="${FUZZ_TIMEOUT:-10}" -rss_limit_mb="${FUZZ_RSS_MB:-1024}" \
    -dict="$dict" -artifact_prefix="$dir/artifacts/" -print_final_stats=1 -reload=0 \
    "$dir/new" "$corpus" > "$dir/log" 2>&1 && status=0 || status=$?
  echo "$status" > "$dir/status"
}

echo "fuzz: ${#names[@]} harnesses, $seconds s each, $jobs at a time; work folder $work"
running=0
for name in "${names[@]}"; do
  run_one "$name" &
  running=$((running + 1))
  if [ "$running" -ge "$jobs" ]; then wait -n || true; running=$((running - 1)); fi
done
wait || true

failed=0
printf '%-20s %12s %9s %7s %8s %11s %s\n' harness executions exec/s cov features corpus+new result
for name in "${names[@]}"; do
  dir="$work/$name"
  status=$(cat "$dir/status" 2>/dev/null || echo 1)
  stat() { sed -n "s/^stat::$1: *\([0-9]*\).*/\1/p" "$dir/log" | tail -n1; }
  execs=$(stat number_of_executed_units)
  rate=$(stat average_exec_per_sec)
  last=$(grep -E '^#[0-9]+' "$dir/log" | grep -E 'cov: ' | tail -n1 || true)
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<< "$last")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<< "$last")
  new=$(find "$dir/new" -type f | wc -l)
  corp=$(sed -n 's/.* corp: \([0-9]*\/[0-9A-Za-z]*\).*/\1/p' <<< "$last")
  artifacts=$(find "$dir/artifacts" -type f | sort)
  result=ok
  if [ "$status" != 0 ] || [ -n "$artifacts" ]; then
    result="FAILED (exit $status)"
    failed=$((failed + 1))
  fi
  printf '%-20s %12s %9s %7s %8s %11s %s\n' "$name" "${execs:-?}" "${rate:-?}" "${cov:-?}" "${ft:-?}" \
         "${corp:-?}+$new" "$result"
  if [ "$result" != ok ]; then
    grep -E 'ERROR: |SUMMARY: |runtime error|invariant broken|terminate called|what\(\)' "$dir/log" | head -n 8 | sed 's/^/    /' || true
    for a in $artifacts; do echo "    reproducer: $a  (replay: $(sed -n 1p "$dir/args") $a)"; done
    echo "    log: $dir/log"
  fi
done
if [ "$failed" -gt 0 ] || [ "${FUZZ_KEEP:-0}" = 1 ]; then
  echo "fuzz: work folder kept: $work (new corpus entries in NAME/new, logs in NAME/log)"
else
  rm -rf "$work"
fi
[ "$failed" = 0 ] || { echo "fuzz: $failed harness(es) found a crash, leak, hang or OOM"; exit 1; }
echo "fuzz: no crash, leak, hang or OOM in ${#names[@]} harnesses"
