// A byte-level BPE vocabulary for models with random weights (`mqlm make-model`, tests): the
// 256 byte tokens, merges learnt deterministically from a built-in English text, pseudo-word
// filler tokens up to the size asked, and Llama 3's special tokens at the end.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

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

}  // namespace mqlm::model::gguf
