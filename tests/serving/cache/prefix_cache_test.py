#!/usr/bin/env python3
"""The KV prefix cache's hot (RAM) and SSD tiers through a real `mqlm serve` (issue 8's Done-when).

Every scenario starts its own server of tiny models with a GPU KV cache of 16 pages of 16 tokens
(256 tokens), so that prompts B and C (200 tokens each) push every page of prompt A (100 tokens:
6 full pages before its last token) out of the GPU, and talks to it over HTTP (urllib):

  hot       A's pages go to the hot tier; A again prefills only its last 4 tokens (96 restored
            from the hot tier, counted) and answers exactly what it answered cold.
  pieces    the same with every spill copied to the host a page at a time (--spill-piece-pages 1).
  ssd       a hot tier of 3 pages: A's pages go on to SSD files; A is restored from SSD, identical;
            after a restart of the server the SSD tier still serves A.
  stop      A's pages are still on the GPU when the server stops: they go to SSD as it stops, and
            the next server restores A from there, identical.
  corrupt   the SSD files damaged while the server is down: a flipped byte is found when read
            (counted, deleted) and a truncated file when the tier is scanned; A is recomputed,
            identical, never restored from them.
  clear     two models' pages in the hot tier; unloading a releases a's pages (its Close); the
            clear answers exactly the bytes left (b's) and the hot tier is empty after; clearing
            the SSD tier answers exactly the files' bytes and leaves the folder empty.
  close     every SSD write fails (--fail-cache-writes) and closing a's pages throws midway
            (--fail-cache-close a): unloading a still releases all of them and says so; a and b
            serve on.
  shrink    the process's resident memory is above --host-memory-soft: the memory enforcer has the
            hot tier give its pages up (counted), and A is computed again, identical.
  diskfull  the server may write files of 8 KiB at most (RLIMIT_FSIZE, as a full disk): every page
            write fails, is counted, and serving goes on with identical output.

Usage: prefix_cache_test.py MQLM_BINARY WORK_DIR [SCENARIO...]
"""
import os
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from serve_harness import FAILURES, check, free_port, http_json  # noqa: E402

PROMPT_A = [5 + i % 50 for i in range(100)]
PROMPT_B = [60 + i % 40 for i in range(200)]
PROMPT_C = [110 + i % 45 for i in range(200)]
A_RESTORABLE = 96  # A's full pages before its last token: 6 of 16 tokens


class Server:
    def __init__(self, mqlm, work, name, models, *extra, file_limit=None):
        self.http = f"http://127.0.0.1:{free_port()}"
        self.log_path = os.path.join(work, f"{name}.log")
        args = [mqlm, "--log-level", os.environ.get("MQLM_TEST_LOG_LEVEL", "info"), "serve", *models,
                "--http", self.http.removeprefix("http://"), "--listen", f"tcp://127.0.0.1:{free_port()}", "--insecure",
                "--kv-pages", "16", "--page-size", "16", *extra]

        def limit_files():
            # As a full disk: writes past file_limit bytes fail with EFBIG instead of killing us.
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (file_limit, file_limit))

        # The log goes through a pipe, so a file-size limit on the server does not cut it short.
        self.process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        preexec_fn=limit_files if file_limit else None)
        log = open(self.log_path, "ab")
        self.pump = threading.Thread(target=lambda: shutil.copyfileobj(self.process.stdout, log, 1), daemon=True)
        self.pump.start()
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                if self.request("GET", "/health")[0] == 200:
                    return
            except OSError:
                pass
            if self.process.poll() is not None:
                break
            time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"mqlm serve did not become healthy: see {self.log_path}")

    def request(self, method, path, body=None, timeout=120):
        return http_json(self.http, method, path, body, timeout)

    def complete(self, tokens, model=None):
        body = {"model": model or "a", "prompt": tokens, "max_tokens": 8, "temperature": 0}
        code, answer = self.request("POST", "/v1/completions", body)
        assert code == 200, (code, answer)
        return answer["choices"][0]["text"], answer["usage"]

    def status(self):
        code, body = self.request("GET", "/api/status")
        assert code == 200, (code, body)
        return body

    def cache(self):
        # Absent until the enforcer's first sample of the cache-writer (each second).
        return self.status()["memory"].get("cache", {})

    def settled_cache(self, until, what, timeout=20):
        """The cache-writer's figures (sampled by the enforcer each second) once `until` holds."""
        deadline = time.time() + timeout
        while True:
            cache = self.cache()
            if (cache and until(cache)) or time.time() > deadline:
                check(bool(cache) and until(cache), f"{what} (cache: {cache})")
                return cache
            time.sleep(0.25)

    def stable_cache(self, until, what):
        """The figures once they hold `until` and a later sample (the enforcer's) says the same."""
        last = None
        for _ in range(40):
            cache = self.settled_cache(until, what)
            if cache == last:
                return cache
            last = cache
            time.sleep(1.1)
        check(False, f"{what}: the cache's figures never settled")
        return last

    def stop(self):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.pump.join(5)


def push_a_out(server, model=None):
    """B and C take every GPU page A had: its 6 full pages leave the GPU (spilled)."""
    server.complete(PROMPT_B, model)
    server.complete(PROMPT_C, model)


def restored(server, cold, tier, model=None):
    """Runs A again: it must answer `cold`'s text with its 96 tokens restored from `tier`."""
    before = server.status()["scheduler"]
    text, usage = server.complete(PROMPT_A, model)
    after = server.status()["scheduler"]
    key = f"restored_{tier}_tokens"
    check(text == cold, f"A restored from {tier} answers {text!r}, cold it answered {cold!r}")
    check(usage["prompt_tokens_details"]["cached_tokens"] == A_RESTORABLE,
          f"A's cached tokens: {usage['prompt_tokens_details']['cached_tokens']}, expected {A_RESTORABLE}")
    check(after[key] - before[key] == A_RESTORABLE, f"{key} grew by {after[key] - before[key]}")
    # Only the 4 tokens after the restored pages are prefilled, then one token per decode step.
    computed = after["computed_tokens"] - before["computed_tokens"]
    expected = len(PROMPT_A) - A_RESTORABLE + usage["completion_tokens"] - 1
    check(computed == expected, f"A restored from {tier} computed {computed} tokens, expected {expected}")


def scenario_hot(mqlm, work, name="hot", *extra):
    server = Server(mqlm, work, name, [f"{work}/a.gguf"], "--hot-cache", "64M", *extra)
    try:
        cold, usage = server.complete(PROMPT_A)
        check(usage["prompt_tokens_details"]["cached_tokens"] == 0, "A's first run found a cache")
        push_a_out(server)
        check(server.status()["scheduler"]["spilled_pages"] >= 6, "A's pages were not spilled")
        restored(server, cold, "hot")
        cache = server.settled_cache(lambda c: c["hot_hits"] >= 6, "the hot tier answered A's pages")
        check(cache["ssd_limit_bytes"] == 0 and cache["ssd_pages"] == 0, "an SSD tier without --ssd-cache-dir")
    finally:
        server.stop()


def scenario_pieces(mqlm, work):
    # Every spill copied a page at a time, each piece its own staging and message: the same.
    scenario_hot(mqlm, work, "pieces", "--spill-piece-pages", "1")


def ssd_server(mqlm, work, name, ssd, *extra, file_limit=None):
    # A hot tier of 3 pages (16 KiB each): A's pages go on to SSD as later ones arrive.
    return Server(mqlm, work, name, [f"{work}/a.gguf"], "--hot-cache", "48K", "--ssd-cache-dir", ssd, *extra,
                  file_limit=file_limit)


def scenario_ssd(mqlm, work):
    ssd = os.path.join(work, "ssd")
    server = ssd_server(mqlm, work, "ssd", ssd)
    try:
        cold, _ = server.complete(PROMPT_A)
        push_a_out(server)
        server.settled_cache(lambda c: c["queued_write_bytes"] == 0 and c["ssd_pages"] >= 6, "A's pages written")
        restored(server, cold, "ssd")
    finally:
        server.stop()
    check(not [f for f in os.listdir(ssd) if f.endswith(".tmp")], "temporary files left in the SSD folder")
    server = ssd_server(mqlm, work, "ssd-restart", ssd)
    try:
        server.settled_cache(lambda c: c["ssd_pages"] >= 6, "the SSD tier's index survived the restart")
        restored(server, cold, "ssd")
    finally:
        server.stop()
    return cold


def scenario_stop(mqlm, work):
    ssd = os.path.join(work, "ssd-stop")
    server = Server(mqlm, work, "stop", [f"{work}/a.gguf"], "--hot-cache", "1M", "--ssd-cache-dir", ssd)
    try:
        cold, _ = server.complete(PROMPT_A)
        check(server.status()["scheduler"]["spilled_pages"] == 0, "A's pages left the GPU before the stop")
    finally:
        server.stop()
    server = Server(mqlm, work, "stop-restart", [f"{work}/a.gguf"], "--hot-cache", "1M", "--ssd-cache-dir", ssd)
    try:
        server.settled_cache(lambda c: c["ssd_pages"] >= 6, "A's pages written to SSD as the server stopped")
        restored(server, cold, "ssd")
    finally:
        server.stop()


def scenario_corrupt(mqlm, work):
    cold = scenario_ssd(mqlm, work)
    ssd = os.path.join(work, "ssd")
    pages = sorted(os.path.join(ssd, f) for f in os.listdir(ssd) if f.endswith(".kvpage"))
    for path in pages:  # one byte flipped in each page's K and V
        with open(path, "r+b") as f:
            f.seek(os.path.getsize(path) - 100)
            byte = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([byte[0] ^ 0x40]))
    server = ssd_server(mqlm, work, "corrupt-flipped", ssd)
    try:
        server.settled_cache(lambda c: c["ssd_pages"] == len(pages), "flipped files indexed until read")
        text, usage = server.complete(PROMPT_A)
        check(text == cold, f"A with damaged SSD pages answered {text!r}, cold {cold!r}")
        check(usage["prompt_tokens_details"]["cached_tokens"] == 0, "a damaged SSD page was used")
        cache = server.settled_cache(lambda c: c["corrupt"] >= 1, "the flipped page was found corrupt")
        check(cache["ssd_pages"] == len(pages) - cache["corrupt"], "a corrupt file was not dropped")
        on_disk = [f for f in os.listdir(ssd) if f.endswith(".kvpage")]
        check(len(on_disk) == len(pages) - cache["corrupt"], "the corrupt file was not deleted")
    finally:
        server.stop()  # which writes A's pages, computed again, back to SSD
    left = sorted(os.path.join(ssd, f) for f in os.listdir(ssd) if f.endswith(".kvpage"))
    for path in left:
        os.truncate(path, os.path.getsize(path) - 7)
    server = ssd_server(mqlm, work, "corrupt-truncated", ssd)
    try:
        server.settled_cache(lambda c: c["ssd_pages"] == 0 and c["ssd_limit_bytes"] > 0, "truncated files not indexed")
        text, usage = server.complete(PROMPT_A)
        check(text == cold and usage["prompt_tokens_details"]["cached_tokens"] == 0,
              "A over truncated SSD pages did not recompute to the same text")
    finally:
        server.stop()


def scenario_clear(mqlm, work):
    ssd = os.path.join(work, "ssd-clear")
    server = Server(mqlm, work, "clear", ["--model", f"a={work}/a.gguf", "--model", f"b={work}/b.gguf",
                                          "--preload", "a", "--preload", "b"],
                    "--hot-cache", "320K", "--ssd-cache-dir", ssd)
    try:
        for model in ("a", "b"):
            server.complete(PROMPT_A, model)
            push_a_out(server, model)
        cache = server.stable_cache(lambda c: set(c["hot_bytes_by_model"]) == {"a", "b"} and c["queued_write_bytes"] == 0,
                                    "both models' pages in the hot tier")
        code, answer = server.request("POST", "/api/models/a/unload?wait=true")
        check(code == 200, f"unloading a: {code} {answer}")
        after = server.stable_cache(lambda c: "a" not in c["hot_bytes_by_model"], "a's hot pages released by its unload")
        b_bytes = after["hot_bytes_by_model"].get("b", 0)
        check(b_bytes == cache["hot_bytes_by_model"]["b"], "b's hot pages changed with a's unload")
        check(after["hot_bytes"] == b_bytes, "hot bytes other than b's after a's unload")
        code, answer = server.request("POST", "/api/hot-cache/clear")
        check(code == 200 and answer["released_bytes"] == b_bytes and answer["released_pages"] == after["hot_pages"],
              f"hot clear answered {code} {answer}, the tier held {b_bytes} bytes in {after['hot_pages']} pages")
        server.settled_cache(lambda c: c["hot_bytes"] == 0 and c["hot_pages"] == 0, "the hot tier empty after clear")
        on_disk = sum(os.path.getsize(os.path.join(ssd, f)) for f in os.listdir(ssd) if f.endswith(".kvpage"))
        check(on_disk > 0, "nothing reached the SSD tier")
        code, answer = server.request("POST", "/api/ssd-cache/clear")
        check(code == 200 and answer["released_bytes"] == on_disk,
              f"SSD clear answered {code} {answer}, the folder held {on_disk} bytes")
        check(not [f for f in os.listdir(ssd) if f.endswith(".kvpage")], "page files left after the SSD clear")
        server.complete(PROMPT_A, "b")  # and it serves on
    finally:
        server.stop()


def scenario_close(mqlm, work):
    server = Server(mqlm, work, "close", ["--model", f"a={work}/a.gguf", "--model", f"b={work}/b.gguf",
                                          "--preload", "a", "--preload", "b"],
                    "--hot-cache", "48K", "--ssd-cache-dir", os.path.join(work, "ssd-close"),
                    "--fail-cache-writes", "--fail-cache-close", "a")
    try:
        cold, _ = server.complete(PROMPT_A, "a")
        push_a_out(server, "a")
        cache = server.settled_cache(lambda c: c["hot_bytes_by_model"].get("a", 0) > 0 and c["write_failures"] > 0,
                                     "a's pages in the hot tier and failed writes counted")
        code, answer = server.request("POST", "/api/models/a/unload?wait=true")
        check(code == 200, f"unloading a: {code} {answer}")
        server.settled_cache(lambda c: "a" not in c["hot_bytes_by_model"] and c["hot_bytes"] == 0,
                             "every hot page of a released although its close threw")
        a = next(m for m in server.status()["memory"]["models"] if m["id"] == "a")
        check("injected failure" in a["last_problem"], f"a's last problem: {a['last_problem']!r}")
        text, _ = server.complete(PROMPT_A, "a")  # loads a again
        check(text == cold, f"a after the failed close answered {text!r}, before {cold!r}")
        server.complete(PROMPT_A, "b")
        check(cache["ssd_pages"] == 0, "a page reached SSD although every write fails")
    finally:
        server.stop()


def scenario_diskfull(mqlm, work):
    ssd = os.path.join(work, "ssd-full")
    server = ssd_server(mqlm, work, "diskfull", ssd, file_limit=8192)
    try:
        cold, _ = server.complete(PROMPT_A)
        push_a_out(server)
        cache = server.settled_cache(lambda c: c["write_failures"] >= 6 and c["queued_write_bytes"] == 0,
                                     "the page writes failed and were counted")
        check(cache["ssd_pages"] == 0 and cache["writes"] == 0, f"pages written on a full disk: {cache}")
        text, _ = server.complete(PROMPT_A)
        check(text == cold, f"A on a full disk answered {text!r}, before {cold!r}")
        check(not os.listdir(ssd), f"files left in the full SSD folder: {os.listdir(ssd)}")
    finally:
        server.stop()


def scenario_shrink(mqlm, work):
    server = Server(mqlm, work, "shrink", [f"{work}/a.gguf"], "--hot-cache", "64M", "--host-memory-soft", "1M")
    try:
        cold, _ = server.complete(PROMPT_A)
        push_a_out(server)
        cache = server.settled_cache(lambda c: c["spilled"] >= 6 and c["hot_bytes"] == 0 and c["dropped"] >= 6,
                                     "the hot tier shrunk to nothing under host-memory pressure")
        memory = server.status()["memory"]
        check(memory["cache_shrinks"] >= 1 and memory["host_soft_bytes"] == 1 << 20,
              f"shrinks {memory['cache_shrinks']}, host soft mark {memory['host_soft_bytes']}")
        text, usage = server.complete(PROMPT_A)
        check(text == cold and usage["prompt_tokens_details"]["cached_tokens"] == 0,
              f"A after the shrink: {text!r} with {usage}, cold {cold!r} (cache: {cache})")
    finally:
        server.stop()


SCENARIOS = {"hot": scenario_hot, "pieces": scenario_pieces, "ssd": scenario_ssd, "stop": scenario_stop, "corrupt": scenario_corrupt, "clear": scenario_clear,
             "close": scenario_close, "shrink": scenario_shrink, "diskfull": scenario_diskfull}


def main():
    mqlm, work = sys.argv[1], sys.argv[2]
    names = sys.argv[3:] or list(SCENARIOS)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    for name, kind in (("a", "f16"), ("b", "f32")):
        subprocess.run([mqlm, "make-model", "--preset", "tiny", "--type", kind, "-o", f"{work}/{name}.gguf"],
                       check=True, stdout=subprocess.DEVNULL)
    for name in names:
        print(f"== {name}", flush=True)
        SCENARIOS[name](mqlm, work)
    if FAILURES:
        print(f"{len(FAILURES)} failures; server logs in {work}")
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
