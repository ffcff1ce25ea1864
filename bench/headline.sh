#!/usr/bin/env bash
# bench/headline.sh — the seed's headline models at real shape on small RAM (issue 15: "Real shapes on small RAM",
# "Memory"). Random weights, real tensor names and shapes, mlx-community affine 4-bit layout
# (tools/peer/synthetic_mlx_headline.cpp); every number is printed with the load average beside it.
#
#   gemma   Gemma-4-26B-A4B, 30 layers, ~14 GB: `tierlm calibrate` then `tierlm serve` at defaults inside a cgroup v1
#           memory group of LIMIT_GIB (8); an OpenAI-protocol client streams a completion (decode tok/s from the
#           chunks' arrival times); the disk bound is measured on the model's own files right before, with the
#           plan's reader (tools/peer/expert_disk_bound.cpp); /health's ledger and the cgroup's peak memory after.
#           Then `serve --context 32768 --max-batch 1` in the same group: /health's kv accounts (windowed layers
#           hold their window, full layers the context) against what full attention on every layer would cost.
#   qwen    Qwen3.5-122B-A10B with its real layer shapes, QWEN_LAYERS (4: 3 Gated DeltaNet + 1 full attention) of
#           48: per-layer decode cost from `calibrate`'s model timings on variants of 1, 3 and 4 layers (the same
#           shards, config.json cut), the disk bound on the same files, a measured streamed decode (calibrate + serve at
#           defaults in a QWEN_STREAM_GIB group), and the extrapolated 48-layer tok/s at 16 and 8 GiB (bench/headline_extrapolate.py); then /health
#           at 32K context (fixed recurrent state vs full KV).
# Host caching: the page cache is dropped (echo 3 > /proc/sys/vm/drop_caches) before calibrate, the bound and serve
# when allowed (said otherwise); the tier and the bound read with O_DIRECT, so the page cache cannot serve them.
#
# usage: bench/headline.sh [BUILD_DIR]    env: WORK (/work/scratch-headline), PARTS ("gemma qwen"), LIMIT_GIB (8),
#        TOKENS (24), CALIBRATE_FLAGS (--quick --prompts WORK/prompts: one short prompt), QWEN_LAYERS (4), QWEN_STREAM_GIB (4: the group of the measured streamed decode), KEEP=1 keeps the model folders. Needs root and cgroup v1 for the limit.
set -euo pipefail
build="$(cd "${1:-build}" && pwd)"
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(dirname "$here")"
bin="$build/tierlm"
gen="$build/bench/synthetic_mlx_headline"
bound="$build/bench/expert_disk_bound"
WORK="${WORK:-/work/scratch-headline}"
PARTS="${PARTS:-gemma qwen}"
LIMIT_GIB="${LIMIT_GIB:-8}"
TOKENS="${TOKENS:-24}"
QWEN_LAYERS="${QWEN_LAYERS:-4}"
QWEN_STREAM_GIB="${QWEN_STREAM_GIB:-4}"
mkdir -p "$WORK/prompts"
# calibrate's router traces run prompts token by token with every expert read from disk: on this VM's ~50 MB/s disk
# a Gemma-4-26B token costs ~20 s cold, so the traces use one short prompt (CALIBRATE_FLAGS overrides).
echo "Small memory, large model." >"$WORK/prompts/short.txt"
CALIBRATE_FLAGS="${CALIBRATE_FLAGS:---quick --prompts $WORK/prompts}"
export XDG_CACHE_HOME="$WORK/cache"  # the wisdom of this bench only
root=/sys/fs/cgroup/memory
group="$root/tierlm_headline_$$"
pid=""
. "$here/bench_lib.sh"  # load, say, drop_caches, cleanup, reader_of_wisdom
trap cleanup EXIT

make_group() {  # make_group BYTES
  [ -d "$group" ] && rmdir "$group"
  if [ "$(id -u)" != 0 ] || ! mkdir "$group" 2>/dev/null || ! echo "$1" >"$group/memory.limit_in_bytes" 2>/dev/null; then
    say "no cgroup v1 memory group: running without a limit"
    group=""
    return
  fi
  echo 0 >"$group/memory.swappiness" 2>/dev/null || true
  say "cgroup $group: limit $(( $(cat "$group/memory.limit_in_bytes") >> 20 )) MiB"
}
in_group() { if [ -n "$group" ]; then (echo "$BASHPID" >"$group/cgroup.procs" && exec "$@"); else "$@"; fi; }
group_report() {
  [ -n "$group" ] || return 0
  say "cgroup peak $(( $(cat "$group/memory.max_usage_in_bytes") >> 20 )) MiB of $(( $(cat "$group/memory.limit_in_bytes") >> 20 )) MiB; $(grep oom_kill "$group/memory.oom_control" | tr '\n' ' ')"
}
plan_reader() { "$bin" wisdom show --model "$1" --json | reader_of_wisdom; }  # plan_reader MODEL -> "DEPTH BLOCK"
# serve_measure MODEL LOG CLIENT_JSON [serve flags...]: serve in the group, a streamed completion, /health, stop.
serve_measure() {
  local model="$1" log="$2" out="$3"
  shift 3
  (if [ -n "$group" ]; then echo "$BASHPID" >"$group/cgroup.procs"; fi; exec "$bin" serve --model "$model" --port 0 "$@") >"$log" 2>&1 &
  pid=$!
  local port="" start
  start=$(date +%s)
  for _ in $(seq 1 36000); do
    port="$(sed -n 's/.*listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$log" | head -n1)"
    [ -n "$port" ] && break
    kill -0 "$pid" 2>/dev/null || { tail -n 30 "$log"; say "serve exited at start"; pid=""; return 1; }
    sleep 0.1
  done
  say "serve $* listening after $(( $(date +%s) - start )) s (port $port)"
  python3 "$here/headline_client.py" "$port" "$pid" "$TOKENS" >"$out" || { tail -n 30 "$log"; say "client failed"; }
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  pid=""
  cat "$out"
}

gemma() {
  local model="$WORK/gemma4-26b-a4b"
  if [ ! -f "$model/config.json" ]; then
    say "writing $model"
    local t0=$SECONDS
    "$gen" "$model" --model gemma4-26b-a4b --tokenizer "$repo/.cache/tokenizers/gemma3" >"$WORK/gemma.bytes"
    say "wrote $(cat "$WORK/gemma.bytes") bytes in $((SECONDS - t0)) s"
  fi
  say "model: $(du -sb "$model" | cut -f1) bytes on disk ($(du -sh "$model" | cut -f1))"
  make_group $((LIMIT_GIB << 30))
  drop_caches
  local t0=$SECONDS
  in_group "$bin" calibrate --model "$model" $CALIBRATE_FLAGS >"$WORK/gemma-plan.txt" 2>"$WORK/gemma-calibrate.log" ||
    { tail -n 30 "$WORK/gemma-calibrate.log"; say "calibrate failed"; return 1; }
  say "calibrate: $((SECONDS - t0)) s"; group_report
  cat "$WORK/gemma-plan.txt"
  read -r depth block < <(plan_reader "$model")
  drop_caches
  say "disk bound on the model's files, plan's reader (depth $depth, block $block):"
  in_group "$bound" "$model" --seconds 20 --depth "$depth" --block "$block" | tee "$WORK/gemma-bound.json"
  say "(load during the bound: $(load))"
  make_group $((LIMIT_GIB << 30))  # a fresh group: its peak is serve's alone
  drop_caches
  serve_measure "$model" "$WORK/gemma-serve.log" "$WORK/gemma-client.json"
  group_report
  python3 "$here/headline_extrapolate.py" run-vs-bound "$WORK/gemma-client.json" "$WORK/gemma-bound.json"
  say "32K context: serve --context 32768 --max-batch 1 in the same ${LIMIT_GIB} GiB group"
  TOKENS=2 serve_measure "$model" "$WORK/gemma-serve32k.log" "$WORK/gemma-client32k.json" --context 32768 --max-batch 1
  group_report
  "$bin" wisdom show --model "$model" --json >"$WORK/gemma.wisdom.json"
  python3 "$here/headline_extrapolate.py" kv "$WORK/gemma-client32k.json" "$WORK/gemma.wisdom.json"
  grep -iE "warn|shrink" "$WORK/gemma-serve32k.log" | head -n 5 || true
}

qwen() {
  local model="$WORK/qwen3.5-122b-a10b-L$QWEN_LAYERS"
  if [ ! -f "$model/config.json" ]; then
    say "writing $model"
    local t0=$SECONDS
    "$gen" "$model" --model qwen3.5-122b-a10b --layers "$QWEN_LAYERS" --tokenizer "$repo/.cache/tokenizers/qwen3" \
      >"$WORK/qwen.bytes"
    say "wrote $(cat "$WORK/qwen.bytes") bytes in $((SECONDS - t0)) s"
  fi
  say "model: $(du -sb "$model" | cut -f1) bytes on disk ($(du -sh "$model" | cut -f1))"
  # Variants of 1 and 3 layers over the same shards: config.json cut to the first N layers.
  for n in 1 3; do
    local v="$WORK/qwen-v$n"
    rm -rf "$v" && mkdir -p "$v"
    for f in "$model"/*.safetensors "$model"/model.safetensors.index.json "$model"/tokenizer*.json; do ln -s "$f" "$v/"; done
    python3 - "$model/config.json" "$v/config.json" "$n" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); n = int(sys.argv[3]); t = c["text_config"]
t["num_hidden_layers"] = n; t["layer_types"] = t["layer_types"][:n]
json.dump(c, open(sys.argv[2], "w"), indent=1)
PY
  done
  [ -n "${QWEN_NO_CALIBRATE:-}" ] || for v in "$WORK/qwen-v1" "$WORK/qwen-v3" "$model"; do
    drop_caches
    local t0=$SECONDS
    "$bin" calibrate --model "$v" $CALIBRATE_FLAGS --budget 16 >"$v.plan.txt" 2>"$v.calibrate.log" ||
      { tail -n 30 "$v.calibrate.log"; say "calibrate $v failed"; return 1; }
    "$bin" wisdom show --model "$v" --json >"$v.wisdom.json"
    say "calibrate $CALIBRATE_FLAGS --budget 16 $(basename "$v"): $((SECONDS - t0)) s"
  done
  read -r depth block < <(plan_reader "$model")
  drop_caches
  say "disk bound on the model's files, plan's reader (depth $depth, block $block):"
  "$bound" "$model" --seconds 20 --depth "$depth" --block "$block" | tee "$WORK/qwen-bound.json"
  say "(load during the bound: $(load))"
  # A measured streamed decode: calibrate then serve at defaults in a group that holds a fraction of the experts.
  make_group $((QWEN_STREAM_GIB << 30))
  drop_caches
  in_group "$bin" calibrate --model "$model" $CALIBRATE_FLAGS >"$WORK/qwen-stream-plan.txt" 2>"$WORK/qwen-stream-calibrate.log" ||
    { tail -n 30 "$WORK/qwen-stream-calibrate.log"; say "calibrate in ${QWEN_STREAM_GIB} GiB failed"; return 1; }
  group_report
  make_group $((QWEN_STREAM_GIB << 30))
  drop_caches
  serve_measure "$model" "$WORK/qwen-serve.log" "$WORK/qwen-client.json"
  group_report
  python3 "$here/headline_extrapolate.py" qwen "$WORK/qwen-v1.wisdom.json" "$WORK/qwen-v3.wisdom.json" \
    "$model.wisdom.json" "$WORK/qwen-bound.json" "$WORK/qwen-client.json" "$model/config.json"
  say "32K context: serve --context 32768 --max-batch 1"
  make_group $((LIMIT_GIB << 30))
  TOKENS=2 serve_measure "$model" "$WORK/qwen-serve32k.log" "$WORK/qwen-client32k.json" --context 32768 --max-batch 1
  group_report
  python3 "$here/headline_extrapolate.py" kv "$WORK/qwen-client32k.json" "$model.wisdom.json"
}

say "$(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB RAM; build $build"
for part in $PARTS; do
  "$part"
  if [ -z "${KEEP:-}" ]; then
    case "$part" in
      gemma) rm -rf "$WORK/gemma4-26b-a4b" ;;
      qwen) rm -rf "$WORK/qwen3.5-122b-a10b-L$QWEN_LAYERS" "$WORK"/qwen-v* ;;
    esac
  fi
done
