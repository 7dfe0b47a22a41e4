#!/usr/bin/env bash
# /api/status and /metrics of a real `mqlm serve --http` of the tiny model, read with curl and
# parsed: jq for the JSON, prometheus_client's parser (Debian's python3-prometheus-client) for
# the text exposition, checking types, label sets, cumulative buckets and counts against the
# requests made; the status page at / without the key and /api/status?history=1 (sampled every
# 100 ms). Then bad HTTP input, each answered with OpenAI's JSON error and its status,
# while the server stays up; then SIGTERM.
# Usage: status_metrics_test.sh MQLM_BINARY WORK_DIR
set -uo pipefail
mqlm=$1
dir=$2
source "$(dirname "${BASH_SOURCE[0]}")/http_server.sh"

start_server --status-sample-ms 100 || exit 1
# A rate needs a sample before the tokens it counts: the first one has nothing to compare with.
for _ in $(seq 50); do
  [[ $(call '/api/status?history=1' "${auth[@]}") == 200 ]] && jq -e '.history.samples | length > 0' "$dir/body" >/dev/null &&
    break
  sleep 0.1
done

# Two requests that finish, so that the counters and histograms have something to show.
completions="[]"
for n in 8 1; do
  status=$(call /v1/completions "${auth[@]}" "${json[@]}" \
    -d "{\"model\": \"tiny\", \"prompt\": \"Once upon a time\", \"max_tokens\": $n, \"temperature\": 0}")
  [[ $status == 200 ]] || fail "a completion answered $status"
  completions=$(jq -c --argjson all "$completions" '$all + [.]' "$dir/body")
done

# ---- /api/status ----
[[ $(call /api/status) == 401 ]] || fail "/api/status without the key is not 401"
jq -e '.error.code == "invalid_api_key" and .error.type == "invalid_request_error"' "$dir/body" >/dev/null ||
  fail "the 401 is not OpenAI's JSON error"
[[ $(call /health) == 200 ]] || fail "/health without the key is not 200"
[[ $(call /api/status "${auth[@]}") == 200 ]] || fail "/api/status with the key is not 200"
cp "$dir/body" "$dir/status.json"
jq -e --argjson done "$completions" '
  (.models | length) == 1 and .models[0].name == "tiny" and .models[0].bytes > 0
  and .models[0].bytes == .pool.active_by_owner["weights:tiny"]
  and .requests == {"tracked": 0, "running": 0, "waiting": 0, "http_open": 0}
  and .kv_pages.total == 1024 and .kv_pages.used == 0
  and .kv_pages.total == .kv_pages.used + .kv_pages.free + .kv_pages.cached
  and .pool.active_bytes >= .models[0].bytes and .pool.peak_active_bytes >= .pool.active_bytes
  and .pool.held_bytes >= .pool.active_bytes and .pool.cached_bytes >= 0
  and .uptime_seconds > 0 and .draining == false
  and .http.finished.stop + .http.finished.length == 2 and .http.finished.abort == 0 and .http.finished.error == 0
  and .http.completion_tokens == ($done | map(.usage.completion_tokens) | add)
  and .http.prompt_tokens == ($done | map(.usage.prompt_tokens) | add)
' "$dir/status.json" >/dev/null || fail "/api/status does not add up: $(cat "$dir/status.json")"

# ---- the status page and its history ----
curl -s -D "$dir/page.headers" -o "$dir/page.html" "$http_url/"
grep -q '^HTTP/1.1 200' "$dir/page.headers" || fail "/ without the key is not 200: $(head -1 "$dir/page.headers")"
grep -qi '^content-type: text/html; charset=utf-8' "$dir/page.headers" || fail "/ is not text/html"
grep -qi "^content-security-policy: default-src 'none';" "$dir/page.headers" || fail "/ has no Content-Security-Policy"
grep -q '<title>mqlm status</title>' "$dir/page.html" || fail "/ is not the status page"
# The samples taken before the model loaded have no pool or resident set yet; the newest has. A
# sample after the completions comes within a few intervals (more on a busy machine).
history_adds_up() {
  [[ $(call '/api/status?history=1' "${auth[@]}") == 200 ]] && jq -e --argjson done "$completions" '
    .scheduler.generated_tokens == ($done | map(.usage.completion_tokens) | add)
    and .history.interval_seconds == 0.1 and .history.capacity == 360 and (.history.samples | length) > 3
    and all(.history.samples[]; .t <= 0) and (.history.samples | map(.t) | . == sort)
    and (.history.samples[-1] | .pool_active_bytes > 0 and .host_rss_bytes > 0)
    and (.history.samples | map(.generated_tokens_per_s) | max) > 0
    and (.history.samples | map(.prompt_tokens_per_s) | max) > 0
  ' "$dir/body" >/dev/null
}
for _ in $(seq 50); do
  history_adds_up && break
  sleep 0.1
done
history_adds_up || fail "/api/status?history=1 does not add up: $(jq -c '.scheduler, .history' "$dir/body")"
jq -e 'has("history") | not' "$dir/status.json" >/dev/null || fail "/api/status has the history unasked"

# ---- /metrics ----
[[ $(call /metrics) == 401 ]] || fail "/metrics without the key is not 401"
curl -s -D "$dir/metrics.headers" -o "$dir/metrics.txt" "${auth[@]}" "$http_url/metrics"
grep -qi '^content-type: text/plain; version=0.0.4' "$dir/metrics.headers" ||
  fail "/metrics is not Prometheus text: $(cat "$dir/metrics.headers")"
/usr/bin/python3 - "$dir/metrics.txt" "$dir/status.json" "$completions" <<'PY' || fail "/metrics does not parse or add up"
import json, math, sys
from prometheus_client.parser import text_string_to_metric_families

text = open(sys.argv[1]).read()
status = json.load(open(sys.argv[2]))
done = json.loads(sys.argv[3])
parsed = list(text_string_to_metric_families(text))
families = {f.name: f for f in parsed}
assert len(families) == len(parsed), "a family appears twice"
# A sample outside its family's TYPE would come back as an untyped family of its own.
assert all(f.type != "untyped" for f in parsed), [f.name for f in parsed if f.type == "untyped"]

def family(name, kind):
    assert name in families, f"no family {name}"
    f = families[name]
    assert f.type == kind, f"{name} is a {f.type}, not a {kind}"
    return f

def samples(f, suffix=""):
    return [s for s in f.samples if s.name == f.name + suffix]

def single(name, kind, suffix=""):
    (sample,) = samples(family(name, kind), suffix)
    assert sample.labels == {}, f"{name} has labels {sample.labels}"
    return sample.value

# Gauges that match /api/status.
assert single("mqlm_uptime_seconds", "gauge") > 0
weights = family("mqlm_model_weight_bytes", "gauge").samples
assert [(s.labels, s.value) for s in weights] == [({"model": "tiny"}, status["models"][0]["bytes"])], weights
pages = {s.labels["state"]: s.value for s in family("mqlm_kv_pages", "gauge").samples}
assert all(set(s.labels) == {"state"} for s in family("mqlm_kv_pages", "gauge").samples)
assert pages == {k: status["kv_pages"][k] for k in ("used", "cached", "free")}, pages
assert single("mqlm_scheduler_requests", "gauge") == 0
assert single("mqlm_http_requests_open", "gauge") == 0
for key in ("active_bytes", "cached_bytes", "peak_active_bytes", "held_bytes"):
    assert single(f"mqlm_pool_{key}", "gauge") == status["pool"][key], key
owners = {s.labels["owner"]: s.value for s in family("mqlm_pool_owner_active_bytes", "gauge").samples}
assert owners == status["pool"]["active_by_owner"], owners
# The GPU's time (lavapipe writes timestamps too): busy, and idle by reason, never less than the
# status read before.
assert single("mqlm_gpu_busy_seconds", "counter", "_total") >= status["gpu_time"]["busy_seconds"] > 0
idle = {s.labels["reason"]: s.value for s in samples(family("mqlm_gpu_idle_seconds", "counter"), "_total")}
assert set(idle) == {"queued", "host"} and all(v >= 0 for v in idle.values()), idle
assert single("mqlm_gpu_submissions", "counter", "_total") >= status["gpu_time"]["submissions"] > 0

# Counters.
finished = {s.labels["finish_reason"]: s.value for s in samples(family("mqlm_http_requests", "counter"), "_total")}
assert set(finished) == {"stop", "length", "tool_calls", "abort", "error"}, finished
assert finished["stop"] + finished["length"] == len(done), finished
assert finished["tool_calls"] == finished["abort"] == finished["error"] == 0, finished
assert single("mqlm_http_completion_tokens", "counter", "_total") == sum(d["usage"]["completion_tokens"] for d in done)
assert single("mqlm_http_prompt_tokens", "counter", "_total") == sum(d["usage"]["prompt_tokens"] for d in done)
assert single("mqlm_scheduler_steps", "counter", "_total") > 0
assert single("mqlm_scheduler_generated_tokens", "counter", "_total") == sum(d["usage"]["completion_tokens"] for d in done)

# Histograms: buckets by le, cumulative, ending at +Inf with the count.
def histogram(name, observations):
    f = family(name, "histogram")
    buckets = samples(f, "_bucket")
    assert all(set(s.labels) == {"le"} for s in buckets), buckets
    bounds = [float(s.labels["le"]) for s in buckets]
    assert bounds == sorted(bounds) and bounds[-1] == math.inf, bounds
    counts = [s.value for s in buckets]
    assert all(a <= b for a, b in zip(counts, counts[1:])), f"{name} buckets are not cumulative: {counts}"
    (count,) = samples(f, "_count")
    (total,) = samples(f, "_sum")
    assert counts[-1] == count.value == observations, (name, counts[-1], count.value, observations)
    assert total.value >= 0

histogram("mqlm_http_time_to_first_token_seconds", len(done))
histogram("mqlm_http_time_per_output_token_seconds", sum(d["usage"]["completion_tokens"] >= 2 for d in done))
print(f"metrics: {len(families)} families parsed and checked")
PY

# ---- bad input: OpenAI's JSON errors, the right statuses ----
# expect STATUS JQ_CHECK DESCRIPTION -- PATH CURL ARGS...
expect() {
  local want=$1 check=$2 what=$3
  shift 4
  local got
  got=$(call "$@")
  [[ $got == "$want" ]] || { fail "$what: $got, wanted $want"; return; }
  jq -e "(.error | keys == [\"code\", \"message\", \"param\", \"type\"]) and ($check)" "$dir/body" >/dev/null ||
    fail "$what: not the expected OpenAI error"
}
expect 400 '.error.type == "invalid_request_error" and .error.param == null' "malformed JSON" -- \
  /v1/chat/completions "${auth[@]}" "${json[@]}" -d '{"model": "tiny", "messages": ['
expect 400 '.error.param == "max_tokens"' "max_tokens as a string" -- \
  /v1/completions "${auth[@]}" "${json[@]}" -d '{"model": "tiny", "prompt": "x", "max_tokens": "8"}'
expect 400 '.error.param == "max_tokens"' "max_tokens over a 32-bit integer" -- \
  /v1/completions "${auth[@]}" "${json[@]}" -d '{"model": "tiny", "prompt": "x", "max_tokens": 99999999999}'
expect 400 '.error.code == "context_length_exceeded"' "max_tokens beyond the context" -- \
  /v1/completions "${auth[@]}" "${json[@]}" -d '{"model": "tiny", "prompt": "x", "max_tokens": 100000}'
expect 400 '.error.param == "top_logprobs"' "top_logprobs 21" -- \
  /v1/chat/completions "${auth[@]}" "${json[@]}" \
  -d '{"model": "tiny", "messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": 21}'
expect 400 '.error.param == "n"' "n = 2" -- \
  /v1/completions "${auth[@]}" "${json[@]}" -d '{"model": "tiny", "prompt": "x", "n": 2}'
expect 404 '.error.code == "model_not_found"' "an unknown model" -- \
  /v1/completions "${auth[@]}" "${json[@]}" -d '{"model": "nope", "prompt": "x"}'
expect 404 '.error.code == "model_not_found"' "an unknown model, streamed" -- \
  /v1/completions "${auth[@]}" "${json[@]}" -d '{"model": "nope", "prompt": "x", "stream": true}'
expect 404 '.error.code == "unknown_url"' "an unknown path" -- /v1/nothing "${auth[@]}"
head -c 1500000 /dev/zero | tr '\0' 'a' >"$dir/big.txt"
expect 413 '.error.code == "request_too_large"' "a body over the limit" -- \
  /v1/completions "${auth[@]}" "${json[@]}" --data-binary "@$dir/big.txt"
expect 401 '.error.code == "invalid_api_key"' "a wrong key" -- \
  /v1/completions -H "Authorization: Bearer wrong" "${json[@]}" -d '{"model": "tiny", "prompt": "x"}'

# Without --cors-origin, no CORS: a browser's preflight is not answered, nor any header sent.
curl -s -D "$dir/cors.headers" -o /dev/null -X OPTIONS -H "Origin: http://a.example" \
  -H "Access-Control-Request-Method: POST" "$http_url/v1/completions"
curl -s -D - -o /dev/null -H "Origin: http://a.example" "${auth[@]}" "$http_url/v1/models" >>"$dir/cors.headers"
! grep -qi '^access-control-' "$dir/cors.headers" && ! grep -q '^HTTP/1.1 204' "$dir/cors.headers" ||
  fail "CORS headers without --cors-origin: $(cat "$dir/cors.headers")"

# Still serving.
[[ $(call /health) == 200 ]] || fail "/health after the bad input is not 200"
status=$(call /v1/completions "${auth[@]}" "${json[@]}" -d '{"model": "tiny", "prompt": "x", "max_tokens": 2}')
[[ $status == 200 ]] && jq -e '.usage.completion_tokens >= 1' "$dir/body" >/dev/null ||
  fail "a completion after the bad input answered $status"

# SIGTERM drains: a stream still open hears why it ends (an error event, then [DONE]) and the
# server exits 0.
curl -sN "${auth[@]}" "${json[@]}" "$http_url/v1/chat/completions" >"$dir/drained.sse" \
  -d '{"model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": 1500, "stream": true}' &
stream_pid=$!
for _ in $(seq 300); do
  grep -q '"content":"[^"]' "$dir/drained.sse" 2>/dev/null && break
  sleep 0.1
done
grep -q '"content":"[^"]' "$dir/drained.sse" || fail "the stream to drain sent no text"
stop_server || failures=$((failures + 1))
wait "$stream_pid"
tail -n 4 "$dir/drained.sse" >"$dir/body"
[[ $(sed -n 's/^data: //p' "$dir/body" | tail -n 1) == "[DONE]" ]] || fail "the drained stream does not end with [DONE]"
sed -n 's/^data: //p' "$dir/body" | head -n 1 | jq -e '.error.code == "aborted" and .error.type == "server_error"' \
  >/dev/null || fail "the drained stream does not end with an error event"

[[ $failures -eq 0 ]] && echo "all status and metrics checks passed"
exit $((failures > 0))
