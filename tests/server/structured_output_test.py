#!/usr/bin/env python3
"""CTest (through with_server.sh): `tierlm serve` on the default model with response_format. Every schema of
tests/runtime/grammar/schemas.json is asked for with several seeds at temperature 1 (and greedily), chat and
completions, streamed and not; every output that finished ("stop") must parse and validate against its schema
(python3-jsonschema, through tests/runtime/grammar/validate_outputs.py). Also: json_object, an unsupported keyword
is a 400 naming it, a malformed response_format is a 400, and max_tokens reached mid-object ends with "length"
(such an output is the unfinished start of a document: it is not validated, and the test prints how many).
Python standard library only."""
import concurrent.futures
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request

BASE = os.environ["TIERLM_BASE_URL"]
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
SEEDS = 8
failures = []


def post(path, body):
    req = urllib.request.Request(BASE + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def json_schema_format(schema):
    return {"type": "json_schema", "json_schema": {"name": "out", "schema": schema, "strict": True}}


def chat(schema_format, seed, temperature, stream=False, max_tokens=900, endpoint="chat"):
    body = {"max_tokens": max_tokens, "temperature": temperature, "seed": seed, "response_format": schema_format}
    if endpoint == "chat":
        body["messages"] = [{"role": "user", "content": "Describe the object as JSON."}]
    else:
        body["prompt"] = "Return the value as JSON:"
    path = "/chat/completions" if endpoint == "chat" else "/completions"
    if stream:
        body["stream"] = True
        req = urllib.request.Request(BASE + path, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        text, finish = "", None
        with urllib.request.urlopen(req, timeout=300) as r:
            for line in r:
                line = line.decode().strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                choice = json.loads(line[6:])["choices"][0]
                text += (choice.get("delta", {}).get("content") or "") if endpoint == "chat" else choice.get("text", "")
                finish = choice.get("finish_reason") or finish
        return text, finish
    status, payload = post(path, body)
    if status != 200:
        raise RuntimeError(f"HTTP {status}: {payload}")
    choice = json.loads(payload)["choices"][0]
    return (choice["message"]["content"] if endpoint == "chat" else choice["text"]), choice["finish_reason"]


def main():
    with open(os.path.join(ROOT, "tests/runtime/grammar/schemas.json")) as f:
        schemas = json.load(f)
    jobs = []  # (schema to validate against, response_format, seed, temperature, stream, endpoint)
    for i, schema in enumerate(schemas):
        for seed in range(SEEDS):
            endpoint = "completion" if seed == 2 else "chat"
            jobs.append((schema, json_schema_format(schema), seed, 1.0, seed == 1, endpoint))
        jobs.append((schema, json_schema_format(schema), 0, 0.0, False, "chat"))
    for seed in range(SEEDS):
        jobs.append(({"type": "object"}, {"type": "json_object"}, seed, 1.0, seed == 1, "chat"))
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda j: chat(j[1], j[2], j[3], stream=j[4], endpoint=j[5]), jobs))
    lines, stopped, lengths = [], 0, 0
    for job, (text, finish) in zip(jobs, results):
        check(finish in ("stop", "length"), f"finish_reason {finish!r} for {text!r}")
        if finish == "stop":
            stopped += 1
            lines.append(json.dumps({"schema": job[0], "text": text}))
        else:
            lengths += 1
            print(f"max_tokens reached (not an error; not validated): {json.dumps(job[0])[:80]} -> {text[:80]!r}...")
    print(f"{len(jobs)} constrained generations: {stopped} finished, {lengths} reached max_tokens (900)")
    # The default model writes docstring English: inside a free string it may run on; most outputs still finish.
    check(stopped >= len(jobs) * 3 // 4, f"only {stopped} of {len(jobs)} finished within 900 tokens")
    oracle = subprocess.run([sys.executable, os.path.join(ROOT, "tests/runtime/grammar/validate_outputs.py")],
                            input="\n".join(lines) + "\n", text=True, capture_output=True)
    print(oracle.stdout.strip())
    if oracle.returncode == 77:
        print("SKIP: python3-jsonschema missing")
        sys.exit(77)
    check(oracle.returncode == 0, "every finished output validates against its schema")

    # max_tokens reached mid-object: "length", and the text is the unfinished start of a document.
    text, finish = chat(json_schema_format(schemas[1]), 3, 1.0, max_tokens=6)
    check(finish == "length" and text.startswith("{"), f"max_tokens mid-object: {finish!r} {text!r}")
    try:
        json.loads(text)
        check(False, f"an object cut at 6 tokens should not parse: {text!r}")
    except json.JSONDecodeError:
        pass

    # Unsupported keywords: 400 naming the keyword.
    for schema, keyword in (({"type": "integer", "minimum": 3}, "minimum"),
                            ({"type": "object", "properties": {"s": {"type": "string", "pattern": "a+"}}}, "pattern")):
        status, payload = post("/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                                                     "response_format": json_schema_format(schema)})
        error = json.loads(payload).get("error", {})
        check(status == 400 and keyword in error.get("message", "") and keyword in (error.get("param") or ""),
              f"unsupported {keyword}: {status} {payload}")
    for bad in ({"type": "xml"}, {"type": "json_schema"}, {"type": "json_schema", "json_schema": {"schema": {}}},
                "json"):
        status, payload = post("/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                                                     "response_format": bad})
        check(status == 400 and "response_format" in payload, f"malformed response_format {bad}: {status} {payload}")

    print(f"structured output: {len(failures)} failed")
    sys.exit(1 if failures else 0)


main()
