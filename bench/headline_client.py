#!/usr/bin/env python3
"""bench/headline.sh's OpenAI-protocol client (Python standard library only): one streamed /v1/completions request
(greedy, ignore_eos, max_tokens TOKENS, usage in the stream), decode tok/s = (completion tokens - 1) / (time from the
first text chunk, which carries prefill, to the usage chunk), then /health (and
the tier's counters before the request and at its first text chunk, so the request's own and its decode's disk bytes
and misses are known); prints one JSON object with the numbers bench/results/headline.md quotes.

usage: headline_client.py PORT SERVER_PID TOKENS
"""
import http.client
import json
import sys
import time

port, pid, tokens = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])


def health():
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("GET", "/health")
    return json.loads(c.getresponse().read())


before = health()["tiering"]
c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
c.request("GET", "/v1/models")
model_id = json.loads(c.getresponse().read())["data"][0]["id"]
c = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
body = {"model": model_id, "prompt": "The memory of a small machine", "max_tokens": tokens, "temperature": 0,
        "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True}
start = time.monotonic()
c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
r = c.getresponse()
assert r.status == 200, (r.status, r.read())
arrivals, text, usage, done, at_first = [], "", None, None, None
for line in r:
    line = line.strip()
    if not line.startswith(b"data: ") or line == b"data: [DONE]":
        continue
    chunk = json.loads(line[6:])
    if chunk.get("usage"):
        usage, done = chunk["usage"], time.monotonic()
    piece = chunk["choices"][0].get("text", "") if chunk.get("choices") else ""
    if piece:
        arrivals.append(time.monotonic())
        text += piece
        if len(arrivals) == 1:
            at_first = health()["tiering"]  # the tier's counters from here on are decode's alone
end = time.monotonic()
c.close()
h = health()
status = {l.split(":")[0]: l.split()[1:] for l in open(f"/proc/{pid}/status")}
m, t, kv = h["memory"], h["tiering"], h["kv"]
out = {
    "chunks": len(arrivals),
    "first_chunk_s": round(arrivals[0] - start, 3) if arrivals else None,
    "usage": usage,
    # tokens after the first over the time from the first text chunk to the usage chunk (empty pieces included)
    "decode_tok_s": round((usage["completion_tokens"] - 1) / (done - arrivals[0]), 4) if usage and arrivals else None,
    "total_s": round(end - start, 3),
    "text": text[:120],
    "vm_hwm_bytes": int(status["VmHWM"][0]) * 1024,
    "memory": m,
    "tiering": t,
    # this request's share of the tier's counters (its prefill and decode)
    "request_tiering": {k: t[k] - before[k] for k in ("disk_bytes_read", "disk_reads", "cache_hits", "cache_misses",
                                                      "read_stall_seconds")},
    # decode only: from the first text chunk (prefill done) to the end
    "decode_tiering": {k: t[k] - at_first[k] for k in ("disk_bytes_read", "cache_hits", "cache_misses",
                                                       "read_stall_seconds", "prefetches", "prefetch_hits",
                                                       "conversions", "conversion_seconds") if k in t
                       } if at_first else None,
    # servers before the conversion counters have none
    **({"request_conversion": {k: t[k] - before[k] for k in ("conversions", "conversion_seconds")}}
       if "conversion_seconds" in t else {}),
    "kv": kv,
}
print(json.dumps(out, indent=1))
