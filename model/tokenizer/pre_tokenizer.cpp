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

// Mistral's tekken (Mistral Nemo, v7 and later): words cut where the case changes. llama.cpp's form
// of its tokenizer.json regex, which mqlm follows so that both give the same ids: a capital is a
// letter other than a-z and a small letter one other than A-Z (tokenizer.json: \p{Lu}\p{Lt}\p{Lm}
// \p{Lo}\p{M} and \p{Ll}\p{Lm}\p{Lo}\p{M}). The two agree on ASCII and on caseless scripts; they
// differ on a word of non-ASCII capitals ("ÉCOLE": llama.cpp cuts "É" off) and on combining marks
// (llama.cpp does not take them with the letters).
constexpr std::string_view kTekken =
    R"([^\r\n\p{L}\p{N}]?(?:(?=\p{L})[^a-z])*(?:(?=\p{L})[^A-Z])+|[^\r\n\p{L}\p{N}]?(?:(?=\p{L})[^a-z])+(?:(?=\p{L})[^A-Z])*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// SmolLM's (and StarCoder's): every digit a word of its own first, then GPT-2's regex on the rest.
constexpr std::string_view kDigits = R"(\p{N})";
constexpr std::array kSmolLm = {kDigits, kGpt2};

struct KnownPreTokenizer {
  std::string_view name;
  std::span<const std::string_view> patterns;  // each cuts the words of the one before, as llama.cpp's list
  bool ignore_merges;
};

constexpr std::array kGpt2Only = {kGpt2};
constexpr std::array kLlama3Only = {kLlama3};
constexpr std::array kQwen2Only = {kQwen2};
constexpr std::array kTekkenOnly = {kTekken};

// The tokenizer.ggml.pre values llama.cpp's converter writes for these regexes, those of the
// models mqlm runs (llama.cpp-de3ff81's llama-vocab.cpp). "default" is GPT-2's here (llama.cpp's
// "default" is a legacy mix of regexes).
constexpr std::array kKnown = {
    KnownPreTokenizer{"default", kGpt2Only, false},   KnownPreTokenizer{"gpt2", kGpt2Only, false},
    KnownPreTokenizer{"gpt-2", kGpt2Only, false},     KnownPreTokenizer{"llama-bpe", kLlama3Only, true},
    KnownPreTokenizer{"llama3", kLlama3Only, true},   KnownPreTokenizer{"llama-v3", kLlama3Only, true},
    KnownPreTokenizer{"falcon3", kLlama3Only, true},  KnownPreTokenizer{"pixtral", kLlama3Only, true},
    KnownPreTokenizer{"smaug-bpe", kLlama3Only, false}, KnownPreTokenizer{"dbrx", kLlama3Only, false},
    KnownPreTokenizer{"qwen2", kQwen2Only, false},    KnownPreTokenizer{"deepseek-r1-qwen", kQwen2Only, false},
    KnownPreTokenizer{"megrez", kQwen2Only, false},   KnownPreTokenizer{"stablelm2", kQwen2Only, false},
    KnownPreTokenizer{"tekken", kTekkenOnly, true},   KnownPreTokenizer{"smollm", kSmolLm, false},
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

// One of our patterns, compiled (and JIT-compiled where PCRE2 can).
std::shared_ptr<const pcre2_real_code_8> compile(std::string_view name, std::string_view pattern) {
  int error = 0;
  PCRE2_SIZE error_offset = 0;
  // MATCH_INVALID_UTF: text from users may hold invalid UTF-8; such bytes then match nothing
  // (and become words of their own) instead of making every match fail.
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &error, &error_offset, nullptr);
  if (code == nullptr) {
    // Our own patterns: failing to compile one is a bug, not bad input.
    throw std::logic_error("pre-tokenizer \"" + std::string(name) + "\" does not compile at " +
                           std::to_string(error_offset) + ": " + pcre2_message(error));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // without JIT support, pcre2_match interprets
  return {code, [](const pcre2_real_code_8* c) { pcre2_code_free(const_cast<pcre2_real_code_8*>(c)); }};
}

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
  std::vector<std::shared_ptr<const pcre2_real_code_8>> codes;
  for (std::string_view pattern : known->patterns) codes.push_back(compile(name, pattern));
  return PreTokenizer(std::move(codes), known->ignore_merges);
}

// Cuts `text` by each pattern in turn, the words of one by the next.
void PreTokenizer::split(std::string_view text, std::vector<std::string_view>& words) const {
  const std::size_t first = words.size();
  split_by(*codes_.front(), text, words);
  std::vector<std::string_view> pieces;
  for (std::size_t next = 1; next < codes_.size(); ++next) {
    pieces.assign(words.begin() + static_cast<std::ptrdiff_t>(first), words.end());
    words.resize(first);
    for (std::string_view piece : pieces) split_by(*codes_[next], piece, words);
  }
}

void PreTokenizer::split_by(const pcre2_real_code_8& code, std::string_view text, std::vector<std::string_view>& words) {
  std::unique_ptr<pcre2_match_data, MatchDataDeleter> match(pcre2_match_data_create_from_pattern(&code, nullptr));
  const auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  std::size_t gap_start = 0;  // start of bytes no match has covered yet
  std::size_t from = 0;
  while (from < text.size()) {
    int rc = pcre2_match(&code, subject, text.size(), from, 0, match.get(), nullptr);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
      rc = pcre2_match(&code, subject, text.size(), from, PCRE2_NO_JIT, match.get(), nullptr);
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
