// Pre-tokenizer splits, checked against the regexes run by Python's `regex` module (which is
// what the models' tokenizer.json patterns are written for).
#include <gtest/gtest.h>

#include <string>
#include <variant>
#include <vector>

#include "model/tokenizer/pre_tokenizer.hpp"

namespace mqlm::model {
namespace {

std::vector<std::string> split(std::string_view pre, std::string_view text) {
  auto made = PreTokenizer::create(pre);
  if (auto* error = std::get_if<PreTokenizerError>(&made)) {
    ADD_FAILURE() << error->message;
    return {};
  }
  std::vector<std::string_view> words;
  std::get<PreTokenizer>(made).split(text, words);
  return {words.begin(), words.end()};
}

using Words = std::vector<std::string>;

struct SplitCase {
  const char* pre;
  const char* text;
  Words words;
};

const SplitCase kCases[] = {
    // numbers: GPT-2 keeps a run, Llama 3 cuts it in threes, Qwen2 into single digits
    {"gpt2", "12345", {"12345"}},
    {"llama-bpe", "12345", {"123", "45"}},
    {"llama-bpe", "1234567 apples", {"123", "456", "7", " apples"}},
    {"qwen2", "12345", {"1", "2", "3", "4", "5"}},
    // contractions: GPT-2's are lower case only, the others any case
    {"gpt2", "don't", {"don", "'t"}},
    {"gpt2", "DON'T", {"DON", "'", "T"}},
    {"llama-bpe", "DON'T", {"DON", "'T"}},
    {"qwen2", "we'LL they're", {"we", "'LL", " they", "'re"}},
    // whitespace runs: the last space goes with the next word
    {"gpt2", "a  \n\n b", {"a", "  \n\n", " b"}},
    {"llama-bpe", "a  \n\n b", {"a", "  \n\n", " b"}},
    {"gpt2", "foo \n\n\tbar  ", {"foo", " \n\n", "\t", "bar", "  "}},
    {"llama-bpe", "foo \n\n\tbar  ", {"foo", " \n\n", "\tbar", "  "}},
    {"qwen2", "  ", {"  "}},
    // CJK letters and punctuation
    {"gpt2", "你好世界", {"你好世界"}},
    {"llama-bpe", "hello 世界。", {"hello", " 世界", "。"}},
    // emoji: skin tone modifier and ZWJ sequences stay with the symbol run
    {"gpt2", "hi 👋🏽 👨‍👩‍👧!", {"hi", " 👋🏽", " 👨‍👩‍👧!"}},
    {"qwen2", "hi 👋🏽 👨‍👩‍👧!", {"hi", " 👋🏽", " 👨‍👩‍👧!"}},
    // punctuation; Llama 3 lets one non-letter lead a run of letters
    {"gpt2", "Hello, world!!! (ok)", {"Hello", ",", " world", "!!!", " (", "ok", ")"}},
    {"gpt2", "$hello x(ok", {"$", "hello", " x", "(", "ok"}},
    {"llama-bpe", "$hello x(ok", {"$hello", " x", "(ok"}},
    // a combining mark is not a letter
    {"gpt2", "e\u0301t\u00e9", {"e", "\u0301", "t\u00e9"}},
    {"llama-bpe", "e\u0301t\u00e9", {"e", "\u0301t\u00e9"}},
    {"llama-bpe", "<|eot_id|>", {"<|", "eot", "_id", "|>"}},
    // tekken (Mistral Nemo): words cut where the case changes, a digit each, '/' kept with the punctuation before it;
    // llama.cpp's form of its regex, which cuts a word of non-ASCII capitals after its first letter
    {"tekken", "getHTTPResponseCode XMLParser", {"get", "HTTPResponse", "Code", " XMLParser"}},
    {"tekken", "iPhone 2024 a/b", {"i", "Phone", " ", "2", "0", "2", "4", " a", "/b"}},
    {"tekken", "ÉCOLE École ΑΘΗΝΑ", {"\u00c9", "COLE", " \u00c9cole", " \u0391\u0398\u0397\u039d\u0391"}},
    {"tekken", "don't //x\n", {"don", "'t", " //", "x", "\n"}},
    // SmolLM: every digit first, then GPT-2's regex on what is left (the space before digits alone)
    {"smollm", "abc 123 don't", {"abc", " ", "1", "2", "3", " don", "'t"}},
    {"smollm", "x1y", {"x", "1", "y"}},
    {"default", "", {}},
};

TEST(PreTokenizer, SplitsAsTheModelsRegexes) {
  for (const auto& c : kCases) {
    EXPECT_EQ(split(c.pre, c.text), c.words) << c.pre << " on \"" << c.text << "\"";
  }
}

TEST(PreTokenizer, AliasesShareTheirFamilysRegex) {
  EXPECT_EQ(split("llama3", "12345"), (Words{"123", "45"}));
  EXPECT_EQ(split("deepseek-r1-qwen", "12"), (Words{"1", "2"}));
  EXPECT_EQ(split("default", "12345"), (Words{"12345"}));
  EXPECT_EQ(split("gpt-2", "12345"), (Words{"12345"}));
  EXPECT_EQ(split("pixtral", "12345"), (Words{"123", "45"}));
  EXPECT_EQ(split("megrez", "12"), (Words{"1", "2"}));
}

TEST(PreTokenizer, SplitAppendsToTheWordsGiven) {
  std::vector<std::string_view> words{"before"};
  std::get<PreTokenizer>(PreTokenizer::create("smollm")).split("a1", words);
  EXPECT_EQ(Words(words.begin(), words.end()), (Words{"before", "a", "1"}));
}

TEST(PreTokenizer, InvalidUtf8BecomesWordsOfItsOwnAndNothingIsLost) {
  EXPECT_EQ(split("gpt2", "ab\xff\xfe cd"), (Words{"ab", "\xff\xfe", " cd"}));
  EXPECT_EQ(split("llama-bpe", "\xe2\x82"), (Words{"\xe2\x82"}));
  EXPECT_EQ(split("qwen2", "x\xc3"), (Words{"x", "\xc3"}));
}

TEST(PreTokenizer, UnknownNameIsAnErrorListingTheKnownOnes) {
  auto made = PreTokenizer::create("nonesuch");
  auto* error = std::get_if<PreTokenizerError>(&made);
  ASSERT_NE(error, nullptr);
  EXPECT_NE(error->message.find("\"nonesuch\""), std::string::npos) << error->message;
  EXPECT_NE(error->message.find("llama-bpe"), std::string::npos) << error->message;
  EXPECT_NE(error->message.find("qwen2"), std::string::npos) << error->message;
}

TEST(PreTokenizer, LlamaThreeTakesWholeWordsFromTheVocabulary) {
  EXPECT_TRUE(std::get<PreTokenizer>(PreTokenizer::create("llama-bpe")).ignore_merges());
  EXPECT_TRUE(std::get<PreTokenizer>(PreTokenizer::create("tekken")).ignore_merges());
  EXPECT_FALSE(std::get<PreTokenizer>(PreTokenizer::create("qwen2")).ignore_merges());
  EXPECT_FALSE(std::get<PreTokenizer>(PreTokenizer::create("gpt2")).ignore_merges());
}

}  // namespace
}  // namespace mqlm::model
