// Writes the tokenizer fuzzer's seed corpus: for each of its tokenizers, texts that merge, split
// into words of every class (letters, digits, spaces, punctuation, CJK, emoji), hold special
// tokens or invalid UTF-8, under each encode mode; and id runs to decode (tokenizer_fuzzer.cpp
// says how the first byte picks all that).
#include <string>
#include <vector>

#include "tests/fuzz/fuzz_support.hpp"

int main(int argc, char** argv) {
  using namespace std::string_literals;
  const auto dir = mqlm::fuzz::seed_dir(argc, argv);
  if (dir.empty()) return 2;
  const std::vector<std::string> texts = {
      "Hello world",
      " the 12345 don't  he said:\n\n\tthe END",
      "\xe4\xbd\xa0\xe5\xa5\xbd, \xf0\x9f\x98\x80 caf\xc3\xa9 1234567",
      "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><tool><a><b> xyz",
      "<s>hello</s><unk> \xe2\x96\x81world",
      "bad \xff\xc3 utf8 \xed\xa0\x80\0end"s,
  };
  const std::string ids = "\x01\x00\x10\x01\x20\x00\x05\x01\xff\x00\x02\x00\x0c\x01\x13\x01"s;
  constexpr int kTokenizers = 7;
  int written = 0;
  for (int tokenizer = 0; tokenizer < kTokenizers; ++tokenizer) {
    for (std::size_t i = 0; i < texts.size(); ++i) {
      const int flags = (i % 2 ? 8 : 0) | (i % 3 ? 16 : 0);  // add_special, parse_special
      const std::string name = "encode-" + std::to_string(tokenizer) + "-" + std::to_string(i);
      if (!mqlm::fuzz::write_seed(dir, name, static_cast<char>(tokenizer | flags) + texts[i])) return 1;
      ++written;
    }
    for (int render_special : {0, 64}) {
      const std::string name = "decode-" + std::to_string(tokenizer) + "-" + std::to_string(render_special);
      if (!mqlm::fuzz::write_seed(dir, name, static_cast<char>(tokenizer | 32 | render_special) + ids)) return 1;
      ++written;
    }
  }
  std::printf("wrote %d seeds to %s\n", written, dir.c_str());
  return 0;
}
