// SentencePiece-style tokenizer (GGUF model "llama"): spaces become "▁", characters merge into
// the highest-scoring vocabulary token, and characters outside the vocabulary fall back to
// byte tokens <0xNN> (or to the unknown token where the vocabulary has none).
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "model/tokenizer/merge_queue.hpp"
#include "model/tokenizer/tokenizer.hpp"
#include "model/tokenizer/utf8.hpp"

namespace mqlm::model {
namespace {

constexpr std::string_view kSpace = "\xE2\x96\x81";  // U+2581 "▁"

// "<0x0A>" -> 10.
std::optional<unsigned char> parse_byte_token(std::string_view text) {
  if (text.size() != 6 || !text.starts_with("<0x") || text[5] != '>') return std::nullopt;
  unsigned value = 0;
  const auto [end, ec] = std::from_chars(text.data() + 3, text.data() + 5, value, 16);
  if (ec != std::errc{} || end != text.data() + 5) return std::nullopt;
  return static_cast<unsigned char>(value);
}

std::string unescape_spaces(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t at = 0; at < text.size();) {
    if (text.substr(at).starts_with(kSpace)) {
      out += ' ';
      at += kSpace.size();
    } else {
      out += text[at++];
    }
  }
  return out;
}

}  // namespace

std::optional<std::string> Tokenizer::load_spm(const Vocabulary& v) {
  const std::size_t n = texts_.size();
  for (std::size_t id = 0; id < n; ++id) {
    const bool typed_byte = types_[id] == TokenType::byte;
    const auto byte = parse_byte_token(texts_[id]);
    if (typed_byte && !byte) {
      return "token " + std::to_string(id) + " \"" + texts_[id] + "\" has type byte but is not <0xNN>";
    }
    // Without token types, a <0xNN> text is taken for a byte token (llama.cpp does the same).
    if (byte && (typed_byte || v.types.empty()) && byte_ids_[*byte] < 0) {
      byte_ids_[*byte] = static_cast<TokenId>(id);
      types_[id] = TokenType::byte;
      text_ids_.erase(texts_[id]);
    }
  }
  if (unk_ < 0) {
    const auto missing = std::find(byte_ids_.begin(), byte_ids_.end(), -1);
    if (missing != byte_ids_.end()) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "<0x%02X>", static_cast<unsigned>(missing - byte_ids_.begin()));
      return std::string("a SentencePiece vocabulary needs byte fallback tokens or an unknown "
                         "token; it has neither ") + hex + " nor unk";
    }
  }

  std::vector<float> scores = v.scores.empty() ? std::vector<float>(n, 0.0f) : v.scores;
  for (std::size_t id = 0; id < n; ++id) {
    if (std::isnan(scores[id])) return "token " + std::to_string(id) + " has a NaN score";
  }
  std::vector<float> distinct = scores;
  std::sort(distinct.begin(), distinct.end(), std::greater<>());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  score_ranks_.resize(n);
  for (std::size_t id = 0; id < n; ++id) {
    const auto at = std::lower_bound(distinct.begin(), distinct.end(), scores[id], std::greater<>());
    score_ranks_[id] = static_cast<std::uint32_t>(at - distinct.begin());
  }

  pieces_.resize(n);
  for (std::size_t id = 0; id < n; ++id) {
    switch (types_[id]) {
      case TokenType::byte:
        pieces_[id] = std::string(1, static_cast<char>(*parse_byte_token(texts_[id])));
        break;
      case TokenType::unknown:
        pieces_[id] = utf8::kReplacement;  // it stands for text the vocabulary cannot spell
        break;
      case TokenType::control:
      case TokenType::user_defined:
        pieces_[id] = texts_[id];
        break;
      default:
        pieces_[id] = unescape_spaces(texts_[id]);
    }
  }
  return std::nullopt;
}

void Tokenizer::encode_spm(std::string_view text, bool after_special,
                           std::vector<TokenId>& out) const {
  std::string escaped;
  escaped.reserve(text.size() + 8);
  if (after_special && add_space_prefix_) escaped += kSpace;
  for (char c : text) {
    if (c == ' ') {
      escaped += kSpace;
    } else {
      escaped += c;
    }
  }
  const std::string_view all = escaped;

  std::vector<merging::Symbol> symbols;
  for (std::size_t at = 0; at < all.size();) {
    const std::size_t length = utf8::symbol_length(all.substr(at));
    const auto found = text_ids_.find(all.substr(at, length));
    symbols.push_back({.start = at, .length = length, .id = found == text_ids_.end() ? -1 : found->second});
    at += length;
  }
  merging::link(symbols);
  merging::merge_symbols(symbols, [&](const merging::Symbol& l, const merging::Symbol& r)
                                      -> std::optional<merging::PairMerge> {
    const auto found = text_ids_.find(all.substr(l.start, l.length + r.length));
    if (found == text_ids_.end()) return std::nullopt;
    return merging::PairMerge{score_ranks_[static_cast<std::size_t>(found->second)], found->second};
  });
  merging::for_each_live(symbols, [&](const merging::Symbol& s) {
    if (s.id >= 0) {
      out.push_back(s.id);
      return;
    }
    const std::string_view bytes = all.substr(s.start, s.length);
    const bool all_bytes = std::all_of(bytes.begin(), bytes.end(), [&](char b) {
      return byte_ids_[static_cast<unsigned char>(b)] >= 0;
    });
    if (!all_bytes) {
      out.push_back(unk_);
      return;
    }
    for (char b : bytes) out.push_back(byte_ids_[static_cast<unsigned char>(b)]);
  });
}

}  // namespace mqlm::model
