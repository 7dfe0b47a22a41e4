#!/usr/bin/env bash
# /health, /ready and /live for operators, against a real `mqlm serve` of two models, one of
# which fails to load (its file is cut short after the server started): the failing model shows
# as failing once its last three requests failed while the other stays ready, and /metrics
# counts by model the requests of both front ends (a ZeroMQ client's included).
# Usage: health_test.sh MQLM_BINARY WORK_DIR
set -uo pipefail
mqlm=$1
dir=$2
source "$(dirname "${BASH_SOURCE[0]}")/http_server.sh"
mkdir -p "$dir"
"$mqlm" make-model --preset tiny --type f16 -o "$dir/tiny.gguf" >"$dir/make.log" 2>&1 || { cat "$dir/make.log"; exit 1; }
cp "$dir/tiny.gguf" "$dir/bad.gguf"
http_port=$(free_port)
gateway_port=$(free_port)
start_server_at "$http_port" serve --model "tiny=$dir/tiny.gguf" --model "bad=$dir/bad.gguf" \
  --http "127.0.0.1:$http_port" --listen "tcp://127.0.0.1:$gateway_port" --insecure || exit 1
truncate -s 30000 "$dir/bad.gguf"

# probe PATH WANT JQ_CHECK DESCRIPTION
probe() {
  local got
  got=$(call "$1")
  [[ $got == "$2" ]] || { fail "$4: $1 answered $got, wanted $2"; return; }
  jq -e "$3" "$dir/body" >/dev/null || fail "$4: $1's body is not as expected"
}
probe /live 200 '.live == true' "at the start"
probe /health 200 '.status == "ok" and .ready == true' "at the start"
probe "/ready?model=bad" 200 '.models.bad.ready == true and .models.bad.failing == false' "before bad's requests"
probe "/ready?model=nope" 404 '.error.code == "model_not_found"' "an unknown model"

for i in 1 2 3; do
  status=$(call /v1/completions "${json[@]}" -d '{"model": "bad", "prompt": "Once", "max_tokens": 2}')
  [[ $status == 500 ]] && jq -e '.error.code == "model_failed"' "$dir/body" >/dev/null ||
    fail "request $i to the broken model answered $status"
  if ((i < 3)); then
    probe "/ready?model=bad" 200 ".models.bad.failed_in_a_row == $i" "after $i failures"
  fi
done
probe "/ready?model=bad" 503 '.models.bad.failing == true and .models.bad.ready == false' "after 3 failures"
probe "/ready?model=tiny" 200 '.models.tiny.ready == true' "the other model"
probe /health 200 '.status == "ok" and .models.bad.failing == true' "one model of two failing"
probe /live 200 '.live == true' "one model failing"

"$mqlm" client --server "tcp://127.0.0.1:$gateway_port" --model tiny -p "Once" -n 3 --temperature 0 \
  >"$dir/client.log" 2>&1 || fail "the ZeroMQ client's request failed: $(tail -3 "$dir/client.log")"
call /metrics >/dev/null
metric() { awk -v name="$1{model=\"$2\"}" '$1 == name { print $2 }' "$dir/body"; }
[[ $(metric mqlm_model_requests_total tiny) == 1 ]] || fail "the ZeroMQ request is not counted for tiny"
[[ $(metric mqlm_model_completion_tokens_total tiny) == 3 ]] || fail "its 3 tokens are not counted"
[[ $(metric mqlm_model_requests_failed_total bad) == 3 ]] || fail "bad's 3 failures are not counted"
[[ $(metric mqlm_model_failing bad) == 1 && $(metric mqlm_model_failing tiny) == 0 ]] ||
  fail "mqlm_model_failing is not 1 for bad and 0 for tiny"

stop_server || failures=$((failures + 1))
[[ $failures -eq 0 ]] || exit 1
echo "health: all passed"
