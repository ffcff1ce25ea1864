#!/usr/bin/env bash
# `tierlm serve` with no --model serves the embedded default model, and its chat route works out of the box (the
# model's own chat template): a fresh XDG cache, so the first start also calibrates, as a new user's would.
# usage: serve_default_model.sh TIERLM_BINARY
set -euo pipefail
bin="$1"
XDG_CACHE_HOME="$(mktemp -d)"
export XDG_CACHE_HOME
log="$XDG_CACHE_HOME/serve.log"
"$bin" serve --port 0 --threads 1 >"$log" 2>&1 &
pid=$!
trap 'kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; rm -rf "$XDG_CACHE_HOME"' EXIT
port=""
for _ in $(seq 1 600); do
  port="$(sed -n 's/.*listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$log" | head -n1)"
  [ -n "$port" ] && break
  kill -0 "$pid" 2>/dev/null || { cat "$log"; echo "FAIL: serve exited"; exit 1; }
  sleep 0.1
done
[ -n "$port" ] || { cat "$log"; echo "FAIL: no port after 60 s"; exit 1; }
grep -q "tierlm-tiny" "$log" || { cat "$log"; echo "FAIL: the default model is not tierlm-tiny"; exit 1; }
python3 - "$port" <<'PY'
import http.client, json, sys
c = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1]), timeout=60)
c.request("GET", "/v1/models")
models = json.loads(c.getresponse().read())
assert [m["id"] for m in models["data"]] == ["tierlm-tiny"], models
body = json.dumps({"model": "tierlm-tiny", "max_tokens": 8,
                   "messages": [{"role": "user", "content": "Return the number of items."}]})
c.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
r = c.getresponse()
data = r.read()
assert r.status == 200, (r.status, data)
reply = json.loads(data)
msg = reply["choices"][0]["message"]
assert msg["role"] == "assistant" and msg["content"], reply
# The prompt is the ChatML rendering of one user turn, counted in tokens.
assert reply["usage"]["prompt_tokens"] > 5 and reply["usage"]["completion_tokens"] >= 1, reply
print("default model chat:", json.dumps(msg["content"]))
PY
echo "serve with no --model serves tierlm-tiny with its chat template"
