// tokenizer.ggml.* metadata: written and read back as the same Vocabulary; inconsistent metadata
// is an error naming the key.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <tuple>

#include "model/gguf/synthetic_vocabulary.hpp"
#include "model/gguf/vocabulary_metadata.hpp"
#include "tests/model/gguf/gguf_test_files.hpp"

namespace mqlm::model::gguf {
namespace {

void expect_same(const Vocabulary& a, const Vocabulary& b) {
  EXPECT_EQ(a.model, b.model);
  EXPECT_EQ(a.pre, b.pre);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.scores, b.scores);
  EXPECT_EQ(a.types, b.types);
  EXPECT_EQ(a.merges, b.merges);
  EXPECT_EQ(std::tie(a.bos, a.eos, a.eot, a.unk, a.pad), std::tie(b.bos, b.eos, b.eot, b.unk, b.pad));
  EXPECT_EQ(a.add_bos, b.add_bos);
  EXPECT_EQ(a.add_eos, b.add_eos);
  EXPECT_EQ(a.add_space_prefix, b.add_space_prefix);
  EXPECT_EQ(a.chat_template, b.chat_template);
}

Vocabulary sentencepiece() {
  Vocabulary v;
  v.model = TokenizerModel::spm;
  v.pre = "default";
  v.tokens = {"<unk>", "<s>", "</s>", "<0x0A>", "▁the", "▁a"};
  v.scores = {0, 0, 0, 0, -1.5f, -2.5f};
  v.types = {TokenType::unknown, TokenType::control, TokenType::control, TokenType::byte, TokenType::normal,
             TokenType::normal};
  v.unk = 0, v.bos = 1, v.eos = 2, v.pad = 0;
  v.add_bos = true;
  return v;
}

GgufResult<Vocabulary> read_back(const GgufWriter& writer) {
  return read_vocabulary(test::expect_file(GgufFile::parse(writer.to_bytes())));
}

void expect_error(const GgufWriter& writer, const std::string& words) {
  auto bytes = writer.to_bytes();
  GgufFile file = test::expect_file(GgufFile::parse(bytes));
  auto result = read_vocabulary(file);
  ASSERT_TRUE(std::holds_alternative<GgufError>(result)) << "read although inconsistent: expected " << words;
  const GgufError& error = std::get<GgufError>(result);
  EXPECT_NE(error.detail.find(words), std::string::npos) << error.detail << "\n  expected: " << words;
  EXPECT_LT(error.offset, bytes.size());
}

TEST(VocabularyMetadata, ByteBpeRoundTrip) {
  Vocabulary v = make_byte_bpe_vocabulary(1024);
  GgufWriter writer;
  write_vocabulary(writer, v);
  auto back = read_back(writer);
  ASSERT_TRUE(std::holds_alternative<Vocabulary>(back)) << std::get<GgufError>(back).message();
  expect_same(std::get<Vocabulary>(back), v);
}

TEST(VocabularyMetadata, SentencePieceRoundTrip) {
  Vocabulary v = sentencepiece();
  GgufWriter writer;
  write_vocabulary(writer, v);
  auto back = read_back(writer);
  ASSERT_TRUE(std::holds_alternative<Vocabulary>(back)) << std::get<GgufError>(back).message();
  expect_same(std::get<Vocabulary>(back), v);
}

// Gemma's: no SentencePiece space in front of the text.
TEST(VocabularyMetadata, SentencePieceWithoutTheSpacePrefixRoundTrip) {
  Vocabulary v = sentencepiece();
  v.add_space_prefix = false;
  GgufWriter writer;
  write_vocabulary(writer, v);
  auto back = read_back(writer);
  ASSERT_TRUE(std::holds_alternative<Vocabulary>(back)) << std::get<GgufError>(back).message();
  expect_same(std::get<Vocabulary>(back), v);
}

TEST(VocabularyMetadata, DefaultsWhenKeysAreAbsent) {
  GgufWriter writer;
  writer.set("tokenizer.ggml.model", std::string("llama"));
  writer.set("tokenizer.ggml.tokens", MetadataArray{std::vector<std::string>{"a", "b"}});
  writer.set("tokenizer.ggml.eos_token_id", std::int32_t{-1});  // "none", as some writers put it
  auto back = read_back(writer);
  ASSERT_TRUE(std::holds_alternative<Vocabulary>(back)) << std::get<GgufError>(back).message();
  const Vocabulary& v = std::get<Vocabulary>(back);
  EXPECT_EQ(v.pre, "default");
  EXPECT_TRUE(v.add_bos);  // SentencePiece models expect BOS unless told otherwise
  EXPECT_FALSE(v.add_eos);
  EXPECT_TRUE(v.add_space_prefix);
  EXPECT_EQ(v.eos, -1);
  EXPECT_TRUE(v.scores.empty());
  EXPECT_TRUE(v.types.empty());
}

TEST(VocabularyMetadata, InconsistentMetadata) {
  auto base = [] {
    GgufWriter writer;
    write_vocabulary(writer, sentencepiece());
    return writer;
  };
  GgufWriter w = base();
  w.set("tokenizer.ggml.scores", MetadataArray{std::vector<float>{1, 2, 3}});
  expect_error(w, "tokenizer.ggml.scores: 3 entries for 6 tokens");
  w = base();
  w.set("tokenizer.ggml.token_type", MetadataArray{std::vector<std::uint32_t>{1, 1, 1, 1, 1, 1}});
  expect_error(w, "metadata key 'tokenizer.ggml.token_type' is an array of u32, expected an array of i32");
  w = base();
  w.set("tokenizer.ggml.token_type", MetadataArray{std::vector<std::int32_t>{1, 1, 9, 1, 1, 1}});
  expect_error(w, "tokenizer.ggml.token_type: token 2 has type 9 (0 to 6 defined)");
  w = base();
  w.set("tokenizer.ggml.bos_token_id", std::uint32_t{6});
  expect_error(w, "tokenizer.ggml.bos_token_id: token id 6 is outside the vocabulary of 6 tokens");
  w = base();
  w.set("tokenizer.ggml.padding_token_id", std::string("0"));
  expect_error(w, "'tokenizer.ggml.padding_token_id' is a string, expected an integer token id");
  w = base();
  w.set("tokenizer.ggml.model", std::string("bert"));
  expect_error(w, "tokenizer model \"bert\" is not supported");
  w = base();
  w.set("tokenizer.ggml.tokens", MetadataArray{std::vector<std::string>{}});
  expect_error(w, "the vocabulary is empty");
  w = base();
  w.set("tokenizer.ggml.tokens", MetadataArray{std::vector<std::int32_t>{1}});
  expect_error(w, "expected an array of strings");
  w = base();
  w.set("tokenizer.ggml.add_bos_token", std::uint8_t{1});
  expect_error(w, "'tokenizer.ggml.add_bos_token' is a u8, expected a bool");
  w = GgufWriter();
  w.set("tokenizer.ggml.tokens", MetadataArray{std::vector<std::string>{"a"}});
  expect_error(w, "metadata key 'tokenizer.ggml.model' is missing");
  w = GgufWriter();
  w.set("tokenizer.ggml.model", std::string("gpt2"));
  w.set("tokenizer.ggml.tokens", MetadataArray{std::vector<std::string>{"a"}});
  expect_error(w, "metadata key 'tokenizer.ggml.merges' is missing");
  w.set("tokenizer.ggml.merges", MetadataArray{std::vector<std::string>{"a b", "ab"}});
  expect_error(w, "tokenizer.ggml.merges: merge 1 is not two parts separated by a space");
}

TEST(SyntheticVocabulary, ByteTokensMergesAndSpecials) {
  EXPECT_EQ(byte_to_unicode(' '), "Ġ");
  EXPECT_EQ(byte_to_unicode('\n'), "Ċ");
  EXPECT_EQ(byte_to_unicode('a'), "a");
  EXPECT_EQ(byte_to_unicode(0xAD), "Ń");  // the last byte GPT-2 moves
  for (std::size_t size : {std::size_t{261}, std::size_t{1024}, std::size_t{4096}}) {
    Vocabulary v = make_byte_bpe_vocabulary(size);
    ASSERT_EQ(v.tokens.size(), size);
    ASSERT_EQ(v.types.size(), size);
    EXPECT_EQ(v.model, TokenizerModel::bpe);
    EXPECT_EQ(v.pre, "llama-bpe");
    std::set<std::string> unique(v.tokens.begin(), v.tokens.end());
    EXPECT_EQ(unique.size(), size) << "token texts repeat";
    std::set<std::string> bytes;
    for (int b = 0; b < 256; ++b) bytes.insert(byte_to_unicode(static_cast<std::uint8_t>(b)));
    EXPECT_EQ(std::set<std::string>(v.tokens.begin(), v.tokens.begin() + 256), bytes);
    EXPECT_EQ(v.tokens[0], "!");  // GPT-2's id order
    for (const auto& merge : v.merges) {
      auto space = merge.find(' ');
      ASSERT_NE(space, std::string::npos);
      std::string left = merge.substr(0, space), right = merge.substr(space + 1);
      EXPECT_TRUE(unique.contains(left) && unique.contains(right) && unique.contains(left + right)) << merge;
    }
    EXPECT_EQ(v.tokens[static_cast<std::size_t>(v.bos)], "<|begin_of_text|>");
    EXPECT_EQ(v.tokens[static_cast<std::size_t>(v.eos)], "<|end_of_text|>");
    EXPECT_EQ(v.tokens[static_cast<std::size_t>(v.eot)], "<|eot_id|>");
    EXPECT_EQ(v.tokens[size - 3], "<|start_header_id|>");
    for (std::size_t id = size - 5; id < size; ++id) EXPECT_EQ(v.types[id], TokenType::control);
    EXPECT_EQ(v.types[300 % (size - 5)], TokenType::normal);
    EXPECT_TRUE(v.add_bos);
    EXPECT_NE(v.chat_template.find("<|start_header_id|>"), std::string::npos);
  }
  Vocabulary v = make_byte_bpe_vocabulary(1024);
  EXPECT_GE(v.merges.size(), 500u);
  std::set<std::string> tokens(v.tokens.begin(), v.tokens.end());
  EXPECT_TRUE(tokens.contains("Ġthe"));
  EXPECT_TRUE(tokens.contains("Ġlighthouse"));
  EXPECT_THROW(make_byte_bpe_vocabulary(260), std::invalid_argument);
}

TEST(SyntheticVocabulary, EveryKind) {
  for (std::string_view name : vocabulary_kind_names()) {
    SCOPED_TRACE(std::string(name));
    const auto kind = parse_vocabulary_kind(name);
    ASSERT_TRUE(kind.has_value());
    EXPECT_EQ(vocabulary_kind_name(*kind), name);
    const Vocabulary v = make_vocabulary(*kind, 1024);
    ASSERT_EQ(v.tokens.size(), 1024u);
    EXPECT_EQ(std::set<std::string>(v.tokens.begin(), v.tokens.end()).size(), 1024u) << "token texts repeat";
    EXPECT_THROW(make_vocabulary(*kind, min_vocabulary_size(*kind) - 1), std::invalid_argument);
    EXPECT_NO_THROW(make_vocabulary(*kind, min_vocabulary_size(*kind)));
    if (v.model == TokenizerModel::bpe) {
      EXPECT_EQ(v.tokens, make_byte_bpe_vocabulary(1024).tokens);
      continue;
    }
    ASSERT_EQ(v.scores.size(), 1024u);
    std::set<std::string> byte_tokens;
    for (std::size_t id = 0; id < v.tokens.size(); ++id) {
      if (v.types[id] == TokenType::byte) byte_tokens.insert(v.tokens[id]);
    }
    EXPECT_EQ(byte_tokens.size(), 256u);
    EXPECT_TRUE(byte_tokens.contains("<0x0A>"));
    const auto the = std::find(v.tokens.begin(), v.tokens.end(), "\u2581the");
    ASSERT_NE(the, v.tokens.end()) << "a piece learnt from the text";
    const float score = v.scores[static_cast<std::size_t>(the - v.tokens.begin())];
    EXPECT_TRUE(score < 0 && score > -50) << "among the first pieces learnt: " << score;
  }
  EXPECT_EQ(make_vocabulary(VocabularyKind::gpt2, 1024).pre, "gpt-2");  // llama.cpp's name for it
  EXPECT_EQ(make_vocabulary(VocabularyKind::qwen2, 1024).pre, "qwen2");
  const Vocabulary gemma = make_vocabulary(VocabularyKind::gemma, 1024);
  EXPECT_FALSE(gemma.add_space_prefix);
  EXPECT_EQ(gemma.tokens[static_cast<std::size_t>(gemma.bos)], "<bos>");
  EXPECT_EQ(gemma.tokens[static_cast<std::size_t>(gemma.eot)], "<end_of_turn>");
  EXPECT_EQ(gemma.types[8], TokenType::user_defined);  // "  ", matched in any text
  const Vocabulary phi3 = make_vocabulary(VocabularyKind::phi3, 1024);
  EXPECT_TRUE(phi3.add_space_prefix);
  EXPECT_EQ(std::tie(phi3.tokens[0], phi3.tokens[1], phi3.tokens[2]), std::tie("<unk>", "<s>", "</s>"));
  EXPECT_EQ(phi3.tokens[static_cast<std::size_t>(phi3.eos)], "<|endoftext|>");
  EXPECT_EQ(phi3.tokens[static_cast<std::size_t>(phi3.eot)], "<|end|>");
  EXPECT_FALSE(parse_vocabulary_kind("tekkenx").has_value());
}

// Without add_bos_token, llama.cpp adds BOS for Llama 3's and tekken's byte-level BPE, not for the others.
TEST(VocabularyMetadata, ByteBpeAddsBosByDefaultWhereLlamaCppDoes) {
  for (auto [pre, bos] : {std::pair{"llama-bpe", true}, {"tekken", true}, {"pixtral", true}, {"qwen2", false},
                          {"gpt-2", false}, {"smollm", false}}) {
    GgufWriter writer;
    writer.set("tokenizer.ggml.model", std::string("gpt2"));
    writer.set("tokenizer.ggml.pre", std::string(pre));
    writer.set("tokenizer.ggml.tokens", MetadataArray{std::vector<std::string>{"a", "b", "ab"}});
    writer.set("tokenizer.ggml.merges", MetadataArray{std::vector<std::string>{"a b"}});
    auto back = read_back(writer);
    ASSERT_TRUE(std::holds_alternative<Vocabulary>(back));
    EXPECT_EQ(std::get<Vocabulary>(back).add_bos, bos) << pre;
  }
}

// llama.cpp gives a model named Phi-3 rstrip on its special tokens (and </s>), but <unk>, <s> and
// <|endoftext|>: "<|user|>\n" is one token there, and read_vocabulary says the same.
TEST(VocabularyMetadata, Phi3NamedModelsSpecialTokensSwallowWhitespaceAfter) {
  const Vocabulary phi3 = make_vocabulary(VocabularyKind::phi3, 1024);
  GgufWriter writer;
  write_vocabulary(writer, phi3);
  auto plain = read_back(writer);
  ASSERT_TRUE(std::holds_alternative<Vocabulary>(plain));
  EXPECT_TRUE(std::get<Vocabulary>(plain).rstrip.empty());
  writer.set("general.name", std::string("Phi-3 Mini"));
  auto named = read_back(writer);
  ASSERT_TRUE(std::holds_alternative<Vocabulary>(named));
  std::set<std::string> stripping;
  for (std::int32_t id : std::get<Vocabulary>(named).rstrip) stripping.insert(phi3.tokens[static_cast<std::size_t>(id)]);
  EXPECT_EQ(stripping, (std::set<std::string>{"</s>", "<|assistant|>", "<|placeholder1|>", "<|system|>", "<|end|>",
                                              "<|user|>"}));
}

}  // namespace
}  // namespace mqlm::model::gguf
