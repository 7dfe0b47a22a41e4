#!/usr/bin/env python3
"""CURVE on the ZeroMQ client port through a real `mqlm serve` of the tiny model (issue 36).

`mqlm keygen` makes the server's and two clients' keys (and will not overwrite them); a tcp://
server without --curve-key and without --insecure exits 2; the server with --curve-key and
--curve-clients (a directory holding alice.pub) serves `mqlm client` with alice's key (flags, and
the MQLM_CURVE_* environment) and examples/python_client.py with it, while a client with mallory's key (pyzmq, and `mqlm client`) and a
plain client get nothing at all; the status event counts mallory's refused handshakes, and the
log names her key once, however often her client reconnects.

Usage: curve_test.py MQLM_BINARY WORK_DIR
"""
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time

import msgpack
import zmq

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from serve_harness import FAILURES, check, free_port  # noqa: E402


def run(*args, env=None, timeout=60):
    return subprocess.run(list(args), capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def key_lines(path):
    with open(path) as f:
        return [line.strip() for line in f if line.strip() and not line.startswith("#")]


def pyzmq_client(context, endpoint, server_pub=None, pair=None):
    """A DEALER like any client's, with CURVE keys (Z85 text) when given."""
    socket = context.socket(zmq.DEALER)
    socket.linger = 0
    if server_pub:
        socket.curve_serverkey = server_pub.encode()
        socket.curve_publickey = pair[0].encode()
        socket.curve_secretkey = pair[1].encode()
    socket.connect(endpoint)
    return socket


def silent(socket, frame, wait_ms):
    """True when nothing at all comes back for wait_ms after sending frame."""
    socket.send(msgpack.packb(frame), zmq.NOBLOCK)
    return socket.poll(wait_ms) == 0


def keygen(mqlm, work):
    for name in ("server", "alice", "mallory"):
        result = run(mqlm, "keygen", os.path.join(work, name))
        check(result.returncode == 0, f"mqlm keygen {name}: {result.returncode} {result.stderr}")
    mode = stat.S_IMODE(os.stat(os.path.join(work, "server.key")).st_mode)
    check(mode == 0o600, f"server.key has mode {oct(mode)}, wanted 0o600")
    before = open(os.path.join(work, "server.key")).read()
    again = run(mqlm, "keygen", os.path.join(work, "server"))
    check(again.returncode != 0 and "exists already" in again.stderr, f"keygen overwrote? {again.stderr}")
    check(open(os.path.join(work, "server.key")).read() == before, "keygen changed an existing key file")
    os.makedirs(os.path.join(work, "clients"))
    shutil.copy(os.path.join(work, "alice.pub"), os.path.join(work, "clients"))


def refused_without_key(mqlm, model):
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    result = run(mqlm, "serve", model, "--listen", endpoint)
    check(result.returncode == 2 and "--curve-key" in result.stderr and "--insecure" in result.stderr,
          f"tcp:// without --curve-key or --insecure: exit {result.returncode}, wanted 2: {result.stderr}")


def start_server(mqlm, model, work, endpoint):
    log_path = os.path.join(work, "serve.log")
    process = subprocess.Popen([mqlm, "--log-level", "info", "serve", model, "--listen", endpoint, "--kv-pages", "32",
                                "--curve-key", os.path.join(work, "server.key"),
                                "--curve-clients", os.path.join(work, "clients")],
                               stdout=open(log_path, "w"), stderr=subprocess.STDOUT)
    deadline = time.time() + 60
    while time.time() < deadline and process.poll() is None:
        if "ready" in open(log_path).read():
            return process, log_path
        time.sleep(0.1)
    check(False, "the CURVE server did not get ready: " + open(log_path).read()[-2000:])
    process.kill()
    return None, log_path


def allowed_client(mqlm, work, endpoint):
    alice = ["--curve-server-key", os.path.join(work, "server.pub"), "--curve-key", os.path.join(work, "alice.key")]
    result = run(mqlm, "client", "--server", endpoint, *alice, "-p", "Once upon a time", "-n", "4",
                 "--temperature", "0")
    check(result.returncode == 0 and "finish: length" in result.stderr,
          f"alice's generate: exit {result.returncode}: {result.stderr}")
    example = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "examples", "python_client.py")
    result = run("/usr/bin/python3", example, "--server", endpoint, "--max-tokens", "4", "--temperature", "0", *alice)
    check(result.returncode == 0 and "finish: length" in result.stderr,
          f"examples/python_client.py with alice's key: exit {result.returncode}: {result.stderr}")
    missing = run(mqlm, "client", "--server", endpoint, "--curve-server-key", os.path.join(work, "server.pub"),
                  "--status")
    check(missing.returncode == 2 and "go together" in missing.stderr, f"half the CURVE flags: {missing.stderr}")


def refused_clients(mqlm, work, endpoint):
    context = zmq.Context()
    server_pub = key_lines(os.path.join(work, "server.pub"))[0]
    mallory_lines = key_lines(os.path.join(work, "mallory.key"))
    mallory = (mallory_lines[0].split()[1], mallory_lines[1].split()[1])
    generate = {"op": "generate", "id": 1, "prompt": "Once upon a time", "max_tokens": 2}
    try:
        stranger = pyzmq_client(context, endpoint, server_pub, mallory)
        check(silent(stranger, generate, 1500), "a client with an unknown key got an answer")
        plain = pyzmq_client(context, endpoint)
        check(silent(plain, {"op": "status"}, 1000), "a plain (no CURVE) client got an answer")
    finally:
        context.destroy(linger=0)
    result = run(mqlm, "client", "--server", endpoint, "--curve-server-key", os.path.join(work, "server.pub"),
                 "--curve-key", os.path.join(work, "mallory.key"), "--status", "--timeout-ms", "1000")
    check(result.returncode == 1 and "no event" in result.stderr and "--curve-clients" in result.stderr,
          f"mqlm client with an unknown key: exit {result.returncode}: {result.stderr}")
    return mallory[0]


def refusals_counted(mqlm, work, endpoint, mallory_key, log_path):
    env = {"MQLM_CURVE_SERVER_KEY": os.path.join(work, "server.pub"),
           "MQLM_CURVE_KEY": os.path.join(work, "alice.key")}
    result = run(mqlm, "client", "--server", endpoint, "--status", "--json", env=env)
    if check(result.returncode == 0, f"alice's status through MQLM_CURVE_*: exit {result.returncode}: {result.stderr}"):
        refused = json.loads(result.stdout.strip().splitlines()[-1]).get("curve_refused", 0)
        check(refused >= 2, f"curve_refused is {refused}, wanted at least mallory's two clients' handshakes")
    log = open(log_path).read()
    check(log.count(mallory_key) == 1, f"mallory's key is in the log {log.count(mallory_key)} times, wanted once")
    check("CURVE, allowed client keys: 1" in log, "the gateway's start line does not say CURVE with one client key")


def main():
    mqlm, work = sys.argv[1], sys.argv[2]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    model = os.path.join(work, "tiny.gguf")
    made = run(mqlm, "make-model", "--preset", "tiny", "--type", "f16", "-o", model)
    if not check(made.returncode == 0, f"make the tiny model: {made.stderr}"):
        return 1
    keygen(mqlm, work)
    refused_without_key(mqlm, model)
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    process, log_path = start_server(mqlm, model, work, endpoint)
    if process is None:
        return 1
    try:
        allowed_client(mqlm, work, endpoint)
        mallory_key = refused_clients(mqlm, work, endpoint)
        refusals_counted(mqlm, work, endpoint, mallory_key, log_path)
    finally:
        process.send_signal(signal.SIGTERM)
        check(process.wait(timeout=30) == 0, "the CURVE server did not stop cleanly")
    stopped = [line for line in open(log_path) if "gateway stopped" in line]
    check(stopped and " 0 CURVE handshakes refused" not in stopped[0], f"the stop line counts no refusal: {stopped}")
    if FAILURES:
        print(open(log_path).read()[-3000:])
    print(f"{len(FAILURES)} failures")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
