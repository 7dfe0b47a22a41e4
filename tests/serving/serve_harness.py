"""What the Python tests that drive a real `mqlm serve` share: failures gathered rather than raised
(a scenario goes on and reports every broken line), free ports, and JSON over HTTP."""
import json
import socket
import urllib.error
import urllib.request

FAILURES = []


def check(condition, what):
    if not condition:
        FAILURES.append(what)
        print(f"FAIL: {what}", flush=True)
    return condition


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_json(base, method, path, body=None, timeout=120):
    """(status, decoded JSON body) of one request; HTTP errors are answers too."""
    data = json.dumps(body).encode() if body is not None else b""
    request = urllib.request.Request(base + path, data=data if method == "POST" else None, method=method,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")
