// Vocabularies for models with random weights (`mqlm make-model`, tests). Byte-level BPE: the 256
// byte tokens, merges learnt deterministically from a built-in English text, pseudo-word filler
// tokens up to the size asked, and Llama 3's special tokens at the end. SentencePiece: byte
// fallback tokens, pieces learnt from the same text and scored by the order they were learnt in,
// fillers, and Gemma's or Phi-3's special tokens where those models have them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "model/vocabulary.hpp"

namespace mqlm::model::gguf {

// GPT-2's bytes_to_unicode: the printable code point (as UTF-8) that stands for one byte in
// byte-level BPE tokens and merges (space -> "Ġ", newline -> "Ċ", 'a' -> "a").
std::string byte_to_unicode(std::uint8_t byte);

inline constexpr std::size_t kMinSyntheticVocabulary = 256 + 5;

// model gpt2, pre "llama-bpe"; ids 0..255 are the bytes in code point order (GPT-2's own order);
// then up to size - 261 learnt merges' tokens, filler tokens, and <|begin_of_text|> (bos),
// <|end_of_text|> (eos), <|start_header_id|>, <|end_header_id|>, <|eot_id|> (eot) as control
// tokens, then `extra_specials` as control tokens too; add_bos, and a Llama 3 chat template.
// Throws std::invalid_argument below the minimum (plus the extra ones).
Vocabulary make_byte_bpe_vocabulary(std::size_t size, std::span<const std::string_view> extra_specials = {});

// The tokenizers a made model can have: byte-level BPE (the same tokens and merges) under Llama 3's
// ("llama-bpe"), Qwen2's, GPT-2's, Mistral's tekken or SmolLM's pre-tokenizer, or a SentencePiece
// vocabulary laid out as Gemma's (no leading space, user-defined whitespace and HTML tokens) or
// Phi-3's (Llama 2's).
enum class VocabularyKind : std::uint8_t { llama_bpe, qwen2, gpt2, tekken, smollm, gemma, phi3 };

// "llama-bpe", "qwen2", "gpt2", "tekken", "smollm", "gemma", "phi3"
std::string_view vocabulary_kind_name(VocabularyKind kind);
std::optional<VocabularyKind> parse_vocabulary_kind(std::string_view name);
std::vector<std::string_view> vocabulary_kind_names();

// The fewest tokens make_vocabulary takes (byte-level BPE: with `extra_specials` more).
std::size_t min_vocabulary_size(VocabularyKind kind, std::size_t extra_specials = 0);

// A vocabulary of `size` tokens of that kind; `extra_specials` go after Llama 3's specials of the
// byte-level ones (the SentencePiece ones have their models' own). Throws std::invalid_argument
// below min_vocabulary_size.
Vocabulary make_vocabulary(VocabularyKind kind, std::size_t size, std::span<const std::string_view> extra_specials = {});

}  // namespace mqlm::model::gguf
