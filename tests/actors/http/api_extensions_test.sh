#!/usr/bin/env bash
# What clients of llama-server and vLLM expect beyond OpenAI's API, against a real `mqlm serve
# --http` of the tiny model, with curl: token ids beside the text in logprobs.
# Usage: api_extensions_test.sh MQLM_BINARY WORK_DIR
set -uo pipefail
mqlm=$1
dir=$2
source "$(dirname "${BASH_SOURCE[0]}")/http_server.sh"
failures=0
fail() {  # fail DESCRIPTION: counts it, shows the last body
  echo "FAIL: $1"
  [[ -f $dir/body ]] && { echo "--- body"; head -c 2000 "$dir/body"; echo; }
  failures=$((failures + 1))
}
# call PATH [CURL ARGS...]: prints the HTTP status; the body is left in $dir/body.
call() {
  local path=$1
  shift
  curl -s -o "$dir/body" -w '%{http_code}' "$@" "$http_url$path"
}
auth=(-H "Authorization: Bearer $api_key")
json=(-H "Content-Type: application/json")

start_server || exit 1

# ---- logprobs: each token's id beside its text ----
status=$(call /v1/completions "${auth[@]}" "${json[@]}" \
  -d '{"model": "tiny", "prompt": "Once upon a time", "max_tokens": 6, "temperature": 0, "logprobs": 3}')
[[ $status == 200 ]] || fail "a completion with logprobs answered $status"
jq -e '.choices[0].logprobs as $l | .usage.completion_tokens as $n
  | ($l.tokens | length) == $n and ($l.token_ids | length) == $n
  and all($l.token_ids[]; type == "number" and . >= 0)
  and ($l.top_logprobs_by_id | length) == $n
  and all(range($n) as $i | $l.top_logprobs_by_id[$i] | has($l.token_ids[$i] | tostring) and length >= 3; .)' \
  "$dir/body" >/dev/null ||
  fail "completions' logprobs lack the token ids"
status=$(call /v1/completions "${auth[@]}" "${json[@]}" -d '{"model": "tiny", "prompt": "Once upon a time",
  "max_tokens": 4, "temperature": 0, "logprobs": 1, "return_tokens_as_token_ids": true}')
[[ $status == 200 ]] && jq -e '.choices[0].logprobs as $l
  | $l.tokens == ($l.token_ids | map("token_id:" + tostring))' "$dir/body" >/dev/null ||
  fail "return_tokens_as_token_ids does not name the tokens by id"
status=$(call /v1/chat/completions "${auth[@]}" "${json[@]}" -d '{"model": "tiny", "max_tokens": 4,
  "temperature": 0, "logprobs": true, "top_logprobs": 2, "messages": [{"role": "user", "content": "Hi"}]}')
[[ $status == 200 ]] && jq -e '.choices[0].logprobs.content as $c | ($c | length) == .usage.completion_tokens
  and all($c[]; (.id | type) == "number" and (.bytes | type) == "array"
                and (.top_logprobs | length) == 2 and all(.top_logprobs[]; (.id | type) == "number"))' \
  "$dir/body" >/dev/null || fail "chat's logprobs lack the token ids"

stop_server || failures=$((failures + 1))
[[ $failures -eq 0 ]] && echo "all API extension checks passed"
exit $((failures > 0))
