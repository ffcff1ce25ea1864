# bench/bench_lib.sh — shell helpers the small-RAM benches share (sourced by bench/headline.sh and bench/mlxslot.sh):
# the load average beside every line, dropping the page cache, stopping the bench's server and removing its memory
# group, and the plan's expert reader read out of wisdom JSON. Uses the globals `pid` (a server) and `group` (a
# cgroup v1 memory group directory), either may be empty.
load() { cut -d' ' -f1-3 /proc/loadavg; }
say() { echo "[$(date -u +%H:%M:%S) load $(load)] $*"; }
drop_caches() {
  sync
  if echo 3 >/proc/sys/vm/drop_caches 2>/dev/null; then say "page cache dropped"; else say "page cache NOT dropped (not allowed)"; fi
}
cleanup() {
  if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
  [ -d "$group" ] && rmdir "$group" 2>/dev/null || true
}
# Wisdom JSON on stdin (a wisdom file, or `tierlm wisdom show --json`) -> "QUEUE_DEPTH BLOCK_SIZE" of the first plan
# reader in it.
reader_of_wisdom() {
  python3 -c '
import json, sys
def find(o):
    if isinstance(o, dict):
        if isinstance(o.get("reader"), dict): return o["reader"]
        for v in o.values():
            r = find(v)
            if r: return r
    if isinstance(o, list):
        for v in o:
            r = find(v)
            if r: return r
r = find(json.load(sys.stdin))
print(r["queue_depth"], r["block_size"])'
}
