#!/usr/bin/env python3
"""The model pool and the memory enforcer through a real `mqlm serve` (issue 7's Done-when lines).

Each scenario starts its own server of two tiny models (a: F16, b: F32) with a ceiling under
which only one fits, a 1 MiB pool block (so that memory not given back shows), and talks to it
over HTTP (urllib, threads for the streams) and over the ZeroMQ protocol (pyzmq + msgpack):

  seed004   8 clients stream from a; loading b evicts a; every stream ends with a final event
            (finish reason, or the abort error) and [DONE]; b loads; the pool's held bytes come
            back within one block of the baseline before the first load.
  refuse    a pinned and loaded: loading b is refused with 507 and the figures (needed,
            available, ceiling, pinned), over HTTP and as the protocol's error; a stays loaded.
  release   a's release throws midway (--fail-release a): the unload still frees its memory,
            reports the problem (answer and status), and the server serves a again.
  cycles    200 loads / unloads of a and b while clients send requests to both: every request
            ends (served, aborted by an eviction, or 507 while the other model is busy), and held
            bytes, tracked requests and the server's threads do not grow.
  names     a folder of models (--models-dir), an alias (--alias) used over HTTP and the
            protocol, and an idle time-to-live (--ttl): the model is unloaded after it, not before.

Usage: model_pool_test.py MQLM_BINARY WORK_DIR [SCENARIO...]
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import msgpack
import zmq

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from serve_harness import FAILURES, check, free_port, http_json  # noqa: E402

BLOCK = 1 << 20  # --pool-block-mib 1
CEILING = "13M"  # a (about 5 MiB) or b (about 9 MiB) fits, not both


class Server:
    def __init__(self, mqlm, work, name, *extra, models=None):
        self.http = f"http://127.0.0.1:{free_port()}"
        self.zmq_endpoint = f"tcp://127.0.0.1:{free_port()}"
        self.log_path = os.path.join(work, f"{name}.log")
        # The server's log goes to WORK_DIR/NAME.log (shown when a scenario fails); set
        # MQLM_TEST_LOG_LEVEL=info or debug to see the enforcer's decisions there.
        level = ["--log-level", os.environ["MQLM_TEST_LOG_LEVEL"]] if "MQLM_TEST_LOG_LEVEL" in os.environ else []
        models = models if models is not None else ["--model", f"a={work}/a.gguf", "--model", f"b={work}/b.gguf"]
        args = [mqlm, *level, "serve", *models,
                "--http", self.http.removeprefix("http://"), "--listen", self.zmq_endpoint, "--insecure",
                "--memory-ceiling", CEILING, "--memory-soft", "1", "--memory-hard", "1",
                "--pool-block-mib", "1", "--kv-pages", "64", *extra]
        self.process = subprocess.Popen(args, stdout=open(self.log_path, "w"), stderr=subprocess.STDOUT)
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                if self.get("/health")[0] == 200:
                    return
            except OSError:
                pass
            if self.process.poll() is not None:
                break
            time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"mqlm serve did not become healthy:\n{self.log_tail()}")

    def log_tail(self, lines=40):
        with open(self.log_path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])

    def request(self, method, path, body=None, timeout=120):
        return http_json(self.http, method, path, body, timeout)

    def get(self, path):
        return self.request("GET", path)

    def post(self, path, body=None, timeout=120):
        return self.request("POST", path, body, timeout)

    def status(self, trim=False):
        code, body = self.get("/api/status?trim=true" if trim else "/api/status")
        assert code == 200, (code, body)
        return body

    def model(self, model_id):
        return next(m for m in self.status()["memory"]["models"] if m["id"] == model_id)

    def threads(self):
        return len(os.listdir(f"/proc/{self.process.pid}/task"))

    def stop(self):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
                check(False, "the server did not stop within 20 s of SIGTERM")


def stream(server, model, max_tokens, out):
    """One streaming completion; out gets the SSE data lines and whether tokens came."""
    body = json.dumps({"model": model, "prompt": "Once upon a time", "max_tokens": max_tokens,
                       "temperature": 0, "stream": True}).encode()
    request = urllib.request.Request(server.http + "/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    out["events"] = []
    out["first_token"] = threading.Event()
    try:
        with urllib.request.urlopen(request, timeout=300) as response:
            out["status"] = response.status
            for raw in response:
                line = raw.decode().strip()
                if not line.startswith("data: "):
                    continue
                data = line[len("data: "):]
                out["events"].append(data if data == "[DONE]" else json.loads(data))
                out["first_token"].set()
    except urllib.error.HTTPError as e:
        out["status"] = e.code
        out["error"] = json.loads(e.read() or b"null")
    except Exception as e:  # noqa: BLE001 - a broken stream is what this test looks for
        out["exception"] = repr(e)
    finally:
        out["first_token"].set()


def ended_with_final(out):
    """A final event (a finish reason, or an error object) and then [DONE]."""
    events = out.get("events", [])
    if len(events) < 2 or events[-1] != "[DONE]":
        return None
    last = events[-2]
    if "error" in last:
        return "error:" + str(last["error"].get("code"))
    reason = last.get("choices", [{}])[0].get("finish_reason")
    return reason


def zmq_call(endpoint, frame, events_wanted=1, timeout_ms=60000):
    context = zmq.Context.instance()
    socket_ = context.socket(zmq.DEALER)
    socket_.setsockopt(zmq.LINGER, 0)
    socket_.connect(endpoint)
    socket_.send(msgpack.packb(frame))
    events = []
    poller = zmq.Poller()
    poller.register(socket_, zmq.POLLIN)
    deadline = time.time() + timeout_ms / 1000
    while len(events) < events_wanted and time.time() < deadline:
        if poller.poll(100):
            body = socket_.recv()
            if body:
                events.append(msgpack.unpackb(body, raw=False))
    socket_.close()
    return events


# ---- scenarios ---------------------------------------------------------------------------------


def seed004(mqlm, work):
    server = Server(mqlm, work, "seed004")
    try:
        baseline = server.status(trim=True)["pool"]["held_bytes"]
        code, loaded = server.post("/api/models/a/load")
        check(code == 200 and loaded["state"] == "loaded", f"loading a: {code} {loaded}")

        streams = [{} for _ in range(8)]
        threads = [threading.Thread(target=stream, args=(server, "a", 400, out)) for out in streams]
        for t in threads:
            t.start()
        for out in streams:
            while "first_token" not in out:
                time.sleep(0.01)
            out["first_token"].wait(120)
        open_streams = sum(1 for out in streams if ended_with_final(out) is None)
        check(open_streams > 0, "no stream of a was still open when b was loaded")

        code, answer = server.post("/api/models/b/load")
        check(code == 200 and answer.get("evicted") == ["a"], f"loading b did not evict a: {code} {answer}")
        for t in threads:
            t.join(120)
        check(not any(t.is_alive() for t in threads), "a stream of a never ended")
        endings = [ended_with_final(out) for out in streams]
        check(all(e is not None for e in endings), f"a stream of a ended without a final event: {streams}")
        aborted = sum(1 for e in endings if e == "error:aborted")
        check(aborted >= 1, f"no stream of a was ended by the eviction: {endings}")
        print(f"seed004: {open_streams} of 8 streams open at the eviction; endings {endings}")

        status = server.status(trim=True)
        states = {m["id"]: m["state"] for m in status["memory"]["models"]}
        check(states == {"a": "unloaded", "b": "loaded"}, f"states after the eviction: {states}")
        check(status["requests"]["tracked"] == 0, f"requests left in the scheduler: {status['requests']}")
        held_b = status["pool"]["held_bytes"]
        b_bytes = server.model("b")["bytes"]
        check(held_b <= baseline + b_bytes + BLOCK,
              f"with only b loaded the pool holds {held_b}, over baseline {baseline} + b {b_bytes} + one block")

        code, unloaded = server.post("/api/models/b/unload?wait=true")
        check(code == 200 and unloaded["state"] == "unloaded" and unloaded["freed_bytes"] > 0,
              f"unloading b: {code} {unloaded}")
        held = server.status(trim=True)["pool"]["held_bytes"]
        check(held <= baseline + BLOCK, f"after the unloads the pool holds {held}, baseline {baseline}")
        print(f"seed004: baseline {baseline} B, held with b {held_b} B, after unloading b {held} B "
              f"(freed {unloaded['freed_bytes']} B in {unloaded['unload_ms']:.1f} ms)")
    finally:
        server.stop()


def refuse(mqlm, work):
    server = Server(mqlm, work, "refuse", "--preload", "a", "--pin", "a")
    try:
        a_before = server.model("a")
        check(a_before["state"] == "loaded" and a_before["pinned"], f"a is not loaded and pinned: {a_before}")
        code, body = server.post("/api/models/b/load")
        error = (body or {}).get("error", {})
        check(code == 507 and error.get("code") == "insufficient_memory", f"loading b: {code} {body}")
        memory = server.status()["memory"]
        b_estimate = next(m for m in memory["models"] if m["id"] == "b")["estimated_bytes"]
        check(error.get("needed_bytes") == b_estimate, f"needed_bytes {error.get('needed_bytes')} != {b_estimate}")
        check(error.get("ceiling_bytes") == memory["ceiling_bytes"], f"ceiling in the 507: {error}")
        check(error.get("available_bytes") == memory["ceiling_bytes"] - a_before["bytes"],
              f"available in the 507: {error}, a holds {a_before['bytes']}")
        check(error.get("pinned") == ["a"], f"pinned in the 507: {error}")
        a_after = server.model("a")
        check(a_after["state"] == "loaded" and a_after["unloads"] == 0, f"a was touched for b: {a_after}")
        # A completion for b: the same refusal, as the request's error.
        code, body = server.post("/v1/completions", {"model": "b", "prompt": "hi", "max_tokens": 2})
        check(code == 507, f"a completion for b: {code} {body}")

        # The same over the ZeroMQ protocol.
        events = zmq_call(server.zmq_endpoint, {"op": "load", "model": "b", "id": 7})
        event = events[0] if events else {}
        check(event.get("event") == "error" and event.get("code") == "insufficient_memory"
              and event.get("id") == 7 and event.get("needed_bytes") == b_estimate and event.get("pinned") == ["a"],
              f"the protocol's load of b: {events}")
        events = zmq_call(server.zmq_endpoint, {"op": "models"})
        models = {m["id"]: m["state"] for m in (events[0].get("models", []) if events else [])}
        check(models == {"a": "loaded", "b": "unloaded"}, f"the protocol's models: {events}")
        events = zmq_call(server.zmq_endpoint, {"op": "unload", "model": "a", "id": "u"}, events_wanted=2)
        check([e.get("state") for e in events] == ["draining", "unloaded"] and events[1].get("freed_bytes", 0) > 0,
              f"the protocol's unload of a: {events}")
        events = zmq_call(server.zmq_endpoint, {"op": "status"})
        check(bool(events) and "memory" in events[0] and events[0]["memory"]["ceiling_bytes"] > 0,
              f"the protocol's status has no memory: {events}")
    finally:
        server.stop()


def release(mqlm, work):
    server = Server(mqlm, work, "release", "--fail-release", "a")
    try:
        baseline = server.status(trim=True)["pool"]["held_bytes"]
        code, _ = server.post("/api/models/a/load")
        check(code == 200, f"loading a: {code}")
        code, unloaded = server.post("/api/models/a/unload?wait=true")
        check(code == 200 and unloaded["state"] == "unloaded", f"unloading a: {code} {unloaded}")
        check(any("injected failure" in p for p in unloaded.get("problems", [])),
              f"the unload does not report the failure: {unloaded}")
        check(unloaded.get("freed_bytes", 0) > 0, f"the unload freed nothing: {unloaded}")
        held = server.status(trim=True)["pool"]["held_bytes"]
        check(held <= baseline + BLOCK, f"after the failed release the pool holds {held}, baseline {baseline}")
        a = server.model("a")
        check(a["state"] == "unloaded" and "injected failure" in a["last_problem"], f"status of a: {a}")
        code, body = server.post("/v1/completions", {"model": "a", "prompt": "Once", "max_tokens": 4,
                                                     "temperature": 0})
        check(code == 200 and body["usage"]["completion_tokens"] >= 1, f"serving a again: {code} {body}")
        print(f"release: problems {unloaded['problems']}, freed {unloaded['freed_bytes']} B, held after {held} B")
    finally:
        server.stop()


def cycles(mqlm, work, count=200):
    server = Server(mqlm, work, "cycles")
    stop = threading.Event()
    outcomes = {}
    lock = threading.Lock()

    def traffic(index):
        model = "ab"[index % 2]
        while not stop.is_set():
            try:
                code, body = server.post("/v1/completions", {"model": model, "prompt": "Hello", "max_tokens": 4,
                                                             "temperature": 0}, timeout=120)
                key = str(code) if code == 200 else f"{code}:{(body or {}).get('error', {}).get('code')}"
            except Exception as e:  # noqa: BLE001
                key = "exception:" + type(e).__name__
            with lock:
                outcomes[key] = outcomes.get(key, 0) + 1
            if key == "507:insufficient_memory":
                time.sleep(0.02)  # the other model is busy: back off a little, as a client would

    try:
        clients = [threading.Thread(target=traffic, args=(i,)) for i in range(4)]
        for c in clients:
            c.start()
        samples = []
        started = time.time()
        for cycle in range(count):
            model = "ab"[cycle % 2]
            code, body = server.post(f"/api/models/{model}/load")
            check(code == 200, f"cycle {cycle}: loading {model}: {code} {body}")
            time.sleep(0.05)  # the clients' requests for the loaded model get a chance to finish
            if cycle == 10:
                samples.append(("warm", server.threads()))
        stop.set()
        for c in clients:
            c.join(180)
        check(not any(c.is_alive() for c in clients), "a client's request never ended")
        elapsed = time.time() - started
        # Settle: the last model idle, then nothing loaded.
        for model in "ab":
            server.post(f"/api/models/{model}/unload?wait=true")
        status = server.status(trim=True)
        memory = status["memory"]
        loads = sum(m["loads"] for m in memory["models"])
        unloads = sum(m["unloads"] for m in memory["models"])
        check(loads >= count and unloads >= count - 1, f"only {loads} loads and {unloads} unloads")
        check(status["requests"]["tracked"] == 0 and status["requests"]["http_open"] == 0,
              f"requests left: {status['requests']}")
        check(status["kv_pages"]["used"] == 0, f"KV pages left in use: {status['kv_pages']}")
        baseline_threads = samples[0][1]
        threads_now = server.threads()
        check(threads_now <= baseline_threads, f"threads grew from {baseline_threads} to {threads_now}")
        held = status["pool"]["held_bytes"]
        check(held <= BLOCK, f"with nothing loaded the pool still holds {held} B after {count} cycles")
        # A request ends served, aborted by an admin load that evicts its model, or refused (507)
        # while the other model is busy: a request's load evicts only idle models.
        unexpected = {k: v for k, v in outcomes.items() if k not in ("200", "503:aborted", "507:insufficient_memory")}
        check(sum(outcomes.values()) > 0 and not unexpected, f"client outcomes: {outcomes}")
        print(f"cycles: {count} loads ({loads} loads, {unloads} unloads in all) in {elapsed:.1f} s; "
              f"client outcomes {outcomes}; threads {baseline_threads} -> {threads_now}; held at the end {held} B")
    finally:
        stop.set()
        server.stop()


def names(mqlm, work):
    folder = os.path.join(work, "names-models")
    os.makedirs(folder, exist_ok=True)
    shutil.copyfile(os.path.join(work, "a.gguf"), os.path.join(folder, "c.gguf"))
    # An id given twice (the folder's c and --model c) is refused before anything starts.
    twice = subprocess.run([mqlm, "serve", "--models-dir", folder, "--model", f"c={work}/b.gguf"],
                           capture_output=True, text=True, timeout=60)
    check(twice.returncode == 2 and "'c' is given twice" in twice.stderr,
          f"a duplicate id: exit {twice.returncode}, {twice.stderr.strip()}")

    # A plain --ttl reaches the one model named on the command line too.
    single = Server(mqlm, work, "names-single", "--ttl", "600", models=[f"{work}/a.gguf"])
    try:
        code, listing = single.get("/v1/models")
        check([(m["id"], m["ttl_s"]) for m in listing["data"]] == [("a", 600)], f"one model's ttl: {listing}")
    finally:
        single.stop()

    server = Server(mqlm, work, "names", "--alias", "fast=c", "--ttl", "c=1", "--ttl", "600",
                    models=["--models-dir", folder, "--model", f"b={work}/b.gguf"])
    try:
        code, body = server.post("/v1/completions", {"model": "fast", "prompt": "Once", "max_tokens": 4})
        ended = time.time()
        check(code == 200 and body.get("model") == "fast", f"a completion by alias: {code} {body}")
        code, listing = server.get("/v1/models")
        by_id = {m["id"]: m for m in listing["data"]}
        check(set(by_id) == {"b", "c", "fast"}, f"/v1/models lists {sorted(by_id)}")
        check(by_id["fast"].get("alias_of") == "c" and by_id["c"].get("aliases") == ["fast"],
              f"the alias in /v1/models: {by_id.get('fast')}, {by_id.get('c')}")
        check(by_id["c"]["ttl_s"] == 1 and by_id["b"]["ttl_s"] == 600, f"ttls: {by_id['c']}, {by_id['b']}")
        # Over the protocol: a load by alias is answered for the model's id.
        events = zmq_call(server.zmq_endpoint, {"op": "load", "id": 1, "model": "fast"})
        check(events and events[0].get("event") == "model" and events[0].get("model") == "c"
              and events[0].get("state") == "loaded", f"a load by alias over the protocol: {events}")
        # c has had no request since `ended`: it goes after its ttl of 1 s, and not before.
        states = []
        while time.time() < ended + 10:
            state = server.model("c")["state"]
            states.append((round(time.time() - ended, 2), state))
            if state == "unloaded":
                break
            time.sleep(0.1)
        first_unloaded = next((t for t, state in states if state == "unloaded"), None)
        check(first_unloaded is not None and first_unloaded >= 1.0,
              f"c unloaded {first_unloaded} s after its last request (ttl 1 s)")
        check(server.model("c")["unloads"] == 1, f"c unloaded {server.model('c')['unloads']} times")
        held = server.status(trim=True)["memory"]["pool"]["held_bytes"]
        check(held <= BLOCK, f"after the ttl the pool holds {held} B")
        print(f"names: alias answered over HTTP and ZeroMQ; c unloaded {first_unloaded} s after its last request "
              f"(ttl 1 s); pool holds {held} B")
    finally:
        server.stop()


SCENARIOS = {"seed004": seed004, "refuse": refuse, "release": release, "cycles": cycles, "names": names}


def main():
    mqlm, work = sys.argv[1], sys.argv[2]
    chosen = sys.argv[3:] or list(SCENARIOS)
    os.makedirs(work, exist_ok=True)
    for name, kind in (("a", "f16"), ("b", "f32")):
        path = os.path.join(work, f"{name}.gguf")
        if not os.path.exists(path):
            subprocess.run([mqlm, "make-model", "--preset", "tiny", "--type", kind, "-o", path], check=True,
                           stdout=subprocess.DEVNULL)
    for name in chosen:
        print(f"--- {name}", flush=True)
        before = len(FAILURES)
        try:
            SCENARIOS[name](mqlm, work)
        except Exception as e:  # noqa: BLE001 - reported as a failure with its cause
            check(False, f"{name} raised {e!r}")
        if len(FAILURES) > before:
            log = os.path.join(work, f"{name}.log")
            if os.path.exists(log):
                print(f"--- {log}\n" + "".join(open(log, errors="replace").readlines()[-30:]))
    print(f"{len(FAILURES)} failures")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
