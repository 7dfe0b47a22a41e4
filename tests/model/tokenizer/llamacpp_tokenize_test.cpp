// mqlm's tokenizers against llama.cpp's llama_tokenize (the oracle) on the same GGUF files.
//
// make-model writes a file of each architecture with each vocabulary kind its family uses (byte-level
// BPE under Llama 3's, Qwen2's and GPT-2's pre-tokenizers, with merges learnt from English text, and
// again with merges across the corpus, which tell any two cuts of a word apart; Gemma's and
// Phi-3's SentencePiece vocabularies); llama.cpp loads its vocabulary alone and mqlm reads the
// same file. Each string of a corpus of hard ones (whitespace runs, digits, contractions,
// CJK, Arabic, emoji, code, special tokens written in the text) is tokenized by both, with BOS / EOS
// added as the vocabulary asks, and with special tokens parsed and not: the ids are equal.
#include <gtest/gtest.h>

#include <llama-cpp.h>
#include <llama.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "model/gguf/synthetic_model.hpp"
#include "model/gguf/vocabulary_metadata.hpp"
#include "model/tokenizer/tokenizer.hpp"
#include "tests/oracle/llamacpp.hpp"

// llama.cpp's pre-tokenizer (src/unicode.h; libllama exports it).
std::vector<std::string> unicode_regex_split(const std::string& text, const std::vector<std::string>& regex_exprs,
                                             bool byte_encode);

namespace mqlm::model {
namespace {

using gguf::VocabularyKind;

// Hard strings: what regexes, merges and SentencePiece's spaces disagree on when they are wrong.
const std::vector<std::string> kCorpus = {
    "",
    " ",
    "Hello world",
    " Hello world",
    "Hello  world   again    and\tagain\t\ttabs",
    "trailing spaces   ",
    "   leading spaces",
    "line one\nline two\n\nline four\n\n\n\nend",
    "windows\r\nline\r\n\r\nends",
    " \n \n\t \n",
    "1 12 123 1234 12345 1234567890",
    "3.14159 and 1,000,000 and -42 and 0x1F and 2024-05-17 09:30",
    "I'm sure you're right, he'll say it's what they've done; she'd go. I'M SURE YOU'RE. O'Neil's",
    "don't DON'T Don'T 'tis ''quoted'' ' s",
    "你好，世界！这是一个测试。",
    "日本語のテキストとカタカナ、ひらがな。",
    "한국어 텍스트입니다",
    "مرحبا بالعالم، كيف حالك؟ ١٢٣٤",
    "Emoji: 👋🏽 👨‍👩‍👧 🇫🇷 ❤️ 🤖🤖🤖",
    "Ünïcödé àccents: naïve café résumé, combining e\xCC\x81 and Ελληνικά and русский",
    "for (int i = 0; i < n; ++i) {\n    x += i * 2;\n}\n",
    "def f(x):\n\treturn x**2  # square\n\nprint(f(3))",
    "<html><body><table><tr><td>cell</td></tr></table></body></html>",
    "camelCaseWords HTTPServer XMLHttpRequest getHTTPResponseCode iPhone",
    "ÉCOLE École éCOLE ΑΘΗΝΑ Αθήνα МОСКВА Москва ǅemal Ǆ",
    "MixedCASE and ALLCAPS and lowercase and Title Case",
    "a/b/c path/to/file.txt https://example.com/a?b=c&d=e",
    "!!! ??? ... --- *** ### @@@ $$$ %%% ^^^ &&& (((  )))",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>",
    "<s> text</s> <unk>",
    "<bos><start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\n",
    "<|user|>\nWhat is 2+2?<|end|>\n<|assistant|>\n  4<|end|>  \n<|endoftext|>",
    "The quick brown fox jumps over the lazy dog.",
};

// A file of one architecture with one vocabulary; `name` is general.name (llama.cpp gives Phi-3's
// special tokens their attributes by it). With `corpus_merges`, the byte-level vocabulary also
// merges across every boundary a pre-tokenizer may draw in the corpus (corpus_merged below): make-
// model's merges, learnt from English words, leave most of the corpus in single bytes, where a
// word cut in another place than llama.cpp cuts it gives the same ids.
struct VocabularyCase {
  const char* label;
  const char* arch;
  VocabularyKind kind;
  const char* name = "mqlm tiny";
  bool corpus_merges = false;
};
constexpr VocabularyCase kCases[] = {
    {"llama_llama_bpe", "llama", VocabularyKind::llama_bpe},
    {"llama_gpt2", "llama", VocabularyKind::gpt2},
    {"qwen2_qwen2", "qwen2", VocabularyKind::qwen2},
    {"qwen3_qwen2", "qwen3", VocabularyKind::qwen2},
    {"gemma2_gemma", "gemma2", VocabularyKind::gemma},
    {"gemma3_gemma", "gemma3", VocabularyKind::gemma},
    {"phi3_phi3", "phi3", VocabularyKind::phi3, "mqlm phi3-mini"},
    {"phi3_llama_bpe", "phi3", VocabularyKind::llama_bpe, "mqlm phi3-mini"},
    {"llama_bpe_corpus_merges", "llama", VocabularyKind::llama_bpe, "mqlm tiny", true},
    {"gpt2_corpus_merges", "llama", VocabularyKind::gpt2, "mqlm tiny", true},
    {"qwen2_corpus_merges", "qwen2", VocabularyKind::qwen2, "mqlm tiny", true},
    {"llama_tekken", "llama", VocabularyKind::tekken},  // Mistral Nemo's
    {"tekken_corpus_merges", "llama", VocabularyKind::tekken, "mqlm tiny", true},
    {"llama_smollm", "llama", VocabularyKind::smollm},
    {"smollm_corpus_merges", "llama", VocabularyKind::smollm, "mqlm tiny", true},
};

void PrintTo(const VocabularyCase& c, std::ostream* out) { *out << c.label; }

// The kind's vocabulary with merges learnt from the corpus itself, nothing cut first, after its own:
// the most frequent adjacent pair (ties: the first in order) merged everywhere, again and again,
// until every string of the corpus is one token.
Vocabulary corpus_merged(VocabularyKind kind) {
  Vocabulary v = gguf::make_vocabulary(kind, 1024);
  std::set<std::string> known(v.tokens.begin(), v.tokens.end());
  std::vector<std::vector<std::string>> strings;
  for (const std::string& text : kCorpus) {
    std::vector<std::string> symbols;
    for (char byte : text) symbols.push_back(gguf::byte_to_unicode(static_cast<std::uint8_t>(byte)));
    strings.push_back(std::move(symbols));
  }
  for (;;) {
    std::map<std::pair<std::string, std::string>, int> pairs;
    for (const auto& symbols : strings) {
      for (std::size_t k = 0; k + 1 < symbols.size(); ++k) ++pairs[{symbols[k], symbols[k + 1]}];
    }
    if (pairs.empty()) break;
    const auto [left, right] = std::ranges::max_element(pairs, {}, [](const auto& p) { return p.second; })->first;
    for (auto& symbols : strings) {
      std::vector<std::string> merged;
      for (std::size_t k = 0; k < symbols.size(); ++k) {
        const bool match = k + 1 < symbols.size() && symbols[k] == left && symbols[k + 1] == right;
        merged.push_back(match ? left + right : symbols[k]);
        k += match ? 1 : 0;
      }
      symbols = std::move(merged);
    }
    v.merges.push_back(left + " " + right);
    if (known.insert(left + right).second) {
      v.tokens.push_back(left + right);
      v.types.push_back(TokenType::normal);
    }
  }
  return v;
}

// A folder of this process's own, removed with everything in it.
class ScratchFolder : public mqlm::testing::ScratchFolder {
 public:
  ScratchFolder() : mqlm::testing::ScratchFolder("mqlm_llamacpp_tokenize") {}
};

// A small model of the case's architecture and vocabulary (one layer: only its vocabulary is read).
std::filesystem::path write_file(const ScratchFolder& folder, const VocabularyCase& c) {
  gguf::ModelShape shape;
  shape.arch = c.arch;
  shape.layers = 1;
  shape.vocabulary = c.kind;
  shape.tied_embeddings = true;
  std::optional<Vocabulary> merged;
  if (c.corpus_merges) {
    merged = corpus_merged(c.kind);
    shape.vocab = static_cast<std::uint32_t>(merged->tokens.size());
  }
  gguf::SyntheticModel model = gguf::make_synthetic_model(shape, gpu::WeightType::f32, 7, c.name);
  if (merged) gguf::write_vocabulary(model.writer, *merged);  // in place of make-model's
  const auto path = folder / fmt::format("{}.gguf", c.label);
  if (auto error = model.writer.write(path)) {
    throw std::runtime_error(error->message());
  }
  return path;
}

Tokenizer mqlm_tokenizer(const std::filesystem::path& path) {
  auto opened = gguf::GgufFile::open(path);
  if (auto* error = std::get_if<gguf::GgufError>(&opened)) throw std::runtime_error(error->message());
  auto vocabulary = gguf::read_vocabulary(std::get<gguf::GgufFile>(opened));
  if (auto* error = std::get_if<gguf::GgufError>(&vocabulary)) throw std::runtime_error(error->message());
  auto tokenizer = Tokenizer::create(std::get<Vocabulary>(vocabulary));
  if (auto* error = std::get_if<TokenizerError>(&tokenizer)) throw std::runtime_error(error->message);
  return std::get<Tokenizer>(std::move(tokenizer));
}

// The file's vocabulary in llama.cpp (no weights loaded).
llama_model_ptr llamacpp_vocabulary(const std::filesystem::path& path) {
  auto params = llama_model_default_params();
  params.vocab_only = true;
  llama_model_ptr model(llama_model_load_from_file(path.c_str(), params));
  if (!model) throw std::runtime_error("llama.cpp cannot load " + path.string());
  return model;
}

std::vector<TokenId> llamacpp_tokenize(const llama_vocab* vocab, std::string_view text, bool add_special,
                                       bool parse_special) {
  std::vector<llama_token> ids(text.size() + 8);
  const auto length = static_cast<std::int32_t>(text.size());
  std::int32_t n = llama_tokenize(vocab, text.data(), length, ids.data(), static_cast<std::int32_t>(ids.size()),
                                  add_special, parse_special);
  if (n < 0) {
    ids.resize(static_cast<std::size_t>(-n));
    n = llama_tokenize(vocab, text.data(), length, ids.data(), -n, add_special, parse_special);
  }
  ids.resize(static_cast<std::size_t>(n));
  return ids;
}

class LlamaCppTokenize : public ::testing::TestWithParam<VocabularyCase> {};

TEST_P(LlamaCppTokenize, IdsEqualLlamaTokenizeOnHardStrings) {
  const VocabularyCase& c = GetParam();
  mqlm::testing::start_llamacpp();
  ScratchFolder folder;
  const auto path = write_file(folder, c);
  const Tokenizer ours = mqlm_tokenizer(path);
  const llama_model_ptr theirs = llamacpp_vocabulary(path);
  const llama_vocab* vocab = llama_model_get_vocab(theirs.get());
  ASSERT_EQ(static_cast<std::size_t>(llama_vocab_n_tokens(vocab)), ours.size());
  int compared = 0, differing = 0;
  for (const std::string& text : kCorpus) {
    for (bool add_special : {true, false}) {
      for (bool parse_special : {false, true}) {
        const auto want = llamacpp_tokenize(vocab, text, add_special, parse_special);
        const auto got = ours.encode(text, {.add_special = add_special, .parse_special = parse_special});
        ++compared;
        if (got == want) continue;
        ++differing;
        ADD_FAILURE() << fmt::format("{} {:?} (add_special {}, parse_special {}):\n  llama.cpp {}\n  mqlm      {}",
                                     c.label, text, add_special, parse_special, want, got);
      }
    }
  }
  fmt::print("oracle | tokenize {:<16} | {} of {} encodings equal\n", c.label, compared - differing, compared);
}

INSTANTIATE_TEST_SUITE_P(Vocabularies, LlamaCppTokenize, ::testing::ValuesIn(kCases),
                         [](const auto& info) { return std::string(info.param.label); });

// The words of llama.cpp's pre-tokenizer: its unicode_regex_split (exported by libllama, declared in
// its src/unicode.h), each regex of the list cutting the words of the one before.
std::vector<std::string> llamacpp_words(const std::string& text, const std::vector<std::string>& regexes) {
  return unicode_regex_split(text, regexes, /*byte_encode=*/false);
}

// llama.cpp's regex lists (src/llama-vocab.cpp, llm_tokenizer_bpe), by a tokenizer.ggml.pre name
// that selects each. llama.cpp runs GPT-2's and Llama 3's by hand-written code and the others by
// std::regex over text with each non-ASCII character replaced by its category; mqlm runs
// tokenizer.json's regexes (and tekken's as llama.cpp writes it) with PCRE2.
struct RegexCase {
  const char* pre;
  std::vector<std::string> regexes;
};
const std::string kLlamaCppGpt2 = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))";
const std::vector<RegexCase> kRegexCases = {
    {"gpt-2", {kLlamaCppGpt2}},
    {"llama-bpe",
     {R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"}},
    {"qwen2",
     {R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"}},
    {"tekken",
     {R"([^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)"}},
    {"smollm", {R"(\p{N})", kLlamaCppGpt2}},
};

class LlamaCppPreTokenizer : public ::testing::TestWithParam<RegexCase> {};

// The words themselves, which the ids above cannot always tell apart (a word cut in two whose
// halves merge back into the same tokens): "ÉCOLE" is "É" and "COLE" in llama.cpp's tekken.
TEST_P(LlamaCppPreTokenizer, WordsEqualLlamaCppsOnHardStrings) {
  const RegexCase& c = GetParam();
  const auto pre = PreTokenizer::create(c.pre);
  ASSERT_TRUE(std::holds_alternative<PreTokenizer>(pre));
  for (const std::string& text : kCorpus) {
    std::vector<std::string_view> words;
    std::get<PreTokenizer>(pre).split(text, words);
    EXPECT_EQ(std::vector<std::string>(words.begin(), words.end()), llamacpp_words(text, c.regexes))
        << c.pre << " " << fmt::format("{:?}", text);
  }
}

INSTANTIATE_TEST_SUITE_P(Regexes, LlamaCppPreTokenizer, ::testing::ValuesIn(kRegexCases),
                         [](const auto& info) {
                           std::string name = info.param.pre;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

}  // namespace
}  // namespace mqlm::model
