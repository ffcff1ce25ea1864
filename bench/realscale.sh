#!/usr/bin/env bash
# bench/realscale.sh — the real-scale small-RAM bench (issue 14 items 3 and 4): a full-shape Qwen3-30B-A3B as a
# user's mlx-community 4-bit folder (~17 GB, random weights with shaped routing: tools/peer/synthetic_mlx_moe.cpp)
# served from inside memory cgroups far smaller than it, at defaults, against llama.cpp on a GGUF of the same
# weights (Q4_1 carrying the same 4-bit codes, scales and biases: tools/peer/gguf_export.cpp --from-mlx).
#
# Per cgroup limit (LIMITS, GiB), all in one cgroup v1 memory group made for it (removed after):
#   1. drop caches; `tierlm calibrate --model M --wisdom W` inside the group (its peak usage recorded);
#   2. for prefetch on (the plan's default) and off (--expert-prefetch 0): drop caches, `tierlm serve --model M
#      --wisdom W` inside the group, the openai SDK (bench/peer/realscale_client.mjs, outside the group: it is the
#      user) asks PROMPTS streamed completions of TOKENS tokens one after another; decode tok/s, the tier's counters
#      over decode (disk bytes, hits, misses, prefetches, stall), /health's ledger, the group's peak usage;
#   3. drop caches; llama.cpp (node-llama-cpp, prebuilt CPU library) on the GGUF, mmap, the plan's thread count,
#      inside the same group: LLAMA_TOKENS tokens after a prompt of the same length; its peak usage and the bytes it
#      read from the device per token.
# The bound is min(compute, disk) measured in the same run on the same files: compute = 1 / the decode step with
# every expert in memory, disk = expert bytes / the per-expert time of top-k concurrent misses, both timed by step 1's
# calibrate on this model (the wisdom's model profile), disk bound = that bandwidth / the run's bytes read per token.
# Host caching: every step starts after `sync; echo 3 > /proc/sys/vm/drop_caches` (the VM's own page cache; the
# hypervisor's cache of the virtual disk cannot be dropped from inside, so it is named in the results as such).
# `uptime` is recorded beside every row (the machine is shared; a row taken at load > 4 is flagged).
#
# MODEL=deepseek-v2-lite runs the same steps on a DeepSeek-V2-Lite-shaped folder instead (bf16 as published, 31.4 GB,
# MLA + YaRN: tools/peer/synthetic_deepseek_v2.cpp; no GGUF of it, so LLAMA=0), after `tierlm pack DIR --format
# $PACK` when PACK is set (what a user with little RAM does: the experts rewritten expert-major in q4/q8_0, streamed
# from DIR/experts.tierlm); it also records `tierlm fit --context 32768 --json` (the planner's KV at 32K).
#
# Usage: bench/realscale.sh [BUILD_DIR]   (as root: cgroup v1 memory + drop_caches; targets tierlm synthetic_mlx_moe
#        gguf_export routing_stats_bench built)
# Environment: MODEL=qwen3-30b-a3b|deepseek-v2-lite PACK=q4|q8_0 WORK=/work/scratch-realscale LIMITS="8 4" TOKENS=128 PROMPTS=3 LLAMA_TOKENS=$TOKENS PORT=5491
#              REUSE_WISDOM=1 (a rerun keeps an existing wisdom-<limit>g.json) PREFETCH_MODES="on off" LLAMA=0 (no
#              llama.cpp step, for reruns of tierlm rows)
#              KEEP=1 (keep the model files; else they are deleted at the end: ~36 GB) ROUTING_STATS=0 (skip the
#              routing table, e.g. while one is being made beside)
# Output: Markdown on stdout (bench/results/realscale.md is this), JSON lines in $WORK/results.jsonl.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$here/.."
build="$(cd "${1:-$root/build}" && pwd)"
work="${WORK:-/work/scratch-realscale}"; limits="${LIMITS:-8 4}"; tokens="${TOKENS:-128}"; nprompts="${PROMPTS:-3}"
llama_tokens="${LLAMA_TOKENS:-$tokens}"; port="${PORT:-5491}"
gguf="$work/qwen3-30b-a3b-q4_1.gguf"
case "${MODEL:-qwen3-30b-a3b}" in
  qwen3-30b-a3b) model="$work/qwen3-30b-a3b-mlx4"
    generate=("$build/bench/synthetic_mlx_moe" "$model" --tokenizer "$root/.cache/tokenizers/qwen3") ;;
  deepseek-v2-lite) model="$work/deepseek-v2-lite"; LLAMA=0; ROUTING_STATS=0
    generate=("$build/bench/synthetic_deepseek_v2" "$model" --config "$root/profiles/fit-configs/deepseek-v2-lite/config.json"
              --tokenizer "$root/.cache/tokenizers/deepseek_v3") ;;
  *) echo "realscale: MODEL must be qwen3-30b-a3b or deepseek-v2-lite" >&2; exit 2 ;;
esac
# The openai SDK (the user's client), and node-llama-cpp when llama.cpp runs.
[ -d "$here/peer/node_modules/openai" ] && { [ "${LLAMA:-1}" = 0 ] || [ -d "$here/peer/node_modules/node-llama-cpp" ]; } ||
  (cd "$here/peer" && npm install --no-audit --no-fund >&2)
results="$work/results.jsonl"
mkdir -p "$work"
log() { echo "realscale: $*" >&2; }
load1() { cut -d' ' -f1 /proc/loadavg; }


# The model and its GGUF (the commands to remake them; they are deleted at the end unless KEEP=1).
if [ ! -f "$model/model.safetensors.index.json" ]; then
  log "generating $model"
  /usr/bin/time -f "generate: %e s" "${generate[@]}" >&2
fi
if [ -n "${PACK:-}" ] && [ ! -f "$model/experts.tierlm" ]; then
  log "packing the experts of $model as $PACK"
  /usr/bin/time -f "pack: %e s, max RSS %M KiB" "$build/tierlm" pack "$model" --format "$PACK" >&2
fi
# The GGUF is first needed by the first llama.cpp step, so its export may overlap the first tierlm runs' start;
# "$gguf.ok" marks a finished export (an export already running for this model is waited for, not repeated).
gguf_ready() {
  while pgrep -f "gguf_export --from-mlx $model" > /dev/null; do sleep 10; done
  if [ ! -f "$gguf.ok" ]; then
    log "exporting $gguf"
    /usr/bin/time -f "gguf: %e s" "$build/bench/gguf_export" --from-mlx "$model" "$gguf" 2> "$gguf.log" >&2
    cat "$gguf.log" >&2
    touch "$gguf.ok"
  fi
  sync
}

drop_caches() { sync; echo 3 > /proc/sys/vm/drop_caches; }
prompt_files=$(ls -Sr "$root"/profiles/prompts/*.txt | head -n "$nprompts" | paste -sd,)  # the shortest prompts: decode is measured

: > "$results"
if [ "${MODEL:-qwen3-30b-a3b}" = deepseek-v2-lite ]; then
  echo "{\"fit_32k\": $(HOME="$work" "$build/tierlm" fit --model "$model" --context 32768 --budget 8 --json), \"load\": [$(load1)]}" >> "$results"
fi
# The routing of the model (not timed: it may run beside other steps, so it is kept once made).
[ -s "$work/routing.md" ] || [ "${ROUTING_STATS:-1}" = 0 ] || "$build/bench/routing_stats_bench" "$model" --max-prompts "${ROUTING_PROMPTS:-8}" \
  --seconds "${ROUTING_SECONDS:-120}" > "$work/routing.md"
[ -s "$work/routing.md" ] && echo "{\"routing\": $(python3 -c 'import json,sys; print(json.dumps(open(sys.argv[1]).read()))' "$work/routing.md")}" >> "$results"

for limit in $limits; do
  cg="/sys/fs/cgroup/memory/tierlm_realscale_${limit}g_$$"
  mkdir "$cg"
  trap 'rmdir "$cg" 2>/dev/null || true' EXIT
  echo $((limit << 30)) > "$cg/memory.limit_in_bytes"
  in_cg() { sh -c 'echo $$ > "$0/cgroup.procs" && exec "$@"' "$cg" "$@"; }
  reset_peak() { echo 0 > "$cg/memory.max_usage_in_bytes"; }
  peak() { cat "$cg/memory.max_usage_in_bytes"; }
  wisdom="$work/wisdom-${limit}g.json"
  if [ "${REUSE_WISDOM:-0}" != 1 ] || [ ! -f "$wisdom" ]; then
    rm -f "$wisdom"
    log "${limit} GiB: calibrate"
    drop_caches; reset_peak
    t0=$(date +%s.%N); l0=$(load1)
    in_cg "$build/tierlm" calibrate --model "$model" --wisdom "$wisdom" > "$work/calibrate-${limit}g.txt" 2> "$work/calibrate-${limit}g.log"
    echo "{\"limit_gib\": $limit, \"step\": \"calibrate\", \"seconds\": $(echo "$(date +%s.%N) - $t0" | bc), \"cgroup_peak\": $(peak), \"load\": [$l0, $(load1)]}" >> "$results"
  fi
  threads=$(python3 -c 'import json,sys; w=json.load(open(sys.argv[1])); e=w["entries"][-1] if "entries" in w else w; print(e["plan"]["threads"])' "$wisdom")

  for prefetch in ${PREFETCH_MODES:-on off}; do
    log "${limit} GiB: serve, prefetch $prefetch"
    extra=(); [ "$prefetch" = off ] && extra=(--expert-prefetch 0)
    drop_caches; reset_peak
    l0=$(load1)
    # Not through the in_cg function: `fn &` forks a subshell, and $! must be the server itself (sh execs it).
    sh -c 'echo $$ > "$0/cgroup.procs" && exec "$@"' "$cg" "$build/tierlm" serve --model "$model" --wisdom "$wisdom" \
      --port "$port" "${extra[@]}" 2> "$work/serve-${limit}g-$prefetch.log" &
    serve_pid=$!
    for _ in $(seq 600); do
      curl -sf "http://127.0.0.1:$port/health/live" > /dev/null && break
      kill -0 "$serve_pid" 2>/dev/null || { log "serve died: see $work/serve-${limit}g-$prefetch.log"; exit 1; }
      sleep 1
    done
    out=$(node "$here/peer/realscale_client.mjs" "http://127.0.0.1:$port" "$prompt_files" "$tokens")
    kill -TERM "$serve_pid"; wait "$serve_pid" || true
    while [ -n "$(cat "$cg/cgroup.procs")" ]; do sleep 1; done  # the next run starts in an empty group
    echo "{\"limit_gib\": $limit, \"step\": \"serve\", \"prefetch\": \"$prefetch\", \"threads\": $threads, \"cgroup_peak\": $(peak), \"load\": [$l0, $(load1)], \"result\": $out}" >> "$results"
  done

  if [ "${LLAMA:-1}" = 0 ]; then rmdir "$cg"; trap - EXIT; continue; fi
  gguf_ready
  log "${limit} GiB: llama.cpp mmap"
  prompt_tokens=$(python3 -c 'import json,sys; r=[json.loads(l) for l in open(sys.argv[1])]; print([x for x in r if x.get("step")=="serve"][-1]["result"]["requests"][0]["prompt_tokens"])' "$results")
  drop_caches; reset_peak
  l0=$(load1)
  out=$(in_cg node "$here/peer/realscale_llamacpp.mjs" "$gguf" "$threads" "$prompt_tokens" "$llama_tokens")
  echo "{\"limit_gib\": $limit, \"step\": \"llama.cpp\", \"threads\": $threads, \"cgroup_peak\": $(peak), \"load\": [$l0, $(load1)], \"result\": $out}" >> "$results"
  rmdir "$cg"
  trap - EXIT
done

python3 "$here/peer/realscale_summary.py" "$results" "$work"
if [ "${KEEP:-0}" != 1 ]; then rm -rf "$model" "$gguf" "$gguf.ok" "$gguf.log"; fi
