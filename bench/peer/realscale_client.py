#!/usr/bin/env python3
"""bench/peer/realscale_client.py — realscale_client.mjs for a machine without Node.js (the device machine): the
same requests (streamed /v1/completions, one at a time, the same seeds, temperature and ignore_eos), the same /health
reads when the first token arrives and after the last, the same JSON line. Python's standard library only: it speaks
the OpenAI HTTP protocol itself (server-sent events, `data: {...}` lines ending with `data: [DONE]`), as the SDK does.

Usage: realscale_client.py BASE_URL PROMPT_FILE[,PROMPT_FILE...] MAX_TOKENS
"""
import json
import sys
import time
import urllib.request

COUNTERS = ["disk_bytes_read", "disk_reads", "cache_hits", "cache_misses", "prefetches", "prefetch_hits",
            "prefetch_wasted", "read_stall_seconds", "moe_seconds", "expert_compute_seconds",
            "inline_conversion_seconds", "conversion_wait_seconds"]


def get(url):
    with urllib.request.urlopen(url, timeout=3600) as r:
        return json.loads(r.read())


def tier_of(h):
    t = h.get("tiering") or {}
    return {k: float(t.get(k, 0) or 0) for k in COUNTERS}


def main():
    if len(sys.argv) != 4:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        sys.exit(2)
    base, prompt_files, max_tokens = sys.argv[1], sys.argv[2], int(sys.argv[3])
    model = get(f"{base}/v1/models")["data"][0]["id"]
    requests, total = [], {k: 0.0 for k in COUNTERS}
    decode_tokens, decode_seconds = 0, 0.0
    for i, path in enumerate(prompt_files.split(",")):
        prompt = open(path, encoding="utf-8").read()
        body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.8,
                           "seed": 1000 + i, "stream": True, "stream_options": {"include_usage": True},
                           "ignore_eos": True}).encode()
        req = urllib.request.Request(f"{base}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json", "Authorization": "Bearer unused"})
        start = time.perf_counter()
        first = last = 0.0
        chunks, usage, at_first = 0, None, None
        with urllib.request.urlopen(req, timeout=3600) as r:
            for raw in r:
                line = raw.decode("utf-8").strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    raise SystemExit(f"realscale_client: the server's stream failed: {chunk['error']}")
                if chunk.get("usage"):
                    usage = chunk["usage"]
                choices = chunk.get("choices") or []
                if not choices or not choices[0].get("text"):
                    continue
                last = time.perf_counter()
                chunks += 1
                if chunks == 1:
                    first = last
                    at_first = tier_of(get(f"{base}/health"))
        at_end = tier_of(get(f"{base}/health"))
        tokens = (usage or {}).get("completion_tokens", chunks)
        seconds = last - first
        delta = {k: at_end[k] - at_first[k] for k in COUNTERS}
        # The first token's own step ran before at_first was read: decode covers tokens 2..n.
        requests.append({"prompt": path.split("/")[-1], "prompt_tokens": (usage or {}).get("prompt_tokens"),
                         "completion_tokens": tokens, "ttft_s": round(first - start, 3),
                         "decode_tps": round((tokens - 1) / seconds, 3), "decode": delta})
        decode_tokens += tokens - 1
        decode_seconds += seconds
        for k in COUNTERS:
            total[k] += delta[k]
    h = get(f"{base}/health")
    print(json.dumps({"engine": "tierlm", "client": "python urllib (no Node.js here)", "decode_tokens": decode_tokens,
                      "decode_seconds": round(decode_seconds, 3), "decode_tps": round(decode_tokens / decode_seconds, 3),
                      "decode": total, "requests": requests, "memory": h.get("memory"),
                      "health_tiering": h.get("tiering"), "kv": h.get("kv")}))


if __name__ == "__main__":
    main()
