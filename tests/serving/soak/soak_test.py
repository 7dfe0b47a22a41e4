#!/usr/bin/env python3
"""A soak through both protocols at once against a real `mqlm serve` of the tiny model: N requests
(20,000 for the record, fewer in CI) from HTTP and ZeroMQ clients side by side, of which 20% are
aborted (HTTP: the stream closed after its first chunk; ZeroMQ: an abort after the first token) and
10% vanish (HTTP: the connection closed before the answer; ZeroMQ: the socket closed unannounced),
the rest run to their end. Prompts share prefixes and the GPU's KV cache is small, so prefix pages
spill into a hot tier that fills early on.

The same N requests run twice on one server: a warm-up that fills the hot tier and meets every
batch shape, then the soak. It fails unless: every request that should have ended well did (0
unintended errors); afterwards every table is empty (the scheduler's requests, running, waiting
and KV pages in use; the http actor's and the gateway's open requests); and, with --rss-limit, the
server's resident set after the soak is at most 2% above what it was after the warm-up. That last
check is off in CI: on lavapipe device memory is process memory, and lavapipe's own allocations
grow by 5-10% over runs this short (heaptrack: inside libvulkan_lvp.so, converging as batch shapes
stop being new). On a GPU the check holds: bench/results/soak-2026-11-29-h200.md (20,000 and
100,000 requests, 0.29-1.02%).

Usage: soak_test.py MQLM_BINARY WORK_DIR [REQUESTS] [CONCURRENCY] [--rss-limit]
"""
import http.client
import json
import os
import random
import socket
import subprocess
import sys
import threading
import time

import msgpack
import zmq

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from serve_harness import FAILURES, check, free_port, http_json  # noqa: E402

RSS_CHECK = "--rss-limit" in sys.argv
ARGS = [a for a in sys.argv if a != "--rss-limit"]
MQLM, WORK = ARGS[1], ARGS[2]
REQUESTS = int(ARGS[3]) if len(ARGS) > 3 else 2000
CONCURRENCY = int(ARGS[4]) if len(ARGS) > 4 else 16
RSS_GROWTH_LIMIT = 0.02
# Prompts: 24 prefixes of 40-90 tokens, each with a short varying tail.
PREFIXES = [[7 + (p * 13 + i * 7) % 200 for i in range(40 + p * 2)] for p in range(24)]


class Tally:
    def __init__(self, requests):
        self.requests = requests
        self.lock = threading.Lock()
        self.next = 0
        self.counts = {}
        self.errors = []

    def take(self):
        with self.lock:
            if self.next >= self.requests:
                return None
            self.next += 1
            return self.next - 1

    def count(self, what, error=None):
        with self.lock:
            self.counts[what] = self.counts.get(what, 0) + 1
            if error is not None and len(self.errors) < 20:
                self.errors.append(f"{what}: {error}")


def kind_of(index):
    r = (index * 2654435761) % 100
    return "abort" if r < 20 else "vanish" if r < 30 else "complete"


def prompt_of(index):
    rng = random.Random(index)
    return rng.choice(PREFIXES) + [rng.randrange(5, 250) for _ in range(rng.randrange(1, 6))]


def http_request(port, index, tally):
    kind = kind_of(index)
    stream = kind == "abort" or index % 2 == 0
    body = json.dumps({"model": "tiny", "prompt": prompt_of(index), "max_tokens": 2 + index % 14,
                       "temperature": 0.7 if index % 3 else 0, "stream": stream, "ignore_eos": True}).encode()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        if kind == "vanish":
            time.sleep(random.random() * 0.05)
            conn.sock.close()
            tally.count("http vanish")
            return
        response = conn.getresponse()
        if response.status != 200:
            tally.count("http error", f"{response.status} {response.read()[:200]!r}")
            return
        if kind == "abort":
            response.fp.readline()  # the first SSE line: the request runs
            conn.sock.shutdown(socket.SHUT_RDWR)
            tally.count("http abort")
            return
        text = response.read()
        ok = b"[DONE]" in text if stream else json.loads(text)["choices"][0]["finish_reason"] == "length"
        tally.count("http complete" if ok else "http error", None if ok else text[-200:])
    except (OSError, http.client.HTTPException, ValueError) as e:
        tally.count("http error", repr(e))
    finally:
        conn.close()


def zmq_request(context, endpoint, index, tally):
    kind = kind_of(index)
    socket_ = context.socket(zmq.DEALER)
    socket_.setsockopt(zmq.LINGER, 0)
    socket_.connect(endpoint)
    try:
        socket_.send(msgpack.packb({"op": "generate", "id": index, "tokens": prompt_of(index),
                                    "max_tokens": 2 + index % 14, "temperature": 0.7 if index % 3 else 0.0,
                                    "stream": True}))
        if kind == "vanish":
            time.sleep(random.random() * 0.05)
            tally.count("zmq vanish")
            return
        aborted = False
        while True:
            if not socket_.poll(120_000):
                tally.count("zmq error", "no event in 120 s")
                return
            frame = socket_.recv()
            if not frame:
                continue
            event = msgpack.unpackb(frame)
            if event.get("event") == "token" and kind == "abort" and not aborted:
                socket_.send(msgpack.packb({"op": "abort", "id": index}))
                aborted = True
            elif event.get("event") == "final":
                reason = event.get("finish_reason")
                # An abort may come after the request ended by itself.
                ok = reason in (("abort", "length", "stop") if kind == "abort" else ("length", "stop"))
                tally.count(f"zmq {kind}" if ok else "zmq error", None if ok else event)
                return
            elif event.get("event") == "error":
                tally.count("zmq error", event)
                return
    finally:
        socket_.close()


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def tables(http_base, context, endpoint):
    _, status = http_json(http_base, "GET", "/api/status")
    socket_ = context.socket(zmq.DEALER)
    socket_.setsockopt(zmq.LINGER, 0)
    socket_.connect(endpoint)
    socket_.send(msgpack.packb({"op": "status"}))
    gateway = msgpack.unpackb(socket_.recv()) if socket_.poll(10_000) else {}
    socket_.close()
    return {"scheduler requests": status["requests"]["tracked"], "running": status["requests"]["running"],
            "waiting": status["requests"]["waiting"], "http open": status["requests"]["http_open"],
            "kv pages used": status["kv_pages"]["used"], "gateway open": gateway.get("gateway_requests", -1)}


def hot_tier(http_base):
    _, status = http_json(http_base, "GET", "/api/status")
    cache = status.get("memory", {}).get("cache", {})
    return {key: cache.get(key) for key in ("hot_bytes", "hot_budget_bytes", "hot_pages", "hot_hits", "spilled", "dropped")}


def run_phase(tally, http_port, context, endpoint, pid, rss):
    """Runs tally's requests on CONCURRENCY clients (half HTTP, half ZeroMQ); rss gets the server's
    resident set as a quarter, half and three quarters of them are done. Returns the seconds taken."""

    def worker(protocol):
        while (index := tally.take()) is not None:
            if protocol == "http":
                http_request(http_port, index, tally)
            else:
                zmq_request(context, endpoint, index, tally)
            for mark in (0.25, 0.5, 0.75):
                if index == int(tally.requests * mark):
                    rss[mark] = rss_kb(pid)

    start = time.time()
    threads = [threading.Thread(target=worker, args=("http" if i % 2 == 0 else "zmq",)) for i in range(CONCURRENCY)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.time() - start


def main():
    os.makedirs(WORK, exist_ok=True)
    model = os.path.join(WORK, "tiny.gguf")
    subprocess.run([MQLM, "make-model", "--preset", "tiny", "--type", "f16", "-o", model], check=True,
                   stdout=subprocess.DEVNULL)
    http_port, zmq_port = free_port(), free_port()
    endpoint = f"tcp://127.0.0.1:{zmq_port}"
    log = open(os.path.join(WORK, "serve.log"), "w")
    server = subprocess.Popen([MQLM, "serve", model, "--http", f"127.0.0.1:{http_port}", "--listen", endpoint, "--insecure",
                               "--kv-pages", "96", "--page-size", "16", "--hot-cache", "8M", "-np", "32", "--spill-piece-pages", "4"],
                              stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{http_port}"
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            if http_json(base, "GET", "/health", timeout=2)[0] == 200:
                break
        except OSError:
            time.sleep(0.3)
    context = zmq.Context()
    # A warm-up of as many requests fills the hot tier and runs every batch shape the soak will
    # take, its tail included (on lavapipe each new shape is compiled, and that code stays); the
    # soak then runs them again, and the resident set after each is compared.
    rss = {}
    run_phase(Tally(REQUESTS), http_port, context, endpoint, server.pid, {})
    time.sleep(2)  # the last vanished clients' aborts settle
    rss["warm"] = rss_kb(server.pid)
    print("hot tier after the warm-up:", hot_tier(base), flush=True)
    tally = Tally(REQUESTS)
    took = run_phase(tally, http_port, context, endpoint, server.pid, rss)
    time.sleep(2)
    after = tables(base, context, endpoint)
    rss["end"] = rss_kb(server.pid)
    print(f"{REQUESTS} requests in {took:.0f} s ({REQUESTS / took:.1f}/s), concurrency {CONCURRENCY}")
    print("outcomes:", json.dumps(dict(sorted(tally.counts.items()))))
    print("tables after:", json.dumps(after))
    print("rss KiB after the warm-up, at 25/50/75% of the soak and after it:",
          [rss.get(m) for m in ("warm", 0.25, 0.5, 0.75, "end")])
    for error in tally.errors:
        print("  error:", error)
    unintended = tally.counts.get("http error", 0) + tally.counts.get("zmq error", 0)
    check(unintended == 0, f"{unintended} unintended errors")
    check(all(value == 0 for value in after.values()), f"tables not empty after the soak: {after}")
    growth = (rss["end"] - rss["warm"]) / rss["warm"]
    print(f"rss growth over the soak: {growth * 100:.2f}%")
    if RSS_CHECK:
        check(growth <= RSS_GROWTH_LIMIT, f"the resident set grew {growth * 100:.2f}% after the hot tier filled")
    print("hot tier after the soak:", hot_tier(base))
    server.terminate()
    check(server.wait(timeout=30) == 0, "mqlm serve did not stop cleanly")
    print(f"{len(FAILURES)} failures")
    return 1 if FAILURES else 0


sys.exit(main())
