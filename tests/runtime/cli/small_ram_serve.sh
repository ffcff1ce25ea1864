#!/usr/bin/env bash
# Auto-sized serving on a small-RAM machine at defaults (issue 14, item 5), scaled to CI: a synthetic MoE model whose
# experts dominate its size (tests/runtime/cli/write_moe_fixture.cpp), then `tierlm calibrate` and `tierlm serve`
# with defaults only (serve: --port 0, so parallel tests never collide), both inside a cgroup v1 memory group of the
# model's size / 2.5. The server must answer a completion over loopback; /health must show the ledger within its
# budget and expert bytes read from disk; the server's peak RSS (VmHWM) must stay within the cgroup limit, and the
# kernel must have killed nothing.
# usage: small_ram_serve.sh TIERLM_BINARY WRITE_MOE_FIXTURE_BINARY
# Exit 77 (skipped, reason printed) when the cgroup cannot be made: it needs root and a writable
# /sys/fs/cgroup/memory (cgroup v1).
set -euo pipefail
bin="$1"
writer="$2"
root=/sys/fs/cgroup/memory
if [ "$(id -u)" != 0 ] || [ ! -w "$root" ]; then
  echo "SKIP: needs root and a writable cgroup v1 memory hierarchy at $root"
  exit 77
fi
work="$(mktemp -d)"
group="$root/tierlm_small_ram_$$"
pid=""
cleanup() {
  if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
  [ -d "$group" ] && rmdir "$group" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*"
  for f in "$work"/*.log; do [ -f "$f" ] && { echo "--- $f"; tail -n 40 "$f"; }; done
  [ -d "$group" ] && { echo "--- $group/memory.oom_control"; cat "$group/memory.oom_control"; }
  exit 1
}

# 4 layers x 96 experts (top-4) of hidden 256 x 1024: 180 MiB of 4-bit experts beside 6 MiB of dense weights, so the
# cgroup (74 MiB) leaves the process's own pages (code, libraries, stacks: ~10 MiB) room beside the 85% budget.
model="$work/model"
model_bytes="$("$writer" "$model" 4 96 4 256 1024)"
limit=$((model_bytes * 2 / 5))
if ! mkdir "$group" 2>/dev/null || ! echo "$limit" >"$group/memory.limit_in_bytes" 2>/dev/null; then
  echo "SKIP: cannot create the memory cgroup $group with a limit"
  exit 77
fi
echo 0 >"$group/memory.swappiness" 2>/dev/null || true
limit="$(cat "$group/memory.limit_in_bytes")"  # as the kernel rounded it (to pages)
echo "model: $((model_bytes >> 20)) MiB; cgroup limit: $((limit >> 20)) MiB (model / 2.5)"

export XDG_CACHE_HOME="$work/cache"
in_group() { (echo "$BASHPID" >"$group/cgroup.procs" && exec "$@"); }

start=$(date +%s)
in_group "$bin" calibrate --model "$model" >"$work/plan.txt" 2>"$work/calibrate.log" ||
  fail "calibrate exited $? inside the cgroup"
grep -q "oom_kill 0" "$group/memory.oom_control" || fail "the kernel killed a process during calibrate"
echo "calibrate: $(( $(date +%s) - start )) s, cgroup peak $(( $(cat "$group/memory.max_usage_in_bytes") >> 20 )) MiB"
grep -E "budget|experts|kv_codec|batch" "$work/plan.txt" | head -n 8 || true

(echo "$BASHPID" >"$group/cgroup.procs" && exec "$bin" serve --model "$model" --port 0) >"$work/serve.log" 2>&1 &
pid=$!  # the subshell that became tierlm serve
port=""
for _ in $(seq 1 600); do
  port="$(sed -n 's/.*listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$work/serve.log" | head -n1)"
  [ -n "$port" ] && break
  kill -0 "$pid" 2>/dev/null || fail "serve exited at start"
  sleep 0.1
done
[ -n "$port" ] || fail "no port after 60 s"
grep -q "memory budget exceeded" "$work/serve.log" && fail "a ledger error at start"
grep "listening" "$work/serve.log"

python3 - "$port" "$pid" "$limit" <<'PY' || fail "client checks"
import http.client, json, sys
port, pid, limit = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
body = json.dumps({"model": "model", "prompt": "The memory of a small machine", "max_tokens": 16, "temperature": 0})
c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
r = c.getresponse()
data = r.read()
assert r.status == 200, (r.status, data)
reply = json.loads(data)
assert reply["usage"]["completion_tokens"] >= 1, reply
print("completion:", json.dumps(reply["choices"][0]["text"]), reply["usage"])
c.request("GET", "/health")
h = json.loads(c.getresponse().read())
m, t = h["memory"], h["tiering"]
status = {l.split(":")[0]: l.split()[1:] for l in open(f"/proc/{pid}/status")}
peak_rss = int(status["VmHWM"][0]) * 1024
print(f"server: VmHWM {peak_rss >> 20} MiB, RssAnon {int(status['RssAnon'][0]) >> 10} MiB, RssFile "
      f"{int(status['RssFile'][0]) >> 10} MiB")
print(f"ledger: used {m['ledger_used_bytes'] >> 20} MiB, peak {m['ledger_peak_bytes'] >> 20} MiB of "
      f"{m['ledger_budget_bytes'] >> 20} MiB; RSS {m['rss_bytes'] >> 20} MiB, peak {peak_rss >> 20} MiB, cgroup "
      f"limit {m['cgroup']['limit_bytes'] >> 20} MiB; expert disk bytes read {t['disk_bytes_read']} "
      f"({t['disk_reads']} reads, hit rate {t['cache_hit_rate']:.3f}); kv {h['kv']['slots']} slots x "
      f"{h['kv']['context']}")
assert m["ledger_budget_bytes"] > 0, m
assert m["ledger_used_bytes"] <= m["ledger_budget_bytes"], m
assert m["ledger_peak_bytes"] <= m["ledger_budget_bytes"], m
assert m["cgroup"]["limit_bytes"] == limit, (m["cgroup"], limit)
assert m["rss_bytes"] <= limit and 0 < peak_rss <= limit, (m["rss_bytes"], peak_rss, limit)
assert t["disk_bytes_read"] > 0, t
PY
grep -q "oom_kill 0" "$group/memory.oom_control" || fail "the kernel killed a process during serve"
echo "small-RAM serving at defaults: calibrate and serve within $((limit >> 20)) MiB, cgroup peak $(( $(cat "$group/memory.max_usage_in_bytes") >> 20 )) MiB"
