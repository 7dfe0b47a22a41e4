// Text to token ids and back, for the two tokenizers GGUF files carry (see model/vocabulary.hpp):
// SentencePiece-style (model "llama": merges by score, byte fallback <0xNN>, "▁" for spaces) and
// byte-level BPE (model "gpt2": merges by rank after a regex pre-tokenizer chosen by
// Vocabulary::pre).
//
// Special tokens are the vocabulary's control, user_defined (added) and unknown tokens. They are
// never produced by merges. User-defined tokens are cut out of any text first, longest match at the
// leftmost position (as llama.cpp and Hugging Face do); control and unknown ones too with
// EncodeOptions::parse_special, and without it their text is plain text. A token marked rstrip
// (Vocabulary::rstrip) swallows the whitespace after it.
//
// SentencePiece's leading space (llama.cpp's rule): every stretch of text that starts the input
// or follows a special token gets one space in front before encoding ("Hi" -> "▁Hi"). Decoding
// mirrors it: the first text piece at the start of a sequence or after a special token loses one
// leading space, so decode(encode(text)) == text. Neither where the vocabulary says not to
// (Vocabulary::add_space_prefix false: Gemma's).
//
// A Tokenizer is immutable after create(): encode and decode may run on many threads at once.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <variant>
#include <vector>

#include "model/tokenizer/pre_tokenizer.hpp"
#include "model/vocabulary.hpp"

namespace mqlm::model {

using TokenId = std::int32_t;

struct EncodeOptions {
  bool add_special = true;     // BOS / EOS where the vocabulary's add_bos / add_eos ask for them
  bool parse_special = false;  // special tokens written in the text are recognised as tokens
};

struct DecodeOptions {
  bool render_special = false;  // control tokens (BOS, <|im_end|>, ...) written as their text
  bool sequence_start = true;   // SentencePiece: the ids start a sequence, so the space encode
                                // put in front is dropped; false when they continue one
};

struct TokenizerError {
  std::string message;
};

class Tokenizer {
 public:
  // Checks the vocabulary whole; an inconsistent one (sizes that disagree, merges naming unknown
  // tokens, a byte-level vocabulary without all 256 byte tokens, an unknown pre-tokenizer, ...)
  // is an error value saying what is wrong.
  static std::variant<Tokenizer, TokenizerError> create(const Vocabulary& vocabulary);

  std::vector<TokenId> encode(std::string_view text, const EncodeOptions& options = {}) const;

  // The bytes the ids stand for: not always valid UTF-8 (ids may end inside a character; see
  // StreamDecoder). An id outside 0..size()-1 is a caller's bug: std::out_of_range.
  std::string decode(std::span<const TokenId> ids, const DecodeOptions& options = {}) const;

  std::size_t size() const { return texts_.size(); }
  TokenizerModel model() const { return model_; }
  TokenId bos() const { return bos_; }  // -1: none
  TokenId eos() const { return eos_; }
  TokenId eot() const { return eot_; }
  bool ends_generation(TokenId id) const { return id >= 0 && (id == eos_ || id == eot_); }
  const std::string& token_text(TokenId id) const { return texts_.at(static_cast<std::size_t>(id)); }
  TokenType token_type(TokenId id) const { return types_.at(static_cast<std::size_t>(id)); }

 private:
  friend class StreamDecoder;

  struct StringHash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  struct Merge {
    std::uint32_t rank;
    TokenId merged;
  };

  Tokenizer() = default;
  std::optional<std::string> load_tokens(const Vocabulary& vocabulary);
  std::optional<std::string> load_spm(const Vocabulary& vocabulary);
  std::optional<std::string> load_bpe(const Vocabulary& vocabulary);
  void load_specials();

  void encode_text(std::string_view text, bool& after_special, std::vector<TokenId>& out) const;
  void encode_spm(std::string_view text, bool after_special, std::vector<TokenId>& out) const;
  void encode_bpe_word(std::string_view word, std::vector<TokenId>& out) const;
  std::optional<std::pair<std::size_t, TokenId>> special_at(std::string_view text, bool parse_special) const;

  bool is_special(TokenId id) const;
  bool strips_leading_space(const DecodeOptions& options) const {
    return model_ == TokenizerModel::spm && add_space_prefix_ && options.sequence_start;
  }
  // Appends one token's bytes; strip_space carries SentencePiece's leading-space rule across calls.
  void append_piece(TokenId id, bool render_special, bool& strip_space, std::string& out) const;

  TokenizerModel model_ = TokenizerModel::bpe;
  std::vector<std::string> texts_;   // id -> text as stored
  std::vector<TokenType> types_;     // id -> type (normal where the vocabulary has none)
  std::vector<std::string> pieces_;  // id -> the bytes it decodes to (control: its text)
  // Text -> id of the tokens merges may produce (normal and undefined ones; first id wins).
  std::unordered_map<std::string, TokenId, StringHash, std::equal_to<>> text_ids_;
  std::array<TokenId, 256> byte_ids_{};  // byte -> its token (<0xNN> / GPT-2 byte char), -1: none
  std::array<std::vector<TokenId>, 256> specials_by_first_byte_;  // longest first
  std::array<std::vector<TokenId>, 256> added_by_first_byte_;     // the user-defined ones of those
  std::vector<bool> rstrip_;  // id -> it swallows the whitespace after it (Vocabulary::rstrip)
  TokenId bos_ = -1, eos_ = -1, eot_ = -1, unk_ = -1;
  bool add_bos_ = false, add_eos_ = false;
  bool add_space_prefix_ = true;  // SentencePiece's leading space (Vocabulary::add_space_prefix)

  // SentencePiece: rank of each token's score (0 = highest; equal scores share a rank).
  std::vector<std::uint32_t> score_ranks_;

  // Byte-level BPE: (left id << 32 | right id) -> merge; each byte's GPT-2 character.
  std::unordered_map<std::uint64_t, Merge> merges_;
  std::array<std::string, 256> byte_chars_;
  std::optional<PreTokenizer> pre_tokenizer_;
};

// Decodes ids as they are generated and hands back only valid UTF-8: a character split across
// tokens is held back until it is whole; an ill-formed sequence becomes U+FFFD as soon as it
// cannot become valid, and finish() flushes an unfinished one the same way.
class StreamDecoder {
 public:
  // For generated text that continues a prompt, pass sequence_start = false. The tokenizer must
  // outlive the decoder.
  StreamDecoder(const Tokenizer& tokenizer, DecodeOptions options);

  std::string push(TokenId id);
  std::string finish();  // then the decoder starts a new stream

 private:
  std::string take_valid();

  const Tokenizer* tokenizer_;
  DecodeOptions options_;
  bool strip_space_;
  std::string pending_;  // decoded bytes not yet handed back: at most an unfinished character
};

}  // namespace mqlm::model
