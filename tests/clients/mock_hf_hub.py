#!/usr/bin/env python3
"""A loopback mock of the Hugging Face Hub and its CDN for `llm download` (standard library
only). Two servers on two ports, as the real Hub and its CDN are two hosts:

Hub  GET  /api/models/{owner}/{name}/revision/{rev}  -> {"sha", "siblings": [{"rfilename"}]}
     HEAD|GET /{owner}/{name}/resolve/{rev}/{path}    -> small files: 200 with ETag = git blob
          sha1; LFS files (*.safetensors, *.model, *.bin): 302 to the CDN with X-Linked-Etag =
          sha256 and X-Linked-Size; X-Repo-Commit on both. Errors carry X-Error-Code as the
          Hub's do (RepoNotFound, RevisionNotFound, EntryNotFound, GatedRepo).
CDN  GET  /blobs/{sha256}?X-Amz-Signature=...         -> the bytes, with Range (206/416); a
          request with an Authorization header is refused (400), as S3 refuses a second
          credential next to a presigned URL.

Repositories (all hold the files of --model-dir; `original/tok512.bin` exercises folders):
  test-org/stories260K  the first CDN GET of model.safetensors drops the connection halfway
  test-org/gated        401 GatedRepo without `Authorization: Bearer hf_test_token`, 403 with
                        another token
  test-org/corrupt      model.safetensors is served with one byte flipped (sha256 mismatch)
Every request is appended to --log as "METHOD PATH range=... auth=yes|no" (one line).
Usage: mock_hf_hub.py --model-dir DIR --port-file FILE --log FILE"""
import argparse
import hashlib
import http.server
import json
import os
import re
import threading
import urllib.parse

TOKEN = "hf_test_token"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
REPOS = ("test-org/stories260K", "test-org/gated", "test-org/corrupt")
LFS_SUFFIXES = (".safetensors", ".model", ".bin")
FILES = ("config.json", "generation_config.json", "tokenizer_config.json", "tokenizer.model",
         "model.safetensors", "original/tok512.bin")


def load_files(model_dir):
    files = {}
    for name in FILES:
        with open(os.path.join(model_dir, name), "rb") as f:
            files[name] = f.read()
    return files


class State:
    def __init__(self, files, log_path):
        self.files = files
        self.blobs = {}  # CDN key -> bytes
        self.log_path = log_path
        self.lock = threading.Lock()
        self.dropped = set()  # CDN keys whose first GET was cut already
        self.cdn_origin = ""

    def log(self, line):
        with self.lock, open(self.log_path, "a") as f:
            f.write(line + "\n")


def git_blob_sha1(data):
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    state = None  # set per server class

    def log_message(self, *args):
        pass

    def record(self):
        self.state.log("%s %s range=%s auth=%s" % (
            self.command, self.path, self.headers.get("Range", "-"),
            "yes" if self.headers.get("Authorization") else "no"))

    def reply(self, status, body=b"", headers=None, send_body=True):
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if send_body and self.command != "HEAD":
            self.wfile.write(body)

    def error(self, status, code, message):
        body = json.dumps({"error": message}).encode()
        self.reply(status, body, {"X-Error-Code": code, "X-Error-Message": message,
                                  "Content-Type": "application/json"})


class HubHandler(Handler):
    def do_GET(self):
        self.record()
        self.route()

    def do_HEAD(self):
        self.record()
        self.route()

    def authorized(self, repo):
        if repo != "test-org/gated":
            return True
        auth = self.headers.get("Authorization")
        if auth == "Bearer " + TOKEN:
            return True
        if auth is None:
            self.error(401, "GatedRepo", "Access to model test-org/gated is restricted. "
                       "You must have access to it and be authenticated to access it.")
        else:
            self.error(403, "GatedRepo", "Access to model test-org/gated is restricted and "
                       "you are not in the authorized list.")
        return False

    def route(self):
        path = urllib.parse.urlsplit(self.path).path
        m = re.fullmatch(r"/api/models/([^/]+/[^/]+)/revision/([^/]+)", path)
        if m and self.command == "GET":
            return self.api_model(m.group(1), urllib.parse.unquote(m.group(2)))
        m = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
        if m:
            return self.resolve(m.group(1), urllib.parse.unquote(m.group(2)),
                                urllib.parse.unquote(m.group(3)))
        self.error(404, "NotFound", "no route " + path)

    def check_repo(self, repo, revision):
        if repo not in REPOS:
            self.error(404, "RepoNotFound", "Repository not found")
            return False
        if not self.authorized(repo):
            return False
        if revision not in ("main", COMMIT):
            self.error(404, "RevisionNotFound", "Invalid rev id: " + revision)
            return False
        return True

    def api_model(self, repo, revision):
        if not self.check_repo(repo, revision):
            return
        body = json.dumps({"id": repo, "modelId": repo, "sha": COMMIT, "private": False,
                           "siblings": [{"rfilename": n} for n in sorted(self.state.files)]})
        self.reply(200, body.encode(), {"Content-Type": "application/json"})

    def resolve(self, repo, revision, name):
        if not self.check_repo(repo, revision):
            return
        data = self.state.files.get(name)
        if data is None:
            return self.error(404, "EntryNotFound", name + " does not exist on " + revision)
        if not name.endswith(LFS_SUFFIXES):
            return self.reply(200, data, {"ETag": '"%s"' % git_blob_sha1(data),
                                          "X-Repo-Commit": COMMIT})
        sha256 = hashlib.sha256(data).hexdigest()
        key = sha256
        if repo == "test-org/corrupt" and name == "model.safetensors":
            key = "corrupt-" + sha256
            bad = bytearray(data)
            bad[len(bad) // 2] ^= 0xFF
            self.state.blobs[key] = bytes(bad)
        elif repo == "test-org/stories260K" and name == "model.safetensors":
            key = "flaky-" + sha256
            self.state.blobs[key] = data
        else:
            self.state.blobs[key] = data
        location = "%s/blobs/%s?X-Amz-Signature=mock" % (self.state.cdn_origin, key)
        self.reply(302, b"", {"Location": location, "X-Linked-Etag": '"%s"' % sha256,
                              "X-Linked-Size": str(len(data)), "X-Repo-Commit": COMMIT,
                              "ETag": '"%s"' % git_blob_sha1(b"version lfs pointer")})


class CdnHandler(Handler):
    def do_GET(self):
        self.record()
        if self.headers.get("Authorization"):
            return self.reply(400, b"Only one auth mechanism allowed")
        key = urllib.parse.urlsplit(self.path).path.rsplit("/", 1)[-1]
        data = self.state.blobs.get(key)
        if data is None:
            return self.reply(404, b"NoSuchKey")
        start = 0
        rng = self.headers.get("Range")
        if rng:
            m = re.fullmatch(r"bytes=(\d+)-", rng)
            if not m or int(m.group(1)) >= len(data):
                return self.reply(416, b"", {"Content-Range": "bytes */%d" % len(data)})
            start = int(m.group(1))
        body = data[start:]
        self.send_response(206 if rng else 200)
        if rng:
            self.send_header("Content-Range", "bytes %d-%d/%d" % (start, len(data) - 1, len(data)))
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        with self.state.lock:
            drop = key.startswith("flaky-") and key not in self.state.dropped
            self.state.dropped.add(key)
        if drop:  # half the promised bytes, then the connection goes away
            self.wfile.write(body[:len(body) // 2])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(2)
            return
        self.wfile.write(body)


def serve(handler_base, state):
    handler = type(handler_base.__name__, (handler_base,), {"state": state})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--port-file", required=True)
    parser.add_argument("--log", required=True)
    args = parser.parse_args()
    state = State(load_files(args.model_dir), args.log)
    cdn = serve(CdnHandler, state)
    state.cdn_origin = "http://127.0.0.1:%d" % cdn.server_address[1]
    hub = serve(HubHandler, state)
    with open(args.port_file + ".tmp", "w") as f:
        f.write(str(hub.server_address[1]))
    os.rename(args.port_file + ".tmp", args.port_file)
    threading.Event().wait()


if __name__ == "__main__":
    main()
