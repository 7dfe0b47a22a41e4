// Encoding to exact ids with the small vocabularies of test_vocabularies.hpp, and the errors a
// vocabulary that does not hold together gives.
#include <gtest/gtest.h>

#include <chrono>
#include <limits>

#include "test_vocabularies.hpp"

namespace mqlm::model {
namespace {

using namespace testing;
using Ids = std::vector<TokenId>;

constexpr EncodeOptions kPlain{.add_special = false, .parse_special = false};
constexpr EncodeOptions kParse{.add_special = false, .parse_special = true};

TEST(BpeEncode, MergesByRank) {
  const Tokenizer t = make_tokenizer(byte_level_vocabulary("gpt2"));
  // " the": h+e first (rank 0), then Ġ+t, then Ġt+he.
  EXPECT_EQ(t.encode(" the", kPlain), (Ids{BpeIds::space_the}));
  EXPECT_EQ(t.encode("the", kPlain), (Ids{BpeIds::the}));
  EXPECT_EQ(t.encode("tthe", kPlain), (Ids{'t', BpeIds::the}));
  EXPECT_EQ(t.encode("don't", kPlain), (Ids{BpeIds::don, BpeIds::quote_t}));
  EXPECT_EQ(t.encode("xyz", kPlain), byte_ids("xyz"));
}

TEST(BpeEncode, NumbersFollowEachPreTokenizer) {
  EXPECT_EQ(make_tokenizer(byte_level_vocabulary("gpt2")).encode("12345", kPlain), (Ids{BpeIds::n12345}));
  EXPECT_EQ(make_tokenizer(byte_level_vocabulary("llama-bpe")).encode("12345", kPlain),
            (Ids{BpeIds::n123, BpeIds::n45}));
  EXPECT_EQ(make_tokenizer(byte_level_vocabulary("qwen2")).encode("12345", kPlain), byte_ids("12345"));
}

TEST(BpeEncode, ContractionsFollowEachPreTokenizer) {
  // GPT-2 leaves "'T" as "'" and "T"; Llama 3 keeps "'T" one word (no merge makes it a token).
  EXPECT_EQ(make_tokenizer(byte_level_vocabulary("gpt2")).encode("DON'T", kPlain), byte_ids("DON'T"));
  EXPECT_EQ(make_tokenizer(byte_level_vocabulary("llama-bpe")).encode("don't", kPlain),
            (Ids{BpeIds::don, BpeIds::quote_t}));
}

TEST(BpeEncode, LlamaThreeTakesAWordInTheVocabularyWhole) {
  EXPECT_EQ(make_tokenizer(byte_level_vocabulary("llama-bpe")).encode(" xyz", kPlain),
            (Ids{BpeIds::space_xyz}));
  EXPECT_EQ(make_tokenizer(byte_level_vocabulary("gpt2")).encode(" xyz", kPlain), byte_ids(" xyz"));
}

TEST(BpeEncode, WhitespaceCjkAndEmojiFallToBytes) {
  const Tokenizer t = make_tokenizer(byte_level_vocabulary("llama-bpe"));
  EXPECT_EQ(t.encode("a  \n\n b", kPlain), byte_ids("a  \n\n b"));
  EXPECT_EQ(t.encode("你好", kPlain), byte_ids("你好"));
  EXPECT_EQ(t.encode("👨‍👩‍👧", kPlain), byte_ids("👨‍👩‍👧"));
  EXPECT_EQ(t.encode("\xff the", kPlain), concat({byte_ids("\xff"), {BpeIds::space_the}}));
}

TEST(BpeEncode, ControlTokensInTextOnlyWhenParsedAddedTokensAlways) {
  const Tokenizer t = make_tokenizer(byte_level_vocabulary("llama-bpe"));
  EXPECT_EQ(t.encode("the<|eot_id|> the", kParse), (Ids{BpeIds::the, BpeIds::eot, BpeIds::space_the}));
  EXPECT_EQ(t.encode("the<|eot_id|>", kPlain), concat({{BpeIds::the}, byte_ids("<|eot_id|>")}));
  // added (user_defined) tokens are cut out of any text, as llama.cpp and Hugging Face cut them
  // (llama_tokenize gave Gemma's whitespace and HTML tokens where mqlm gave their bytes)
  EXPECT_EQ(t.encode("<tool>the", kParse), (Ids{BpeIds::tool, BpeIds::the}));
  EXPECT_EQ(t.encode("<tool>the", kPlain), (Ids{BpeIds::tool, BpeIds::the}));
  // longest match at the leftmost position
  EXPECT_EQ(t.encode("<a><b><a>", kParse), (Ids{BpeIds::a_b, BpeIds::a}));
  EXPECT_EQ(t.encode("<|eot_id", kParse), byte_ids("<|eot_id"));
}

TEST(BpeEncode, AnRstripTokenSwallowsTheWhitespaceAfterIt) {
  Vocabulary v = byte_level_vocabulary("llama-bpe");
  v.rstrip = {BpeIds::eot, BpeIds::tool};
  const Tokenizer t = make_tokenizer(v);
  // Phi-3's "<|end|>\n<|assistant|>\n": llama.cpp drops the line breaks after its chat markers
  EXPECT_EQ(t.encode("the<|eot_id|> \n\t the", kParse), (Ids{BpeIds::the, BpeIds::eot, BpeIds::the}));
  EXPECT_EQ(t.encode("<tool>  the", kPlain), (Ids{BpeIds::tool, BpeIds::the}));
  EXPECT_EQ(t.encode("the<|begin_of_text|> the", kParse), (Ids{BpeIds::the, BpeIds::begin_of_text, BpeIds::space_the}));
  // not parsed, the token is text, and so is the space after it
  EXPECT_EQ(t.encode("<|eot_id|> ", kPlain), byte_ids("<|eot_id|> "));
  v.rstrip = {9999};
  EXPECT_TRUE(std::holds_alternative<TokenizerError>(Tokenizer::create(v)));
}

TEST(BpeEncode, BosAndEosAsTheVocabularySays) {
  Vocabulary v = byte_level_vocabulary("llama-bpe");
  const Tokenizer bos_only = make_tokenizer(v);
  EXPECT_EQ(bos_only.encode("the"), (Ids{BpeIds::begin_of_text, BpeIds::the}));
  EXPECT_EQ(bos_only.encode(""), (Ids{BpeIds::begin_of_text}));
  EXPECT_EQ(bos_only.encode("the", kPlain), (Ids{BpeIds::the}));
  v.add_bos = false;
  v.add_eos = true;
  const Tokenizer eos_only = make_tokenizer(v);
  EXPECT_EQ(eos_only.encode("the"), (Ids{BpeIds::the, BpeIds::end_of_text}));
  EXPECT_TRUE(eos_only.ends_generation(BpeIds::eot));
  EXPECT_TRUE(eos_only.ends_generation(BpeIds::end_of_text));
  EXPECT_FALSE(eos_only.ends_generation(BpeIds::the));
}

TEST(SpmEncode, MergesByScoreWithTheLeadingSpace) {
  const Tokenizer t = make_tokenizer(sentencepiece_vocabulary());
  EXPECT_EQ(t.encode("hello world"), (Ids{SpmIds::bos, SpmIds::space_hello, SpmIds::space_world}));
  EXPECT_EQ(t.encode("hello", kPlain), (Ids{SpmIds::space_hello}));
  EXPECT_EQ(t.encode(" hello", kPlain), (Ids{SpmIds::space, SpmIds::space_hello}));
  EXPECT_EQ(t.encode("", kPlain), Ids{});
  EXPECT_EQ(t.encode(""), (Ids{SpmIds::bos}));
  EXPECT_EQ(t.encode("held", kPlain), (Ids{SpmIds::space, SpmIds::he, SpmIds::ld}));
}

// Gemma's files (tokenizer.ggml.add_space_prefix false): no space in front of the text, at its
// start or after a special token, and none taken off when decoding (llama.cpp's rule both ways).
TEST(SpmEncode, WithoutTheLeadingSpaceWhereTheVocabularySaysSo) {
  Vocabulary v = sentencepiece_vocabulary();
  v.add_space_prefix = false;
  const Tokenizer t = make_tokenizer(v);
  EXPECT_EQ(t.encode("hello world"), (Ids{SpmIds::bos, SpmIds::hello, SpmIds::space_world}));
  EXPECT_EQ(t.encode(" hello", kPlain), (Ids{SpmIds::space_hello}));
  EXPECT_EQ(t.encode("hello</s>world", kParse),
            (Ids{SpmIds::hello, SpmIds::eos, SpmIds::w, SpmIds::or_, SpmIds::ld}));
  EXPECT_EQ(t.decode(Ids{SpmIds::space_hello, SpmIds::space_world}), " hello world");
  EXPECT_EQ(t.decode(t.encode("hello world")), "hello world");
  EXPECT_EQ(t.decode(t.encode(" hello</s> world", kParse)), " hello world");
}

TEST(SpmEncode, ByteFallbackForCharactersOutsideTheVocabulary) {
  const Tokenizer t = make_tokenizer(sentencepiece_vocabulary());
  const TokenId b0 = SpmIds::byte0;
  EXPECT_EQ(t.encode("hé", kPlain), (Ids{SpmIds::space, SpmIds::h, b0 + 0xC3, b0 + 0xA9}));
  EXPECT_EQ(t.encode("你好", kPlain), (Ids{SpmIds::space, SpmIds::ni, b0 + 0xE5, b0 + 0xA5, b0 + 0xBD}));
  EXPECT_EQ(t.encode("\n", kPlain), (Ids{SpmIds::space, b0 + '\n'}));
  EXPECT_EQ(t.encode("\xff", kPlain), (Ids{SpmIds::space, b0 + 0xFF}));
}

TEST(SpmEncode, UnknownTokenWithoutByteFallback) {
  const Tokenizer t = make_tokenizer(sentencepiece_vocabulary(/*byte_fallback=*/false));
  EXPECT_EQ(t.encode("hé你", kPlain), (Ids{SpmIds::space, SpmIds::h, SpmIds::unk, SpmIds::ni}));
}

TEST(SpmEncode, SpecialTokensInTextOnlyWhenParsed) {
  const Tokenizer t = make_tokenizer(sentencepiece_vocabulary());
  // After a special token the text gets its leading space again (llama.cpp's rule).
  EXPECT_EQ(t.encode("hello</s>world", kParse),
            (Ids{SpmIds::space_hello, SpmIds::eos, SpmIds::space_world}));
  const Ids plain = t.encode("</s>", kPlain);
  EXPECT_EQ(plain.size(), 5u);  // ▁ and the four bytes of "</s>"
  EXPECT_EQ(plain[0], SpmIds::space);
  EXPECT_EQ(plain[1], SpmIds::byte0 + '<');
}

TEST(VocabularyErrors, NameWhatIsWrong) {
  auto expect_error = [](const Vocabulary& v, std::string_view needle) {
    const std::string message = creation_error(v);
    EXPECT_NE(message.find(needle), std::string::npos) << message;
  };
  Vocabulary v = byte_level_vocabulary("gpt2");
  v.types.pop_back();
  expect_error(v, "token types for");

  v = sentencepiece_vocabulary();
  v.scores.push_back(1);
  expect_error(v, "scores for");

  v = byte_level_vocabulary("gpt2");
  v.merges.push_back(gpt2_text("x") + " " + gpt2_text("yz"));
  expect_error(v, "not a token");

  v = byte_level_vocabulary("gpt2");
  v.merges.push_back("nospace");
  expect_error(v, "is not \"left right\"");

  v = byte_level_vocabulary("gpt2");
  v.tokens[' '] = "space";
  expect_error(v, "byte 0x20");

  v = byte_level_vocabulary("mystery-pre");
  expect_error(v, "unknown pre-tokenizer \"mystery-pre\"");

  v = byte_level_vocabulary("gpt2");
  v.bos = static_cast<TokenId>(v.tokens.size());
  expect_error(v, "bos id");

  v = byte_level_vocabulary("gpt2");
  v.bos = -1;
  expect_error(v, "add_bos is set");

  v = sentencepiece_vocabulary(/*byte_fallback=*/false);
  v.unk = -1;
  expect_error(v, "neither <0x00> nor unk");

  v = sentencepiece_vocabulary();
  v.tokens[SpmIds::byte0] = "zero";
  expect_error(v, "has type byte but is not <0xNN>");

  v = sentencepiece_vocabulary();
  v.scores[SpmIds::h] = std::numeric_limits<float>::quiet_NaN();
  expect_error(v, "NaN score");

  v = sentencepiece_vocabulary();
  v.types[5] = static_cast<TokenType>(42);
  expect_error(v, "has type 42");

  v = Vocabulary{};
  expect_error(v, "no tokens");
}

}  // namespace
}  // namespace mqlm::model

namespace mqlm::model {
namespace {

// Long single words and whitespace runs: the merge heap and the regexes stay near linear.
TEST(Encode, LongInputsStayFast) {
  const std::string letters(200'000, 'e');
  const std::string spaces = std::string(200'000, ' ') + "x";
  const std::string digits(200'000, '7');
  for (const char* pre : {"gpt2", "llama-bpe", "qwen2"}) {
    const Tokenizer t = testing::make_tokenizer(testing::byte_level_vocabulary(pre));
    for (const std::string* text : {&letters, &spaces, &digits}) {
      const auto start = std::chrono::steady_clock::now();
      const auto ids = t.encode(*text, kPlain);
      const auto took = std::chrono::steady_clock::now() - start;
      EXPECT_EQ(t.decode(ids), *text);
      EXPECT_LT(took, std::chrono::seconds(1)) << pre;
    }
  }
  const Tokenizer spm = testing::make_tokenizer(testing::sentencepiece_vocabulary());
  EXPECT_EQ(spm.decode(spm.encode(letters)), letters);
  EXPECT_EQ(spm.decode(spm.encode(spaces)), spaces);
}

}  // namespace
}  // namespace mqlm::model
