-- wrk script for tests/server/load_test.sh: short non-streaming completions; counts responses by status class so
-- the test can require zero 5xx (wrk itself only reports "non-2xx").
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"model":"tierlm-tiny","prompt":"def add(a, b):","max_tokens":8,"temperature":0}'

local threads = {}
function setup(thread)
  table.insert(threads, thread)
end
function init(args)
  ok, client_errors, server_errors = 0, 0, 0
end
function response(status, headers, body)
  if status >= 500 then server_errors = server_errors + 1
  elseif status >= 400 then client_errors = client_errors + 1
  else ok = ok + 1 end
end
function done(summary, latency, requests)
  local ok_total, c4, c5 = 0, 0, 0
  for _, t in ipairs(threads) do
    ok_total = ok_total + t:get("ok")
    c4 = c4 + t:get("client_errors")
    c5 = c5 + t:get("server_errors")
  end
  io.write(string.format("LOAD requests=%d ok=%d 4xx=%d 5xx=%d socket_errors=%d p50_ms=%.2f p99_ms=%.2f max_ms=%.2f rps=%.1f\n",
    summary.requests, ok_total, c4, c5,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    latency:percentile(50) / 1000, latency:percentile(99) / 1000, latency.max / 1000,
    summary.requests / (summary.duration / 1e6)))
end
