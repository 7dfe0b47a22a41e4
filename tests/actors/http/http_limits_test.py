"""The HTTP layer against clients that are many, slow, hostile or gone, through real sockets to a
real `mqlm serve` (started by http_limits_test.sh): keep-alive, 1,000 connections at once,
pipelining, connections that trickle their headers, header floods, bodies over the limit
(declared, chunked, compressed) with the server's memory bounded, malformed framing, the API key
checked before any body, and a client that leaves a non-streaming request.

Usage: http_limits_test.py HTTP_PORT API_KEY SERVER_PID
"""

import json
import resource
import socket
import sys
import threading
import time

PORT = int(sys.argv[1])
KEY = sys.argv[2]
SERVER_PID = int(sys.argv[3])
failures = []


def check(condition, what):
    print(("ok   " if condition else "FAIL ") + what, flush=True)
    if not condition:
        failures.append(what)


def connect(timeout=30):
    s = socket.create_connection(("127.0.0.1", PORT), timeout=timeout)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def request(method, path, body=b"", headers=(), key=True):
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1"]
    if key:
        lines.append(f"Authorization: Bearer {KEY}")
    if body:
        lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    lines += list(headers)
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


class Reader:
    """Responses read off one socket, in order (Content-Length or chunked bodies)."""

    def __init__(self, sock):
        self.sock = sock
        self.data = b""

    def fill(self):
        got = self.sock.recv(65536)
        if not got:
            raise ConnectionError("closed")
        self.data += got

    def line(self):
        while b"\r\n" not in self.data:
            self.fill()
        line, self.data = self.data.split(b"\r\n", 1)
        return line

    def exactly(self, n):
        while len(self.data) < n:
            self.fill()
        out, self.data = self.data[:n], self.data[n:]
        return out

    def response(self):
        status = int(self.line().split()[1])
        headers = {}
        while (line := self.line()) != b"":
            name, value = line.decode().split(":", 1)
            headers[name.strip().lower()] = value.strip()
        if headers.get("transfer-encoding") == "chunked":
            body = b""
            while (size := int(self.line(), 16)) != 0:
                body += self.exactly(size)
                self.line()
            self.line()
        else:
            body = self.exactly(int(headers.get("content-length", 0)))
        return status, headers, body


def call(method, path, body=b"", headers=(), key=True):
    with connect() as s:
        s.sendall(request(method, path, body, headers, key))
        return Reader(s).response()


def status_json():
    status, _, body = call("GET", "/api/status")
    assert status == 200, status
    return json.loads(body)


def server_rss_kb():
    with open(f"/proc/{SERVER_PID}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def closed_by_server(sock, within):
    sock.settimeout(within)
    try:
        while sock.recv(65536):
            pass
        return True
    except (ConnectionError, OSError):
        return True
    except socket.timeout:
        return False


def health_time():
    start = time.monotonic()
    status, _, _ = call("GET", "/health", key=False)
    return status, time.monotonic() - start


COMPLETION = json.dumps({"model": "tiny", "prompt": "Once upon a time", "max_tokens": 8, "temperature": 0}).encode()


def keep_alive():
    with connect() as s:
        reader = Reader(s)
        statuses = []
        for _ in range(20):
            s.sendall(request("GET", "/v1/models"))
            statuses.append(reader.response()[0])
        s.sendall(request("POST", "/v1/completions", COMPLETION))
        statuses.append(reader.response()[0])
    check(statuses == [200] * 21, f"one connection carries 21 requests (got {set(statuses)})")


def thousand_connections():
    socks = [connect() for _ in range(1000)]
    for s in socks:
        s.sendall(request("GET", "/health", key=False))
    first = [Reader(s).response()[0] for s in socks]
    check(first.count(200) == 1000, f"1,000 connections open at once each answered ({first.count(200)} 200s)")
    start = time.monotonic()
    status, _, body = call("POST", "/v1/completions", COMPLETION)
    took = time.monotonic() - start
    check(status == 200 and took < 10, f"a completion beside them answered {status} in {took:.2f} s")
    for s in socks:
        s.sendall(request("GET", "/health", key=False))
    second = [Reader(s).response()[0] for s in socks]
    check(second.count(200) == 1000, f"the 1,000 connections each carry a second request ({second.count(200)})")
    for s in socks:
        s.close()


def pipelining():
    with connect() as s:
        paths = ["/health", "/v1/models", "/nothing", "/v1/models/tiny"]
        s.sendall(b"".join(request("GET", p) for p in paths))
        reader = Reader(s)
        got = [reader.response() for _ in paths]
    statuses = [g[0] for g in got]
    check(statuses == [200, 200, 404, 200], f"four pipelined requests answered in order ({statuses})")
    check(json.loads(got[3][2]).get("id") == "tiny", "the fourth answer is the fourth request's")


def slow_headers():
    socks = []
    for _ in range(200):
        s = connect()
        s.sendall(b"GET /health HTTP/1.1\r\n")
        socks.append(s)
    stop = threading.Event()

    def trickle():
        while not stop.is_set():
            for s in socks:
                try:
                    s.send(b"X")
                except OSError:
                    pass
            stop.wait(1.0)

    dripper = threading.Thread(target=trickle)
    dripper.start()
    time.sleep(2)
    times = [health_time() for _ in range(5)]
    check(all(status == 200 and took < 1.0 for status, took in times),
          f"200 connections trickling headers: /health answers in {max(t for _, t in times):.3f} s at most")
    # The header timeout (10 s from the first byte) ends them, trickle or not.
    time.sleep(9)
    stop.set()
    dripper.join()
    closed = sum(closed_by_server(s, 3) for s in socks)
    check(closed == 200, f"the server closed the trickling connections after its header timeout ({closed}/200)")
    for s in socks:
        s.close()


def answer_while_sending(head, pieces):
    """Sends `head` then `pieces` from a thread of its own until the server stops taking them,
    while this thread reads the answer: the server may answer before the client is done."""
    with connect() as s:
        s.sendall(head)
        sent = [0]

        def send():
            try:
                for piece in pieces:
                    s.sendall(piece)
                    sent[0] += 1
            except OSError:
                pass

        sender = threading.Thread(target=send)
        sender.start()
        try:
            status, _, body = Reader(s).response()
        finally:
            try:  # the server may have ended the connection already (its linger is 1 s or 8 MB)
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sender.join()
        return status, body, sent[0]


def header_flood():
    before = server_rss_kb()
    flood = (f"X-Flood-{i}: {'v' * 180}\r\n".encode() for i in range(200_000))
    status, _, sent = answer_while_sending(b"GET /health HTTP/1.1\r\nHost: x\r\n", flood)
    grew = server_rss_kb() - before
    check(status == 431, f"a flood of 200,000 headers (41 MB) is 431 (after {sent} were sent)")
    check(grew < 20_000, f"the server's memory grew {grew} KiB for it")


def oversized_bodies():
    before = server_rss_kb()
    status, body, _ = answer_while_sending(request("POST", "/v1/completions", headers=["Content-Length: 1500000"]),
                                           (b"a" * 1000 for _ in range(1500)))
    check(status == 413 and json.loads(body)["error"]["code"] == "request_too_large", f"a declared 1.5 MB body: {status}")
    chunk = b"%x\r\n%s\r\n" % (65536, b"a" * 65536)
    status, _, sent = answer_while_sending(
        request("POST", "/v1/completions", headers=["Transfer-Encoding: chunked", "Content-Type: application/json"]),
        (chunk for _ in range(800)))
    check(status == 413, f"a 50 MB chunked body is 413 after {sent * 64} KiB were sent")
    check(server_rss_kb() - before < 30_000, f"the server's memory grew {server_rss_kb() - before} KiB for both")


def encodings_and_keys():
    gzip_headers = ["Content-Encoding: gzip", "Content-Type: application/json", "Content-Length: 400000"]
    for key, want in ((True, 415), (False, 401)):
        status, _, _ = answer_while_sending(request("POST", "/v1/completions", headers=gzip_headers, key=key),
                                            [b"\x1f\x8b" + b"\0" * 1000])
        check(status == want, f"a gzip body {'with' if key else 'without'} the key: {status} before it was sent")
    status, _, _ = answer_while_sending(request("POST", "/v1/completions", key=False,
                                                headers=["Content-Length: 50000000"]), [b"{"])
    check(status == 401, f"a 50 MB body without the key: {status} before any of it is read")


def malformed_framing():
    cases = {
        "conflicting Content-Length": b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
                                      b"Content-Length: 7\r\n\r\nhello!!",
        "a malformed chunk": b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                             + f"Authorization: Bearer {KEY}\r\n\r\n".encode() +
                             b"zz\r\nhello\r\n0\r\n\r\n",
        "a request line that is not HTTP": b"HELLO THERE\r\n\r\n",
        "a transfer coding other than chunked": b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                                                b"Transfer-Encoding: gzip\r\nContent-Length: 5\r\n"
                                                + f"Authorization: Bearer {KEY}\r\n\r\n".encode() + b"hello",
    }
    for what, raw in cases.items():
        with connect() as s:
            s.sendall(raw)
            status = Reader(s).response()[0]
        check(status == 400, f"{what}: {status}")
    start = time.monotonic()
    status, _, _ = call("POST", "/v1/completions")
    took = time.monotonic() - start
    check(status == 400 and took < 1, f"a POST without a body: {status} in {took:.2f} s")


def vanishing_client():
    aborted_before = status_json()["http"]["finished"]["abort"]
    body = json.dumps({"model": "tiny", "prompt": "Once", "max_tokens": 2000, "ignore_eos": True}).encode()
    s = connect()
    s.sendall(request("POST", "/v1/completions", body))
    time.sleep(0.5)
    s.close()
    left = time.monotonic()
    while time.monotonic() - left < 1.0 and status_json()["http"]["finished"]["abort"] == aborted_before:
        time.sleep(0.05)
    took = time.monotonic() - left
    check(status_json()["http"]["finished"]["abort"] == aborted_before + 1,
          f"a client that left a non-streaming request: aborted and counted {took:.2f} s after")


def main():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 8192), hard))
    for test in (keep_alive, thousand_connections, pipelining, malformed_framing, encodings_and_keys,
                 oversized_bodies, header_flood, vanishing_client, slow_headers):
        try:
            test()
        except Exception as e:  # a test that could not finish is a failure, not a crash of the rest
            check(False, f"{test.__name__} raised {e!r}")
    status, took = health_time()
    check(status == 200, "the server is still up and healthy")
    print(f"{len(failures)} failures")
    return 1 if failures else 0


sys.exit(main())
