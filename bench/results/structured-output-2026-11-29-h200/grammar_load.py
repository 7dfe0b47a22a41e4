"""32 clients loop /v1/completions for a fixed time, with and without response_format; prints
completion tokens/s. stdlib only (the GPU machine's python)."""
import json, sys, threading, time, urllib.request

url = sys.argv[1]
mode = sys.argv[2]  # plain | json_object
clients, seconds = int(sys.argv[3]), float(sys.argv[4])
stop_at = time.time() + seconds
tokens = [0] * clients
requests = [0] * clients
errors = []

def body(i):
    b = {"model": sys.argv[5], "prompt": "Write a JSON object describing a book %d:" % i, "max_tokens": 128,
         "temperature": 0.8, "seed": i}
    if mode == "json_object":
        b["response_format"] = {"type": "json_object"}
    return json.dumps(b).encode()

def client(c):
    n = 0
    while time.time() < stop_at:
        req = urllib.request.Request(url + "/v1/completions", data=body(c * 1000 + n),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                out = json.load(r)
            tokens[c] += out["usage"]["completion_tokens"]
            requests[c] += 1
        except Exception as e:  # noqa
            errors.append(str(e))
        n += 1

t0 = time.time()
threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
for t in threads: t.start()
for t in threads: t.join()
wall = time.time() - t0
print(f"{mode}: clients {clients}, {sum(requests)} requests, {sum(tokens)} completion tokens in {wall:.1f} s: "
      f"{sum(tokens) / wall:.1f} tok/s, {sum(tokens) / max(1, sum(requests)):.1f} tokens a request, {len(errors)} errors "
      f"{errors[:2]}")
