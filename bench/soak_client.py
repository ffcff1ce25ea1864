#!/usr/bin/env python3
"""Bounded loopback soak of `tierlm serve` (run through bench/soak.sh; Python 3 standard library only).

Starts the server on 127.0.0.1 (port 0, read from its "listening on http://127.0.0.1:PORT" line on stdout or stderr),
then for --minutes keeps it at capacity (max-batch + queue-limit + 2 workers, each sending requests back to back) with
a weighted mix: chat and text completions, streamed and not; streams cancelled mid-way (socket closed, sometimes with
an RST); non-streamed requests abandoned before the answer; malformed JSON; invalid fields; bodies over
--max-body-bytes (413); headers over 16 KiB (431); garbage bytes; slow writers and slow readers; several requests on
one keep-alive connection; the GET routes, unknown routes and wrong methods. Every --sample-seconds it records the
server's RSS (/proc/PID/status VmRSS), open fds (/proc/PID/fd) and GET /health.

Checks: zero 5xx; no connection the server closed or reset where an answer was due; every answer as expected for its
kind (429 with Retry-After counts as an answer and the worker backs off as told); the server alive throughout; RSS at
the end of the load within 5% of RSS after warm-up (warm-up: the first 2 minutes of load, or the first 20% for runs
under 10 minutes; both figures are the mean of three samples); fds back to the idle baseline (taken before the load)
within 15 s of the load stopping; KV positions_used and in-flight requests back to 0 when idle. Then: a load, a
kill -9 of the server in the middle of it, a restart on the same XDG_CACHE_HOME that must come up without
calibrating, publish the same GET /wisdom and serve a completion. Prints a summary and `soak: N passed, M failed`;
exits 1 on any failure.

Traffic goes to 127.0.0.1 only, bounded in count (the workers) and time (--minutes, per-request timeouts).
"""
import argparse
import collections
import json
import os
import random
import re
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

LISTENING = re.compile(rb"listening on http://127\.0\.0\.1:(\d+)")
PROMPTS = [
    "Return the number of",
    "Write a function that parses a date",
    "Explain what a context manager does",
    "List the arguments of open()",
    "How do I sort a dictionary by value?",
    "Describe the difference between a list and a tuple in Python, with examples of when each is the better choice.",
]


class Closed(Exception):
    """The server closed or reset the connection before a whole response."""


# ---------------------------------------------------------------------------------------------------------------
# The server process


class Server:
    def __init__(self, args, cache_dir, log_path):
        self.args, self.cache_dir, self.log_path = args, cache_dir, log_path
        self.proc, self.port = None, None

    def command(self):
        a = self.args
        template = ["--chat-template", a.chat_template] if a.chat_template else []
        return [a.binary, "serve", "--model", a.model, *template, "--host", "127.0.0.1",
                "--port", "0", "--max-batch", str(a.max_batch), "--queue-limit", str(a.queue_limit),
                "--threads", str(a.threads), "--max-body-bytes", str(a.max_body_bytes)]

    def start(self, timeout=240):
        env = dict(os.environ, XDG_CACHE_HOME=self.cache_dir, NO_PROXY="127.0.0.1", no_proxy="127.0.0.1")
        log = open(self.log_path, "ab")
        log.write(b"\n===== start " + time.strftime("%H:%M:%S").encode() + b"\n")
        log.flush()
        self.offset = log.tell()
        # stdout and stderr both into the log: the listening line moves from one to the other.
        self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env=env)
        log.close()
        deadline = time.time() + timeout
        while time.time() < deadline:
            m = LISTENING.search(self.log_since_start())
            if m:
                self.port = int(m.group(1))
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"tierlm serve exited with {self.proc.returncode}:\n{self.log_since_start().decode(errors='replace')}")
            time.sleep(0.1)
        raise RuntimeError("tierlm serve printed no listening line in %d s" % timeout)

    def log_since_start(self):
        with open(self.log_path, "rb") as f:
            f.seek(self.offset)
            return f.read()

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def rss_bytes(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        return 0

    def fds(self):
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def kill9(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self):
        if not self.alive():
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return "killed after 30 s"


# ---------------------------------------------------------------------------------------------------------------
# HTTP/1.1 over plain sockets: the client must be able to misbehave (garbage, drip-fed requests, abandoned streams).


class Connection:
    def __init__(self, port, timeout=60.0):
        self.port = port
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.buf = b""

    def close(self, reset=False):
        if reset:  # SO_LINGER 0: close sends an RST, as a killed client would
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.sock.close()

    def send(self, data):
        self.sock.sendall(data)

    def request_bytes(self, method, path, body=None, headers=(), keep_alive=True, content_length=None):
        lines = [f"{method} {path} HTTP/1.1", f"Host: 127.0.0.1:{self.port}", "User-Agent: tierlm-soak"]
        if body is not None:
            lines.append("Content-Type: application/json")
            lines.append(f"Content-Length: {len(body) if content_length is None else content_length}")
        if not keep_alive:
            lines.append("Connection: close")
        lines.extend(headers)
        return ("\r\n".join(lines) + "\r\n\r\n").encode() + (body or b"")

    def _fill(self):
        try:
            data = self.sock.recv(65536)
        except ConnectionResetError:
            raise Closed("reset")
        if not data:
            raise Closed("closed")
        self.buf += data

    def _line(self):
        while b"\r\n" not in self.buf:
            self._fill()
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def _exactly(self, n):
        while len(self.buf) < n:
            self._fill()
        data, self.buf = self.buf[:n], self.buf[n:]
        return data

    def read_head(self):
        """(status, headers) of the next response."""
        try:
            status_line = self._line()
        except Closed as e:
            raise Closed(f"{e} before a response")
        parts = status_line.split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1."):
            raise Closed(f"not an HTTP response: {status_line[:80]!r}")
        headers = {}
        while True:
            line = self._line()
            if not line:
                break
            k, _, v = line.partition(b":")
            headers[k.strip().lower().decode()] = v.strip().decode(errors="replace")
        return int(parts[1]), headers

    def chunks(self, headers):
        """The body's pieces as they arrive (chunked or Content-Length)."""
        if headers.get("transfer-encoding", "").lower() == "chunked":
            while True:
                size = int(self._line().split(b";")[0], 16)
                if size == 0:
                    while self._line():  # trailers
                        pass
                    return
                data = self._exactly(size)
                self._exactly(2)
                yield data
        elif "content-length" in headers:
            yield self._exactly(int(headers["content-length"]))
        else:  # until the server closes
            while True:
                try:
                    self._fill()
                except Closed:
                    data, self.buf = self.buf, b""
                    yield data
                    return

    def read_response(self):
        status, headers = self.read_head()
        body = b"".join(self.chunks(headers))
        return status, headers, body


# ---------------------------------------------------------------------------------------------------------------
# Request kinds. Each returns the list of statuses it saw; raises Unexpected for a wrong answer, Closed when the server
# dropped a connection that was owed an answer.


class Unexpected(Exception):
    pass


class Busy(Exception):
    """429: the worker backs off for retry_after seconds (0.5 when the server gave no Retry-After)."""

    def __init__(self, retry_after, told):
        self.retry_after, self.told = retry_after, told


def chat_body(rng, stream, max_tokens=None, **extra):
    body = {"model": "tierlm-tiny", "messages": [{"role": "user", "content": rng.choice(PROMPTS)}],
            "max_tokens": max_tokens or rng.randint(1, 48), "stream": stream}
    if rng.random() < 0.3:
        body["messages"].insert(0, {"role": "system", "content": "You are terse."})
    if rng.random() < 0.3:
        body.update(temperature=0.8, top_p=0.9, seed=rng.randint(0, 1000))
    if stream and rng.random() < 0.5:
        body["stream_options"] = {"include_usage": True}
    if not stream and rng.random() < 0.2:
        body.update(logprobs=True, top_logprobs=2)
    body.update(extra)
    return json.dumps(body).encode()


def completion_body(rng, stream, max_tokens=None):
    return json.dumps({"model": "tierlm-tiny", "prompt": rng.choice(PROMPTS),
                       "max_tokens": max_tokens or rng.randint(1, 48), "stream": stream}).encode()


def check_busy(status, headers):
    if status == 429:
        try:
            retry = float(headers.get("retry-after", "0.5"))
        except ValueError:
            raise Unexpected(f"429 with a Retry-After that is not a number: {headers.get('retry-after')!r}")
        raise Busy(min(max(retry, 0.05), 10.0), "retry-after" in headers)


def expect(status, wanted, body, what):
    if status not in wanted:
        raise Unexpected(f"{what}: {status} (expected {sorted(wanted)}): {body[:200]!r}")


def generate(conn, rng, endpoint, stream, body):
    conn.send(conn.request_bytes("POST", endpoint, body))
    status, headers = conn.read_head()
    if status != 200 or not stream:
        body = b"".join(conn.chunks(headers))
        check_busy(status, headers)
        expect(status, {200}, body, endpoint)
        doc = json.loads(body)
        if not doc.get("choices"):
            raise Unexpected(f"{endpoint}: no choices: {body[:200]!r}")
        return status
    if not headers.get("content-type", "").startswith("text/event-stream"):
        raise Unexpected(f"stream with content-type {headers.get('content-type')!r}")
    text = b"".join(conn.chunks(headers)).decode()
    events = [e[len("data: "):] for e in text.split("\n\n") if e.startswith("data: ")]
    if not events or events[-1] != "[DONE]":
        raise Unexpected(f"stream did not end with [DONE]: {text[-200:]!r}")
    for e in events[:-1]:
        doc = json.loads(e)
        if "error" in doc:
            raise Unexpected(f"error event in a stream: {e[:200]}")
    return status


def kind_chat(port, rng):
    conn = Connection(port)
    try:
        return [generate(conn, rng, "/v1/chat/completions", False, chat_body(rng, False))]
    finally:
        conn.close()


def kind_chat_stream(port, rng):
    conn = Connection(port)
    try:
        return [generate(conn, rng, "/v1/chat/completions", True, chat_body(rng, True))]
    finally:
        conn.close()


def kind_completion(port, rng):
    conn = Connection(port)
    stream = rng.random() < 0.5
    try:
        return [generate(conn, rng, "/v1/completions", stream, completion_body(rng, stream))]
    finally:
        conn.close()


def kind_stream_cancel(port, rng):
    """A long stream abandoned after a few events: the server must free the slot."""
    conn = Connection(port)
    try:
        conn.send(conn.request_bytes("POST", "/v1/chat/completions", chat_body(rng, True, max_tokens=900)))
        status, headers = conn.read_head()
        if status != 200:
            body = b"".join(conn.chunks(headers))
            check_busy(status, headers)
            expect(status, {200}, body, "stream to cancel")
        pieces = conn.chunks(headers)
        for _ in range(rng.randint(1, 4)):
            next(pieces, None)
        return [status]
    finally:
        conn.close(reset=rng.random() < 0.5)


def kind_abandon(port, rng):
    """A non-streamed request whose client goes away before the answer."""
    conn = Connection(port)
    conn.send(conn.request_bytes("POST", "/v1/chat/completions", chat_body(rng, False, max_tokens=300)))
    time.sleep(rng.uniform(0.0, 0.15))
    conn.close(reset=rng.random() < 0.3)
    return ["abandoned"]


def one_request(port, method, path, body, wanted, what, headers=()):
    conn = Connection(port)
    try:
        conn.send(conn.request_bytes(method, path, body, headers))
        status, hdrs, resp = conn.read_response()
        expect(status, wanted, resp, what)
        return [status]
    finally:
        conn.close()


def kind_malformed_json(port, rng):
    body = rng.choice([b"{not json", b'{"messages": [', b"[1, 2, 3]", b'"a string"', b"", b"\xff\xfe\x00{}",
                       b'{"messages": [{"role": "user", "content": "hi"}]}}'])
    return one_request(port, "POST", "/v1/chat/completions", body, {400}, "malformed JSON")


INVALID_CHAT = [
    {"messages": "hello"},
    {"messages": []},
    {"messages": [{"role": "wizard", "content": "hi"}]},
    {"messages": [{"role": "user"}]},
    {"messages": [{"role": "user", "content": "hi"}], "max_tokens": -1},
    {"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"},
    {"messages": [{"role": "user", "content": "hi"}], "n": 17},
    {"messages": [{"role": "user", "content": "hi"}], "store": True},
    {"messages": [{"role": "user", "content": "hi"}], "top_p": 7},
    {"messages": [{"role": "user", "content": "hi"}], "stream": "yes"},
    {"messages": [{"role": "user", "content": "hi"}], "stop": 42},
    {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 10 ** 30},
    {"prompt": "chat route with a prompt"},
]
INVALID_COMPLETION = [{"prompt": 12}, {"max_tokens": 5}, {"prompt": "hi", "echo": "x"}, {"prompt": "hi", "best_of": 4}]


def kind_invalid_fields(port, rng):
    if rng.random() < 0.7:
        return one_request(port, "POST", "/v1/chat/completions", json.dumps(rng.choice(INVALID_CHAT)).encode(), {400},
                           "invalid chat fields")
    return one_request(port, "POST", "/v1/completions", json.dumps(rng.choice(INVALID_COMPLETION)).encode(), {400},
                       "invalid completion fields")


def kind_oversized(port, rng, max_body_bytes):
    """A body over --max-body-bytes: 413. Half declare it and send little; half send all of it, as a client would."""
    conn = Connection(port, timeout=30)
    size = max_body_bytes + rng.randint(1, 4 * max_body_bytes)
    filler = json.dumps({"messages": [{"role": "user", "content": "x" * size}]}).encode()
    try:
        if rng.random() < 0.5:
            conn.send(conn.request_bytes("POST", "/v1/chat/completions", filler[:1024], content_length=len(filler)))
        else:
            try:
                conn.send(conn.request_bytes("POST", "/v1/chat/completions", filler))
            except (BrokenPipeError, ConnectionResetError):
                pass  # the server answered and closed before the whole body went out: its answer is still owed
        status, headers, body = conn.read_response()
        expect(status, {413}, body, f"{len(filler)}-byte body")
        return [status]
    finally:
        conn.close()


def kind_huge_headers(port, rng):
    conn = Connection(port, timeout=30)
    filler = ["X-Filler-%d: %s" % (i, "h" * 1000) for i in range(rng.randint(17, 40))]
    try:
        try:
            conn.send(conn.request_bytes("GET", "/health", None, filler))
        except (BrokenPipeError, ConnectionResetError):
            pass
        status, headers, body = conn.read_response()
        expect(status, {431}, body, "headers over 16 KiB")
        return [status]
    finally:
        conn.close()


def kind_garbage(port, rng):
    """Random bytes, then a blank line: a 400 or a close, never a 5xx or a hang."""
    conn = Connection(port, timeout=40)
    try:
        data = bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 600)))
        data = rng.choice([b"", b"GET ", b"POST /v1/chat/completions HTTP/1.1\r\n"]) + data + b"\r\n\r\n"
        try:
            conn.send(data)
        except (BrokenPipeError, ConnectionResetError):
            return ["closed"]
        try:
            status, headers, body = conn.read_response()
        except Closed:
            return ["closed"]  # allowed: nothing about these bytes deserves an answer
        except socket.timeout:
            return ["no answer (idle)"]  # an incomplete request the server is still waiting on: also allowed
        if status >= 500:
            raise Unexpected(f"garbage got {status}: {body[:200]!r}")
        return [status]
    finally:
        conn.close()


def kind_slow_writer(port, rng):
    """The request drip-fed over about a second and a half: still answered."""
    conn = Connection(port)
    try:
        data = conn.request_bytes("POST", "/v1/chat/completions", chat_body(rng, False, max_tokens=8))
        pieces = rng.randint(8, 24)
        step = max(1, len(data) // pieces)
        for i in range(0, len(data), step):
            conn.send(data[i:i + step])
            time.sleep(1.5 / pieces)
        status, headers, body = conn.read_response()
        check_busy(status, headers)
        expect(status, {200}, body, "slow writer")
        return [status]
    finally:
        conn.close()


def kind_slow_reader(port, rng):
    """A stream read a little at a time (the server's socket buffer fills)."""
    conn = Connection(port)
    conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    try:
        conn.send(conn.request_bytes("POST", "/v1/chat/completions", chat_body(rng, True, max_tokens=96)))
        time.sleep(0.5)
        status, headers = conn.read_head()
        if status != 200:
            body = b"".join(conn.chunks(headers))
            check_busy(status, headers)
            expect(status, {200}, body, "slow reader")
        n = 0
        for piece in conn.chunks(headers):
            n += 1
            if n % 8 == 0:
                time.sleep(0.05)
        return [status]
    finally:
        conn.close()


def kind_keep_alive(port, rng):
    """Several requests, one connection: every answer on it, none closing it."""
    conn = Connection(port)
    statuses = []
    try:
        for _ in range(rng.randint(2, 6)):
            choice = rng.random()
            if choice < 0.35:
                stream = rng.random() < 0.5
                statuses.append(generate(conn, rng, "/v1/chat/completions", stream,
                                         chat_body(rng, stream, max_tokens=rng.randint(1, 12))))
                continue
            if choice < 0.5:
                conn.send(conn.request_bytes("POST", "/v1/chat/completions", b"{oops"))
                wanted = {400}
            else:
                path = rng.choice(["/health", "/v1/models", "/metrics", "/wisdom"])
                conn.send(conn.request_bytes("GET", path))
                wanted = {200}
            status, headers, body = conn.read_response()
            expect(status, wanted, body, "keep-alive request")
            statuses.append(status)
            if headers.get("connection", "").lower() == "close":
                raise Unexpected("the server closed a keep-alive connection after " + str(status))
            if rng.random() < 0.3:
                time.sleep(rng.uniform(0.1, 1.5))  # idle on the open connection
        return statuses
    except Busy:
        raise
    finally:
        conn.close()


def kind_pipelined(port, rng):
    """Two or three requests in one write (HTTP/1.1 pipelining): every answer, in order."""
    conn = Connection(port)
    try:
        first_stream = rng.random() < 0.3
        plan = [("POST", "/v1/chat/completions", chat_body(rng, first_stream, max_tokens=rng.randint(1, 8)), {200}),
                ("GET", "/health", None, {200}), ("GET", "/v1/nope", None, {404})][:rng.randint(2, 3)]
        rng.shuffle(plan)
        conn.send(b"".join(conn.request_bytes(m, path, body) for m, path, body, _ in plan))
        statuses = []
        for m, path, body, wanted in plan:
            status, headers, resp = conn.read_response()
            check_busy(status, headers)
            expect(status, wanted, resp, f"pipelined {m} {path}")
            statuses.append(status)
        return statuses
    finally:
        conn.close()


def kind_partial(port, rng):
    """Half a request, a pause, then the client goes away (a slowloris in miniature): no leak."""
    conn = Connection(port)
    try:
        data = conn.request_bytes("POST", "/v1/chat/completions", chat_body(rng, False))
        conn.send(data[:rng.randint(1, len(data) - 1)])
        time.sleep(rng.uniform(0.5, 4.0))
        return ["abandoned"]
    finally:
        conn.close(reset=rng.random() < 0.3)


def kind_http10(port, rng):
    """HTTP/1.0, no keep-alive: the answer, then the server closes."""
    conn = Connection(port)
    try:
        conn.send(f"GET /health HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
        status, headers, body = conn.read_response()
        expect(status, {200}, body, "HTTP/1.0 GET /health")
        conn.sock.settimeout(10)
        try:
            rest = conn.sock.recv(1)
        except ConnectionResetError:
            raise Closed("reset after an HTTP/1.0 answer")
        if rest:
            raise Unexpected("bytes after an HTTP/1.0 answer")
        return [status]
    finally:
        conn.close()


def kind_routes(port, rng):
    path, method, wanted = rng.choice([("/health", "GET", {200}), ("/metrics", "GET", {200}),
                                       ("/v1/models", "GET", {200}), ("/wisdom", "GET", {200}), ("/", "GET", {200}),
                                       ("/v1/nope", "GET", {404}), ("/v1/chat/completions", "GET", {405}),
                                       ("/health", "DELETE", {405}), ("/../../etc/passwd", "GET", {404, 400})])
    return one_request(port, method, path, None, wanted, f"{method} {path}")


# ---------------------------------------------------------------------------------------------------------------


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.by_kind = collections.Counter()
        self.statuses = collections.Counter()
        self.failures = collections.Counter()
        self.examples = []
        self.busy = 0
        self.busy_told = 0  # of them, with a Retry-After header

    def record(self, kind, statuses):
        with self.lock:
            self.by_kind[kind] += 1
            for s in statuses:
                self.statuses[s] += 1

    def fail(self, kind, what):
        with self.lock:
            self.by_kind[kind] += 1
            self.failures[kind] += 1
            if len(self.examples) < 30:
                self.examples.append(f"{time.strftime('%H:%M:%S')} {kind}: {what}")


def make_kinds(args):
    return [  # (name, weight, function)
        ("chat", 20, kind_chat),
        ("chat_stream", 16, kind_chat_stream),
        ("completion", 8, kind_completion),
        ("stream_cancel", 10, kind_stream_cancel),
        ("abandon", 5, kind_abandon),
        ("malformed_json", 6, kind_malformed_json),
        ("invalid_fields", 6, kind_invalid_fields),
        ("oversized", 3, lambda port, rng: kind_oversized(port, rng, args.max_body_bytes)),
        ("huge_headers", 3, kind_huge_headers),
        ("garbage", 3, kind_garbage),
        ("slow_writer", 3, kind_slow_writer),
        ("slow_reader", 3, kind_slow_reader),
        ("keep_alive", 8, kind_keep_alive),
        ("pipelined", 3, kind_pipelined),
        ("partial", 2, kind_partial),
        ("http10", 1, kind_http10),
        ("routes", 6, kind_routes),
    ]


def worker(index, port, kinds, stats, stop, seed):
    rng = random.Random(seed * 1000 + index)
    names, weights = [k[0] for k in kinds], [k[1] for k in kinds]
    functions = {k[0]: k[2] for k in kinds}
    while not stop.is_set():
        name = rng.choices(names, weights)[0]
        try:
            stats.record(name, functions[name](port, rng))
        except Busy as b:
            stats.record(name, [429])
            with stats.lock:
                stats.busy += 1
                stats.busy_told += b.told
            stop.wait(b.retry_after)
        except Closed as e:
            stats.record(name, ["closed early"])
            stats.fail(name, f"connection dropped by the server: {e}")
        except socket.timeout:
            stats.record(name, ["timeout"])
            stats.fail(name, "timed out waiting for the server")
        except (ConnectionError, OSError) as e:
            stats.record(name, ["socket error"])
            stats.fail(name, f"socket error: {e!r}")
        except Unexpected as e:
            stats.fail(name, str(e))
        except Exception as e:  # a bug in this client, or JSON the server should not have sent
            stats.fail(name, f"{type(e).__name__}: {e}")


def get_json(port, path, timeout=10):
    conn = Connection(port, timeout=timeout)
    try:
        conn.send(conn.request_bytes("GET", path))
        status, headers, body = conn.read_response()
        return status, (json.loads(body) if status == 200 else None)
    finally:
        conn.close()


def mean(xs):
    return sum(xs) / len(xs) if xs else float("nan")


def mb(x):
    return f"{x / 1e6:.1f} MB"


class Checks:
    def __init__(self):
        self.passed, self.failed = 0, 0

    def check(self, ok, what):
        print(("ok   " if ok else "FAIL ") + what, flush=True)
        if ok:
            self.passed += 1
        else:
            self.failed += 1
        return ok


def soak(args, server, checks):
    port = server.port
    kinds = make_kinds(args)
    stats = Stats()
    # Idle baseline: after a few requests of each main kind (lazy first-use allocations), with no connection open.
    for rng_seed in range(3):
        rng = random.Random(rng_seed)
        for fn in (kind_chat, kind_chat_stream, kind_completion, kind_routes):
            try:
                fn(port, rng)
            except Exception:
                pass
    time.sleep(1.0)
    fds_idle = server.fds()
    rss_idle = server.rss_bytes()
    workers = args.workers or args.max_batch + args.queue_limit + 2
    seconds = args.minutes * 60
    warmup = 120.0 if seconds >= 600 else 0.2 * seconds
    print(f"soak: {workers} workers for {seconds:.0f} s against 127.0.0.1:{port} (max batch {args.max_batch}, queue "
          f"limit {args.queue_limit}); warm-up {warmup:.0f} s; idle baseline: {fds_idle} fds, RSS {mb(rss_idle)}",
          flush=True)

    stop = threading.Event()
    threads = [threading.Thread(target=worker, args=(i, port, kinds, stats, stop, args.seed), daemon=True)
               for i in range(workers)]
    t0 = time.time()
    for t in threads:
        t.start()
    samples = []  # (seconds since start, rss, fds, health status, positions_used, in_flight)
    health_failures = 0
    died = False
    while time.time() - t0 < seconds:
        time.sleep(min(args.sample_seconds, max(0.0, seconds - (time.time() - t0))))
        if not server.alive():
            died = True
            break
        rss, fds = server.rss_bytes(), server.fds()
        try:
            status, health = get_json(port, "/health")
        except Exception as e:
            status, health = f"error {e!r}", None
        if status != 200:
            health_failures += 1
        used = health["kv"]["positions_used"] if health else None
        in_flight = health["requests"]["in_flight"] if health else None
        samples.append((time.time() - t0, rss, fds, status, used, in_flight))
        done = sum(stats.by_kind.values())
        print(f"  {time.time() - t0:6.0f} s  RSS {mb(rss)}  fds {fds}  /health {status}  kv positions {used}  "
              f"in flight {in_flight}  requests {done}  failures {sum(stats.failures.values())}", flush=True)
    stop.set()
    for t in threads:
        t.join(timeout=90)
    load_seconds = time.time() - t0
    stuck = sum(t.is_alive() for t in threads)

    # Idle again: fds, KV positions and in-flight requests back to the baseline. fds are counted before each /health
    # request, when the previous one's connection has had half a second to close.
    idle_deadline = time.time() + 15
    fds_end = used_end = in_flight_end = None
    while server.alive():
        fds_end = server.fds()
        try:
            _, health = get_json(port, "/health")
            used_end, in_flight_end = health["kv"]["positions_used"], health["requests"]["in_flight"]
        except Exception:
            pass
        if (fds_end <= fds_idle and used_end == 0 and in_flight_end == 0) or time.time() > idle_deadline:
            break
        time.sleep(0.5)

    cancelled = None  # generations the server cancelled because their client went away
    try:
        conn = Connection(port, timeout=10)
        conn.send(conn.request_bytes("GET", "/metrics"))
        m = re.search(rb"^tierlm_sequences_cancelled_total (\S+)", conn.read_response()[2], re.M)
        cancelled = int(float(m.group(1))) if m else None
        conn.close()
    except Exception:
        pass

    under_load = [s for s in samples if s[0] >= warmup]
    rss_after_warmup = mean([s[1] for s in under_load[:3]])
    rss_end = mean([s[1] for s in samples[-3:]])
    rss_max = max([s[1] for s in samples], default=0)
    total = sum(stats.by_kind.values())
    five_xx = sum(n for s, n in stats.statuses.items() if isinstance(s, int) and s >= 500)

    print("\n--- soak summary ---")
    print(f"duration: {load_seconds:.0f} s of load ({args.minutes:g} min asked), {total} requests "
          f"({total / max(load_seconds, 1):.1f}/s), {workers} workers")
    print("requests by kind: " + ", ".join(f"{k} {n}" for k, n in sorted(stats.by_kind.items())))
    print("statuses: " + ", ".join(f"{k} {n}" for k, n in sorted(stats.statuses.items(), key=lambda kv: str(kv[0]))))
    print(f"5xx: {five_xx}; 429 back-offs: {stats.busy} ({stats.busy_told} with Retry-After); failures: {sum(stats.failures.values())} "
          + (str(dict(stats.failures)) if stats.failures else ""))
    for e in stats.examples:
        print("  " + e)
    print(f"RSS: idle {mb(rss_idle)}, after warm-up {mb(rss_after_warmup)}, end {mb(rss_end)}, max {mb(rss_max)}")
    print(f"fds: idle {fds_idle}, after the load {fds_end}; KV positions_used when idle {used_end}, in flight "
          f"{in_flight_end}; generations cancelled by the server (client gone): {cancelled}")

    checks.check(not died, "the server stayed up through the load")
    checks.check(stuck == 0, f"every worker finished ({stuck} stuck)")
    checks.check(total > 0 and stats.by_kind["chat"] > 0, f"{total} requests were sent")
    checks.check(five_xx == 0, f"zero 5xx ({five_xx})")
    checks.check(not stats.failures, f"every answer as expected for its kind ({sum(stats.failures.values())} not)")
    checks.check(health_failures == 0, f"/health answered 200 at every sample ({health_failures} did not)")
    if len(under_load) >= 3:
        change = (rss_end - rss_after_warmup) / rss_after_warmup
        checks.check(abs(change) <= 0.05, f"RSS flat within 5% after warm-up: {mb(rss_after_warmup)} -> "
                                          f"{mb(rss_end)} ({change * 100:+.1f}%)")
    else:
        checks.check(False, f"RSS: too few samples after warm-up ({len(under_load)}); run longer")
    checks.check(fds_end is not None and fds_end <= fds_idle, f"fds back to the idle baseline: {fds_end} <= {fds_idle}")
    walked_away = stats.by_kind["stream_cancel"] + stats.by_kind["abandon"]
    checks.check(walked_away == 0 or (cancelled or 0) > 0,
                 f"clients that went away had their generations cancelled ({cancelled} cancelled, {walked_away} left)")
    checks.check(used_end == 0 and in_flight_end == 0,
                 f"idle: KV positions_used {used_end}, in flight {in_flight_end} (both 0)")
    return {"total": total, "statuses": stats.statuses}


def kill_and_restart(args, server, checks):
    """Load, kill -9 in the middle of it, restart on the same wisdom: no calibration, the same plan, serving."""
    status, wisdom_before = get_json(server.port, "/wisdom")
    checks.check(status == 200 and wisdom_before, "GET /wisdom before the kill")
    stop = threading.Event()
    killed_load = collections.Counter()

    def load(i):
        rng = random.Random(1000 + i)
        while not stop.is_set():
            try:
                (kind_chat_stream if i % 2 else kind_chat)(server.port, rng)
                killed_load["answered"] += 1
            except Exception:
                killed_load["cut"] += 1
                if stop.is_set():
                    return
                time.sleep(0.05)

    threads = [threading.Thread(target=load, args=(i,), daemon=True) for i in range(args.max_batch + 2)]
    for t in threads:
        t.start()
    time.sleep(3.0)
    in_flight = None
    try:
        in_flight = get_json(server.port, "/health")[1]["requests"]["in_flight"]
    except Exception:
        pass
    stop.set()  # no new requests: the ones in flight are cut by the kill
    server.kill9()
    for t in threads:
        t.join(timeout=60)
    print(f"kill -9 with {in_flight} requests in flight; during the load {killed_load['answered']} answered, "
          f"{killed_load['cut']} cut by the kill")
    checks.check(server.proc.returncode == -signal.SIGKILL, f"the server died of SIGKILL ({server.proc.returncode})")

    env = dict(os.environ, XDG_CACHE_HOME=server.cache_dir)
    shown = subprocess.run([args.binary, "wisdom", "show", "--json"], env=env, capture_output=True, timeout=60)
    checks.check(shown.returncode == 0, "the wisdom file still reads after the kill (`tierlm wisdom show`)")

    t0 = time.time()
    server.start()
    log = server.log_since_start().decode(errors="replace")
    calibrated = "quick calibration" in log
    checks.check(not calibrated, f"the restart came up in {time.time() - t0:.1f} s without calibrating")
    status, wisdom_after = get_json(server.port, "/wisdom")
    checks.check(status == 200 and wisdom_after == wisdom_before,
                 "GET /wisdom after the restart is the plan from before (fingerprints "
                 f"{(wisdom_after or {}).get('device_fingerprint')}/{(wisdom_after or {}).get('model_fingerprint')}, "
                 f"created {(wisdom_after or {}).get('created_at')})")
    try:
        answered = kind_chat(server.port, random.Random(7)) == [200]
    except Exception as e:
        answered = False
        print(f"  completion after the restart failed: {e!r}")
    checks.check(answered, "the restarted server serves a completion")
    code = server.stop()
    checks.check(code == 0, f"the restarted server stops cleanly on SIGTERM (exit {code})")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--binary", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--chat-template", default="", help="override the model's own chat template")
    p.add_argument("--cache-dir", required=True, help="XDG_CACHE_HOME for the server (its wisdom lives there)")
    p.add_argument("--log", required=True, help="the server's stdout and stderr")
    p.add_argument("--minutes", type=float, default=20)
    p.add_argument("--max-batch", type=int, default=4)
    p.add_argument("--queue-limit", type=int, default=4)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--max-body-bytes", type=int, default=65536)
    p.add_argument("--workers", type=int, default=0, help="default: max batch + queue limit + 2")
    p.add_argument("--sample-seconds", type=float, default=10)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()

    checks = Checks()
    server = Server(args, args.cache_dir, args.log)
    try:
        server.start()
        log = server.log_since_start().decode(errors="replace")
        checks.check("quick calibration" not in log, "the first start used the calibrated plan (no calibration)")
        soak(args, server, checks)
        if server.alive():
            kill_and_restart(args, server, checks)
        else:
            checks.check(False, "the server died during the soak: no kill -9/restart phase")
    except Exception as e:
        checks.check(False, f"soak aborted: {type(e).__name__}: {e}")
    finally:
        if server.alive():
            server.stop()
    errors = [line for line in open(args.log, errors="replace") if "[error]" in line or "[critical]" in line]
    print(f"server log: {len(errors)} error lines" + "".join("\n  " + e.rstrip() for e in errors[:10]))
    print(f"soak: {checks.passed} passed, {checks.failed} failed")
    return 1 if checks.failed else 0


if __name__ == "__main__":
    sys.exit(main())
