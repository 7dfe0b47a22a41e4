#!/usr/bin/env bash
# What clients of llama-server and vLLM expect beyond OpenAI's API, against a real `mqlm serve
# --http` of the tiny model, with curl: token ids beside the text in logprobs; CORS for the origins
# given with --cors-origin (then for any, with *); the extension fields ignore_eos, cache_prompt and
# chat_template_kwargs; /tokenize and /detokenize.
# Usage: api_extensions_test.sh MQLM_BINARY WORK_DIR
set -uo pipefail
mqlm=$1
dir=$2
source "$(dirname "${BASH_SOURCE[0]}")/http_server.sh"
# headers PATH [CURL ARGS...]: prints the HTTP status; the headers are left in $dir/headers.
headers() {
  local path=$1
  shift
  curl -s -D "$dir/headers" -o "$dir/body" -w '%{http_code}' "$@" "$http_url$path"
}
# has_header 'NAME: VALUE': whether the last headers() had it (a regex, case-insensitive).
has_header() { tr -d '\r' <"$dir/headers" | grep -qiE "^$1\$"; }

start_server --cors-origin http://a.example --cors-origin http://b.example:3000 || exit 1

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

# ---- extension fields ----
# A bias makes EOS (<|end_of_text|>, its id from /tokenize) the first token, which ends the
# completion unless ignore_eos.
eos=$(curl -s "${auth[@]}" "$http_url/tokenize" -d '{"content": "<|end_of_text|>"}' | jq '.tokens[0]')
eos_first="\"logit_bias\": {\"$eos\": 100}, \"model\": \"tiny\", \"prompt\": \"x\", \"max_tokens\": 5"
status=$(call /v1/completions "${auth[@]}" "${json[@]}" -d "{$eos_first, \"logprobs\": 0}")
[[ $status == 200 ]] && jq -e --argjson eos "$eos" '.choices[0].finish_reason == "stop"
  and .choices[0].logprobs.token_ids == [$eos]' "$dir/body" >/dev/null || fail "EOS does not end a completion"
status=$(call /v1/completions "${auth[@]}" "${json[@]}" -d "{$eos_first, \"ignore_eos\": true}")
[[ $status == 200 ]] && jq -e '.choices[0].finish_reason == "length" and .usage.completion_tokens == 5' \
  "$dir/body" >/dev/null || fail "ignore_eos does not go on past EOS"
status=$(call /v1/chat/completions "${auth[@]}" "${json[@]}" -d '{"model": "tiny", "max_tokens": 2,
  "messages": [{"role": "user", "content": "Hi"}], "cache_prompt": true,
  "chat_template_kwargs": {"enable_thinking": false}}')
[[ $status == 200 ]] || fail "cache_prompt and chat_template_kwargs are refused ($status)"

# ---- /tokenize and /detokenize ----
text="Once upon a time"
[[ $(call /tokenize -d "{\"content\": \"$text\"}") == 401 ]] || fail "/tokenize without the key is not 401"
[[ $(call /tokenize "${auth[@]}" -d "{\"content\": \"$text\", \"with_pieces\": true}") == 200 ]] &&
  jq -e --arg text "$text" '.count == (.tokens | length) and .count > 1
    and all(.tokens[]; (.id | type) == "number") and ([.tokens[].piece] | add) == $text' "$dir/body" >/dev/null ||
  fail "/tokenize with pieces"
ids=$(jq -c '[.tokens[].id]' "$dir/body")
[[ $(call /detokenize "${auth[@]}" -d "{\"tokens\": $ids}") == 200 ]] &&
  jq -e --arg text "$text" '.content == $text and .prompt == $text' "$dir/body" >/dev/null ||
  fail "/detokenize does not give the text back"
# add_special: BOS in front, as a completion's prompt has it; vLLM's shape adds it unless asked not to.
call /tokenize "${auth[@]}" -d "{\"content\": \"$text\", \"add_special\": true}" >/dev/null
jq -e --argjson ids "$ids" '.tokens[1:] == $ids and (.tokens[0] | IN($ids[]) | not)' "$dir/body" >/dev/null ||
  fail "add_special does not put BOS in front"
with_bos=$(jq -c .tokens "$dir/body")
call /tokenize "${auth[@]}" -d "{\"model\": \"tiny\", \"prompt\": \"$text\"}" >/dev/null
jq -e --argjson t "$with_bos" '.tokens == $t and .count == ($t | length)' "$dir/body" >/dev/null ||
  fail "vLLM's /tokenize shape"
call /v1/completions "${auth[@]}" "${json[@]}" \
  -d "{\"model\": \"tiny\", \"prompt\": \"$text\", \"max_tokens\": 1}" >/dev/null
jq -e --argjson t "$with_bos" '.usage.prompt_tokens == ($t | length)' "$dir/body" >/dev/null ||
  fail "a completion's prompt tokens are not /tokenize's count"
# Special tokens written in the text are tokens, unless parse_special is false.
call /tokenize "${auth[@]}" -d '{"content": "<|end_of_text|>", "parse_special": false}' >/dev/null
jq -e --argjson eos "$eos" '(.tokens | length) > 1 and (.tokens | index($eos)) == null' "$dir/body" >/dev/null &&
  [[ $eos =~ ^[0-9]+$ ]] || fail "parse_special false still parses <|end_of_text|> (EOS $eos)"
[[ $(call /detokenize "${auth[@]}" -d '{"tokens": [99999999]}') == 400 ]] &&
  jq -e '.error.message | test("not a token id")' "$dir/body" >/dev/null || fail "/detokenize of an unknown id"
[[ $(call /tokenize "${auth[@]}" -d '{"content": "x", "model": "nope"}') == 404 ]] ||
  fail "/tokenize for an unknown model is not 404"
[[ $(call /tokenize "${auth[@]}" -d '{"text": "x"}') == 400 ]] &&
  jq -e '.error.param == "text"' "$dir/body" >/dev/null || fail "/tokenize with an unknown field is not 400"

# ---- CORS ----
# A browser's preflight goes without the key; the answer lets its real request through.
preflight=(-X OPTIONS -H "Origin: http://a.example" -H "Access-Control-Request-Method: POST"
  -H "Access-Control-Request-Headers: authorization, content-type, x-stainless-os")
[[ $(headers /v1/chat/completions "${preflight[@]}") == 204 ]] || fail "the preflight is not answered 204"
has_header 'access-control-allow-origin: http://a.example' && has_header 'vary: origin' &&
  has_header 'access-control-allow-methods: .*POST.*' && has_header 'access-control-max-age: [0-9]+' &&
  has_header 'access-control-allow-headers: Authorization, Content-Type.*x-stainless-os' ||
  fail "the preflight's headers: $(cat "$dir/headers")"
origin_b=(-H "Origin: http://b.example:3000")
[[ $(headers /v1/completions "${origin_b[@]}" "${auth[@]}" "${json[@]}" \
  -d '{"model": "tiny", "prompt": "x", "max_tokens": 2}') == 200 ]] &&
  has_header 'access-control-allow-origin: http://b.example:3000' || fail "a POST from an allowed origin"
[[ $(headers /v1/completions "${origin_b[@]}" "${auth[@]}" "${json[@]}" \
  -d '{"model": "tiny", "prompt": "x", "max_tokens": 2, "stream": true}') == 200 ]] &&
  has_header 'access-control-allow-origin: http://b.example:3000' || fail "a stream to an allowed origin"
# An error is readable by the page too.
[[ $(headers /v1/models "${origin_b[@]}") == 401 ]] &&
  has_header 'access-control-allow-origin: http://b.example:3000' || fail "a 401 to an allowed origin"
# Another origin gets no CORS header, and no preflight.
[[ $(headers /v1/models -H "Origin: http://c.example" "${auth[@]}") == 200 ]] &&
  ! has_header 'access-control-.*' || fail "an origin not given got CORS headers"
[[ $(headers /v1/chat/completions -X OPTIONS -H "Origin: http://c.example" \
  -H "Access-Control-Request-Method: POST") != 204 ]] && ! has_header 'access-control-.*' ||
  fail "a preflight from an origin not given was answered"

stop_server || failures=$((failures + 1))

# --cors-origin '*': any origin, and no Vary (the answer is the same for all).
start_server --cors-origin '*' || exit 1
[[ $(headers /v1/chat/completions "${preflight[@]/a.example/anywhere.example}") == 204 ]] &&
  has_header 'access-control-allow-origin: \*' && ! has_header 'vary: .*' ||
  fail "--cors-origin '*' does not answer any origin's preflight"
stop_server || failures=$((failures + 1))
[[ $failures -eq 0 ]] && echo "all API extension checks passed"
exit $((failures > 0))
