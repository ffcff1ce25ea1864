#!/usr/bin/env python3
"""A loopback Hugging Face hub for tests (Python standard library only).

Serves folders as model repos, speaking the parts of the hub's HTTP protocol that huggingface_hub and
@huggingface/hub use to download:
  GET  /api/models/ORG/NAME[/revision/REV]        model info: sha, siblings (+ size/blobId/lfs with ?blobs=true)
  GET  /api/models/ORG/NAME/tree/REV[/PATH]        the file list (recursive, expand)
  POST /api/models/ORG/NAME/paths-info/REV         metadata of named paths
  HEAD|GET /ORG/NAME/resolve/REV/FILE              regular files: 200 with ETag (git blob sha1), X-Repo-Commit;
                                                   LFS files (*.safetensors): 302 to the blob store with
                                                   X-Linked-Etag (sha256), X-Linked-Size, X-Repo-Commit — the
                                                   first LFS file by a relative Location, the others absolute
  HEAD|GET /lfs-store/SHA256                       LFS content, with Range
Errors carry X-Error-Code (RepoNotFound, RevisionNotFound, EntryNotFound, GatedRepo) as the hub's do.

Test knobs (attributes of TestHub, changeable while it runs): gated_token (a repo needs this bearer token: no
token 401, another 403), corrupt (LFS bytes served with one byte flipped, under the true sha256), throttle
(bytes per second for LFS content), drop_after (close an LFS connection after this many body bytes).
Every LFS body byte written is counted per sha256 (served), and every request is logged (requests).
"""
import hashlib
import json
import os
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

LAST_MODIFIED = "2026-01-01T00:00:00.000Z"
CHUNK = 64 * 1024


class SparseData:
    """A large file that is its first bytes followed by zeros, served without ever existing (a tens-of-GB shard)."""

    def __init__(self, head, size):
        self.head, self.size = head, size

    def __len__(self):
        return self.size

    def __getitem__(self, span):
        start, stop, _ = span.indices(self.size)
        head = self.head[start:stop] if start < len(self.head) else b""
        return head + bytes(max(0, stop - start - len(head)))


class RepoFile:
    def __init__(self, path, data):
        self.path = path
        self.data = data
        if isinstance(data, SparseData):  # named by its head and size: never hashed whole
            self.git_sha1 = hashlib.sha1(b"sparse %d\0" % len(data) + data.head).hexdigest()
            self.lfs = True
            self.sha256 = hashlib.sha256(b"sparse %d\0" % len(data) + data.head).hexdigest()
            self.pointer_size = 134
            self.oid = self.git_sha1
            return
        self.git_sha1 = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
        self.lfs = path.endswith(".safetensors")
        self.sha256 = hashlib.sha256(data).hexdigest() if self.lfs else None
        if self.lfs:  # the pointer file git stores in place of the content
            pointer = ("version https://git-lfs.github.com/spec/v1\noid sha256:%s\nsize %d\n"
                       % (self.sha256, len(data))).encode()
            self.pointer_size = len(pointer)
            self.oid = hashlib.sha1(b"blob %d\0" % len(pointer) + pointer).hexdigest()
        else:
            self.oid = self.git_sha1

    def etag(self):
        return self.sha256 if self.lfs else self.git_sha1

    def tree_entry(self, commit, expand):
        entry = {"type": "file", "oid": self.oid, "size": len(self.data), "path": self.path}
        if self.lfs:
            entry["lfs"] = {"oid": self.sha256, "size": len(self.data), "pointerSize": self.pointer_size}
        if expand:
            entry["lastCommit"] = {"id": commit, "title": "test commit", "date": LAST_MODIFIED}
            entry["securityFileStatus"] = {"status": "safe"}
        return entry


class Repo:
    def __init__(self, name, folder, extra=None):
        self.name = name
        self.files = [RepoFile(path, data) for path, data in (extra or {}).items()]
        for root, _, names in os.walk(folder):
            for n in sorted(names):
                full = os.path.join(root, n)
                with open(full, "rb") as f:
                    self.files.append(RepoFile(os.path.relpath(full, folder), f.read()))
        self.files.sort(key=lambda f: f.path)
        digest = hashlib.sha1(name.encode())
        for f in self.files:
            digest.update(f.path.encode() + b"\0" + f.oid.encode())
        self.commit = digest.hexdigest()

    def file(self, path):
        return next((f for f in self.files if f.path == path), None)


class QuietServer(ThreadingHTTPServer):
    def handle_error(self, request, client_address):  # a client that hangs up mid-file is part of the tests
        pass


class TestHub:
    def __init__(self, repos, extra=None):
        """repos: {"ORG/NAME": folder}; extra: {"ORG/NAME": {path: bytes or SparseData}} added to a repo's files"""
        self.repos = {name: Repo(name, folder, (extra or {}).get(name)) for name, folder in repos.items()}
        self.gated_token = None
        self.corrupt = False
        self.throttle = 0
        self.drop_after = 0
        self.served = {}
        self.requests = []
        self.lock = threading.Lock()
        hub = self

        class Handler(HubHandler):
            pass

        Handler.hub = hub
        self.server = QuietServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = "http://127.0.0.1:%d" % self.port
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def start(self):
        self.thread.start()
        return self

    def stop(self):
        self.server.shutdown()
        self.server.server_close()

    def lfs_bytes_served(self):
        with self.lock:
            return sum(self.served.values())

    def blob(self, sha256):
        for repo in self.repos.values():
            for f in repo.files:
                if f.sha256 == sha256:
                    return f
        return None


class HubHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    hub = None

    def log_message(self, fmt, *args):  # quiet: the tests read hub.requests instead
        pass

    # --- responses -------------------------------------------------------------------------------------------------
    def reply(self, status, body=b"", headers=None, content_type="application/json"):
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
        self.log(status)

    def error(self, status, code, message):
        self.reply(status, json.dumps({"error": message}).encode(),
                   {"X-Error-Code": code, "X-Error-Message": message})

    def json(self, value, headers=None):
        self.reply(200, json.dumps(value).encode(), headers)

    def log(self, status, extra=None):
        entry = {"method": self.command, "path": self.path, "status": status,
                 "range": self.headers.get("Range"), "auth": self.headers.get("Authorization") is not None}
        entry.update(extra or {})
        with self.hub.lock:
            self.hub.requests.append(entry)

    # --- routing ---------------------------------------------------------------------------------------------------
    def do_HEAD(self):
        self.route()

    def do_GET(self):
        self.route()

    def do_POST(self):
        self.route()

    def route(self):
        url = urlsplit(self.path)
        path = unquote(url.path)
        query = parse_qs(url.query)
        if self.command == "POST":
            length = int(self.headers.get("Content-Length", "0"))
            self.body = self.rfile.read(length) if length else b""
        m = re.fullmatch(r"/lfs-store/([0-9a-f]{64})", path)
        if m:
            return self.lfs(m.group(1))
        m = re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/([^/]+))?", path)
        if m and self.command == "GET":
            return self.model_info(m.group(1), m.group(2) or "main", query)
        m = re.fullmatch(r"/api/models/([^/]+/[^/]+)/tree/([^/]+)(?:/(.*))?", path)
        if m and self.command == "GET":
            return self.tree(m.group(1), m.group(2), m.group(3) or "", query)
        m = re.fullmatch(r"/api/models/([^/]+/[^/]+)/paths-info/([^/]+)", path)
        if m and self.command == "POST":
            return self.paths_info(m.group(1), m.group(2))
        m = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
        if m and self.command in ("GET", "HEAD"):
            return self.resolve(m.group(1), m.group(2), m.group(3))
        self.error(404, "NotFound", "no route " + path)

    def repo_at(self, name, revision):
        """The repo, or None after answering the error."""
        repo = self.hub.repos.get(name)
        if repo is None:
            self.error(404, "RepoNotFound", "Repository not found")
            return None
        if self.hub.gated_token is not None:
            auth = self.headers.get("Authorization")
            if auth is None:
                self.error(401, "GatedRepo", "Access to model %s is restricted. You must be authenticated." % name)
                return None
            if auth != "Bearer " + self.hub.gated_token:
                self.error(403, "GatedRepo", "Access to model %s is restricted and you are not in the authorized list."
                           % name)
                return None
        if revision not in ("main", "HEAD", repo.commit):
            self.error(404, "RevisionNotFound", "Invalid rev id: " + revision)
            return None
        return repo

    # --- API -------------------------------------------------------------------------------------------------------
    def model_info(self, name, revision, query):
        repo = self.repo_at(name, revision)
        if repo is None:
            return
        blobs = query.get("blobs", ["false"])[0].lower() == "true"
        siblings = []
        for f in repo.files:
            s = {"rfilename": f.path}
            if blobs:
                s.update({"blobId": f.oid, "size": len(f.data)})
                if f.lfs:
                    s["lfs"] = {"sha256": f.sha256, "size": len(f.data), "pointerSize": f.pointer_size}
            siblings.append(s)
        self.json({"_id": "0" * 24, "id": name, "modelId": name, "sha": repo.commit, "private": False,
                   "gated": "auto" if self.hub.gated_token else False, "disabled": False, "downloads": 0, "likes": 0,
                   "lastModified": LAST_MODIFIED, "createdAt": LAST_MODIFIED, "tags": ["safetensors"],
                   "pipeline_tag": "text-generation", "library_name": "transformers", "siblings": siblings})

    def tree(self, name, revision, sub, query):
        repo = self.repo_at(name, revision)
        if repo is None:
            return
        expand = query.get("expand", ["false"])[0].lower() == "true"
        recursive = query.get("recursive", ["false"])[0].lower() == "true"
        prefix = sub.rstrip("/") + "/" if sub else ""
        entries, dirs = [], set()
        for f in repo.files:
            if not f.path.startswith(prefix):
                continue
            rest = f.path[len(prefix):]
            if "/" in rest and not recursive:
                dirs.add(prefix + rest.split("/")[0])
                continue
            for i in range(rest.count("/")):
                dirs.add(prefix + "/".join(rest.split("/")[:i + 1]))
            entries.append(f.tree_entry(repo.commit, expand))
        entries += [{"type": "directory", "oid": "0" * 40, "size": 0, "path": d} for d in sorted(dirs)]
        self.json(entries)

    def paths_info(self, name, revision):
        repo = self.repo_at(name, revision)
        if repo is None:
            return
        request = json.loads(self.body or b"{}")
        expand = bool(request.get("expand"))
        out = [repo.file(p).tree_entry(repo.commit, expand) for p in request.get("paths", []) if repo.file(p)]
        self.json(out)

    # --- files -----------------------------------------------------------------------------------------------------
    def resolve(self, name, revision, path):
        repo = self.repo_at(name, revision)
        if repo is None:
            return
        f = repo.file(path)
        if f is None:
            return self.error(404, "EntryNotFound", "Entry not found")
        common = {"X-Repo-Commit": repo.commit, "Accept-Ranges": "bytes"}
        if f.lfs:
            lfs_files = [x for x in repo.files if x.lfs]
            target = "/lfs-store/" + f.sha256
            if lfs_files.index(f) > 0:
                target = self.hub.url + target  # absolute, as to a CDN; the first LFS file gets a relative one
            headers = dict(common)
            headers.update({"Location": target, "ETag": '"%s"' % f.sha256, "X-Linked-Etag": '"%s"' % f.sha256,
                            "X-Linked-Size": str(len(f.data))})
            return self.reply(302, b"", headers, "text/plain")
        self.send_content(f.data, dict(common, ETag='"%s"' % f.git_sha1), None)

    def lfs(self, sha256):
        f = self.hub.blob(sha256)
        if f is None:
            return self.error(404, "EntryNotFound", "no such blob")
        data = f.data
        if self.hub.corrupt:
            middle = len(data) // 2
            data = data[:middle] + bytes([data[middle] ^ 0xFF]) + data[middle + 1:]
        self.send_content(data, {"ETag": '"%s"' % sha256}, sha256)

    def send_content(self, data, headers, counted_as):
        start, end, status = 0, len(data), 200
        wanted = self.headers.get("Range")
        m = re.fullmatch(r"bytes=(\d+)-(\d*)", wanted or "")
        if m:
            start = int(m.group(1))
            end = min(len(data), int(m.group(2)) + 1) if m.group(2) else len(data)
            if start >= len(data):
                return self.reply(416, b"", dict(headers, **{"Content-Range": "bytes */%d" % len(data)}))
            status = 206
            headers["Content-Range"] = "bytes %d-%d/%d" % (start, end - 1, len(data))
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(end - start))
        self.end_headers()
        self.log(status, {"start": start})
        if self.command == "HEAD":
            return
        sent, began = 0, time.monotonic()
        position = start
        while position < end:
            chunk = data[position:min(end, position + CHUNK)]
            if self.hub.drop_after and counted_as and sent + len(chunk) > self.hub.drop_after:
                chunk = chunk[:max(0, self.hub.drop_after - sent)]
                self.write_counted(chunk, counted_as)
                self.close_connection = True
                self.connection.shutdown(2)  # the network goes away mid-file
                return
            if not self.write_counted(chunk, counted_as):
                return
            sent += len(chunk)
            position += len(chunk)
            if self.hub.throttle and counted_as:
                ahead = sent / self.hub.throttle - (time.monotonic() - began)
                if ahead > 0:
                    time.sleep(ahead)

    def write_counted(self, chunk, counted_as):
        try:
            self.wfile.write(chunk)
            self.wfile.flush()
        except OSError:
            self.close_connection = True
            return False
        if counted_as:
            with self.hub.lock:
                self.hub.served[counted_as] = self.hub.served.get(counted_as, 0) + len(chunk)
        return True


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repo", action="append", required=True, help="ORG/NAME=FOLDER")
    parser.add_argument("--token", help="make every repo gated behind this bearer token")
    args = parser.parse_args()
    hub = TestHub(dict(r.split("=", 1) for r in args.repo))
    hub.gated_token = args.token
    print(hub.url, flush=True)
    hub.server.serve_forever()
