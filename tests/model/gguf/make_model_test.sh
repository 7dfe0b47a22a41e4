#!/bin/bash
# `mqlm make-model`: writes a loadable tiny model, the same bytes for the same seed, llama-quantize's
# mixture for the file type named in any case (or every matrix one type with --pure), and refuses
# bad options with exit code 2 and a message.
set -u
mqlm=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$mqlm" make-model --preset tiny --type q4_0 --pure -o "$dir/a.gguf" --seed 3 > "$dir/out" || fail "tiny q4_0"
grep -q "wrote $dir/a.gguf: llama 2 layers, hidden 256.*; q4_0 pure: q4_0 16;" "$dir/out" || fail "summary: $(cat "$dir/out")"
[ "$(head -c 4 "$dir/a.gguf")" = GGUF ] || fail "no GGUF magic"
"$mqlm" make-model --preset tiny --type q4_0 --pure -o "$dir/b.gguf" --seed 3 > /dev/null || fail "again"
cmp -s "$dir/a.gguf" "$dir/b.gguf" || fail "same seed, different bytes"
"$mqlm" make-model --preset tiny --type q4_0 --pure -o "$dir/c.gguf" --seed 4 > /dev/null || fail "seed 4"
cmp -s "$dir/a.gguf" "$dir/c.gguf" && fail "different seeds, same bytes"
# llama-quantize's Q8_0 has every matrix Q8_0, so the mixture is the pure file.
"$mqlm" make-model --preset tiny --type Q8_0 -o "$dir/q8.gguf" > /dev/null || fail "Q8_0"
"$mqlm" make-model --preset tiny --type q8_0 --pure -o "$dir/q8-pure.gguf" > /dev/null || fail "q8_0 --pure"
cmp -s "$dir/q8.gguf" "$dir/q8-pure.gguf" || fail "Q8_0 mixture and pure q8_0 differ"
"$mqlm" make-model --preset tiny --type Q4_K_M -o "$dir/q4km.gguf" > "$dir/out" || fail "Q4_K_M"
grep -q "; q4_k_m: q4_k 13, q6_k 3;" "$dir/out" || fail "Q4_K_M summary: $(cat "$dir/out")"
"$mqlm" make-model --preset tiny --type q8_0 --arch qwen3 --hidden 336 --heads 6 --head-dim 56 \
  -o "$dir/d.gguf" > /dev/null 2> "$dir/err" || fail "qwen3 with fallbacks"
grep -q "note: token_embd.weight is f16: rows of 336 elements are not whole q8_0 blocks of 32" "$dir/err" ||
  fail "no fallback note: $(cat "$dir/err")"
# Mixtures of experts: qwen3moe's default experts, Mixtral as llama with --experts, their summaries,
# llama-quantize's 8-expert types (attn_k and attn_v Q8_0, attn_output Q5_K), the 30B-A3B preset.
"$mqlm" make-model --arch qwen3moe --type q4_k_m -o "$dir/moe.gguf" > "$dir/out" || fail "qwen3moe"
grep -q "qwen3moe 2 layers, .*, 8 experts of 256, 2 a token; q4_k_m: q8_0 4, q4_k 8, q5_k 2, q6_k 2;" "$dir/out" ||
  fail "qwen3moe summary: $(cat "$dir/out")"
"$mqlm" make-model --arch llama --experts 8 --experts-used 3 -o "$dir/mixtral.gguf" > "$dir/out" || fail "mixtral"
grep -q "llama 2 layers, .*FFN 768, .*, 8 experts of 768, 3 a token; f16: f16 16;" "$dir/out" ||
  fail "mixtral summary: $(cat "$dir/out")"
"$mqlm" make-model --preset qwen3moe-30b-a3b --layers 1 --vocab 512 --type q8_0 -o "$dir/a3b.gguf" > "$dir/out" ||
  fail "qwen3moe-30b-a3b"
grep -q "qwen3moe 1 layers, hidden 2048, 32 heads (4 KV) of 128, .*128 experts of 768, 8 a token" "$dir/out" ||
  fail "qwen3moe-30b-a3b summary: $(cat "$dir/out")"
rm -f "$dir/a3b.gguf"

expect_refusal() {  # expected words, then the arguments
  local words=$1; shift
  "$mqlm" make-model "$@" > /dev/null 2> "$dir/err"
  [ $? -eq 2 ] || fail "make-model $* did not exit 2"
  grep -q "$words" "$dir/err" || fail "make-model $*: no '$words' in: $(cat "$dir/err")"
}
"$mqlm" make-model --preset tiny --arch gemma2 --tokenizer gemma -o "$dir/g.gguf" > /dev/null || fail "gemma tokenizer"
grep -q "<start_of_turn>" "$dir/g.gguf" || fail "no Gemma vocabulary in the gemma2 file"
"$mqlm" make-model --preset phi3-mini --layers 1 --hidden 384 --heads 4 --kv-heads 4 --ffn 256 --vocab 1024 \
  --context 4096 --rope-scaling longrope --rope-original-context 512 -o "$dir/p.gguf" > "$dir/out" || fail "longrope"
grep -q "rope longrope (rope_factors_long/short.weight) from 512" "$dir/out" || fail "longrope summary: $(cat "$dir/out")"
grep -q "rope_factors_long.weight" "$dir/p.gguf" || fail "no rope_factors_long.weight"
expect_refusal "longrope scaling is Phi-3's" --rope-scaling longrope -o "$dir/x.gguf"
expect_refusal "no preset named 'huge'" --preset huge -o "$dir/x.gguf"
expect_refusal "no tokenizer named 'bert' (there are llama-bpe, qwen2, gpt2, tekken, smollm, gemma, phi3)" --tokenizer bert -o "$dir/x.gguf"
expect_refusal "unknown type 'q7_k' (llama-quantize's file types: f32, .*q4_k_m, q4_k," --type q7_k -o "$dir/x.gguf"
expect_refusal "4 heads do not share 3 KV heads evenly" --kv-heads 3 -o "$dir/x.gguf"
expect_refusal "only qwen3moe and llama (Mixtral) have experts, not qwen2" --arch qwen2 --experts 8 -o "$dir/x.gguf"
expect_refusal "8 experts, 9 used" --arch qwen3moe --experts-used 9 -o "$dir/x.gguf"
"$mqlm" make-model --preset tiny -o /nonexistent-dir/x.gguf > /dev/null 2> "$dir/err" && fail "wrote to nowhere"
grep -q "cannot create /nonexistent-dir/x.gguf.partial" "$dir/err" || fail "bad path message: $(cat "$dir/err")"
echo "make-model: all checks passed"
