#!/usr/bin/python3
"""Soak test of a running `llm serve` (OpenAI-compatible HTTP on loopback). Stdlib only.

Many concurrent clients send a random mix for a bounded count and time: completions and chat
(streamed or not; random max_tokens, temperature, stop, n, logprobs, seed, include_usage),
client disconnects mid-stream and mid-response (raw sockets closed early), requests with a
`timeout`, oversized bodies (413), malformed bodies (400), wrong routes / methods (404 /
405), bursts past the admission limit (429 + Retry-After), and a few /metrics, /v1/models,
/tokenize, /detokenize calls.

Checks (any failure: exit 1):
  * every answered request got exactly one well-formed final response: JSON bodies parse and
    have the expected shape; streams are `data:` events that parse, each choice gets exactly
    one finish_reason, the stream ends with `data: [DONE]` and nothing follows it; errors
    have OpenAI's shape {"error": {"message", "type", "param", "code"}}; 429 has Retry-After;
  * afterwards /health is 200, vllm:num_requests_running / _waiting are 0 and
    vllm:kv_cache_usage_perc is 0 within --settle-seconds;
  * the growth of vllm:request_success_total (all finish reasons, `abort` included) equals
    the generation requests the server accepted (status 200 seen by this client), and
    llm:http_responses_total grew by what this client saw for 404/405/413/429;
  * the server's RSS (/proc/PID/status) after the soak is within --max-rss-growth-mib of its
    RSS after the warm-up.
Prints a summary table and writes a JSON summary (--json).

Usage: server_soak.py --url http://127.0.0.1:PORT --pid PID [--requests N] [--clients C]
       [--seconds S] [--seed K] [--max-body-bytes B] [--burst B] [--json FILE]
"""
import argparse
import collections
import http.client
import json
import random
import socket
import sys
import threading
import time
import urllib.parse

FINISH_OK = {"stop", "length", "timeout"}
PROMPTS = ["Once upon a time", "The little dog", "Lily and Ben went to the park.", "One day, a",
           "Tom had a red ball. He", "The sun was", "She saw a big", "Mom said"]
STOPS = [".", "\n", "the", "!", ["and", "."], ["He", "She"], "xyz"]


class Violation(Exception):
    pass


def rss_kib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


class Soak:
    def __init__(self, args):
        self.args = args
        u = urllib.parse.urlparse(args.url)
        if u.hostname not in ("127.0.0.1", "localhost", "::1"):
            raise SystemExit("server_soak: loopback only (got %s)" % u.hostname)
        self.host, self.port = "127.0.0.1" if u.hostname == "localhost" else u.hostname, u.port
        self.lock = threading.Lock()
        self.by_kind = collections.Counter()       # request kind -> count
        self.status = collections.Counter()        # HTTP status -> count (what we saw)
        self.kind_status = collections.Counter()   # (kind, status) -> count
        self.errors = collections.Counter()        # error type (ours) -> count
        self.finish = collections.Counter()        # finish_reason -> count (per choice)
        self.violations = []
        self.accepted = 0          # generation requests answered 200 (the server admitted them)
        self.disconnects = 0       # accepted requests we walked away from
        self.retry_after_missing = 0
        self.next_request = 0
        self.rss_peak = 0
        self.peak_busy = 0  # the most running + waiting seen in /metrics
        self.rss_samples = []
        self.has_chat = False
        self.model = None
        self.max_model_len = 512
        self.headers = {"Content-Type": "application/json"}
        if args.api_key:
            self.headers["Authorization"] = "Bearer " + args.api_key

    # ---- plumbing ----------------------------------------------------------------------
    def conn(self, timeout=None):
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout or self.args.io_timeout)

    def request(self, method, path, body=None, headers=None, timeout=None):
        """One request on a fresh connection -> (status, headers, body bytes)."""
        c = self.conn(timeout)
        try:
            h = dict(self.headers)
            h.update(headers or {})
            if isinstance(body, (dict, list)):
                body = json.dumps(body)
            c.request(method, path, body=body, headers=h)
            r = c.getresponse()
            data = r.read()  # raises IncompleteRead on a truncated chunked body
            return r.status, r, data
        finally:
            c.close()

    def violation(self, kind, what, detail=""):
        with self.lock:
            self.errors["violation:" + what] += 1
            if len(self.violations) < 50:
                self.violations.append({"kind": kind, "what": what, "detail": str(detail)[:400]})

    def record(self, kind, status):
        with self.lock:
            self.by_kind[kind] += 1
            self.status[status] += 1
            self.kind_status[(kind, status)] += 1

    def check_error_shape(self, kind, status, data):
        try:
            body = json.loads(data)
            e = body["error"]
            ok = (isinstance(e.get("message"), str) and isinstance(e.get("type"), str)
                  and "param" in e and "code" in e
                  and (e["param"] is None or isinstance(e["param"], str))
                  and (e["code"] is None or isinstance(e["code"], str)))
        except (ValueError, KeyError, TypeError, AttributeError):
            ok = False
        if not ok:
            self.violation(kind, "error_shape", "%s %r" % (status, data[:200]))

    # ---- generation requests -----------------------------------------------------------
    def random_generation(self, rng, chat=False):
        body = {"max_tokens": rng.choice([1, 2, 5, 16, 32, 64, rng.randint(1, 120)])}
        if chat:
            body["messages"] = [{"role": "user", "content": rng.choice(PROMPTS)}]
            if rng.random() < 0.3:
                body["messages"].insert(0, {"role": "system", "content": "Tell a story."})
        else:
            body["prompt"] = rng.choice(PROMPTS)
        if rng.random() < 0.7:
            body["temperature"] = rng.choice([0, 0.5, 0.8, 1.0, 1.5])
        if rng.random() < 0.3:
            body["stop"] = rng.choice(STOPS)
        if rng.random() < 0.25:
            body["n"] = rng.randint(2, 3)
        if rng.random() < 0.25:
            if chat:
                body["logprobs"] = True
                body["top_logprobs"] = rng.randint(0, 3)
            else:
                body["logprobs"] = rng.randint(0, 3)
        if rng.random() < 0.4:
            body["seed"] = rng.randint(0, 2**31)
        if rng.random() < 0.2:
            body["top_p"] = 0.9
        if rng.random() < 0.2:
            body["ignore_eos"] = True
        return body

    def validate_final(self, kind, body, want, chat, stream_usage=False):
        obj = "chat.completion" if chat else "text_completion"
        if body.get("object") != obj or not isinstance(body.get("id"), str):
            raise Violation("bad_envelope", body)
        choices = body.get("choices")
        if not isinstance(choices, list) or len(choices) != want.get("n", 1):
            raise Violation("bad_choices", body)
        for i, c in enumerate(choices):
            if c.get("index") != i:
                raise Violation("bad_choice_index", c)
            fr = c.get("finish_reason")
            if fr not in FINISH_OK:
                raise Violation("bad_finish_reason", fr)
            if (chat and not isinstance(c.get("message", {}).get("content"), str)) or (
                    not chat and not isinstance(c.get("text"), str)):
                raise Violation("bad_text", c)
            if "logprobs" in want and want["logprobs"] is not False and c.get("logprobs") is None:
                raise Violation("missing_logprobs", c)
            with self.lock:
                self.finish[fr] += 1
        u = body.get("usage")
        if not isinstance(u, dict) or u.get("total_tokens") != u.get("prompt_tokens", 0) + u.get(
                "completion_tokens", -1):
            raise Violation("bad_usage", u)

    def parse_sse(self, kind, data, want, chat):
        """Validates a whole SSE body; returns None or raises Violation."""
        text = data.decode("utf-8")
        if not text.endswith("\n\n"):
            raise Violation("stream_not_terminated", text[-200:])
        events = text.split("\n\n")[:-1]
        n = want.get("n", 1)
        finishes = collections.Counter()
        done = 0
        usage_chunks = 0
        for ev in events:
            if ev.startswith(":"):
                continue  # SSE comment (the server's liveness probe)
            if not ev.startswith("data: "):
                raise Violation("bad_sse_line", ev[:200])
            if done:
                raise Violation("data_after_done", ev[:200])
            payload = ev[6:]
            if payload == "[DONE]":
                done += 1
                continue
            try:
                chunk = json.loads(payload)
            except ValueError:
                raise Violation("bad_chunk_json", payload[:200])
            obj = "chat.completion.chunk" if chat else "text_completion"
            if chunk.get("object") != obj:
                raise Violation("bad_chunk_object", chunk)
            if chunk.get("choices") == [] and "usage" in chunk:
                usage_chunks += 1
                continue
            for c in chunk.get("choices", []):
                idx = c.get("index")
                if not isinstance(idx, int) or not 0 <= idx < n:
                    raise Violation("bad_chunk_index", c)
                if finishes[idx]:
                    raise Violation("chunk_after_finish", c)
                fr = c.get("finish_reason")
                if fr is not None:
                    if fr not in FINISH_OK:
                        raise Violation("bad_finish_reason", fr)
                    finishes[idx] += 1
                    with self.lock:
                        self.finish[fr] += 1
        if done != 1:
            raise Violation("missing_done", text[-200:])
        if any(finishes[i] != 1 for i in range(n)):
            raise Violation("missing_finish_reason", dict(finishes))
        include_usage = want.get("stream_options", {}).get("include_usage", False)
        if usage_chunks != (1 if include_usage else 0):
            raise Violation("usage_chunk_count", usage_chunks)

    def generation(self, rng, kind, chat, stream, extra=None):
        body = self.random_generation(rng, chat)
        body["stream"] = stream
        if stream and rng.random() < 0.3:
            body["stream_options"] = {"include_usage": True}
        body.update(extra or {})
        path = "/v1/chat/completions" if chat else "/v1/completions"
        try:
            status, resp, data = self.request("POST", path, body)
        except http.client.IncompleteRead as e:
            self.record(kind, "truncated")
            return self.violation(kind, "truncated_body", e)
        except (OSError, http.client.HTTPException) as e:
            self.record(kind, "conn_error")
            return self.violation(kind, "connection_error", repr(e))
        self.record(kind, status)
        if status == 429:
            with self.lock:
                self.errors["429_overloaded"] += 1
            if not resp.getheader("Retry-After"):
                self.violation(kind, "429_without_retry_after")
            self.check_error_shape(kind, status, data)
            if kind != "burst":  # back off as a client should (shorter than Retry-After: 1)
                time.sleep(rng.uniform(0.05, 0.3))
            return
        if status != 200:
            self.check_error_shape(kind, status, data)
            return self.violation(kind, "unexpected_status", "%s %s %r" % (status, json.dumps(body), data[:200]))
        with self.lock:
            self.accepted += 1
        try:
            if stream:
                self.parse_sse(kind, data, body, chat)
            else:
                self.validate_final(kind, json.loads(data), body, chat)
        except Violation as v:
            self.violation(kind, v.args[0], "%s | %s" % (json.dumps(body)[:200], v.args[1] if len(v.args) > 1 else ""))
        except ValueError as e:
            self.violation(kind, "bad_json", "%r %r" % (e, data[:200]))

    # ---- raw-socket clients ------------------------------------------------------------
    def raw_send(self, method, path, body, timeout=None):
        s = socket.create_connection((self.host, self.port), timeout=timeout or self.args.io_timeout)
        head = "%s %s HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: application/json\r\n" % (
            method, path, self.host, self.port)
        if "Authorization" in self.headers:
            head += "Authorization: %s\r\n" % self.headers["Authorization"]
        head += "Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body)
        s.sendall(head.encode() + body)
        return s

    @staticmethod
    def read_head(s):
        buf = b""
        while b"\r\n\r\n" not in buf:
            part = s.recv(4096)
            if not part:
                break
            buf += part
        line = buf.split(b"\r\n", 1)[0].split()
        status = int(line[1]) if len(line) > 1 and line[1].isdigit() else None
        return status, buf

    def disconnect(self, rng, kind, stream, chat):
        """A long generation whose client closes the socket early (sometimes with RST)."""
        body = {"max_tokens": rng.randint(100, 300), "ignore_eos": True, "stream": stream,
                "temperature": rng.choice([0, 1.0])}
        if rng.random() < 0.3:
            body["n"] = 2
        if chat:
            body["messages"] = [{"role": "user", "content": rng.choice(PROMPTS)}]
            path = "/v1/chat/completions"
        else:
            body["prompt"] = rng.choice(PROMPTS)
            path = "/v1/completions"
        try:
            s = self.raw_send("POST", path, json.dumps(body).encode())
        except OSError as e:
            self.record(kind, "conn_error")
            return self.violation(kind, "connection_error", repr(e))
        try:
            status, buf = self.read_head(s)
            self.record(kind, status if status is not None else "no_status")
            if status == 429:
                with self.lock:
                    self.errors["429_overloaded"] += 1
                time.sleep(rng.uniform(0.05, 0.3))
                return
            if status != 200:
                return self.violation(kind, "unexpected_status", "%s %r" % (status, buf[:200]))
            with self.lock:
                self.accepted += 1
                self.disconnects += 1
            if stream:  # wait for the first event (or a probe), then leave mid-stream
                while b"data: " not in buf and b": ping" not in buf:
                    part = s.recv(4096)
                    if not part:
                        break
                    buf += part
            else:  # leave while the server is still generating
                time.sleep(rng.uniform(0.0, 0.3))
            if rng.random() < 0.5:  # RST instead of FIN
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        except OSError as e:
            self.violation(kind, "connection_error", repr(e))
        finally:
            s.close()

    def partial_body(self, rng):
        """Sends half a body and closes: nothing must be admitted."""
        kind = "partial_body"
        body = json.dumps({"prompt": "Once upon a time", "max_tokens": 8}).encode()
        s = socket.create_connection((self.host, self.port), timeout=self.args.io_timeout)
        head = ("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                "Content-Length: %d\r\n\r\n" % len(body)).encode()
        try:
            s.sendall(head + body[: rng.randint(0, len(body) - 1)])
        finally:
            s.close()
        self.record(kind, "closed")

    # ---- error paths -------------------------------------------------------------------
    def expect_error(self, kind, method, path, body, want_status, headers=None):
        try:
            status, resp, data = self.request(method, path, body, headers)
        except (OSError, http.client.HTTPException) as e:
            self.record(kind, "conn_error")
            return self.violation(kind, "connection_error", repr(e))
        self.record(kind, status)
        if status == 429 and want_status == 400:  # admission runs after validation only
            return self.violation(kind, "429_for_invalid_request")
        if status != want_status:
            return self.violation(kind, "unexpected_status", "%s %s %s %r -> %s %r" % (
                method, path, want_status, str(body)[:120], status, data[:200]))
        if want_status == 405 and not resp.getheader("Allow"):
            self.violation(kind, "405_without_allow")
        with self.lock:
            self.errors["%d_%s" % (status, kind)] += 1
        self.check_error_shape(kind, status, data)

    def oversized(self, rng):
        kind = "oversized_413"
        size = self.args.max_body_bytes + rng.choice([1, 1000, self.args.max_body_bytes])
        body = '{"prompt": "%s", "max_tokens": 1}' % ("x" * (size - 31))
        assert len(body) == size
        self.expect_error(kind, "POST", rng.choice(["/v1/completions", "/v1/chat/completions"]),
                          body.encode(), 413)

    def malformed(self, rng):
        cases = [
            b"{", b"", b"null", b"[1, 2]", b'{"prompt": "a",', b"\xff\xfe", b'"just a string"',
            {"prompt": "a", "max_tokens": "ten"}, {"prompt": "a", "temperature": "hot"},
            {"prompt": 5}, {"prompt": "a", "n": "2"}, {"prompt": "a", "stream": "yes"},
            {"prompt": "a", "stop": 5}, {"prompt": "a", "logprobs": 99}, {"prompt": "a", "max_tokens": 0},
            {"prompt": "a", "temperature": 5}, {"prompt": "a", "max_tokens": 100000},
            {"prompt": [1, 2, 100000]}, {"prompt": "a", "timeout": -1}, {"prompt": "a", "echo": True},
            {"prompt": "a", "logit_bias": [1]}, {"prompt": []}, {"max_tokens": 4},
            {"prompt": "a", "stop_token_ids": ["x"]}, {"prompt": "a", "seed": "s"},
        ]
        chat_cases = [{"messages": "hi"}, {"messages": []}, {"messages": [{"role": "user", "content": "a"}],
                                                              "max_tokens": -3}]
        path = "/v1/completions"
        case = rng.choice(cases)
        if self.has_chat and rng.random() < 0.25:
            path, case = "/v1/chat/completions", rng.choice(chat_cases)
        body = case if isinstance(case, bytes) else json.dumps(case).encode()
        self.expect_error("malformed_400", "POST", path, body, 400)

    def wrong_route(self, rng):
        cases = [("GET", "/v1/nope", 404), ("POST", "/v2/completions", 404), ("GET", "/static/nope.js", 404),
                 ("GET", "/v1/completions", 405), ("DELETE", "/v1/chat/completions", 405),
                 ("PUT", "/v1/completions", 405), ("POST", "/health", 405),
                 ("POST", "/metrics", 405), ("DELETE", "/v1/models", 405)]
        method, path, want = rng.choice(cases)
        self.expect_error("wrong_route_%d" % want, method, path, b"{}" if method != "GET" else None, want)

    def misc(self, rng):
        kind = "misc"
        method, path, body = rng.choice([("GET", "/v1/models", None), ("GET", "/health", None),
                                         ("POST", "/tokenize", {"prompt": rng.choice(PROMPTS)}),
                                         ("POST", "/detokenize", {"tokens": [1, 300, 400]})])
        try:
            status, _, data = self.request(method, path, body)
            json.loads(data)
        except (OSError, http.client.HTTPException, ValueError) as e:
            self.record(kind, "conn_error")
            return self.violation(kind, "misc_failed", repr(e))
        self.record(kind, status)
        if status != 200:
            self.violation(kind, "unexpected_status", "%s %s -> %s" % (method, path, status))

    def burst(self, rng):
        """More simultaneous long requests than the server admits: some must get 429."""
        threads = [threading.Thread(target=self.generation, args=(
            random.Random(rng.random()), "burst", False, rng.random() < 0.5,
            {"max_tokens": 64, "ignore_eos": True, "n": 1}))
            for _ in range(self.args.burst)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    # ---- driver ------------------------------------------------------------------------
    def one(self, rng):
        r = rng.random()
        chat = self.has_chat and rng.random() < 0.35
        if r < 0.30:
            self.generation(rng, "chat" if chat else "completion", chat, False)
        elif r < 0.58:
            self.generation(rng, "chat_stream" if chat else "completion_stream", chat, True)
        elif r < 0.64:
            self.disconnect(rng, "disconnect_stream", True, chat)
        elif r < 0.70:
            self.disconnect(rng, "disconnect_nonstream", False, chat)
        elif r < 0.75:
            self.generation(rng, "timeout", chat, rng.random() < 0.5,
                            {"timeout": rng.uniform(0.02, 0.4), "max_tokens": 300, "ignore_eos": True,
                             "stop": None})
        elif r < 0.79:
            self.oversized(rng)
        elif r < 0.87:
            self.malformed(rng)
        elif r < 0.93:
            self.wrong_route(rng)
        elif r < 0.97:
            self.misc(rng)
        else:
            self.partial_body(rng)

    def worker(self, index, deadline):
        rng = random.Random(self.args.seed * 1000003 + index)
        while time.monotonic() < deadline:
            with self.lock:
                if self.next_request >= self.args.requests:
                    return
                n = self.next_request
                # a burst counts as --burst requests towards --requests
                is_burst = self.args.burst and n // self.args.burst_every != (
                    n + self.args.burst) // self.args.burst_every
                self.next_request += self.args.burst if is_burst else 1
            try:
                if is_burst:
                    self.burst(rng)
                else:
                    self.one(rng)
            except Exception as e:  # a bug in this script or an unexpected client error
                self.violation("worker", "exception", repr(e))

    def sampler(self, stop):
        """RSS every 0.25 s; /metrics every 0.5 s (the peak of running + waiting)."""
        tick = 0
        while not stop.wait(0.25):
            kib = rss_kib(self.args.pid)
            if kib is not None:
                self.rss_peak = max(self.rss_peak, kib)
                self.rss_samples.append(kib)
            tick += 1
            if tick % 2 == 0:
                try:
                    m = self.metrics()
                except (OSError, http.client.HTTPException, Violation) as e:
                    self.violation("metrics", "metrics_failed", repr(e))
                    continue
                busy = m.get("vllm:num_requests_running", 0) + m.get("vllm:num_requests_waiting", 0)
                self.peak_busy = max(self.peak_busy, int(busy))

    def metrics(self):
        status, _, data = self.request("GET", "/metrics")
        if status != 200:
            raise Violation("metrics_status", status)
        out = {"success": collections.Counter(), "http": collections.Counter()}
        for line in data.decode().splitlines():
            if line.startswith("#") or not line.strip():
                continue
            name_labels, value = line.rsplit(" ", 1)
            name = name_labels.split("{", 1)[0]
            if name == "vllm:request_success_total":
                reason = name_labels.split('finished_reason="', 1)[1].split('"', 1)[0]
                out["success"][reason] += int(float(value))
            elif name == "llm:http_responses_total":
                st = name_labels.split('status="', 1)[1].split('"', 1)[0]
                out["http"][int(st)] += int(float(value))
            elif name in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                          "vllm:kv_cache_usage_perc"):
                out[name] = float(value)
        return out

    def run(self):
        a = self.args
        t0 = time.monotonic()
        while True:  # the server may still be loading
            try:
                status, _, _ = self.request("GET", "/health", timeout=2)
                if status == 200:
                    break
            except OSError:
                pass
            if time.monotonic() - t0 > 30:
                raise SystemExit("server_soak: /health never answered 200")
            time.sleep(0.1)
        _, _, data = self.request("GET", "/v1/models")
        m = json.loads(data)["data"][0]
        self.model, self.max_model_len = m["id"], m.get("max_model_len", 512)
        status, _, _ = self.request("POST", "/v1/chat/completions",
                                    {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
        self.has_chat = status == 200

        # Warm-up: every path once or more, so allocator arenas and thread stacks exist.
        warm_rng = random.Random(a.seed - 1)
        warm = [threading.Thread(target=lambda i=i: [self.one(random.Random(a.seed * 7 + i * 100 + k))
                                                    for k in range(a.warmup // 8 + 1)])
                for i in range(8)]
        for t in warm:
            t.start()
        for t in warm:
            t.join()
        self.burst(warm_rng)
        self.wait_idle()
        self.reset_counters()
        time.sleep(0.5)
        rss_base = rss_kib(a.pid)
        before = self.metrics()

        stop = threading.Event()
        samp = threading.Thread(target=self.sampler, args=(stop,), daemon=True)
        samp.start()
        start = time.monotonic()
        deadline = start + a.seconds
        workers = [threading.Thread(target=self.worker, args=(i, deadline)) for i in range(a.clients)]
        for t in workers:
            t.start()
        for t in workers:
            t.join()
        duration = time.monotonic() - start

        idle_s, last = self.wait_idle()
        stop.set()
        samp.join()
        time.sleep(0.5)
        rss_end = rss_kib(a.pid)
        after = self.metrics()
        health, _, _ = self.request("GET", "/health")

        # Server-side accounting.
        if health != 200:
            self.violation("final", "health_not_200", health)
        if idle_s is None:
            self.violation("final", "not_idle", last)
        success = after["success"] - before["success"]
        finished = sum(success.values())
        if finished != self.accepted:
            self.violation("final", "success_total_mismatch",
                           "server finished %d (%s), client saw %d accepted" % (finished, dict(success), self.accepted))
        http_delta = {s: after["http"][s] - before["http"][s] for s in set(after["http"]) | set(before["http"])}
        for st in (404, 405, 413, 429):
            if http_delta.get(st, 0) != self.status.get(st, 0):
                self.violation("final", "http_responses_total_mismatch",
                               "status %d: server %d, client %d" % (st, http_delta.get(st, 0), self.status.get(st, 0)))
        if a.burst and self.status.get(429, 0) == 0:
            self.violation("final", "no_429_seen", "bursts never went past the admission limit")
        # (Reported, not checked: the engine's gauges count sequences, and a request with n > 1
        # has n of them, so running + waiting may exceed the admission limit on requests.)
        growth_mib = (rss_end - rss_base) / 1024 if rss_end and rss_base else None
        if growth_mib is None:
            self.violation("final", "rss_unreadable", a.pid)
        elif growth_mib > a.max_rss_growth_mib:
            self.violation("final", "rss_growth", "%.1f MiB > %.1f MiB" % (growth_mib, a.max_rss_growth_mib))

        summary = {
            "url": a.url, "model": self.model, "chat": self.has_chat,
            "requests_sent": sum(self.by_kind.values()), "requests_limit": a.requests,
            "clients": a.clients, "seed": a.seed, "duration_s": round(duration, 2),
            "requests_per_s": round(sum(self.by_kind.values()) / duration, 1),
            "by_kind": dict(sorted(self.by_kind.items())),
            "statuses": {str(k): v for k, v in sorted(self.status.items(), key=str)},
            "by_kind_status": {"%s %s" % k: v for k, v in sorted(self.kind_status.items(), key=str)},
            "errors": dict(sorted(self.errors.items())),
            "finish_reasons_client": dict(sorted(self.finish.items())),
            "accepted": self.accepted, "client_disconnects": self.disconnects,
            "server_finished_by_reason": dict(sorted(success.items())),
            "server_aborted": success.get("abort", 0),
            "server_http_errors_delta": {str(k): v for k, v in sorted(http_delta.items()) if v},
            "peak_running_plus_waiting": self.peak_busy, "admission_limit": a.admission_limit,
            "idle_after_s": idle_s,
            "rss_base_mib": round(rss_base / 1024, 1) if rss_base else None,
            "rss_end_mib": round(rss_end / 1024, 1) if rss_end else None,
            "rss_peak_mib": round(self.rss_peak / 1024, 1),
            "rss_growth_mib": round(growth_mib, 1) if growth_mib is not None else None,
            "rss_growth_bound_mib": a.max_rss_growth_mib,
            "violations": self.violations,
            "num_violations": sum(v for k, v in self.errors.items() if k.startswith("violation:")),
        }
        self.print_summary(summary)
        if a.json:
            with open(a.json, "w") as f:
                json.dump(summary, f, indent=1)
        return summary

    def reset_counters(self):
        with self.lock:
            self.by_kind.clear(); self.status.clear(); self.kind_status.clear()
            self.finish.clear()
            self.errors = collections.Counter({k: v for k, v in self.errors.items() if k.startswith("violation:")})
            self.accepted = self.disconnects = self.next_request = 0

    def wait_idle(self):
        """Seconds until running = waiting = 0 and KV usage = 0 (None: not within --settle-seconds)."""
        t0 = time.monotonic()
        last = None
        while time.monotonic() - t0 < self.args.settle_seconds:
            last = self.metrics()
            if (last.get("vllm:num_requests_running") == 0 and last.get("vllm:num_requests_waiting") == 0
                    and last.get("vllm:kv_cache_usage_perc") == 0):
                return round(time.monotonic() - t0, 2), last
            time.sleep(0.1)
        return None, {k: v for k, v in (last or {}).items() if k.startswith("vllm:")}

    @staticmethod
    def print_summary(s):
        print("== server soak: %d requests, %d clients, %.1f s (%.1f req/s), model %s, chat %s" % (
            s["requests_sent"], s["clients"], s["duration_s"], s["requests_per_s"], s["model"], s["chat"]))
        print("%-24s %s" % ("kind", "count  statuses"))
        per = collections.defaultdict(list)
        for k, v in s["by_kind_status"].items():
            kind, st = k.rsplit(" ", 1)
            per[kind].append("%s:%d" % (st, v))
        for kind, n in s["by_kind"].items():
            print("%-24s %5d  %s" % (kind, n, " ".join(per[kind])))
        print("statuses:        %s" % s["statuses"])
        print("errors:          %s" % s["errors"])
        print("finish (client): %s" % s["finish_reasons_client"])
        print("accepted %d, client disconnects %d; server finished %s (aborted %d)" % (
            s["accepted"], s["client_disconnects"], s["server_finished_by_reason"], s["server_aborted"]))
        print("server 4xx delta: %s" % s["server_http_errors_delta"])
        print("peak running+waiting %d (admission limit %s)" % (s["peak_running_plus_waiting"], s["admission_limit"]))
        print("idle after %s s; RSS base %s MiB, peak %s MiB, end %s MiB, growth %s MiB (bound %s)" % (
            s["idle_after_s"], s["rss_base_mib"], s["rss_peak_mib"], s["rss_end_mib"], s["rss_growth_mib"],
            s["rss_growth_bound_mib"]))
        for v in s["violations"]:
            print("VIOLATION %s" % json.dumps(v))
        print("== %s (%d violations)" % ("FAIL" if s["num_violations"] else "OK", s["num_violations"]))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", required=True, help="http://127.0.0.1:PORT")
    p.add_argument("--pid", type=int, required=True, help="the server's pid (for its RSS)")
    p.add_argument("--requests", type=int, default=1500)
    p.add_argument("--clients", type=int, default=24)
    p.add_argument("--seconds", type=float, default=60)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--warmup", type=int, default=80, help="requests before the RSS baseline")
    p.add_argument("--max-body-bytes", type=int, default=65536, help="the server's --max-body-bytes")
    p.add_argument("--burst", type=int, default=40, help="simultaneous requests in a burst (0: none)")
    p.add_argument("--burst-every", type=int, default=250, help="one burst per this many requests")
    p.add_argument("--admission-limit", type=int, default=0,
                   help="the server's --max-num-seqs + --max-queued-requests (reported with the peak of "
                        "running + waiting sequences)")
    p.add_argument("--max-rss-growth-mib", type=float, default=64)
    p.add_argument("--settle-seconds", type=float, default=10)
    p.add_argument("--io-timeout", type=float, default=60)
    p.add_argument("--api-key", default="")
    p.add_argument("--json", help="write the summary here")
    s = Soak(p.parse_args()).run()
    sys.exit(1 if s["num_violations"] else 0)


if __name__ == "__main__":
    main()
