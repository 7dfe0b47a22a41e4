// libFuzzer target: the GGUF reader on arbitrary bytes.
//
// Beyond "no crash, leak, UB, hang or allocation past libFuzzer's limit" (the sanitizers and
// -malloc_limit_mb see to those) it checks the reader's contract: an error has a detail and an
// offset inside the input; a parsed file's tensor data lies inside it; read_vocabulary() gives a
// consistent vocabulary or an error; and writing what was read, reading it and writing it again
// gives the same bytes.
#include <cstdio>
#include <cstdlib>

#include "model/gguf/gguf_file.hpp"
#include "model/gguf/gguf_writer.hpp"
#include "model/gguf/vocabulary_metadata.hpp"

namespace {

using namespace mqlm::model::gguf;

[[noreturn]] void contract_broken(const char* what) {
  std::fprintf(stderr, "GGUF reader contract broken: %s\n", what);
  std::abort();
}

void check_vocabulary(const GgufFile& file) {
  auto result = read_vocabulary(file);
  if (const auto* error = std::get_if<GgufError>(&result)) {
    if (error->detail.empty()) contract_broken("a vocabulary error without detail");
    return;
  }
  const auto& v = std::get<mqlm::model::Vocabulary>(result);
  auto n = static_cast<std::int64_t>(v.tokens.size());
  if (n == 0) contract_broken("an empty vocabulary");
  if (!v.scores.empty() && v.scores.size() != v.tokens.size()) contract_broken("scores not one per token");
  if (!v.types.empty() && v.types.size() != v.tokens.size()) contract_broken("types not one per token");
  for (std::int32_t id : {v.bos, v.eos, v.eot, v.unk, v.pad}) {
    if (id < -1 || id >= n) contract_broken("a special token id outside the vocabulary");
  }
}

std::vector<std::byte> rewrite(const GgufFile& file) {
  GgufWriter writer(file.version());
  for (const auto& entry : file.metadata()) writer.set(entry.key, entry.value);
  for (const auto& tensor : file.tensors()) {
    auto data = file.data(tensor);
    writer.add_tensor(tensor.name, tensor.type, tensor.dims, std::vector<std::byte>(data.begin(), data.end()));
  }
  return writer.to_bytes();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto* bytes = reinterpret_cast<const std::byte*>(data);
  auto result = GgufFile::parse(std::vector<std::byte>(bytes, bytes + size));
  if (const auto* error = std::get_if<GgufError>(&result)) {
    if (error->detail.empty()) contract_broken("an error without detail");
    if (error->offset > size) contract_broken("an error offset past the end of the input");
    return 0;
  }
  const GgufFile& file = std::get<GgufFile>(result);
  unsigned sum = 0;
  for (const auto& tensor : file.tensors()) {
    auto span = file.data(tensor);  // throws if outside the file
    if (!span.empty()) sum += std::to_integer<unsigned>(span.front()) + std::to_integer<unsigned>(span.back());
    (void)weight_type(tensor);
  }
  if (sum == 0xFFFFFFFFu) std::fprintf(stderr, "%u\n", sum);  // keeps the reads
  check_vocabulary(file);

  // Writing pads to the alignment: a hostile one of 2^31 would make the writer, not the reader,
  // allocate gigabytes.
  if (file.alignment() > 4096) return 0;
  auto first = rewrite(file);
  auto again = GgufFile::parse(first);
  if (!std::holds_alternative<GgufFile>(again)) contract_broken("what was read, written, does not read");
  if (rewrite(std::get<GgufFile>(again)) != first) contract_broken("writing what was read is not stable");
  return 0;
}
