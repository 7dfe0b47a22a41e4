// Byte-level BPE (GGUF model "gpt2"): the pre-tokenizer cuts text into words, each word's bytes
// start as the tokens of GPT-2's byte characters, and pairs merge by the rank of their merge.
#include <cstdio>
#include <unordered_map>

#include "model/tokenizer/merge_queue.hpp"
#include "model/tokenizer/tokenizer.hpp"
#include "model/tokenizer/utf8.hpp"

namespace mqlm::model {
namespace {

// GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the others (controls,
// space, 0x7F-0xA0, 0xAD) for U+0100 onwards in byte order, so every token text is printable.
std::array<char32_t, 256> gpt2_byte_code_points() {
  std::array<char32_t, 256> table{};
  char32_t next = 256;
  for (unsigned b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    table[b] = printable ? b : next++;
  }
  return table;
}

std::string hex_byte(unsigned byte) {
  char hex[8];
  std::snprintf(hex, sizeof hex, "0x%02X", byte);
  return hex;
}

// Back from GPT-2's characters to the bytes they stand for; a character outside the table (or an
// invalid byte) is kept as written.
std::string bytes_of_gpt2_text(std::string_view text,
                               const std::unordered_map<char32_t, unsigned char>& byte_of) {
  std::string bytes;
  for (std::size_t at = 0; at < text.size();) {
    const std::size_t length = utf8::symbol_length(text.substr(at));
    const std::string_view ch = text.substr(at, length);
    at += length;
    if (length == 1 && static_cast<unsigned char>(ch[0]) >= 0x80) {
      bytes += ch;  // invalid UTF-8: not one of GPT-2's characters
      continue;
    }
    char32_t cp = static_cast<unsigned char>(ch[0]) & (length == 1 ? 0x7F : 0xFF >> (length + 1));
    for (std::size_t i = 1; i < length; ++i) cp = (cp << 6) | (static_cast<unsigned char>(ch[i]) & 0x3F);
    const auto byte = byte_of.find(cp);
    if (byte != byte_of.end()) {
      bytes += static_cast<char>(byte->second);
    } else {
      bytes += ch;
    }
  }
  return bytes;
}

}  // namespace

std::optional<std::string> Tokenizer::load_bpe(const Vocabulary& v) {
  const std::size_t n = texts_.size();
  std::unordered_map<std::string_view, TokenId> any_ids;  // every token, first id wins
  for (std::size_t id = 0; id < n; ++id) any_ids.try_emplace(texts_[id], static_cast<TokenId>(id));

  const auto code_points = gpt2_byte_code_points();
  std::unordered_map<char32_t, unsigned char> byte_of;
  for (unsigned b = 0; b < 256; ++b) {
    byte_chars_[b].clear();
    utf8::append_code_point(byte_chars_[b], code_points[b]);
    byte_of[code_points[b]] = static_cast<unsigned char>(b);
    const auto found = any_ids.find(byte_chars_[b]);
    if (found == any_ids.end()) {
      return "a byte-level BPE vocabulary needs a token for each of the 256 bytes; byte " +
             hex_byte(b) + " (\"" + byte_chars_[b] + "\") has none";
    }
    byte_ids_[b] = found->second;
  }

  for (std::size_t rank = 0; rank < v.merges.size(); ++rank) {
    const std::string& merge = v.merges[rank];
    const std::size_t space = merge.size() < 2 ? std::string::npos : merge.find(' ', 1);
    const auto where = [&] { return "merge " + std::to_string(rank) + " \"" + merge + "\""; };
    if (space == std::string::npos) return where() + " is not \"left right\"";
    const std::string_view left = std::string_view(merge).substr(0, space);
    const std::string_view right = std::string_view(merge).substr(space + 1);
    const std::string joined = std::string(left) + std::string(right);
    for (std::string_view part : {left, right, std::string_view(joined)}) {
      if (!any_ids.contains(part)) return where() + " names \"" + std::string(part) + "\", not a token";
    }
    const std::uint64_t key = (std::uint64_t{static_cast<std::uint32_t>(any_ids[left])} << 32) |
                              static_cast<std::uint32_t>(any_ids[right]);
    merges_.try_emplace(key, Merge{static_cast<std::uint32_t>(rank), any_ids[joined]});
  }

  auto pre = PreTokenizer::create(v.pre);
  if (auto* error = std::get_if<PreTokenizerError>(&pre)) return error->message;
  pre_tokenizer_ = std::get<PreTokenizer>(std::move(pre));

  pieces_.resize(n);
  for (std::size_t id = 0; id < n; ++id) {
    const TokenType type = types_[id];
    if (type == TokenType::control || type == TokenType::user_defined) {
      pieces_[id] = texts_[id];  // added tokens are stored as they read, not byte-encoded
      continue;
    }
    if (type == TokenType::unknown) {
      pieces_[id] = utf8::kReplacement;
      continue;
    }
    pieces_[id] = bytes_of_gpt2_text(texts_[id], byte_of);
  }
  return std::nullopt;
}

void Tokenizer::encode_bpe_word(std::string_view word, std::vector<TokenId>& out) const {
  if (pre_tokenizer_->ignore_merges()) {
    std::string chars;
    for (char b : word) chars += byte_chars_[static_cast<unsigned char>(b)];
    if (const auto found = text_ids_.find(chars); found != text_ids_.end()) {
      out.push_back(found->second);
      return;
    }
  }
  std::vector<merging::Symbol> symbols(word.size());
  for (std::size_t i = 0; i < word.size(); ++i) {
    symbols[i].start = i;
    symbols[i].length = 1;
    symbols[i].id = byte_ids_[static_cast<unsigned char>(word[i])];
  }
  merging::link(symbols);
  merging::merge_symbols(symbols, [&](const merging::Symbol& l, const merging::Symbol& r)
                                      -> std::optional<merging::PairMerge> {
    const std::uint64_t key =
        (std::uint64_t{static_cast<std::uint32_t>(l.id)} << 32) | static_cast<std::uint32_t>(r.id);
    const auto found = merges_.find(key);
    if (found == merges_.end()) return std::nullopt;
    return merging::PairMerge{found->second.rank, found->second.merged};
  });
  merging::for_each_live(symbols, [&](const merging::Symbol& s) { out.push_back(s.id); });
}

}  // namespace mqlm::model
