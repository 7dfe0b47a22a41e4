#include "model/tokenizer/tokenizer.hpp"

#include <algorithm>
#include <cctype>
#include <stdexcept>

#include "model/tokenizer/utf8.hpp"

namespace mqlm::model {
namespace {

bool valid_type(TokenType type) {
  return type >= TokenType::undefined && type <= TokenType::byte;
}

}  // namespace

std::variant<Tokenizer, TokenizerError> Tokenizer::create(const Vocabulary& vocabulary) {
  Tokenizer tokenizer;
  tokenizer.model_ = vocabulary.model;
  std::optional<std::string> error = tokenizer.load_tokens(vocabulary);
  if (!error) {
    error = vocabulary.model == TokenizerModel::spm ? tokenizer.load_spm(vocabulary)
                                                    : tokenizer.load_bpe(vocabulary);
  }
  if (error) return TokenizerError{"vocabulary: " + *error};
  tokenizer.load_specials();
  return tokenizer;
}

// Sizes, special ids and flags; what both models share.
std::optional<std::string> Tokenizer::load_tokens(const Vocabulary& v) {
  const std::size_t n = v.tokens.size();
  if (n == 0) return "it has no tokens";
  if (n > static_cast<std::size_t>(INT32_MAX)) return "it has more tokens than ids can number";
  if (!v.scores.empty() && v.scores.size() != n) {
    return std::to_string(v.scores.size()) + " scores for " + std::to_string(n) + " tokens";
  }
  if (!v.types.empty() && v.types.size() != n) {
    return std::to_string(v.types.size()) + " token types for " + std::to_string(n) + " tokens";
  }
  const std::pair<const char*, TokenId> ids[] = {
      {"bos", v.bos}, {"eos", v.eos}, {"eot", v.eot}, {"unk", v.unk}, {"pad", v.pad}};
  for (const auto& [name, id] : ids) {
    if (id < -1 || id >= static_cast<TokenId>(n)) {
      return std::string(name) + " id " + std::to_string(id) + " is outside the " +
             std::to_string(n) + " tokens";
    }
  }
  if (v.add_bos && v.bos < 0) return "add_bos is set but no BOS token is named";
  if (v.add_eos && v.eos < 0) return "add_eos is set but no EOS token is named";
  rstrip_.assign(n, false);
  for (TokenId id : v.rstrip) {
    if (id < 0 || id >= static_cast<TokenId>(n)) return "rstrip token " + std::to_string(id) + " is outside the vocabulary";
    rstrip_[static_cast<std::size_t>(id)] = true;
  }

  texts_ = v.tokens;
  types_ = v.types;
  if (types_.empty()) {
    // Without types, the tokens the vocabulary names as special are still special.
    types_.assign(n, TokenType::normal);
    for (TokenId id : {v.bos, v.eos, v.eot, v.pad}) {
      if (id >= 0) types_[static_cast<std::size_t>(id)] = TokenType::control;
    }
    if (v.unk >= 0) types_[static_cast<std::size_t>(v.unk)] = TokenType::unknown;
  }
  for (std::size_t id = 0; id < n; ++id) {
    if (!valid_type(types_[id])) {
      return "token " + std::to_string(id) + " has type " +
             std::to_string(static_cast<std::int32_t>(types_[id])) + ", not one of 0..6";
    }
  }
  bos_ = v.bos;
  eos_ = v.eos;
  eot_ = v.eot;
  unk_ = v.unk;
  add_bos_ = v.add_bos;
  add_eos_ = v.add_eos;
  add_space_prefix_ = v.add_space_prefix;
  byte_ids_.fill(-1);
  for (std::size_t id = 0; id < n; ++id) {
    const TokenType type = types_[id];
    if (type == TokenType::normal || type == TokenType::undefined) {
      text_ids_.try_emplace(texts_[id], static_cast<TokenId>(id));
    }
  }
  return std::nullopt;
}

bool Tokenizer::is_special(TokenId id) const {
  const TokenType type = types_[static_cast<std::size_t>(id)];
  return type == TokenType::control || type == TokenType::user_defined ||
         type == TokenType::unknown;
}

void Tokenizer::load_specials() {
  for (std::size_t id = 0; id < texts_.size(); ++id) {
    if (!is_special(static_cast<TokenId>(id)) || texts_[id].empty()) continue;
    const auto first = static_cast<unsigned char>(texts_[id][0]);
    specials_by_first_byte_[first].push_back(static_cast<TokenId>(id));
    if (types_[id] == TokenType::user_defined) added_by_first_byte_[first].push_back(static_cast<TokenId>(id));
  }
  for (auto* lists : {&specials_by_first_byte_, &added_by_first_byte_}) {
    for (auto& list : *lists) {
      std::stable_sort(list.begin(), list.end(), [&](TokenId a, TokenId b) {
        return texts_[static_cast<std::size_t>(a)].size() > texts_[static_cast<std::size_t>(b)].size();
      });
    }
  }
}

// The longest special token `text` starts with: (its length, its id). User-defined tokens are
// matched in any text (as Hugging Face's added tokens and llama.cpp's are), control and unknown
// ones only where special tokens are parsed.
std::optional<std::pair<std::size_t, TokenId>> Tokenizer::special_at(std::string_view text, bool parse_special) const {
  const auto& candidates = parse_special ? specials_by_first_byte_ : added_by_first_byte_;
  for (TokenId id : candidates[static_cast<unsigned char>(text[0])]) {
    const std::string& special = texts_[static_cast<std::size_t>(id)];
    if (text.starts_with(special)) return std::pair{special.size(), id};
  }
  return std::nullopt;
}

std::vector<TokenId> Tokenizer::encode(std::string_view text, const EncodeOptions& options) const {
  std::vector<TokenId> out;
  out.reserve(text.size() / 3 + 2);
  if (options.add_special && add_bos_) out.push_back(bos_);
  bool after_special = true;  // the start counts as following a special token
  std::size_t fragment_start = 0;
  for (std::size_t at = 0; at < text.size();) {
    const auto special = special_at(text.substr(at), options.parse_special);
    if (!special) {
      ++at;
      continue;
    }
    encode_text(text.substr(fragment_start, at - fragment_start), after_special, out);
    out.push_back(special->second);
    after_special = true;
    at += special->first;
    if (rstrip_[static_cast<std::size_t>(special->second)]) {
      while (at < text.size() && std::isspace(static_cast<unsigned char>(text[at])) != 0) ++at;
    }
    fragment_start = at;
  }
  encode_text(text.substr(fragment_start), after_special, out);
  if (options.add_special && add_eos_) out.push_back(eos_);
  return out;
}

void Tokenizer::encode_text(std::string_view text, bool& after_special,
                            std::vector<TokenId>& out) const {
  if (text.empty()) return;
  if (model_ == TokenizerModel::spm) {
    encode_spm(text, after_special, out);
  } else {
    std::vector<std::string_view> words;
    pre_tokenizer_->split(text, words);
    for (std::string_view word : words) encode_bpe_word(word, out);
  }
  after_special = false;
}

void Tokenizer::append_piece(TokenId id, bool render_special, bool& strip_space,
                             std::string& out) const {
  if (id < 0 || static_cast<std::size_t>(id) >= texts_.size()) {
    throw std::out_of_range("token id " + std::to_string(id) + " is outside the vocabulary of " +
                            std::to_string(texts_.size()) + " tokens");
  }
  const TokenType type = types_[static_cast<std::size_t>(id)];
  const std::string& piece = pieces_[static_cast<std::size_t>(id)];
  if (type == TokenType::control || type == TokenType::user_defined) {
    if (type == TokenType::user_defined || render_special) out += piece;
    strip_space = model_ == TokenizerModel::spm && add_space_prefix_;  // encode put a space after it
    return;
  }
  const bool text_piece = type == TokenType::normal || type == TokenType::undefined ||
                          type == TokenType::unused;
  std::string_view bytes = piece;
  if (strip_space && text_piece && bytes.starts_with(' ')) bytes.remove_prefix(1);
  strip_space = false;
  out += bytes;
}

std::string Tokenizer::decode(std::span<const TokenId> ids, const DecodeOptions& options) const {
  std::string out;
  bool strip_space = strips_leading_space(options);
  for (TokenId id : ids) append_piece(id, options.render_special, strip_space, out);
  return out;
}

StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, DecodeOptions options)
    : tokenizer_(&tokenizer), options_(options), strip_space_(tokenizer.strips_leading_space(options)) {}

std::string StreamDecoder::push(TokenId id) {
  tokenizer_->append_piece(id, options_.render_special, strip_space_, pending_);
  return take_valid();
}

std::string StreamDecoder::take_valid() {
  std::string out;
  std::size_t at = 0;
  while (at < pending_.size()) {
    const utf8::Scan scan = utf8::scan(std::string_view(pending_).substr(at));
    if (scan.status == utf8::Status::incomplete) break;  // the next token may finish it
    if (scan.status == utf8::Status::complete) {
      out.append(pending_, at, scan.length);
    } else {
      out += utf8::kReplacement;
    }
    at += scan.length;
  }
  pending_.erase(0, at);
  return out;
}

std::string StreamDecoder::finish() {
  std::string out = utf8::to_valid(pending_);
  pending_.clear();
  strip_space_ = tokenizer_->strips_leading_space(options_);
  return out;
}

}  // namespace mqlm::model
