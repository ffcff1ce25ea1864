#!/usr/bin/env bash
# Runs a command against a fresh `tierlm serve` on a free loopback port, then stops the server.
# usage: with_server.sh TIERLM_BINARY [serve flags...] -- COMMAND [ARGS...]
# The command sees TIERLM_BASE_URL (http://127.0.0.1:PORT/v1) and TIERLM_ROOT_URL (http://127.0.0.1:PORT).
set -euo pipefail
binary="$1"; shift
flags=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do flags+=("$1"); shift; done
shift || true
log="$(mktemp -t tierlm-serve.XXXXXX)"
# The default model's own chat template (profiles/models/tierlm-tiny/chat_template.jinja) serves the chat route, and
# the tests run on explicit flags, without calibrating (--no-wisdom).
here="$(cd "$(dirname "$0")" && pwd)"
"$binary" serve --model "$here/../../profiles/models/tierlm-tiny" --no-wisdom --host 127.0.0.1 --port 0 "${flags[@]}" >"$log" 2>&1 &
pid=$!
cleanup() { kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; rm -f "$log"; }
trap cleanup EXIT
port=""
for _ in $(seq 1 300); do
  port="$(sed -n 's/.*listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$log" | head -n1)"
  [ -n "$port" ] && break
  kill -0 "$pid" 2>/dev/null || { cat "$log"; echo "with_server: tierlm serve exited"; exit 1; }
  sleep 0.1
done
[ -n "$port" ] || { cat "$log"; echo "with_server: no port after 30 s"; exit 1; }
export TIERLM_ROOT_URL="http://127.0.0.1:$port" TIERLM_BASE_URL="http://127.0.0.1:$port/v1"
export NO_PROXY="127.0.0.1,localhost" no_proxy="127.0.0.1,localhost"
set +e
"$@"
status=$?
set -e
if [ $status -ne 0 ] && [ $status -ne 77 ]; then echo "--- server log ---"; tail -n 50 "$log"; fi
exit $status
