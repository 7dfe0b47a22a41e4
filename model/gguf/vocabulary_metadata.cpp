#include "model/gguf/vocabulary_metadata.hpp"

#include <algorithm>
#include <cctype>

#include <fmt/format.h>

namespace mqlm::model::gguf {

namespace {

constexpr std::string_view kModel = "tokenizer.ggml.model";
constexpr std::string_view kPre = "tokenizer.ggml.pre";
constexpr std::string_view kTokens = "tokenizer.ggml.tokens";
constexpr std::string_view kScores = "tokenizer.ggml.scores";
constexpr std::string_view kTypes = "tokenizer.ggml.token_type";
constexpr std::string_view kMerges = "tokenizer.ggml.merges";
constexpr std::string_view kAddBos = "tokenizer.ggml.add_bos_token";
constexpr std::string_view kAddEos = "tokenizer.ggml.add_eos_token";
constexpr std::string_view kAddSpacePrefix = "tokenizer.ggml.add_space_prefix";
constexpr std::string_view kChatTemplate = "tokenizer.chat_template";

struct SpecialId {
  std::string_view key;
  std::int32_t Vocabulary::*field;
};
constexpr SpecialId kSpecialIds[] = {
    {"tokenizer.ggml.bos_token_id", &Vocabulary::bos},     {"tokenizer.ggml.eos_token_id", &Vocabulary::eos},
    {"tokenizer.ggml.eot_token_id", &Vocabulary::eot},     {"tokenizer.ggml.unknown_token_id", &Vocabulary::unk},
    {"tokenizer.ggml.padding_token_id", &Vocabulary::pad},
};

GgufError at_key(const GgufFile& file, std::string_view key, std::string detail) {
  return GgufError{file.find(key)->offset, std::string(key) + ": " + std::move(detail)};
}

// One entry per token when present; an error when of another type or size.
template <typename T>
std::optional<GgufError> read_per_token(const GgufFile& file, std::string_view key, std::string_view expected,
                                        std::size_t tokens, std::vector<T>& out) {
  if (file.find(key) == nullptr) return std::nullopt;
  const auto* values = file.get_array<T>(key);
  if (values == nullptr) return file.key_error(key, expected);
  if (values->size() != tokens) {
    return at_key(file, key, fmt::format("{} entries for {} tokens", values->size(), tokens));
  }
  out = *values;
  return std::nullopt;
}

std::optional<GgufError> read_types(const GgufFile& file, Vocabulary& vocabulary) {
  std::vector<std::int32_t> types;
  if (auto error = read_per_token(file, kTypes, "an array of i32", vocabulary.tokens.size(), types)) return error;
  vocabulary.types.reserve(types.size());
  for (std::size_t id = 0; id < types.size(); ++id) {
    if (types[id] < 0 || types[id] > static_cast<std::int32_t>(TokenType::byte)) {
      return at_key(file, kTypes, fmt::format("token {} has type {} (0 to 6 defined)", id, types[id]));
    }
    vocabulary.types.push_back(static_cast<TokenType>(types[id]));
  }
  return std::nullopt;
}

std::optional<GgufError> read_merges(const GgufFile& file, Vocabulary& vocabulary) {
  if (file.find(kMerges) == nullptr) {
    if (vocabulary.model == TokenizerModel::bpe) return file.key_error(kMerges, "an array of strings");
    return std::nullopt;
  }
  const auto* merges = file.get_array<std::string>(kMerges);
  if (merges == nullptr) return file.key_error(kMerges, "an array of strings");
  for (std::size_t rank = 0; rank < merges->size(); ++rank) {
    const std::string& merge = (*merges)[rank];
    auto space = merge.find(' ', 1);
    if (space == std::string::npos || space + 1 >= merge.size()) {
      return at_key(file, kMerges, fmt::format("merge {} is not two parts separated by a space", rank));
    }
  }
  vocabulary.merges = *merges;
  return std::nullopt;
}

std::optional<GgufError> read_special_ids(const GgufFile& file, Vocabulary& vocabulary) {
  for (const auto& special : kSpecialIds) {
    if (file.find(special.key) == nullptr) continue;
    auto id = file.get_int(special.key);
    if (!id) return file.key_error(special.key, "an integer token id");
    if (*id == -1) continue;  // some writers say "none" so
    if (*id < 0 || static_cast<std::uint64_t>(*id) >= vocabulary.tokens.size()) {
      return at_key(file, special.key,
                    fmt::format("token id {} is outside the vocabulary of {} tokens", *id, vocabulary.tokens.size()));
    }
    vocabulary.*special.field = static_cast<std::int32_t>(*id);
  }
  return std::nullopt;
}

// Without add_bos_token, llama.cpp adds BOS for SentencePiece and for these pre-tokenizers of
// byte-level BPE (Llama 3's family and Mistral's tekken).
bool adds_bos_by_default(const Vocabulary& vocabulary) {
  constexpr std::string_view kBosPre[] = {"llama-bpe", "llama3", "llama-v3", "falcon3", "pixtral", "tekken"};
  return vocabulary.model == TokenizerModel::spm ||
         std::find(std::begin(kBosPre), std::end(kBosPre), vocabulary.pre) != std::end(kBosPre);
}

std::optional<GgufError> read_flags(const GgufFile& file, Vocabulary& vocabulary) {
  vocabulary.add_bos = adds_bos_by_default(vocabulary);
  vocabulary.add_eos = false;
  for (auto [key, field] : {std::pair{kAddBos, &Vocabulary::add_bos}, std::pair{kAddEos, &Vocabulary::add_eos},
                            std::pair{kAddSpacePrefix, &Vocabulary::add_space_prefix}}) {
    if (file.find(key) == nullptr) continue;
    auto flag = file.get_bool(key);
    if (!flag) return file.key_error(key, "a bool");
    vocabulary.*field = *flag;
  }
  return std::nullopt;
}

// llama.cpp's rule (llama-vocab.cpp): in a model whose general.name says Phi-3, every special
// token and </s> swallow the whitespace after them, but <unk>, <s> and <|endoftext|>.
void mark_phi3_rstrip(const GgufFile& file, Vocabulary& vocabulary) {
  std::string name(file.get_string("general.name").value_or(""));
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
  if (name.find("phi3") == std::string::npos && name.find("phi-3") == std::string::npos) return;
  for (std::size_t id = 0; id < vocabulary.tokens.size(); ++id) {
    const std::string& text = vocabulary.tokens[id];
    const TokenType type = vocabulary.types.empty() ? TokenType::normal : vocabulary.types[id];
    const bool special = type == TokenType::control || type == TokenType::user_defined || type == TokenType::unknown;
    if ((special || text == "</s>") && text != "<unk>" && text != "<s>" && text != "<|endoftext|>") {
      vocabulary.rstrip.push_back(static_cast<std::int32_t>(id));
    }
  }
}

}  // namespace

GgufResult<Vocabulary> read_vocabulary(const GgufFile& file) {
  Vocabulary vocabulary;
  auto model = file.get_string(kModel);
  if (!model) return file.key_error(kModel, "a string (\"llama\" or \"gpt2\")");
  if (*model == "llama") {
    vocabulary.model = TokenizerModel::spm;
  } else if (*model == "gpt2") {
    vocabulary.model = TokenizerModel::bpe;
  } else {
    return at_key(file, kModel, fmt::format("tokenizer model \"{}\" is not supported (\"llama\" and \"gpt2\" are)",
                                            model->substr(0, 40)));
  }
  if (file.find(kPre) != nullptr) {
    auto pre = file.get_string(kPre);
    if (!pre) return file.key_error(kPre, "a string");
    vocabulary.pre = *pre;
  }
  const auto* tokens = file.get_array<std::string>(kTokens);
  if (tokens == nullptr) return file.key_error(kTokens, "an array of strings");
  if (tokens->empty()) return at_key(file, kTokens, "the vocabulary is empty");
  if (tokens->size() > static_cast<std::size_t>(INT32_MAX)) return at_key(file, kTokens, "more tokens than ids");
  vocabulary.tokens = *tokens;
  if (auto error = read_per_token(file, kScores, "an array of f32", tokens->size(), vocabulary.scores)) return *error;
  if (auto error = read_types(file, vocabulary)) return *error;
  if (auto error = read_merges(file, vocabulary)) return *error;
  if (auto error = read_special_ids(file, vocabulary)) return *error;
  if (auto error = read_flags(file, vocabulary)) return *error;
  if (file.find(kChatTemplate) != nullptr) {
    auto chat_template = file.get_string(kChatTemplate);
    if (!chat_template) return file.key_error(kChatTemplate, "a string");
    vocabulary.chat_template = *chat_template;
  }
  mark_phi3_rstrip(file, vocabulary);
  return vocabulary;
}

void write_vocabulary(GgufWriter& writer, const Vocabulary& vocabulary) {
  writer.set(std::string(kModel), std::string(vocabulary.model == TokenizerModel::spm ? "llama" : "gpt2"));
  writer.set(std::string(kPre), vocabulary.pre);
  writer.set(std::string(kTokens), MetadataArray{vocabulary.tokens});
  if (!vocabulary.scores.empty()) writer.set(std::string(kScores), MetadataArray{vocabulary.scores});
  if (!vocabulary.types.empty()) {
    std::vector<std::int32_t> types;
    for (auto type : vocabulary.types) types.push_back(static_cast<std::int32_t>(type));
    writer.set(std::string(kTypes), MetadataArray{std::move(types)});
  }
  if (!vocabulary.merges.empty()) writer.set(std::string(kMerges), MetadataArray{vocabulary.merges});
  for (const auto& special : kSpecialIds) {
    std::int32_t id = vocabulary.*special.field;
    if (id >= 0) writer.set(std::string(special.key), static_cast<std::uint32_t>(id));
  }
  writer.set(std::string(kAddBos), vocabulary.add_bos);
  writer.set(std::string(kAddEos), vocabulary.add_eos);
  if (vocabulary.model == TokenizerModel::spm && !vocabulary.add_space_prefix) {
    writer.set(std::string(kAddSpacePrefix), false);
  }
  if (!vocabulary.chat_template.empty()) writer.set(std::string(kChatTemplate), vocabulary.chat_template);
}

}  // namespace mqlm::model::gguf
