// Writes the GGUF fuzzer's seed corpus: small valid files with every metadata type, tensors of
// every type, both versions, a custom alignment and a byte-level BPE vocabulary.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "model/gguf/synthetic_vocabulary.hpp"
#include "model/gguf/vocabulary_metadata.hpp"
#include "tests/model/gguf/gguf_test_files.hpp"

int main(int argc, char** argv) {
  using namespace mqlm::model::gguf;
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s SEED_DIR\n", argv[0]);
    return 2;
  }
  const std::filesystem::path dir = argv[1];
  std::filesystem::create_directories(dir);
  std::vector<std::pair<std::string, GgufWriter>> seeds;

  seeds.emplace_back("small-model", test::small_model_writer());

  GgufWriter metadata(2);
  metadata.set("u8", std::uint8_t{1}), metadata.set("i8", std::int8_t{-1}), metadata.set("u16", std::uint16_t{2});
  metadata.set("i16", std::int16_t{-2}), metadata.set("u32", std::uint32_t{3}), metadata.set("i32", std::int32_t{-3});
  metadata.set("f32", 0.5f), metadata.set("bool", true), metadata.set("string", std::string("text"));
  metadata.set("u64", std::uint64_t{4}), metadata.set("i64", std::int64_t{-4}), metadata.set("f64", 0.25);
  MetadataArray inner{std::vector<std::uint16_t>{1, 2}};
  metadata.set("nested", MetadataArray{std::vector<MetadataArray>{inner, MetadataArray{std::vector<bool>{true}}}});
  metadata.set("strings", MetadataArray{std::vector<std::string>{"a", "bc"}});
  seeds.emplace_back("metadata-v2", std::move(metadata));

  GgufWriter tensors;
  tensors.set("general.alignment", std::uint32_t{64});
  std::uint64_t seed = 1;
  for (auto type : mqlm::gpu::all_weight_types) {
    tensors.add_tensor(std::string(mqlm::gpu::weight_type_name(type)), to_tensor_type(type), {256, 1},
                       mqlm::gpu::random_weights(type, 1, 256, seed++));
  }
  tensors.add_tensor("iq2_xxs", TensorType::iq2_xxs, {256}, std::vector<std::byte>(66));  // not computed with
  tensors.add_tensor("empty", TensorType::f16, {0, 3}, std::vector<std::byte>());
  seeds.emplace_back("tensors", std::move(tensors));

  GgufWriter vocabulary;
  write_vocabulary(vocabulary, make_byte_bpe_vocabulary(300));
  seeds.emplace_back("vocabulary", std::move(vocabulary));

  for (const auto& [name, writer] : seeds) {
    auto bytes = writer.to_bytes();
    std::ofstream out(dir / name, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    if (!out) {
      std::fprintf(stderr, "cannot write %s\n", (dir / name).c_str());
      return 1;
    }
  }
  std::printf("wrote %zu seeds to %s\n", seeds.size(), dir.c_str());
  return 0;
}
