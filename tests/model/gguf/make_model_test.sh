#!/bin/bash
# `mqlm make-model`: writes a loadable tiny model, the same bytes for the same seed, and refuses
# bad options with exit code 2 and a message.
set -u
mqlm=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$mqlm" make-model --preset tiny --type q4_0 -o "$dir/a.gguf" --seed 3 > "$dir/out" || fail "tiny q4_0"
grep -q "wrote $dir/a.gguf: llama 2 layers, hidden 256" "$dir/out" || fail "summary: $(cat "$dir/out")"
[ "$(head -c 4 "$dir/a.gguf")" = GGUF ] || fail "no GGUF magic"
"$mqlm" make-model --preset tiny --type q4_0 -o "$dir/b.gguf" --seed 3 > /dev/null || fail "again"
cmp -s "$dir/a.gguf" "$dir/b.gguf" || fail "same seed, different bytes"
"$mqlm" make-model --preset tiny --type q4_0 -o "$dir/c.gguf" --seed 4 > /dev/null || fail "seed 4"
cmp -s "$dir/a.gguf" "$dir/c.gguf" && fail "different seeds, same bytes"
"$mqlm" make-model --preset tiny --type q4_k --arch qwen3 --hidden 320 --heads 5 --kv-heads 1 \
  -o "$dir/d.gguf" > /dev/null 2> "$dir/err" || fail "qwen3 with fallbacks"
grep -q "note: token_embd.weight is q8_0" "$dir/err" || fail "no fallback note: $(cat "$dir/err")"

expect_refusal() {  # expected words, then the arguments
  local words=$1; shift
  "$mqlm" make-model "$@" > /dev/null 2> "$dir/err"
  [ $? -eq 2 ] || fail "make-model $* did not exit 2"
  grep -q "$words" "$dir/err" || fail "make-model $*: no '$words' in: $(cat "$dir/err")"
}
expect_refusal "no preset named 'huge'" --preset huge -o "$dir/x.gguf"
expect_refusal "unknown weight type 'q6_k'" --type q6_k -o "$dir/x.gguf"
expect_refusal "4 heads do not share 3 KV heads evenly" --kv-heads 3 -o "$dir/x.gguf"
"$mqlm" make-model --preset tiny -o /nonexistent-dir/x.gguf > /dev/null 2> "$dir/err" && fail "wrote to nowhere"
grep -q "cannot create /nonexistent-dir/x.gguf.partial" "$dir/err" || fail "bad path message: $(cat "$dir/err")"
echo "make-model: all checks passed"
