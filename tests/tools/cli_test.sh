#!/usr/bin/env bash
# The command line as a user meets it: exit codes and what is printed, with a real trace file.
set -uo pipefail
mqlm=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
failures=0
check() {  # check DESCRIPTION EXPECTED_CODE COMMAND...
  local what=$1 want=$2
  shift 2
  "$@" >"$dir/out" 2>"$dir/err"
  local got=$?
  if [[ $got -ne $want ]]; then
    echo "FAIL: $what: exit $got, wanted $want"; cat "$dir/out" "$dir/err"; failures=$((failures + 1))
  fi
}
expect_output() {  # expect_output DESCRIPTION PATTERN (in the last command's stdout+stderr)
  if ! grep -qE -- "$2" "$dir/out" "$dir/err"; then
    echo "FAIL: $1: no line matching '$2'"; cat "$dir/out" "$dir/err"; failures=$((failures + 1))
  fi
}

check "help lists the subcommands" 0 "$mqlm" --help
expect_output "help" "demo"
check "the version" 0 "$mqlm" --version
expect_output "project()'s version and the commit" "^mqlm [0-9]+\.[0-9]+\.[0-9]+ \(.+\)$"
check "demo over ipc with a trace" 0 "$mqlm" demo --transport ipc --rounds 50 --blob-bytes 1000 --trace "$dir/t.trc"
expect_output "demo report" "50 pongs, 0 mismatched"

check "show filtered by kind" 0 "$mqlm" trace show "$dir/t.trc" --kind Pong
[[ $(grep -c ' Pong ' "$dir/out") -eq 100 ]] || { echo "FAIL: expected 100 Pong lines (50 out, 50 in)"; failures=$((failures + 1)); }
grep -q ' Ping ' "$dir/out" && { echo "FAIL: the Pong filter let a Ping through"; failures=$((failures + 1)); }
check "show filtered by actor" 0 "$mqlm" trace show "$dir/t.trc" --actor demo
expect_output "the report reached demo" "ProbeReport"
check "show with an unknown kind" 2 "$mqlm" trace show "$dir/t.trc" --kind Nonsense

check "replay echo" 0 "$mqlm" trace replay "$dir/t.trc" --actor echo
expect_output "replay echo" "^no difference"
check "replay prober with its options" 0 "$mqlm" trace replay "$dir/t.trc" --actor prober --set rounds=50 --set report_to=demo --set blob_bytes=1000
check "replay prober built differently (another blob seed)" 1 "$mqlm" trace replay "$dir/t.trc" --actor prober --set rounds=50 --set report_to=demo --set blob_bytes=1000 --set seed=2
expect_output "the difference is shown" "send #1: recorded Ping to echo"
check "replay an actor that is not in the trace" 2 "$mqlm" trace replay "$dir/t.trc" --actor nobody --as echo
check "replay an unknown kind" 2 "$mqlm" trace replay "$dir/t.trc" --actor echo --as teapot

head -c 200 "$dir/t.trc" >"$dir/short.trc"
check "a truncated trace" 2 "$mqlm" trace show "$dir/short.trc"
expect_output "the error names the offset" "at byte [0-9]+"

check "demo without blobs in the trace" 0 "$mqlm" demo --rounds 20 --blob-bytes 5000 --trace "$dir/nb.trc" --trace-without-blobs
[[ $(stat -c %s "$dir/nb.trc") -lt 50000 ]] || { echo "FAIL: blobs were recorded"; failures=$((failures + 1)); }
check "echo replays without the blobs' bytes" 1 "$mqlm" trace replay "$dir/nb.trc" --actor echo
expect_output "the hash of zeros differs from the recorded one" "replayed Pong to prober"

check "node with a malformed address" 2 "$mqlm" node --actor echo --address echo
check "node with an unknown actor kind" 2 "$mqlm" node --actor x=teapot
check "node with a bad option" 2 "$mqlm" node --actor prober --set prober.rounds=many

# Links over tcp:// are CURVE (docs/protocol.md): keys, or --insecure, or no start.
check "node over tcp:// without keys" 2 "$mqlm" node --actor echo --address echo=tcp://127.0.0.1:5601
expect_output "the refusal says what to give" "--link-key FILE .*--insecure"
check "keygen for a node" 0 "$mqlm" keygen "$dir/node"
check "an address's key without --link-key" 2 "$mqlm" node --actor echo --address "echo=tcp://127.0.0.1:5601@$dir/node.pub"
expect_output "the refusal names the missing flag" "names a public key, so the links are CURVE: give --link-key"
check "--link-key and a tcp:// address without a key" 2 "$mqlm" node --actor echo --link-key "$dir/node.key" --address echo=tcp://127.0.0.1:5601
expect_output "the refusal names the address" "echo=tcp://127.0.0.1:5601 has no public key"
check "an address's key file that is not there" 2 "$mqlm" node --actor echo --link-key "$dir/node.key" --address "echo=tcp://127.0.0.1:5601@$dir/nobody.pub"
expect_output "the refusal names the file" "nobody.pub: No such file"
check "a secret key where a public key goes" 2 "$mqlm" node --actor echo --link-key "$dir/node.key" --address "echo=tcp://127.0.0.1:5601@$dir/node.key"
expect_output "the refusal says which file is which" "give public keys \(NAME.pub\) here"

# A model made on the spot, generated from on the GPU (lavapipe here).
check "make a tiny model" 0 "$mqlm" make-model --preset tiny --type q8_0 -o "$dir/tiny.gguf"
check "greedy generation" 0 "$mqlm" generate "$dir/tiny.gguf" -p "Once upon a time" -n 12 --temperature 0
expect_output "speed is reported" "decode: 12 tokens in"
cp "$dir/out" "$dir/greedy1"
check "greedy generation again" 0 "$mqlm" generate "$dir/tiny.gguf" -p "Once upon a time" -n 12 --temperature 0
cmp -s "$dir/out" "$dir/greedy1" || { echo "FAIL: greedy output differs between runs"; failures=$((failures + 1)); }
check "sampling with a seed" 0 "$mqlm" generate "$dir/tiny.gguf" -p "Hello" -n 16 --temperature 1 --seed 7
cp "$dir/out" "$dir/seeded1"
check "the same seed" 0 "$mqlm" generate "$dir/tiny.gguf" -p "Hello" -n 16 --temperature 1 --seed 7
cmp -s "$dir/out" "$dir/seeded1" || { echo "FAIL: the same seed gave other text"; failures=$((failures + 1)); }
check "an absurd temperature" 2 "$mqlm" generate "$dir/tiny.gguf" -p "Hello" --temperature -1
expect_output "the error names the field" "temperature"
check "more tokens than the context" 2 "$mqlm" generate "$dir/tiny.gguf" -p "Hello" -n 100000
# A head size and a RoPE the preset does not have: written, said, and generated from.
check "make a model of head size 80, yarn x4, partial rotary" 0 "$mqlm" make-model --preset tiny --arch qwen3 \
  --head-dim 80 --rotary-dims 32 --rope-scaling yarn --rope-factor 4 --rope-original-context 512 -o "$dir/yarn.gguf"
expect_output "the summary says it" "of 80, .*rotary 32 of 80, rope yarn x4 from 512"
check "generation from it" 0 "$mqlm" generate "$dir/yarn.gguf" -p "Once upon a time" -n 4 --temperature 0
check "llama3 as keys" 0 "$mqlm" make-model --preset tiny --rope-scaling llama3 --rope-factor 8 --rope-llama3-keys \
  -o "$dir/llama3.gguf"
expect_output "the summary says how" "rope llama3 x8 \(keys\)"
check "a gemma3 model" 0 "$mqlm" make-model --preset tiny --arch gemma3 -o "$dir/gemma3.gguf"
expect_output "the summary says its window" "gemma3 2 layers, .*\(tied\), sliding window 1024"
check "phi3's heads must fill the hidden size" 2 "$mqlm" make-model --preset tiny --arch phi3 --head-dim 80 -o "$dir/bad.gguf"
check "rotary dims past the head" 2 "$mqlm" make-model --preset tiny --rotary-dims 66 -o "$dir/bad.gguf"
check "an unknown scaling" 105 "$mqlm" make-model --preset tiny --rope-scaling ntk -o "$dir/bad.gguf"
check "LongRoPE outside phi3" 2 "$mqlm" make-model --preset tiny --rope-scaling longrope -o "$dir/bad.gguf"
expect_output "the error says whose it is" "longrope scaling is Phi-3's"
head -c 5000 "$dir/tiny.gguf" >"$dir/cut.gguf"
check "a truncated model" 2 "$mqlm" generate "$dir/cut.gguf" -p "Hello"
expect_output "the error names the offset" "at byte [0-9]+"
check "serve with a tcp:// link without keys" 2 "$mqlm" serve "$dir/tiny.gguf" --run gateway --listen "ipc://$dir/gw" --address scheduler=tcp://127.0.0.1:5602
expect_output "serve's refusal says what to give" "links over tcp:// \(scheduler=tcp://127.0.0.1:5602\) are encrypted"

[[ $failures -eq 0 ]] && echo "all command-line checks passed"
exit $((failures > 0))
