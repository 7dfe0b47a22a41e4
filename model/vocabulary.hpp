// A tokenizer's vocabulary as GGUF files carry it (the tokenizer.ggml.* metadata): what the GGUF
// reader fills, `mqlm make-model` writes, and the tokenizers are built from.
//
// Conventions (those of real GGUF files):
// - model "llama": SentencePiece. Tokens use U+2581 ("▁") for a space; byte-fallback tokens are
//   named "<0x0A>" and have type byte; scores rank merges (higher first).
// - model "gpt2": byte-level BPE. Every byte maps to one printable code point by GPT-2's
//   bytes_to_unicode table (space -> "Ġ" U+0120, newline -> "Ċ" U+010A, ...); tokens and
//   merges are strings of those code points; merges are "left right", earlier = higher rank.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mqlm::model {

enum class TokenizerModel : std::uint8_t { spm, bpe };  // "llama", "gpt2"

// tokenizer.ggml.token_type values
enum class TokenType : std::int32_t {
  undefined = 0,
  normal = 1,
  unknown = 2,
  control = 3,       // special: <s>, </s>, <|im_start|>, ...
  user_defined = 4,  // added tokens, matched whole in text
  unused = 5,
  byte = 6,          // SentencePiece byte fallback "<0xNN>"
};

struct Vocabulary {
  TokenizerModel model = TokenizerModel::bpe;
  std::string pre = "default";           // tokenizer.ggml.pre: "default", "llama-bpe", "qwen2", ...
  std::vector<std::string> tokens;       // id -> text, as stored
  std::vector<float> scores;             // empty or one per token
  std::vector<TokenType> types;          // empty (all normal) or one per token
  std::vector<std::string> merges;       // bpe only: "left right", by rank
  std::int32_t bos = -1, eos = -1, eot = -1, unk = -1, pad = -1;  // -1: none
  bool add_bos = false;
  bool add_eos = false;
  // SentencePiece: text at the start or after a special token gets a space in front, which
  // decoding takes off again (tokenizer.ggml.add_space_prefix; Gemma's files say false).
  bool add_space_prefix = true;
  std::string chat_template;             // tokenizer.chat_template, empty if absent
  // Special tokens that swallow the whitespace after them where they are matched in text (Hugging
  // Face's rstrip; GGUF files do not carry it: llama.cpp gives it to Phi-3's chat markers by the
  // model's name, and read_vocabulary does the same).
  std::vector<std::int32_t> rstrip;
};

}  // namespace mqlm::model
