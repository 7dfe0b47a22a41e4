// The tokenizer.ggml.* metadata of a GGUF file as a Vocabulary, and back.
#pragma once

#include "model/gguf/gguf_file.hpp"
#include "model/gguf/gguf_writer.hpp"
#include "model/vocabulary.hpp"

namespace mqlm::model::gguf {

// Reads tokenizer.ggml.model ("llama" or "gpt2"), .pre, .tokens, .scores, .token_type, .merges,
// the bos/eos/eot/unknown/padding token ids, .add_bos_token/.add_eos_token and
// tokenizer.chat_template. An error names the key and what is inconsistent (scores or types
// not one per token, an id past the vocabulary, a type out of range, a merge without a space).
// When add_bos_token is absent it is true for "llama" (SentencePiece models expect BOS) and for
// "gpt2" under Llama 3's and tekken's pre-tokenizers, false for other "gpt2", as llama.cpp does. A model whose general.name says Phi-3 gets llama.cpp's rstrip
// on its special tokens (Vocabulary::rstrip).
GgufResult<Vocabulary> read_vocabulary(const GgufFile& file);

// Sets the same keys (ids of -1, empty scores, types, merges and template are left out).
void write_vocabulary(GgufWriter& writer, const Vocabulary& vocabulary);

}  // namespace mqlm::model::gguf
