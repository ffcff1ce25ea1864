#!/usr/bin/env python3
"""tierlm's hub client end to end against the loopback test hub (test_hub.py), one case per CTest:

  hub_cli_test.py TIERLM CASE

The test repo is the embedded default model resharded into two safetensors shards plus an index (so both redirect
forms and several parallel files are exercised) and a README.md that tierlm must not fetch. The oracle for "the
model works" is `tierlm run` on the original folder: the hub copy must generate the same text. Every case runs in
its own temporary HOME / HF_HOME and talks to 127.0.0.1 only. Exit code 77: skipped (with the reason).
"""
import hashlib
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from test_hub import TestHub  # noqa: E402

SOURCE = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
TINY = os.path.join(SOURCE, "profiles", "models", "tierlm-tiny")
REPO = "tierlm-test/tiny-sharded"
TOKEN = "hf_loopbackTestToken0123456789"
NEEDED = ["chat_template.jinja", "config.json", "generation_config.json", "model-00001-of-00002.safetensors",
          "model-00002-of-00002.safetensors", "model.safetensors.index.json", "tokenizer.json",
          "tokenizer_config.json"]
RUN_ARGS = ["--prompt", "Return the number of", "--max-tokens", "16", "--threads", "1", "--no-wisdom"]


def fail(message):
    print("FAIL: " + message, flush=True)
    sys.exit(1)


def check(condition, message):
    if not condition:
        fail(message)


def reshard(source, dest):
    """The default model split into two shards + index, as transformers' save_pretrained(max_shard_size=...) does."""
    os.makedirs(dest)
    for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                 "chat_template.jinja"):
        shutil.copy(os.path.join(source, name), dest)
    with open(os.path.join(dest, "README.md"), "w") as f:
        f.write("# tiny-sharded\nA test repo; tierlm must not download this file.\n")
    with open(os.path.join(source, "model.safetensors"), "rb") as f:
        blob = f.read()
    header_len = struct.unpack("<Q", blob[:8])[0]
    header = json.loads(blob[8:8 + header_len])
    header.pop("__metadata__", None)
    data = blob[8 + header_len:]
    names = sorted(header)
    halves = [names[:len(names) // 2], names[len(names) // 2:]]
    weight_map = {}
    for i, half in enumerate(halves):
        shard = "model-%05d-of-%05d.safetensors" % (i + 1, len(halves))
        out_header, payload = {"__metadata__": {"format": "pt"}}, bytearray()
        for name in half:
            begin, end = header[name]["data_offsets"]
            out_header[name] = {"dtype": header[name]["dtype"], "shape": header[name]["shape"],
                                "data_offsets": [len(payload), len(payload) + end - begin]}
            payload += data[begin:end]
            weight_map[name] = shard
        text = json.dumps(out_header).encode()
        text += b" " * (-len(text) % 8)
        with open(os.path.join(dest, shard), "wb") as f:
            f.write(struct.pack("<Q", len(text)) + text + payload)
    with open(os.path.join(dest, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": len(data)}, "weight_map": weight_map}, f, indent=2)


class Case:
    def __init__(self, tierlm):
        self.tierlm = tierlm
        self.tmp = tempfile.mkdtemp(prefix="tierlm-hub-")
        self.repo_dir = os.path.join(self.tmp, "repo")
        reshard(TINY, self.repo_dir)
        self.hub = TestHub({REPO: self.repo_dir}).start()
        self.cache = os.path.join(self.tmp, "hf", "hub")
        self.env = dict(os.environ)
        for k in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE",
                  "HF_TOKEN_PATH"):
            self.env.pop(k, None)
        self.env.update({"HOME": self.tmp, "XDG_CACHE_HOME": os.path.join(self.tmp, "xdg"),
                         "HF_HOME": os.path.join(self.tmp, "hf"), "HF_ENDPOINT": self.hub.url,
                         "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"})
        self.folder = os.path.join(self.cache, "models--" + REPO.replace("/", "--"))
        self.commit = self.hub.repos[REPO].commit

    def close(self):
        self.hub.stop()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def tierlm_run(self, args, env=None, timeout=120, preexec=None):
        result = subprocess.run([self.tierlm] + args, env=env or self.env, capture_output=True, text=True,
                                timeout=timeout, preexec_fn=preexec)
        return result

    def pull(self, extra_env=None, args=(), preexec=None):
        env = dict(self.env, **(extra_env or {}))
        r = self.tierlm_run(["pull", REPO] + list(args), env=env, preexec=preexec)
        if r.returncode != 0:
            print("tierlm pull said: " + r.stderr.strip().splitlines()[-1] if r.stderr.strip() else "(nothing)")
        return r

    def snapshot(self):
        return os.path.join(self.folder, "snapshots", self.commit)

    def repo_file(self, name):
        return self.hub.repos[REPO].file(name)

    def check_layout(self, files):
        """The cache as huggingface_hub lays it out: refs/main, relative links to blobs named by etag."""
        with open(os.path.join(self.folder, "refs", "main")) as f:
            check(f.read() == self.commit, "refs/main holds the commit (no newline)")
        for name in files:
            link = os.path.join(self.snapshot(), name)
            check(os.path.islink(link), name + " is a symlink in the snapshot")
            target = os.readlink(link)
            etag = self.repo_file(name).etag()
            check(target == "../../blobs/" + etag, "%s links relatively to ../../blobs/%s, not %s" % (name, etag, target))
            with open(link, "rb") as f:
                data = f.read()
            check(data == self.repo_file(name).data, name + " holds the repo's bytes")
        left = [n for n in os.listdir(os.path.join(self.folder, "blobs")) if n.endswith(".incomplete")]
        check(not left, "no .incomplete file is left: %s" % left)

    def lfs_served(self, name):
        return self.hub.served.get(self.repo_file(name).sha256, 0)

    def expected_text(self):
        r = self.tierlm_run(["run", "--model", TINY] + RUN_ARGS)
        check(r.returncode == 0 and r.stdout.strip(), "run on the original folder: " + r.stderr[-2000:])
        return r.stdout

    def node(self, *args):
        node = shutil.which("node")
        if not node:
            print("SKIP: node is not installed")
            sys.exit(77)
        r = subprocess.run([node, os.path.join(HERE, "node", "hub_client.mjs")] + list(args), capture_output=True,
                           text=True, timeout=120, env=self.env)
        if r.returncode == 77:
            print("SKIP: " + r.stderr.strip())
            sys.exit(77)
        check(r.returncode == 0, "node hub_client.mjs %s: %s" % (args[0], r.stderr[-2000:]))
        return r.stdout


def case_pull_then_npm_scan(c):
    """tierlm pulls only what the model needs; the npm client's cache scan reads tierlm's cache as valid; the model
    runs offline from it and writes what the original folder writes."""
    r = c.pull()
    check(r.returncode == 0, "pull: " + r.stderr[-3000:])
    check(r.stdout.strip() == c.snapshot(), "pull prints the snapshot folder on stdout: %r" % r.stdout)
    size = "%.1f MB" % (sum(len(c.repo_file(f).data) for f in NEEDED) / 1e6)  # every needed file, in decimal MB
    check("download %s: 100%% %s / %s" % (REPO, size, size) in r.stderr and "ETA" in r.stderr,
          "a plain progress line on a non-terminal stderr: " + r.stderr[-1000:])
    check(sorted(os.listdir(c.snapshot())) == NEEDED, "only the needed files: %s" % sorted(os.listdir(c.snapshot())))
    c.check_layout(NEEDED)
    for shard in NEEDED[3:5]:
        check(c.lfs_served(shard) == len(c.repo_file(shard).data), shard + " fetched exactly once")
    redirects = [q for q in c.hub.requests if q["status"] == 302]
    check(any(q for q in redirects), "the LFS files came through redirects")
    check(not any("README" in q["path"] for q in c.hub.requests), "README.md was never requested")
    scan = json.loads(c.node("scan", c.cache))
    check(scan["warnings"] == [], "scanCacheDir warnings: %s" % scan["warnings"])
    check(len(scan["repos"]) == 1 and scan["repos"][0]["id"] == {"name": REPO, "type": "model"}, "scan: %s" % scan)
    revision = scan["repos"][0]["revisions"]
    check(len(revision) == 1 and revision[0]["commitOid"] == c.commit and revision[0]["refs"] == ["main"],
          "scan revision: %s" % revision)
    check(sorted(os.path.basename(f["path"]) for f in revision[0]["files"]) == NEEDED, "scan files")
    check(scan["repos"][0]["size"] == sum(len(c.repo_file(n).data) for n in NEEDED), "scan size")
    expected = c.expected_text()
    before = len(c.hub.requests)
    r = c.tierlm_run(["run", "--model", REPO] + RUN_ARGS, env=dict(c.env, HF_HUB_OFFLINE="1"))
    check(r.returncode == 0, "offline run by id: " + r.stderr[-2000:])
    check(r.stdout == expected, "same text as the original folder:\n%r\n%r" % (r.stdout, expected))
    check(len(c.hub.requests) == before, "HF_HUB_OFFLINE=1: no request reached the hub")
    # Online again: the cache is complete, so only the file list is asked for, no byte of content.
    served = c.hub.lfs_bytes_served()
    r = c.pull()
    check(r.returncode == 0 and c.hub.lfs_bytes_served() == served, "a second pull fetches nothing: " + r.stderr)


def case_npm_download_then_offline(c):
    """What @huggingface/hub downloaded is used as it is: tierlm runs it with HF_HUB_OFFLINE=1 and, online, fetches
    no byte of it again."""
    path = c.node("download", c.hub.url, REPO, c.cache).strip()
    check(path == c.snapshot(), "snapshotDownload's folder %s is the snapshot %s" % (path, c.snapshot()))
    served = c.hub.lfs_bytes_served()
    expected = c.expected_text()
    c.hub.stop()  # nothing to talk to: offline means offline
    env = dict(c.env, HF_HUB_OFFLINE="1")
    r = c.tierlm_run(["run", "--model", REPO] + RUN_ARGS, env=env)
    check(r.returncode == 0, "offline run of the npm client's download: " + r.stderr[-2000:])
    check(r.stdout == expected, "same text as the original folder")
    r = c.tierlm_run(["run", "--model", REPO + "@" + c.commit] + RUN_ARGS, env=env)
    check(r.returncode == 0 and r.stdout == expected, "ORG/NAME@COMMIT offline: " + r.stderr[-2000:])
    serve_offline_by_id(c, env, expected)
    r = c.tierlm_run(["pull", "tierlm-test/not-cached"], env=env)
    check(r.returncode == 1 and "HF_HUB_OFFLINE" in r.stderr and "tierlm-test/not-cached" in r.stderr,
          "offline and not cached: a clear error: " + r.stderr)
    # Online: a fresh hub on the same files; the cache already holds every blob.
    c.hub = TestHub({REPO: c.repo_dir}).start()
    c.env["HF_ENDPOINT"] = c.hub.url
    r = c.pull()
    check(r.returncode == 0, "pull over the npm client's cache: " + r.stderr[-2000:])
    check(c.hub.lfs_bytes_served() == 0, "no content fetched again (%d bytes)" % c.hub.lfs_bytes_served())
    check(served > 0, "the npm client did fetch the shards")


def serve_offline_by_id(c, env, expected):
    """`tierlm serve --model ORG/NAME` offline: the model is named by its id and completes as `run` does."""
    import urllib.request

    log_path = os.path.join(c.tmp, "serve.log")
    with open(log_path, "w") as log:
        server = subprocess.Popen([c.tierlm, "serve", "--model", REPO, "--no-wisdom", "--threads", "1", "--host",
                                   "127.0.0.1", "--port", "0"], env=env, stdout=subprocess.DEVNULL, stderr=log)
    try:
        port, deadline = None, time.monotonic() + 60
        while port is None and time.monotonic() < deadline:
            check(server.poll() is None, "serve exited: " + open(log_path).read()[-2000:])
            found = re.search(r"listening on http://127\.0\.0\.1:(\d+)", open(log_path).read())
            port = found and found.group(1)
            time.sleep(0.1)
        check(port, "serve printed no port")
        base = "http://127.0.0.1:%s/v1" % port
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        models = json.load(opener.open(base + "/models", timeout=30))
        check([m["id"] for m in models["data"]] == [REPO], "serve names the model by its hub id: %s" % models)
        prompt = RUN_ARGS[RUN_ARGS.index("--prompt") + 1]
        request = urllib.request.Request(base + "/completions", method="POST", headers={
            "Content-Type": "application/json"}, data=json.dumps({
                "model": REPO, "prompt": prompt, "max_tokens": 16, "temperature": 0}).encode())
        text = json.load(opener.open(request, timeout=60))["choices"][0]["text"]
        check(prompt + text + "\n" == expected, "serve's completion %r is run's %r" % (text, expected))
    finally:
        server.terminate()
        server.wait(timeout=30)


def wait_for_partial(c, shard, at_least, timeout=30):
    path = os.path.join(c.folder, "blobs", c.repo_file(shard).sha256 + ".incomplete")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.path.exists(path) and os.path.getsize(path) >= at_least:
            return path
        time.sleep(0.02)
    fail("no partial download of %s appeared" % shard)


def case_kill_resume(c):
    """kill -9 mid-download, then a second pull resumes each file where it stopped: no byte is fetched twice (beyond
    the chunk in flight at the kill)."""
    c.hub.throttle = 1_000_000  # 1 MB/s per connection
    env = dict(c.env)
    process = subprocess.Popen([c.tierlm, "pull", REPO], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    shard = NEEDED[3]
    partial = wait_for_partial(c, shard, 1_000_000)
    process.send_signal(signal.SIGKILL)
    process.wait()
    time.sleep(0.5)  # the hub's threads for the dead connections see the broken pipe and stop counting
    check(not os.path.exists(os.path.join(c.snapshot(), shard)), "the partial shard is not in the snapshot")
    have = {s: os.path.getsize(os.path.join(c.folder, "blobs", c.repo_file(s).sha256 + ".incomplete"))
            for s in NEEDED[3:5]
            if os.path.exists(os.path.join(c.folder, "blobs", c.repo_file(s).sha256 + ".incomplete"))}
    check(have.get(shard, 0) >= 1_000_000, "partial %s: %s" % (partial, have))
    c.hub.throttle = 0
    first = {s: c.lfs_served(s) for s in NEEDED[3:5]}
    r = c.pull()
    check(r.returncode == 0, "pull after kill -9: " + r.stderr[-3000:])
    check("resuming" in r.stderr, "the second pull says it resumes")
    c.check_layout(NEEDED)
    for s in NEEDED[3:5]:
        size = len(c.repo_file(s).data)
        second = c.lfs_served(s) - first[s]
        resumed = [q["start"] for q in c.hub.requests if q["path"].endswith(c.repo_file(s).sha256)
                   and q["method"] == "GET" and q.get("start") is not None][-1]
        check(resumed == have.get(s, 0), "%s resumed at the partial size %d (asked %d)" % (s, have.get(s, 0), resumed))
        check(second == size - have.get(s, 0), "%s: the second pull fetched only the rest (%d of %d)" %
              (s, second, size))
        check(c.lfs_served(s) <= size + 4 * 65536, "%s: %d bytes served in all for %d" % (s, c.lfs_served(s), size))
        print("%s: %d bytes, %d before the kill (%d in flight lost), %d after" %
              (s, size, first[s], first[s] - have.get(s, 0), second))


def case_concurrent(c):
    """Two pulls of the same repo at once (a second shell, or Python beside tierlm) share the per-blob locks: both
    finish, and each blob is fetched exactly once."""
    c.hub.throttle = 4_000_000
    first = subprocess.Popen([c.tierlm, "pull", REPO], env=c.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    wait_for_partial(c, NEEDED[3], 1)
    second = subprocess.Popen([c.tierlm, "pull", REPO], env=c.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    outputs = [p.communicate(timeout=120) for p in (first, second)]
    check(first.returncode == 0 and second.returncode == 0, "both pulls finish: %s" % [o[1][-1500:] for o in outputs])
    check(outputs[0][0] == outputs[1][0], "both print the same snapshot")
    check("another download" in outputs[1][1], "the second says it waits for the first: " + outputs[1][1][-1500:])
    c.check_layout(NEEDED)
    for s in NEEDED[3:5]:
        check(c.lfs_served(s) == len(c.repo_file(s).data), "%s fetched once: %d bytes for %d" %
              (s, c.lfs_served(s), len(c.repo_file(s).data)))


def case_network_loss(c):
    """The connection drops mid-file: a clear error naming repo and file, complete files kept, the partial file kept
    out of the snapshot; the next pull resumes and fetches each byte exactly once."""
    c.hub.drop_after = 1_500_000
    r = c.pull()
    check(r.returncode == 1, "pull with the network dropping fails")
    check(REPO in r.stderr and "model-0000" in r.stderr and "run the same command again" in r.stderr,
          "the error names repo, file and what to do: " + r.stderr[-3000:])
    for name in NEEDED:
        present = os.path.exists(os.path.join(c.snapshot(), name))
        check(present == (not name.endswith(".safetensors")), "%s in the snapshot: %s" % (name, present))
    check(not os.path.exists(os.path.join(c.folder, "refs", "main")), "no ref to an incomplete snapshot")
    c.hub.drop_after = 0
    r = c.pull()
    check(r.returncode == 0, "pull after the network came back: " + r.stderr[-3000:])
    c.check_layout(NEEDED)
    for s in NEEDED[3:5]:
        check(c.lfs_served(s) == len(c.repo_file(s).data), "%s: %d bytes served for %d" %
              (s, c.lfs_served(s), len(c.repo_file(s).data)))


def case_checksum(c):
    """Bytes that do not hash to the hub's sha256 ETag are refused: nothing is renamed into blobs or the snapshot."""
    c.hub.corrupt = True
    r = c.pull()
    check(r.returncode == 1, "a corrupt download fails")
    check("checksum mismatch" in r.stderr and REPO in r.stderr and "model-00001-of-00002.safetensors" in r.stderr,
          "the error says so, with repo and file: " + r.stderr[-3000:])
    for s in NEEDED[3:5]:
        sha = c.repo_file(s).sha256
        check(not os.path.lexists(os.path.join(c.snapshot(), s)), s + " is not in the snapshot")
        check(not os.path.exists(os.path.join(c.folder, "blobs", sha)), s + "'s blob was not created")
        check(not os.path.exists(os.path.join(c.folder, "blobs", sha + ".incomplete")), "the bad bytes are gone")
    r = c.tierlm_run(["run", "--model", REPO] + RUN_ARGS, env=dict(c.env, HF_HUB_OFFLINE="1"))
    check(r.returncode == 1, "the partial model is never run")
    c.hub.corrupt = False
    r = c.pull()
    check(r.returncode == 0, "a good download after a bad one: " + r.stderr[-2000:])
    c.check_layout(NEEDED)


def case_gated(c):
    """A gated repo: no token 401, a wrong one 403, each a clear error; the right one (HF_TOKEN) works, and the
    token never appears in any output."""
    c.hub.gated_token = TOKEN
    r = c.pull()
    check(r.returncode == 1 and "401" in r.stderr and "HF_TOKEN" in r.stderr and REPO in r.stderr,
          "no token: " + r.stderr)
    wrong = "hf_wrongWrongWrong"
    r = c.pull({"HF_TOKEN": wrong})
    check(r.returncode == 1 and "403" in r.stderr and "accept its terms" in r.stderr, "wrong token: " + r.stderr)
    check(wrong not in r.stderr + r.stdout, "the token is not echoed")
    r = c.pull({"HF_TOKEN": TOKEN})
    check(r.returncode == 0, "right token: " + r.stderr[-2000:])
    check(TOKEN not in r.stderr + r.stdout, "the token is never logged")
    c.check_layout(NEEDED)
    lfs_gets = [q for q in c.hub.requests if q["path"].startswith("/lfs-store/") and q["method"] == "GET"]
    check(lfs_gets and all(q["auth"] for q in lfs_gets), "the same-origin blob store got the token")
    # The token file `huggingface-cli login` writes works too.
    shutil.rmtree(c.folder)
    with open(os.path.join(c.tmp, "hf", "token"), "w") as f:
        f.write(TOKEN + "\n")
    r = c.pull()
    check(r.returncode == 0, "token from HF_HOME/token: " + r.stderr[-2000:])


def case_not_found(c):
    """404s: a repo that does not exist, a revision that does not, a file named by --include that does not."""
    r = c.tierlm_run(["pull", "tierlm-test/no-such-model"])
    check(r.returncode == 1 and "tierlm-test/no-such-model" in r.stderr and "404" in r.stderr and
          "no such repo" in r.stderr, "missing repo: " + r.stderr)
    r = c.tierlm_run(["run", "--model", "tierlm-test/no-such-model"] + RUN_ARGS)
    check(r.returncode == 1 and "no such repo" in r.stderr, "run with a missing repo: " + r.stderr)
    r = c.tierlm_run(["pull", REPO + "@no-such-branch"])
    check(r.returncode == 1 and "revision not found" in r.stderr and "no-such-branch" in r.stderr,
          "missing revision: " + r.stderr)
    check(not os.path.exists(c.folder) or not os.listdir(os.path.join(c.folder, "snapshots")),
          "nothing was cached for the failures")
    r = c.tierlm_run(["pull", "not a model id"])
    check(r.returncode != 0 and "not a Hugging Face repo id" in r.stderr, "a malformed id: " + r.stderr)


def case_disk_full(c):
    """A file-size limit (ulimit -f) stops the shards mid-write: a clear error naming the file and what to do, the
    small files complete and kept; without the limit the next pull resumes and completes."""
    import resource

    limit = 2 * 1024 * 1024

    def limit_files():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    r = c.pull(preexec=limit_files)
    check(r.returncode == 1, "pull past the file-size limit fails (rc %d): %s" % (r.returncode, r.stderr[-2000:]))
    check("cannot write" in r.stderr and "HF_HUB_CACHE" in r.stderr and "model-0000" in r.stderr,
          "the error names the file and what to do: " + r.stderr[-3000:])
    for name in NEEDED:
        present = os.path.exists(os.path.join(c.snapshot(), name))
        check(present == (not name.endswith(".safetensors")), "%s in the snapshot: %s" % (name, present))
    for s in NEEDED[3:5]:
        partial = os.path.join(c.folder, "blobs", c.repo_file(s).sha256 + ".incomplete")
        check(os.path.exists(partial) and os.path.getsize(partial) <= limit, "the partial file is kept at the limit")
    r = c.pull()
    check(r.returncode == 0, "pull with room again: " + r.stderr[-2000:])
    check("resuming" in r.stderr, "it resumed the partial files")
    c.check_layout(NEEDED)


def case_fit(c):
    """`tierlm fit` by hub id reads config.json and the shard headers only (bytes counted) and answers as it does
    for the local folder (the oracle: the same planner on the same shape); an unknown architecture is named."""
    device = os.path.join(SOURCE, "profiles", "devices", "laptop-8gb.json")
    args = ["--device", device, "--context", "512", "--json"]
    r = c.tierlm_run(["fit", "--model", TINY] + args)
    check(r.returncode == 0, "fit on the folder: " + r.stderr[-2000:])
    local = json.loads(r.stdout)
    r = c.tierlm_run(["fit", "--model", REPO] + args)
    check(r.returncode == 0, "fit by hub id: " + r.stderr[-2000:])
    remote = json.loads(r.stdout)
    check(local["fits"] and remote["fits"] and remote["supported"], "the tiny model fits: %s" % remote)
    for key in ("weight_format", "stored_bytes", "largest_context", "predicted"):
        check(local[key] == remote[key], "%s: folder %s, hub %s" % (key, local[key], remote[key]))
    served = c.hub.lfs_bytes_served()
    shards = sum(len(c.repo_file(s).data) for s in NEEDED[3:5])
    # The shards' headers only: ~24 KB for the default model's 2 shards (a MoE: one header entry per expert tensor).
    check(0 < served < 65536, "fit read %d bytes of %d bytes of shards" % (served, shards))
    check(remote["bytes_fetched"] < 98304, "fit's own count: %d bytes" % remote["bytes_fetched"])
    check(not os.path.exists(c.folder), "fit downloads nothing into the cache")
    print("fit by id: %d bytes of shards read (of %d), %d bytes in all" % (served, shards, remote["bytes_fetched"]))
    other = os.path.join(c.tmp, "unsupported")
    shutil.copytree(c.repo_dir, other)
    with open(os.path.join(other, "config.json")) as f:
        config = json.load(f)
    config["model_type"] = "mamba"
    with open(os.path.join(other, "config.json"), "w") as f:
        json.dump(config, f)
    c.hub.stop()
    c.hub = TestHub({REPO: c.repo_dir, "tierlm-test/unsupported": other}).start()
    c.env["HF_ENDPOINT"] = c.hub.url
    r = c.tierlm_run(["fit", "--model", "tierlm-test/unsupported", "--device", device])
    check(r.returncode == 0 and "'mamba' is not supported" in r.stdout, "unsupported: " + r.stdout + r.stderr)


def case_fit_sparse_40gb(c):
    """`fit` on a repo of published Qwen3-30B-A3B shape whose four shards (58 GB of expert weights) are served
    sparse: the answer costs their headers (2.5 MB for 18432 tensors; the hub counts every content byte it
    sends), never a download."""
    from test_hub import SparseData

    folder = os.path.join(c.tmp, "qwen3-30b-a3b")
    os.makedirs(folder)
    config = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 2048,
              "intermediate_size": 6144, "moe_intermediate_size": 768, "num_hidden_layers": 48,
              "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128,
              "num_experts_per_tok": 8, "norm_topk_prob": True, "vocab_size": 151936,
              "max_position_embeddings": 40960, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
              "tie_word_embeddings": False, "torch_dtype": "bfloat16", "hidden_act": "silu",
              "decoder_sparse_step": 1, "mlp_only_layers": []}
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f)
    shards, weight_map = {}, {}
    layers_per_shard = 12
    for shard_index in range(4):
        name = "model-%05d-of-00004.safetensors" % (shard_index + 1)
        header, offset = {"__metadata__": {"format": "pt"}}, 0
        for layer in range(shard_index * layers_per_shard, (shard_index + 1) * layers_per_shard):
            for expert in range(128):
                for proj, shape in (("gate_proj", [768, 2048]), ("up_proj", [768, 2048]), ("down_proj", [2048, 768])):
                    tensor = "model.layers.%d.mlp.experts.%d.%s.weight" % (layer, expert, proj)
                    size = shape[0] * shape[1] * 2
                    header[tensor] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + size]}
                    weight_map[tensor] = name
                    offset += size
        text = json.dumps(header).encode()
        text += b" " * (-len(text) % 8)
        head = struct.pack("<Q", len(text)) + text
        shards[name] = SparseData(head, len(head) + offset)
    total = sum(len(d) for d in shards.values())
    c.hub.stop()
    c.hub = TestHub({REPO: c.repo_dir, "tierlm-test/qwen3-30b-a3b": folder},
                    {"tierlm-test/qwen3-30b-a3b": shards}).start()
    c.env["HF_ENDPOINT"] = c.hub.url
    device = os.path.join(SOURCE, "profiles", "devices", "laptop-8gb.json")
    started = time.monotonic()
    r = c.tierlm_run(["fit", "--model", "tierlm-test/qwen3-30b-a3b", "--device", device, "--json"], timeout=170)
    check(r.returncode == 0, "fit on the sparse repo: " + r.stderr[-2000:])
    answer = json.loads(r.stdout)
    served = c.hub.lfs_bytes_served()
    check(answer["supported"] and answer["stored_bytes"] == 48 * 128 * 3 * 768 * 2048 * 2, "fit saw the whole model: %s" % answer)
    check(served < 4_000_000, "fit read %d bytes of a %d-byte repo" % (served, total))
    check(not os.path.exists(os.path.join(c.cache, "models--tierlm-test--qwen3-30b-a3b")), "nothing cached")
    print("fit on a %.1f GB repo: %d bytes of shards read (%d in all) in %.1f s; fits at context %d: %s" %
          (total / 1e9, served, answer["bytes_fetched"], time.monotonic() - started, answer["context"],
           answer["fits"]))


CASES = {name[len("case_"):]: fn for name, fn in globals().items() if name.startswith("case_")}

if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[2] not in CASES:
        print("usage: hub_cli_test.py TIERLM {%s}" % ",".join(CASES))
        sys.exit(2)
    started = time.monotonic()
    case = Case(os.path.abspath(sys.argv[1]))
    try:
        CASES[sys.argv[2]](case)
    finally:
        case.close()
    print("hub %s: ok (%.1f s)" % (sys.argv[2], time.monotonic() - started))
