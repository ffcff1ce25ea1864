#!/usr/bin/env python3
"""Writes the fuzz seed corpora (tests/fuzz/corpus/<harness>/seed-*) from the project's fixtures, so the seeds are
real inputs made small: safetensors headers of tests/fixtures/models with every dimension cut to at most 2 (so the
files stay valid and tiny), one real header with its data truncated, the real config.json files, tokenizer.json files
of the npm tokenizer packages (tools/fetch_tokenizers.sh) and the embedded model cut to a few hundred tokens, the
real chat templates and the template feature cases, raw HTTP requests like those SDKs, curl and browsers send, and
OpenAI request bodies. regressions/ (inputs that once crashed) are never touched. Deterministic: run it again and
git shows no change unless a fixture changed.

Usage: python3 tests/fuzz/make_corpus.py
"""
import hashlib
import json
import os
import struct
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CORPUS = os.path.join(ROOT, "tests", "fuzz", "corpus")
DTYPE_SIZE = {"BOOL": 1, "U8": 1, "I8": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4,
              "F64": 8, "I64": 8, "U64": 8}


def write_seeds(harness, seeds):
    folder = os.path.join(CORPUS, harness)
    os.makedirs(folder, exist_ok=True)
    for name in os.listdir(folder):
        if name.startswith("seed-"):
            os.remove(os.path.join(folder, name))
    for name, data in seeds:
        if isinstance(data, str):
            data = data.encode()
        with open(os.path.join(folder, "seed-" + name), "wb") as f:
            f.write(data)
    print(f"{harness}: {len(seeds)} seeds, {sum(len(d) for _, d in seeds)} bytes")


def model_dirs():
    base = os.path.join(ROOT, "tests", "fixtures", "models")
    dirs = [(n, os.path.join(base, n)) for n in sorted(os.listdir(base)) if os.path.isdir(os.path.join(base, n))]
    return dirs + [("tierlm-tiny", os.path.join(ROOT, "profiles", "models", "tierlm-tiny"))]


def safetensors_seeds():
    seeds = []
    for name, folder in model_dirs():
        path = os.path.join(folder, "model.safetensors")
        with open(path, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(length))
            data = f.read(4096)
        small, offset, payload = {}, 0, bytearray()
        for key, entry in header.items():
            if key == "__metadata__":
                small[key] = entry
                continue
            shape = [min(d, 2) for d in entry["shape"]]
            count = 1
            for d in shape:
                count *= d
            size = count * DTYPE_SIZE[entry["dtype"]]
            small[key] = {"dtype": entry["dtype"], "shape": shape, "data_offsets": [offset, offset + size]}
            payload += bytes((offset + i) * 37 & 0xFF for i in range(size))
            offset += size
        text = json.dumps(small, separators=(",", ":")).encode()
        text += b" " * (-len(text) % 8)  # the writers pad the header to 8 bytes
        seeds.append((name + ".safetensors", struct.pack("<Q", len(text)) + text + bytes(payload)))
        if name == "qwen3":  # the real header, its data cut short: the bounds checks' path
            raw = json.dumps(header, separators=(",", ":")).encode()
            seeds.append((name + "-truncated.safetensors", struct.pack("<Q", len(raw)) + raw + data))
    return seeds


def config_seeds():
    seeds = []
    for name, folder in model_dirs():
        with open(os.path.join(folder, "config.json"), "rb") as f:
            seeds.append((name + ".json", f.read()))
    return seeds


def shrink_tokenizer(tokenizer, keep_ids, keep_added):
    model = dict(tokenizer["model"])
    vocab = {t: i for t, i in model["vocab"].items() if i < keep_ids}
    merges = []
    for m in model["merges"]:
        a, b = m if isinstance(m, list) else m.split(" ", 1)
        if a in vocab and b in vocab and a + b in vocab:
            merges.append(m)
    model["vocab"], model["merges"] = vocab, merges[:400]
    added = []
    for i, t in enumerate([t for t in tokenizer["added_tokens"] if t["special"]][:keep_added]):
        t = dict(t)
        if t["id"] >= keep_ids:
            t["id"] = keep_ids + i
        added.append(t)
    out = dict(tokenizer)
    out["model"], out["added_tokens"] = model, added
    post = out.get("post_processor")
    if post and post.get("type") == "TemplateProcessing":
        post = dict(post)
        post["special_tokens"] = {k: v for k, v in post["special_tokens"].items()
                                  if all(any(a["content"] == tok for a in added) for tok in v["tokens"])}
        out["post_processor"] = post
    return json.dumps(out, ensure_ascii=False, separators=(",", ":"))


def tokenizer_seeds():
    seeds = []
    sources = [("tierlm-tiny", os.path.join(ROOT, "profiles", "models", "tierlm-tiny", "tokenizer.json"), 300)]
    for name, keep in (("qwen3", 400), ("llama3", 400), ("gemma3", 600), ("deepseek_v3", 400)):
        sources.append((name, os.path.join(ROOT, ".cache", "tokenizers", name, "tokenizer.json"), keep))
    for name, path, keep in sources:
        if not os.path.exists(path):
            sys.exit(f"{path} is missing: run tools/fetch_tokenizers.sh first")
        with open(path, encoding="utf-8") as f:
            seeds.append((name + ".json", shrink_tokenizer(json.load(f), keep, 8)))
    return seeds


def template_seeds():
    seeds, seen = [], set()
    folder = os.path.join(ROOT, "tests", "fixtures", "templates")
    for file in sorted(os.listdir(folder)):
        with open(os.path.join(folder, file), encoding="utf-8") as f:
            for line in f:
                case = json.loads(line)
                text = case.get("meta", case).get("template")
                if not text or text in seen:
                    continue
                seen.add(text)
                label = case.get("name") or file.rsplit(".", 1)[0]
                seeds.append((f"{label}-{hashlib.sha1(text.encode()).hexdigest()[:8]}.jinja", text))
    with open(os.path.join(ROOT, "profiles", "models", "tierlm-tiny", "chat_template.jinja"), encoding="utf-8") as f:
        seeds.append(("tierlm-tiny.jinja", f.read()))
    return seeds


def http_request(method, target, headers, body=b"", version="1.1"):
    lines = [f"{method} {target} HTTP/{version}"] + [f"{k}: {v}" for k, v in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def http_seeds():
    chat = json.dumps({"model": "tierlm-tiny", "messages": [{"role": "user", "content": "Hello"}],
                       "max_tokens": 16, "stream": True}).encode()
    sdk = [("Host", "127.0.0.1:5413"), ("Accept", "application/json"), ("Content-Type", "application/json"),
           ("User-Agent", "OpenAI/JS 4.104.0"), ("Authorization", "Bearer sk-fuzz-key"),
           ("x-stainless-retry-count", "0"), ("Content-Length", str(len(chat))), ("Connection", "keep-alive")]
    browser = [("Host", "localhost:5413"), ("Origin", "http://localhost:3000"), ("Content-Type", "application/json"),
               ("Content-Length", str(len(chat)))]
    chunked_body = b"%x\r\n%s\r\n0\r\n\r\n" % (len(chat), chat)
    return [
        ("health.http", http_request("GET", "/health", [("Host", "localhost:5413"), ("User-Agent", "curl/7.88.1"),
                                                       ("Accept", "*/*")])),
        ("chat-sdk.http", http_request("POST", "/v1/chat/completions", sdk, chat)),
        ("chat-browser.http", http_request("POST", "/v1/chat/completions", browser, chat)),
        ("chat-chunked.http", http_request("POST", "/v1/completions",
                                           [("Host", "[::1]:5413"), ("Content-Type", "application/json; charset=utf-8"),
                                            ("Transfer-Encoding", "chunked"), ("x-request-id", "req-42")],
                                           chunked_body)),
        ("preflight.http", http_request("OPTIONS", "/v1/chat/completions",
                                        [("Host", "127.0.0.1:5413"), ("Origin", "https://app.example.com"),
                                         ("Access-Control-Request-Method", "POST"),
                                         ("Access-Control-Request-Headers", "authorization, content-type")])),
        ("head-models-http10.http", http_request("HEAD", "/v1/models", [("Host", "proxy.example.com")], version="1.0")),
        ("telemetry-query.http", http_request("GET", "/v1/telemetry?limit=3&api_key=sk%2Dfuzz%2Dkey",
                                              [("Host", "127.0.0.1"), ("Accept", "text/event-stream")])),
        ("pipelined.http", http_request("GET", "/metrics", [("Host", "127.0.0.1:5413")]) +
         http_request("GET", "/health/live", [("Host", "127.0.0.1:5413"), ("Connection", "close")])),
        ("rebinding.http", http_request("GET", "/wisdom", [("Host", "attacker.example:5413"),
                                                          ("Authorization", "basic Zm9vOmJhcg==")])),
    ]


def openai_seeds():
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
              "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    bodies = {
        "chat-minimal": {"model": "tierlm-tiny", "messages": [{"role": "user", "content": "Say hi"}]},
        "chat-sampling": {"messages": [{"role": "system", "content": "Be brief."},
                                       {"role": "user", "content": "Count to 3"}],
                          "temperature": 0.7, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "seed": 1234,
                          "presence_penalty": 0.5, "frequency_penalty": 0.2, "repetition_penalty": 1.1,
                          "max_completion_tokens": 32, "stop": ["\n\n", "END"], "n": 1},
        "chat-stream": {"messages": [{"role": "developer", "content": "x"}, {"role": "user", "content": "y"}],
                        "stream": True, "stream_options": {"include_usage": True}, "logprobs": True,
                        "top_logprobs": 3, "max_tokens": 8},
        "chat-tools": {"messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "18C, cloudy"}],
            "tools": tools, "tool_choice": "auto"},
        "chat-content-parts": {"messages": [{"role": "user", "content": [{"type": "text", "text": "part one "},
                                                                          {"type": "text", "text": "part two"}]}],
                               "stop": "\n", "ignore_eos": True},
        "completion-text": {"model": "tierlm-tiny", "prompt": "def fibonacci(n):", "max_tokens": 24,
                            "temperature": 0, "logprobs": 2, "stream": False},
        "completion-tokens": {"prompt": [151644, 872, 198, 9707], "max_tokens": 4, "echo": False},
        "completion-list": {"prompt": ["Once upon a time"], "suffix": None, "best_of": 1},
    }
    return [(name + ".json", json.dumps(body, ensure_ascii=False)) for name, body in bodies.items()]


def main():
    write_seeds("safetensors_header", safetensors_seeds())
    write_seeds("config_json", config_seeds())
    write_seeds("tokenizer_json", tokenizer_seeds())
    write_seeds("jinja_template", template_seeds())
    write_seeds("http_request", http_seeds())
    write_seeds("openai_request", openai_seeds())


if __name__ == "__main__":
    main()
