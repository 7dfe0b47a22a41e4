#include "model/gguf/synthetic_vocabulary.hpp"

#include <algorithm>
#include <array>
#include <cctype>
#include <map>
#include <stdexcept>
#include <string_view>
#include <unordered_set>
#include <vector>

#include <fmt/format.h>

namespace mqlm::model::gguf {

namespace {

constexpr std::string_view kSentencePieceSpace = "\xE2\x96\x81";  // U+2581 "▁"

// The text the merges are learnt from: plain English with numbers, punctuation and line breaks,
// so that common words, spaces before words and a few digit groups become tokens.
constexpr std::string_view kTrainingText = R"(The old lighthouse stood on the rocks at the end of the harbour, and every night its keeper climbed the one hundred and twelve steps to light the lamp.
She had kept the light for thirty years. In the morning she wrote the weather in a book: the wind, the rain, the height of the waves and the ships that passed.
On the 3rd of March, 1998, a storm came in from the west. The sea was white, the sky was grey, and the boats in the harbour pulled at their ropes.
"There will be no ships tonight," said the fisherman who brought her bread. "Nobody is that foolish."
But at half past nine she saw a small light moving on the water, far beyond the rocks. It was a boat, and it was coming towards the harbour.
She turned the great lamp so that its beam fell on the safe channel between the rocks, and she held it there for an hour while the boat came closer.
When the boat reached the harbour, the people of the town were waiting on the quay with ropes and blankets and hot tea.
There were four children on the boat and their father, who had lost his way in the rain. They were cold, wet and hungry, but they were alive.
The next morning the keeper wrote in her book: wind from the west, heavy rain, waves of 6 metres, one boat came in safely at 10:45.
Years later, one of the children came back to the town. She was a teacher now, and she told her pupils the story of the light on the rocks.
Time passes, and things change. The lighthouse has an electric lamp today, and nobody needs to climb the steps every night.
But the people of the town still remember the keeper, and every year on the 3rd of March they leave flowers at the door of the lighthouse.
A good model of language learns which words follow which. It learns that the sea is wide, that the night is dark, and that a light can guide the way home.
It learns numbers too: 1, 2, 3, 10, 42, 100, 256, 1024 and 2048; dates such as 2024-05-17; and times like 09:30 or 18:00.
It learns questions and answers. What is the capital of France? Paris. How many days are in a week? Seven. Who wrote the book? We do not know.
The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs. How vexingly quick daft zebras jump!
Please write a short poem about the sea. Then explain, in simple words, why the sky is blue and why the sea looks green near the shore.
We went to the market on Saturday and bought apples, bread, cheese, eggs, fish, milk and tomatoes for the week.
The train leaves the station at seven o'clock, and it arrives in the city two hours later, if the weather is kind and the line is clear.
I think that we should meet again tomorrow, when we have more time to talk about the plans for the new school and the library.
)";

// GPT-2's split of the bytes: these stand for themselves, the rest move to 256 and up.
bool byte_is_printable(int b) { return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255); }

std::string utf8(std::uint32_t code_point) {
  std::string out;
  if (code_point < 0x80) {
    out += static_cast<char>(code_point);
  } else {  // every code point here is below 0x800
    out += static_cast<char>(0xC0 | (code_point >> 6));
    out += static_cast<char>(0x80 | (code_point & 0x3F));
  }
  return out;
}

std::uint32_t byte_code_point(std::uint8_t byte) {
  if (byte_is_printable(byte)) return byte;
  std::uint32_t moved = 0;
  for (int b = 0; b < byte; ++b) moved += byte_is_printable(b) ? 0 : 1;
  return 256 + moved;
}

// The training text cut as Llama 3's pre-tokenizer would cut plain ASCII, near enough: words
// with their leading space, contractions, digit groups of up to three, punctuation runs with a
// leading space, and line breaks.
std::vector<std::string> pre_split(std::string_view text) {
  std::vector<std::string> chunks;
  std::size_t i = 0;
  auto is_alpha = [](char c) { return std::isalpha(static_cast<unsigned char>(c)) != 0; };
  auto is_digit = [](char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; };
  while (i < text.size()) {
    std::size_t start = i;
    if (text[i] == '\n') {
      while (i < text.size() && text[i] == '\n') ++i;
    } else if (text[i] == '\'' && i + 1 < text.size() && is_alpha(text[i + 1])) {
      i += 2;
      while (i < text.size() && is_alpha(text[i]) && i - start < 3) ++i;
    } else if (is_digit(text[i])) {
      while (i < text.size() && is_digit(text[i]) && i - start < 3) ++i;
    } else {
      if (text[i] == ' ' && i + 1 < text.size() && text[i + 1] != ' ' && text[i + 1] != '\n') ++i;
      if (i < text.size() && is_alpha(text[i])) {
        while (i < text.size() && is_alpha(text[i])) ++i;
      } else if (i < text.size() && is_digit(text[i])) {
        i = start + 1;  // a space before digits is a chunk of its own
      } else {
        while (i < text.size() && !is_alpha(text[i]) && !is_digit(text[i]) && text[i] != ' ' && text[i] != '\n') ++i;
        if (i == start) ++i;
      }
    }
    chunks.emplace_back(text.substr(start, i - start));
  }
  return chunks;
}

// Words to learn merges from: each a sequence of symbols (ids into `names`), with its count.
struct TrainingWords {
  std::vector<std::string> names;  // symbol id -> its text
  std::vector<std::pair<std::vector<int>, int>> words;
};

// Classic BPE training: merge the most frequent adjacent pair (ties: the pair of earliest
// symbols), again and again, until `limit` merges or no pair is left. Symbols are ids into
// `names` so that counting is cheap.
std::vector<std::pair<std::string, std::string>> learn_merges(TrainingWords training, std::size_t limit) {
  auto& [names, words] = training;
  std::vector<std::pair<std::string, std::string>> merges;
  while (merges.size() < limit) {
    std::map<std::pair<int, int>, int> pairs;
    for (const auto& [symbols, count] : words) {
      for (std::size_t k = 0; k + 1 < symbols.size(); ++k) pairs[{symbols[k], symbols[k + 1]}] += count;
    }
    if (pairs.empty()) break;
    auto best = std::max_element(pairs.begin(), pairs.end(),
                                 [](const auto& a, const auto& b) { return a.second < b.second; });  // first max
    auto [left, right] = best->first;
    int joined = static_cast<int>(names.size());
    names.push_back(names[left] + names[right]);
    for (auto& [symbols, count] : words) {
      std::size_t out = 0;
      for (std::size_t k = 0; k < symbols.size(); ++k, ++out) {
        bool match = k + 1 < symbols.size() && symbols[k] == left && symbols[k + 1] == right;
        symbols[out] = match ? joined : symbols[k];
        if (match) ++k;
      }
      symbols.resize(out);
    }
    merges.emplace_back(names[left], names[right]);
  }
  return merges;
}

// Byte-level BPE: the text's chunks as bytes, each byte its GPT-2 character (symbol id = byte).
TrainingWords byte_training_words() {
  std::map<std::string, int> chunk_counts;
  for (auto& chunk : pre_split(kTrainingText)) ++chunk_counts[chunk];
  TrainingWords training;
  for (int b = 0; b < 256; ++b) training.names.push_back(byte_to_unicode(static_cast<std::uint8_t>(b)));
  for (const auto& [chunk, count] : chunk_counts) {
    std::vector<int> symbols;
    for (char c : chunk) symbols.push_back(static_cast<std::uint8_t>(c));
    training.words.emplace_back(std::move(symbols), count);
  }
  return training;
}

// SentencePiece: each line's words with "▁" in front, each UTF-8 character a symbol; line breaks
// are words of their own.
TrainingWords sentencepiece_training_words() {
  std::map<std::string, int> word_counts;
  std::size_t start = 0;
  for (std::size_t at = 0; at <= kTrainingText.size(); ++at) {
    if (at < kTrainingText.size() && kTrainingText[at] != ' ' && kTrainingText[at] != '\n') continue;
    if (at > start) ++word_counts[std::string(kSentencePieceSpace) + std::string(kTrainingText.substr(start, at - start))];
    if (at < kTrainingText.size() && kTrainingText[at] == '\n') ++word_counts["\n"];
    start = at + 1;
  }
  TrainingWords training;
  std::map<std::string, int> ids;
  for (const auto& [word, count] : word_counts) {
    std::vector<int> symbols;
    for (std::size_t at = 0; at < word.size();) {
      std::size_t length = 1;
      while (at + length < word.size() && (static_cast<unsigned char>(word[at + length]) & 0xC0) == 0x80) ++length;
      auto [id, added] = ids.try_emplace(word.substr(at, length), static_cast<int>(training.names.size()));
      if (added) training.names.push_back(word.substr(at, length));
      symbols.push_back(id->second);
      at += length;
    }
    training.words.emplace_back(std::move(symbols), count);
  }
  return training;
}

// "Ġbako", "Ġtelimu", ... ("▁bako" in SentencePiece): pronounceable and distinct for each n, so
// sampled text reads as words.
std::string filler_word(std::size_t n, std::string_view space) {
  constexpr std::string_view consonants = "bdfgklmnprstvz", vowels = "aeiou";
  constexpr std::size_t syllables = consonants.size() * vowels.size();
  std::string word(space);
  for (std::size_t v = n + syllables; v > 0; v /= syllables) {
    word += consonants[v % syllables / vowels.size()];
    word += vowels[v % vowels.size()];
  }
  return word;
}

constexpr std::string_view kGemmaChatTemplate =
    "{{ bos_token }}{% for message in messages %}{% set role = 'model' if message['role'] == 'assistant' else "
    "message['role'] %}{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}";

constexpr std::string_view kPhi3ChatTemplate =
    "{% for message in messages %}{{ '<|' + message['role'] + '|>' + '\n' + message['content'] + '<|end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}";

struct SentencePieceLayout {
  std::vector<std::pair<std::string_view, TokenType>> head, tail;  // before the byte tokens; at the end
};

// Gemma's: <pad> <eos> <bos> <unk> and the turn markers first, then added tokens its converter
// marks user-defined (whitespace runs, HTML tags), which are matched in any text. Phi-3's: Llama
// 2's <unk> <s> </s> first and its chat markers at the end.
SentencePieceLayout sentencepiece_layout(VocabularyKind kind) {
  using enum TokenType;
  if (kind == VocabularyKind::gemma) {
    return {{{"<pad>", control}, {"<eos>", control}, {"<bos>", control}, {"<unk>", unknown},
             {"<start_of_turn>", control}, {"<end_of_turn>", control}, {"\n\n", user_defined},
             {"\n\n\n", user_defined}, {"  ", user_defined}, {"   ", user_defined}, {"    ", user_defined},
             {"\t\t", user_defined}, {"<table>", user_defined}, {"<tr>", user_defined}, {"<td>", user_defined},
             {"</td>", user_defined}},
            {}};
  }
  return {{{"<unk>", unknown}, {"<s>", control}, {"</s>", control}},
          {{"<|endoftext|>", control}, {"<|assistant|>", control}, {"<|placeholder1|>", control},
           {"<|system|>", control}, {"<|end|>", control}, {"<|user|>", control}}};
}

std::int32_t id_of(const Vocabulary& v, std::string_view text) {
  return static_cast<std::int32_t>(std::find(v.tokens.begin(), v.tokens.end(), text) - v.tokens.begin());
}

constexpr std::string_view kLlama3ChatTemplate =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + "
    "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";

}  // namespace

std::string byte_to_unicode(std::uint8_t byte) { return utf8(byte_code_point(byte)); }

Vocabulary make_byte_bpe_vocabulary(std::size_t size, std::span<const std::string_view> extra_specials) {
  if (size < kMinSyntheticVocabulary + extra_specials.size()) {
    throw std::invalid_argument("a byte-level BPE vocabulary needs at least " +
                                std::to_string(kMinSyntheticVocabulary + extra_specials.size()) + " tokens");
  }
  std::vector<std::string_view> specials = {"<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                                            "<|end_header_id|>", "<|eot_id|>"};
  specials.insert(specials.end(), extra_specials.begin(), extra_specials.end());
  const std::size_t regular = size - specials.size();
  Vocabulary v;
  v.model = TokenizerModel::bpe;
  v.pre = "llama-bpe";
  std::vector<std::pair<std::uint32_t, std::uint8_t>> bytes;  // in code point order, GPT-2's ids
  for (int b = 0; b < 256; ++b) bytes.emplace_back(byte_code_point(static_cast<std::uint8_t>(b)), b);
  std::sort(bytes.begin(), bytes.end());
  for (auto [code_point, byte] : bytes) v.tokens.push_back(utf8(code_point));
  std::unordered_set<std::string> known(v.tokens.begin(), v.tokens.end());
  for (auto& [left, right] : learn_merges(byte_training_words(), regular - 256)) {
    v.merges.push_back(left + " " + right);
    if (known.insert(left + right).second) v.tokens.push_back(left + right);
  }
  const std::string space = byte_to_unicode(' ');
  for (std::size_t n = 0; v.tokens.size() < regular; ++n) {
    if (known.insert(filler_word(n, space)).second) v.tokens.push_back(filler_word(n, space));
  }
  v.types.assign(v.tokens.size(), TokenType::normal);
  for (auto special : specials) {
    v.tokens.emplace_back(special);
    v.types.push_back(TokenType::control);
  }
  v.bos = static_cast<std::int32_t>(regular);
  v.eos = static_cast<std::int32_t>(regular + 1);
  v.eot = static_cast<std::int32_t>(regular + 4);
  v.add_bos = true;
  v.chat_template = std::string(kLlama3ChatTemplate);
  return v;
}

namespace {

constexpr std::array kKindNames = {std::pair{VocabularyKind::llama_bpe, "llama-bpe"}, std::pair{VocabularyKind::qwen2, "qwen2"},
                                   std::pair{VocabularyKind::gpt2, "gpt2"}, std::pair{VocabularyKind::tekken, "tekken"},
                                   std::pair{VocabularyKind::smollm, "smollm"}, std::pair{VocabularyKind::gemma, "gemma"},
                                   std::pair{VocabularyKind::phi3, "phi3"}};

bool is_sentencepiece(VocabularyKind kind) { return kind == VocabularyKind::gemma || kind == VocabularyKind::phi3; }

std::size_t sentencepiece_minimum(VocabularyKind kind) {
  const SentencePieceLayout layout = sentencepiece_layout(kind);
  return layout.head.size() + 256 + sentencepiece_training_words().names.size() + layout.tail.size();
}

// The layout's tokens around the 256 byte tokens <0xNN>, the training text's characters and the
// pieces learnt from it (scored by the order they were learnt in, the first highest), and filler
// words up to `size`.
Vocabulary make_sentencepiece_vocabulary(VocabularyKind kind, std::size_t size) {
  const SentencePieceLayout layout = sentencepiece_layout(kind);
  if (size < sentencepiece_minimum(kind)) {
    throw std::invalid_argument(fmt::format("a {} vocabulary needs at least {} tokens", vocabulary_kind_name(kind),
                                            sentencepiece_minimum(kind)));
  }
  Vocabulary v;
  v.model = TokenizerModel::spm;
  auto add = [&v](std::string text, TokenType type, float score) {
    v.tokens.push_back(std::move(text));
    v.types.push_back(type);
    v.scores.push_back(score);
  };
  for (auto [text, type] : layout.head) add(std::string(text), type, 0.0f);
  for (int b = 0; b < 256; ++b) add(fmt::format("<0x{:02X}>", b), TokenType::byte, 0.0f);
  const std::size_t regular = size - layout.tail.size();
  TrainingWords training = sentencepiece_training_words();
  std::unordered_set<std::string> known(training.names.begin(), training.names.end());
  for (const auto& name : training.names) add(name, TokenType::normal, -1.0e6f);
  const std::size_t merge_limit = regular - v.tokens.size();
  float score = 0.0f;
  for (auto& [left, right] : learn_merges(std::move(training), merge_limit)) {
    if (v.tokens.size() < regular && known.insert(left + right).second) add(left + right, TokenType::normal, score--);
  }
  for (std::size_t n = 0; v.tokens.size() < regular; ++n) {
    std::string word = filler_word(n, kSentencePieceSpace);
    if (known.insert(word).second) add(std::move(word), TokenType::normal, score--);
  }
  for (auto [text, type] : layout.tail) add(std::string(text), type, 0.0f);
  v.add_bos = true;
  if (kind == VocabularyKind::gemma) {
    v.pad = 0, v.eos = 1, v.bos = 2, v.unk = 3, v.eot = id_of(v, "<end_of_turn>");
    v.add_space_prefix = false;
    v.chat_template = std::string(kGemmaChatTemplate);
  } else {
    v.unk = 0, v.bos = 1, v.eos = id_of(v, "<|endoftext|>"), v.eot = id_of(v, "<|end|>");
    v.chat_template = std::string(kPhi3ChatTemplate);
  }
  return v;
}

}  // namespace

std::string_view vocabulary_kind_name(VocabularyKind kind) {
  for (auto [k, name] : kKindNames) {
    if (k == kind) return name;
  }
  return "?";
}

std::optional<VocabularyKind> parse_vocabulary_kind(std::string_view name) {
  for (auto [kind, n] : kKindNames) {
    if (n == name) return kind;
  }
  return std::nullopt;
}

std::vector<std::string_view> vocabulary_kind_names() {
  std::vector<std::string_view> names;
  for (auto [kind, name] : kKindNames) names.emplace_back(name);
  return names;
}

std::size_t min_vocabulary_size(VocabularyKind kind, std::size_t extra_specials) {
  return is_sentencepiece(kind) ? sentencepiece_minimum(kind) : kMinSyntheticVocabulary + extra_specials;
}

Vocabulary make_vocabulary(VocabularyKind kind, std::size_t size, std::span<const std::string_view> extra_specials) {
  if (is_sentencepiece(kind)) return make_sentencepiece_vocabulary(kind, size);
  Vocabulary v = make_byte_bpe_vocabulary(size, extra_specials);
  v.pre = kind == VocabularyKind::gpt2 ? "gpt-2" : vocabulary_kind_name(kind);  // llama.cpp knows "gpt-2" only
  return v;
}

}  // namespace mqlm::model::gguf
