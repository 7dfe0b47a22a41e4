// Small vocabularies in the shapes real GGUF files have, built in code since no model can be
// downloaded: a byte-level BPE one (ids 0..255 are the bytes, so unmerged text encodes to its
// byte values) and SentencePiece ones with scores, with and without byte fallback.
#pragma once

#include <cstdio>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "model/tokenizer/tokenizer.hpp"
#include "model/vocabulary.hpp"

namespace mqlm::model::testing {

// GPT-2's bytes_to_unicode, written out independently of the library's.
inline std::string gpt2_char(unsigned byte) {
  const bool printable = (byte >= 0x21 && byte <= 0x7E) || (byte >= 0xA1 && byte <= 0xAC) || byte >= 0xAE;
  unsigned cp = byte;
  if (!printable) {
    cp = 256;
    for (unsigned b = 0; b < byte; ++b) {
      if (!((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE)) ++cp;
    }
  }
  std::string out;
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return out;
}

// GPT-2 characters of raw text: "Ġthe" for " the".
inline std::string gpt2_text(std::string_view raw) {
  std::string out;
  for (char c : raw) out += gpt2_char(static_cast<unsigned char>(c));
  return out;
}

// Ids of text that no merge touches: its bytes.
inline std::vector<TokenId> byte_ids(std::string_view raw) {
  std::vector<TokenId> ids;
  for (char c : raw) ids.push_back(static_cast<unsigned char>(c));
  return ids;
}

inline std::vector<TokenId> concat(std::initializer_list<std::vector<TokenId>> parts) {
  std::vector<TokenId> all;
  for (const auto& p : parts) all.insert(all.end(), p.begin(), p.end());
  return all;
}

struct BpeIds {
  // Merged tokens, in the order merges produce them.
  static constexpr TokenId he = 256, space_t = 257, space_the = 258, the = 259, n12 = 260,
                           n123 = 261, n45 = 262, n12345 = 263, on = 264, don = 265, quote_t = 266,
                           space_xyz = 267;  // in the vocabulary, but no merge makes it
  static constexpr TokenId begin_of_text = 268, end_of_text = 269, eot = 270, tool = 271,
                           a = 272, a_b = 273;
};

inline Vocabulary byte_level_vocabulary(std::string pre) {
  Vocabulary v;
  v.model = TokenizerModel::bpe;
  v.pre = std::move(pre);
  for (unsigned b = 0; b < 256; ++b) v.tokens.push_back(gpt2_char(b));
  const std::pair<std::string_view, std::string_view> merges[] = {
      {"h", "e"},   {" ", "t"},  {" t", "he"}, {"t", "he"}, {"1", "2"}, {"12", "3"},
      {"4", "5"},   {"123", "45"}, {"o", "n"}, {"d", "on"}, {"'", "t"}};
  for (const auto& [left, right] : merges) {
    v.merges.push_back(gpt2_text(left) + " " + gpt2_text(right));
    v.tokens.push_back(gpt2_text(left) + gpt2_text(right));
  }
  v.tokens.push_back(gpt2_text(" xyz"));
  v.types.assign(v.tokens.size(), TokenType::normal);
  const std::pair<std::string_view, TokenType> specials[] = {
      {"<|begin_of_text|>", TokenType::control}, {"<|end_of_text|>", TokenType::control},
      {"<|eot_id|>", TokenType::control},        {"<tool>", TokenType::user_defined},
      {"<a>", TokenType::control},               {"<a><b>", TokenType::control}};
  for (const auto& [text, type] : specials) {
    v.tokens.emplace_back(text);
    v.types.push_back(type);
  }
  v.bos = BpeIds::begin_of_text;
  v.eos = BpeIds::end_of_text;
  v.eot = BpeIds::eot;
  v.add_bos = true;
  return v;
}

struct SpmIds {
  static constexpr TokenId unk = 0, bos = 1, eos = 2;
  static constexpr TokenId byte0 = 3;  // <0x00>; byte b is byte0 + b
  static constexpr TokenId space = 259, h = 260, e = 261, l = 262, o = 263, w = 264, r = 265,
                           d = 266, ll = 267, he = 268, llo = 269, hello = 270, space_hello = 271,
                           space_w = 272, or_ = 273, space_wor = 274, ld = 275, space_world = 276,
                           space_space = 277, ni = 278;
};

// With byte fallback: <unk>, <s>, </s>, <0x00>..<0xFF>, then pieces whose scores make
// "hello world" merge as ll, he, llo, hello, ▁hello, ▁w, or, ▁wor, ld, ▁world.
inline Vocabulary sentencepiece_vocabulary(bool byte_fallback = true) {
  Vocabulary v;
  v.model = TokenizerModel::spm;
  v.pre = "default";
  auto add = [&](std::string text, float score, TokenType type) {
    v.tokens.push_back(std::move(text));
    v.scores.push_back(score);
    v.types.push_back(type);
  };
  add("<unk>", 0, TokenType::unknown);
  add("<s>", 0, TokenType::control);
  add("</s>", 0, TokenType::control);
  for (unsigned b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    if (byte_fallback) {
      add(name, 0, TokenType::byte);
    } else {
      add(std::string("unused") + name, 0, TokenType::unused);  // keeps the ids the same
    }
  }
  const std::pair<std::string_view, float> pieces[] = {
      {"▁", -10},    {"h", -10},     {"e", -10},     {"l", -10},       {"o", -10},
      {"w", -10},    {"r", -10},     {"d", -10},     {"ll", -1},       {"he", -2},
      {"llo", -3},   {"hello", -4},  {"▁hello", -5}, {"▁w", -6},       {"or", -7},
      {"▁wor", -8},  {"ld", -9},     {"▁world", -9.5f}, {"▁▁", -20},   {"你", -10}};
  for (const auto& [text, score] : pieces) add(std::string(text), score, TokenType::normal);
  v.bos = SpmIds::bos;
  v.eos = SpmIds::eos;
  v.unk = SpmIds::unk;
  v.add_bos = true;
  return v;
}

// Throws what create() refused with (a test that catches nothing fails with it); no gtest here,
// so that the tokenizer fuzzer builds these vocabularies too.
inline Tokenizer make_tokenizer(const Vocabulary& vocabulary) {
  auto made = Tokenizer::create(vocabulary);
  if (auto* error = std::get_if<TokenizerError>(&made)) throw std::runtime_error(error->message);
  return std::get<Tokenizer>(std::move(made));
}

inline std::string creation_error(const Vocabulary& vocabulary) {
  auto made = Tokenizer::create(vocabulary);
  auto* error = std::get_if<TokenizerError>(&made);
  return error ? error->message : std::string("(created)");
}

}  // namespace mqlm::model::testing
