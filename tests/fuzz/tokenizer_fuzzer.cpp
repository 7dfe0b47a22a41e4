// libFuzzer target: the tokenizers (byte-level BPE under each pre-tokenizer regex, SentencePiece
// with and without byte fallback) encoding arbitrary bytes and decoding arbitrary ids.
//
// The input's first byte picks a tokenizer (bits 0-2) and what to do with the rest: encode it as
// text (bit 5 clear; bit 3: add_special, bit 4: parse_special) or read it as 16-bit ids, a few
// outside the vocabulary, and decode them (bit 5 set; bit 6: render_special). The tokenizers
// are built once, from `mqlm make-model`'s vocabulary and the tokenizer tests' ones.
//
// Beyond "no crash, leak, UB, hang or allocation past libFuzzer's limit" it checks what the
// tokenizers promise: the pre-tokenizer's words cover the text exactly; encode gives ids of the
// vocabulary, BOS first when asked for; decode(encode(text)) == text wherever that holds
// (byte-level BPE: any bytes; SentencePiece with byte fallback: valid UTF-8 without U+2581,
// unless it names the unknown token);
// decode refuses an id outside the vocabulary with std::out_of_range and nothing else; and the
// stream decoder hands back only valid UTF-8, the same text as decode when that is valid.
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "model/gguf/synthetic_vocabulary.hpp"
#include "model/tokenizer/tokenizer.hpp"
#include "model/tokenizer/utf8.hpp"
#include "tests/fuzz/fuzz_support.hpp"
#include "tests/model/tokenizer/test_vocabularies.hpp"

namespace {

using namespace mqlm::model;

[[noreturn]] void contract_broken(std::string_view what) { mqlm::fuzz::contract_broken("tokenizer", what); }

struct Subject {
  Tokenizer tokenizer;
  std::optional<PreTokenizer> pre_tokenizer;  // byte-level BPE's
  bool round_trips_bytes = false;             // decode(encode(any bytes)) == the bytes
  bool round_trips_text = false;              // the same for valid UTF-8 without U+2581
};

Subject subject(const Vocabulary& vocabulary, bool byte_fallback) {
  Subject s{testing::make_tokenizer(vocabulary), std::nullopt, false, false};
  if (vocabulary.model == TokenizerModel::bpe) {
    s.pre_tokenizer = std::get<PreTokenizer>(PreTokenizer::create(vocabulary.pre));
    s.round_trips_bytes = true;
  }
  s.round_trips_text = s.round_trips_bytes || byte_fallback;
  return s;
}

const std::vector<Subject>& subjects() {
  static const std::vector<Subject> all = [] {
    std::vector<Subject> made;
    made.push_back(subject(gguf::make_byte_bpe_vocabulary(2000), false));  // llama-bpe
    for (const char* pre : {"gpt2", "smaug-bpe", "qwen2", "llama-bpe"}) {
      made.push_back(subject(testing::byte_level_vocabulary(pre), false));
    }
    made.push_back(subject(testing::sentencepiece_vocabulary(true), true));
    made.push_back(subject(testing::sentencepiece_vocabulary(false), false));
    return made;
  }();
  return all;
}

void check_words(const PreTokenizer& pre_tokenizer, std::string_view text) {
  std::vector<std::string_view> words;
  pre_tokenizer.split(text, words);
  const char* at = text.data();
  for (std::string_view word : words) {
    if (word.data() != at || word.empty()) contract_broken("the words do not follow each other");
    at += word.size();
  }
  if (at != text.data() + text.size()) contract_broken("the words do not cover the text");
}

void check_encode(const Subject& s, std::string_view text, const EncodeOptions& options) {
  const Tokenizer& t = s.tokenizer;
  if (s.pre_tokenizer) check_words(*s.pre_tokenizer, text);
  const std::vector<TokenId> ids = t.encode(text, options);
  for (TokenId id : ids) {
    if (id < 0 || static_cast<std::size_t>(id) >= t.size()) contract_broken("encode gave an id outside the vocabulary");
  }
  if (options.add_special && t.bos() >= 0 && (ids.empty() || ids.front() != t.bos())) {
    contract_broken("encode did not put BOS first");
  }
  const bool valid_text = utf8::to_valid(text) == text && text.find("\xE2\x96\x81") == std::string_view::npos;
  if (!s.round_trips_bytes && !(s.round_trips_text && valid_text)) return;
  // An unknown token (<unk> written in the text, with parse_special) decodes to U+FFFD: no round trip.
  for (TokenId id : ids) {
    if (t.token_type(id) == TokenType::unknown) return;
  }
  // The BOS encode added is no text of the input's.
  const auto first = ids.begin() + (options.add_special && t.bos() >= 0 ? 1 : 0);
  const std::string back = t.decode(std::vector<TokenId>(first, ids.end()), {.render_special = options.parse_special});
  if (back != text) contract_broken("decode(encode(text)) is not the text");
}

void check_decode(const Subject& s, std::span<const std::uint8_t> bytes, bool render_special) {
  const Tokenizer& t = s.tokenizer;
  std::vector<TokenId> ids;
  bool outside = false;
  for (std::size_t i = 0; i + 1 < bytes.size(); i += 2) {
    const auto raw = static_cast<std::int32_t>(bytes[i] | (bytes[i + 1] << 8));
    ids.push_back(raw % static_cast<std::int32_t>(t.size() + 8) - 4);  // 4 below, 4 past
    outside = outside || ids.back() < 0 || static_cast<std::size_t>(ids.back()) >= t.size();
  }
  const DecodeOptions options{.render_special = render_special};
  std::string text;
  try {
    text = t.decode(ids, options);
  } catch (const std::out_of_range&) {
    if (!outside) contract_broken("decode refused ids of the vocabulary");
    return;
  }
  if (outside) contract_broken("decode took an id outside the vocabulary");
  StreamDecoder stream(t, options);
  std::string streamed;
  for (TokenId id : ids) streamed += stream.push(id);
  streamed += stream.finish();
  if (utf8::to_valid(streamed) != streamed) contract_broken("the stream decoder handed back invalid UTF-8");
  if (utf8::to_valid(text) == text && streamed != text) contract_broken("the stream decoder's text is not decode's");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::uint8_t mode = data[0];
  const Subject& s = subjects()[(mode & 7) % subjects().size()];
  const std::span<const std::uint8_t> rest(data + 1, size - 1);
  try {
    if (mode & 32) {
      check_decode(s, rest, mode & 64);
    } else {
      const std::string_view text(reinterpret_cast<const char*>(rest.data()), rest.size());
      check_encode(s, text, EncodeOptions{.add_special = (mode & 8) != 0, .parse_special = (mode & 16) != 0});
    }
  } catch (const std::exception& e) {
    contract_broken(std::string("an exception: ") + e.what());
  }
  return 0;
}
