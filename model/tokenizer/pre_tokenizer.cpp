#define PCRE2_CODE_UNIT_WIDTH 8
#include "model/tokenizer/pre_tokenizer.hpp"

#include <pcre2.h>

#include <array>
#include <stdexcept>

namespace mqlm::model {
namespace {

// GPT-2's pattern (openai/gpt-2 encoder.py), trailing \s+ included so that whitespace before a
// word is never left unmatched.
constexpr std::string_view kGpt2 =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Llama 3's tokenizer.json: contractions in any case, a non-letter may lead a run of letters,
// numbers in groups of up to three digits, newlines kept with the punctuation before them.
constexpr std::string_view kLlama3 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Qwen2's tokenizer.json: Llama 3's with every digit a word of its own.
constexpr std::string_view kQwen2 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

struct KnownPreTokenizer {
  std::string_view name;
  std::string_view pattern;
  bool ignore_merges;
};

// The tokenizer.ggml.pre values llama.cpp's converter writes for these three regexes.
// "default" is GPT-2's here (llama.cpp's "default" is a legacy mix of regexes).
constexpr std::array kKnown = {
    KnownPreTokenizer{"default", kGpt2, false},   KnownPreTokenizer{"gpt2", kGpt2, false},
    KnownPreTokenizer{"gpt-2", kGpt2, false},     KnownPreTokenizer{"llama-bpe", kLlama3, true},
    KnownPreTokenizer{"llama3", kLlama3, true},   KnownPreTokenizer{"llama-v3", kLlama3, true},
    KnownPreTokenizer{"falcon3", kLlama3, true},  KnownPreTokenizer{"smaug-bpe", kLlama3, false},
    KnownPreTokenizer{"dbrx", kLlama3, false},    KnownPreTokenizer{"qwen2", kQwen2, false},
    KnownPreTokenizer{"deepseek-r1-qwen", kQwen2, false},
    KnownPreTokenizer{"stablelm2", kQwen2, false},
};

constexpr auto kKnownNames = [] {
  std::array<std::string_view, kKnown.size()> names{};
  for (std::size_t i = 0; i < kKnown.size(); ++i) names[i] = kKnown[i].name;
  return names;
}();

std::string pcre2_message(int code) {
  std::array<PCRE2_UCHAR, 256> buffer{};
  pcre2_get_error_message(code, buffer.data(), buffer.size());
  return reinterpret_cast<const char*>(buffer.data());
}

struct MatchDataDeleter {
  void operator()(pcre2_match_data* data) const { pcre2_match_data_free(data); }
};

}  // namespace

std::span<const std::string_view> PreTokenizer::known_names() { return kKnownNames; }

std::variant<PreTokenizer, PreTokenizerError> PreTokenizer::create(std::string_view name) {
  const KnownPreTokenizer* known = nullptr;
  for (const auto& k : kKnown) {
    if (k.name == name) known = &k;
  }
  if (known == nullptr) {
    std::string list;
    for (auto n : kKnownNames) list += (list.empty() ? "" : ", ") + std::string(n);
    return PreTokenizerError{"unknown pre-tokenizer \"" + std::string(name) +
                             "\" (tokenizer.ggml.pre); known: " + list};
  }
  int error = 0;
  PCRE2_SIZE error_offset = 0;
  // MATCH_INVALID_UTF: text from users may hold invalid UTF-8; such bytes then match nothing
  // (and become words of their own) instead of making every match fail.
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(known->pattern.data()),
                                   known->pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &error,
                                   &error_offset, nullptr);
  if (code == nullptr) {
    // Our own patterns: failing to compile one is a bug, not bad input.
    throw std::logic_error("pre-tokenizer \"" + std::string(name) + "\" does not compile at " +
                           std::to_string(error_offset) + ": " + pcre2_message(error));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // without JIT support, pcre2_match interprets
  std::shared_ptr<const pcre2_real_code_8> shared(
      code, [](const pcre2_real_code_8* c) { pcre2_code_free(const_cast<pcre2_real_code_8*>(c)); });
  return PreTokenizer(std::move(shared), known->ignore_merges);
}

void PreTokenizer::split(std::string_view text, std::vector<std::string_view>& words) const {
  std::unique_ptr<pcre2_match_data, MatchDataDeleter> match(
      pcre2_match_data_create_from_pattern(code_.get(), nullptr));
  const auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  std::size_t gap_start = 0;  // start of bytes no match has covered yet
  std::size_t from = 0;
  while (from < text.size()) {
    int rc = pcre2_match(code_.get(), subject, text.size(), from, 0, match.get(), nullptr);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
      rc = pcre2_match(code_.get(), subject, text.size(), from, PCRE2_NO_JIT, match.get(), nullptr);
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      throw std::runtime_error("pre-tokenizer failed at byte " + std::to_string(from) + ": " +
                               pcre2_message(rc));
    }
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match.get());
    const std::size_t start = ovector[0], end = ovector[1];
    if (end == start) {  // none of our patterns matches empty; never loop on one that does
      from = start + 1;
      continue;
    }
    if (start > gap_start) words.push_back(text.substr(gap_start, start - gap_start));
    words.push_back(text.substr(start, end - start));
    gap_start = from = end;
  }
  if (gap_start < text.size()) words.push_back(text.substr(gap_start));
}

}  // namespace mqlm::model
