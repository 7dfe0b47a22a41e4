// Decoding: encode -> decode round trips on tricky and random text for both models, and the
// stream decoder's hold-back of characters split across tokens.
#include <gtest/gtest.h>

#include <random>

#include "model/tokenizer/utf8.hpp"
#include "test_vocabularies.hpp"

namespace mqlm::model {
namespace {

using namespace testing;
using Ids = std::vector<TokenId>;

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";

const std::string_view kTricky[] = {
    "",
    " ",
    "     ",
    "\n",
    "\t\n \r\n",
    "hello world",
    "  hello  world  ",
    "don't DON'T we'LL",
    "12345 678\n90",
    "你好，世界。",
    "👨‍👩‍👧 👋🏽 🇫🇷",
    "e\u0301 \u0915\u094D\u0937",  // combining acute; Devanagari conjunct
    "\xff\xfe",                    // invalid bytes
    "\xc3",                        // a character cut short
    "ab\x80 cd",
    "\xed\xa0\x80",                // an encoded surrogate
    std::string_view("a\0b", 3),
    "<|eot_id|></s><tool>",        // special texts, as plain text
    "the the the",
};

std::string show(std::string_view s) {
  std::string out;
  for (unsigned char c : s) {
    if (c >= 0x20 && c < 0x7F) {
      out += static_cast<char>(c);
    } else {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02X", c);
      out += hex;
    }
  }
  return out;
}

std::vector<Tokenizer> all_tokenizers() {
  std::vector<Tokenizer> all;
  for (const char* pre : {"gpt2", "llama-bpe", "qwen2"}) all.push_back(make_tokenizer(byte_level_vocabulary(pre)));
  all.push_back(make_tokenizer(sentencepiece_vocabulary()));
  return all;
}

TEST(RoundTrip, TrickyStrings) {
  for (const Tokenizer& t : all_tokenizers()) {
    for (std::string_view text : kTricky) {
      EXPECT_EQ(show(t.decode(t.encode(text))), show(text)) << "model " << static_cast<int>(t.model());
      const Ids ids = t.encode(text, {.add_special = false, .parse_special = true});
      EXPECT_EQ(show(t.decode(ids, {.render_special = true})), show(text));
    }
  }
}

TEST(RoundTrip, SpecialTokensRenderedOnlyWhenAsked) {
  const Tokenizer bpe = make_tokenizer(byte_level_vocabulary("llama-bpe"));
  const Ids ids = bpe.encode("the<|eot_id|><tool> the", {.add_special = true, .parse_special = true});
  EXPECT_EQ(bpe.decode(ids), "the<tool> the");  // added tokens are text; control tokens are not
  EXPECT_EQ(bpe.decode(ids, {.render_special = true}), "<|begin_of_text|>the<|eot_id|><tool> the");

  const Tokenizer spm = make_tokenizer(sentencepiece_vocabulary());
  const Ids spm_ids = spm.encode("hello</s> world", {.add_special = true, .parse_special = true});
  EXPECT_EQ(spm.decode(spm_ids), "hello world");
  EXPECT_EQ(spm.decode(spm_ids, {.render_special = true}), "<s>hello</s> world");
}

TEST(SpmDecode, LeadingSpaceDroppedOnlyAtTheStartOfASequence) {
  const Tokenizer t = make_tokenizer(sentencepiece_vocabulary());
  const Ids ids{SpmIds::space_hello, SpmIds::space_world};
  EXPECT_EQ(t.decode(ids), "hello world");
  EXPECT_EQ(t.decode(ids, {.sequence_start = false}), " hello world");
  EXPECT_EQ(t.decode(Ids{SpmIds::unk}), kReplacement);
}

TEST(StreamDecoder, HoldsBackACharacterSplitAcrossTokens) {
  const Tokenizer t = make_tokenizer(byte_level_vocabulary("gpt2"));
  StreamDecoder stream(t, {.sequence_start = false});
  const Ids wave = byte_ids("👋");  // four byte tokens
  ASSERT_EQ(wave.size(), 4u);
  EXPECT_EQ(stream.push(BpeIds::the), "the");
  EXPECT_EQ(stream.push(wave[0]), "");
  EXPECT_EQ(stream.push(wave[1]), "");
  EXPECT_EQ(stream.push(wave[2]), "");
  EXPECT_EQ(stream.push(wave[3]), "👋");
  EXPECT_EQ(stream.push(BpeIds::space_the), " the");
  EXPECT_EQ(stream.finish(), "");
}

TEST(StreamDecoder, SpmByteFallbackAndLeadingSpace) {
  const Tokenizer t = make_tokenizer(sentencepiece_vocabulary());
  const Ids ids = t.encode("hello é", {.add_special = true});
  StreamDecoder at_start(t, {.sequence_start = true});
  std::string whole;
  std::vector<std::string> parts;
  for (TokenId id : ids) {
    parts.push_back(at_start.push(id));
    whole += parts.back();
  }
  whole += at_start.finish();
  EXPECT_EQ(whole, "hello é");
  EXPECT_EQ(parts.back(), "é");            // the second byte completes it
  EXPECT_EQ(parts[parts.size() - 2], "");  // the first is held back

  StreamDecoder continuing(t, {.sequence_start = false});
  EXPECT_EQ(continuing.push(SpmIds::space_hello), " hello");
}

TEST(StreamDecoder, InvalidSequencesBecomeReplacementCharacters) {
  const Tokenizer t = make_tokenizer(byte_level_vocabulary("gpt2"));
  StreamDecoder stream(t, {});
  EXPECT_EQ(stream.push(0xE2), "");
  EXPECT_EQ(stream.push(0x82), "");
  EXPECT_EQ(stream.finish(), kReplacement);  // cut short at the end of the stream
  EXPECT_EQ(stream.push(0xFF), kReplacement);  // can never start a character
  EXPECT_EQ(stream.push(0xE2), "");
  EXPECT_EQ(stream.push('a'), std::string(kReplacement) + "a");  // broken by what follows
  EXPECT_EQ(stream.push(0xF0), "");
  EXPECT_EQ(stream.push(0x9F), "");
  EXPECT_EQ(stream.push(0xF0), kReplacement);  // one U+FFFD per broken sequence
  EXPECT_EQ(stream.finish(), kReplacement);
}

// Random strings of pieces that stress the tokenizers: letters, digits, whitespace runs,
// punctuation, CJK, emoji with ZWJ and modifiers, combining marks, special-token texts and raw
// bytes (often invalid UTF-8). "▁" is left out: SentencePiece reads it as a space by design.
std::string random_text(std::mt19937& rng) {
  static const std::string_view pieces[] = {
      "a", "e", "the", " ", "  ", "\n", "\t", "\r\n", "'s", "'T", "1", "23", "4567", ",", "!",
      "(", "$", "é", "e\u0301", "你", "好", "世界", "👋", "🏽", "\u200D", "👨", "🇫", "ß", "Ω",
      "<|eot_id|>", "<tool>", "</s>", "<s>", "<a>", "<0x41>", "hello", " world"};
  std::uniform_int_distribution<std::size_t> length(0, 24);
  std::uniform_int_distribution<std::size_t> pick(0, std::size(pieces));  // the last: a raw byte
  std::uniform_int_distribution<int> byte(0, 255);
  std::string text;
  for (std::size_t n = length(rng); n > 0; --n) {
    const std::size_t i = pick(rng);
    if (i == std::size(pieces)) {
      text += static_cast<char>(byte(rng));
    } else {
      text += pieces[i];
    }
  }
  return text;
}

TEST(RoundTrip, RandomStringsBothModels) {
  std::mt19937 rng(20240611);
  const std::vector<Tokenizer> tokenizers = all_tokenizers();
  for (int i = 0; i < 2000; ++i) {
    const std::string text = random_text(rng);
    for (const Tokenizer& t : tokenizers) {
      ASSERT_EQ(show(t.decode(t.encode(text))), show(text)) << "iteration " << i;
      const Ids parsed = t.encode(text, {.add_special = true, .parse_special = true});
      ASSERT_EQ(show(t.decode(parsed, {.render_special = true, .sequence_start = true})),
                show(t.model() == TokenizerModel::spm ? "<s>" + text : "<|begin_of_text|>" + text))
          << "iteration " << i;
      // Streaming the same ids gives the valid-UTF-8 form of the whole decode.
      StreamDecoder stream(t, {});
      std::string streamed;
      for (TokenId id : t.encode(text)) streamed += stream.push(id);
      streamed += stream.finish();
      ASSERT_EQ(show(streamed), show(utf8::to_valid(text))) << "iteration " << i;
    }
  }
}

}  // namespace
}  // namespace mqlm::model
