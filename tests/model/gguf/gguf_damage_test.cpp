// Truncated, corrupted and hostile files: each gives an error that says what and where (the
// byte offset of the bad field), never a crash, a hang or a huge allocation.
#include <gtest/gtest.h>

#include "tests/model/gguf/gguf_test_files.hpp"

namespace mqlm::model::gguf {
namespace {

using test::fields_of;
using test::peek;
using test::poke;

constexpr std::uint64_t kHuge = std::uint64_t{1} << 62;

class GgufDamage : public ::testing::Test {
 protected:
  void SetUp() override {
    good = test::small_model_writer().to_bytes();
    auto result = GgufFile::parse(good);
    ASSERT_TRUE(std::holds_alternative<GgufFile>(result));
    parsed = std::make_unique<GgufFile>(std::get<GgufFile>(std::move(result)));
  }

  // Parses `bytes`, expects an error at `offset` whose detail contains `words`.
  static void expect_error(const std::vector<std::byte>& bytes, std::uint64_t offset, const std::string& words) {
    auto result = GgufFile::parse(bytes);
    ASSERT_TRUE(std::holds_alternative<GgufError>(result)) << "parsed although damaged: expected " << words;
    const auto& error = std::get<GgufError>(result);
    EXPECT_EQ(error.offset, offset) << error.detail;
    EXPECT_NE(error.detail.find(words), std::string::npos) << error.detail << "\n  expected: " << words;
  }

  std::uint64_t entry(std::string_view key) const { return parsed->find(key)->offset; }
  // The value type field of an entry, and its value just after.
  std::uint64_t value_type_field(std::string_view key) const { return entry(key) + 8 + key.size(); }
  test::TensorFields tensor(std::string_view name) const { return fields_of(*parsed->tensor(name)); }

  std::vector<std::byte> good;
  std::unique_ptr<GgufFile> parsed;
};

TEST_F(GgufDamage, TruncatedAnywhere) {
  for (std::size_t size = 0; size < good.size(); ++size) {
    auto result = GgufFile::parse(std::vector<std::byte>(good.begin(), good.begin() + static_cast<long>(size)));
    ASSERT_TRUE(std::holds_alternative<GgufError>(result)) << "a file cut to " << size << " bytes parsed";
    const auto& error = std::get<GgufError>(result);
    EXPECT_LE(error.offset, size);
    EXPECT_FALSE(error.detail.empty());
  }
  EXPECT_TRUE(std::holds_alternative<GgufFile>(GgufFile::parse(good)));
}

TEST_F(GgufDamage, TruncationNamesTheField) {
  expect_error({}, 0, "file ends inside the GGUF magic");
  expect_error(std::vector<std::byte>(good.begin(), good.begin() + 6), 4, "file ends inside the GGUF version");
  auto key = entry("tokenizer.ggml.tokens");
  expect_error(std::vector<std::byte>(good.begin(), good.begin() + static_cast<long>(key + 12)), key,
               "a metadata key's length declares 21 bytes but only 4 are left");
  auto last = tensor("k.weight");
  expect_error(std::vector<std::byte>(good.begin(), good.begin() + static_cast<long>(last.offset + 3)), last.offset,
               "file ends inside a tensor data offset");
  // The last tensor's data cut short.
  expect_error(std::vector<std::byte>(good.begin(), good.end() - 1), last.offset, "runs past the end of the file");
}

TEST_F(GgufDamage, BadMagicAndVersion) {
  auto bytes = good;
  bytes[3] = std::byte{'X'};
  expect_error(bytes, 0, "not a GGUF file: it starts with 47 47 55 58");
  bytes = good;
  poke<std::uint32_t>(bytes, 4, 1);
  expect_error(bytes, 4, "GGUF version 1 is not supported");
  poke<std::uint32_t>(bytes, 4, 4);
  expect_error(bytes, 4, "unsupported GGUF version 4");
  poke<std::uint32_t>(bytes, 4, 0x03000000u);
  expect_error(bytes, 4, "big-endian");
}

TEST_F(GgufDamage, HugeCounts) {
  auto bytes = good;
  poke<std::uint64_t>(bytes, 8, kHuge);
  expect_error(bytes, 8, "the tensor count is 4611686018427387904");
  bytes = good;
  poke<std::uint64_t>(bytes, 16, kHuge);
  expect_error(bytes, 16, "the metadata entry count is 4611686018427387904");
  // More entries than there are: the tensor infos are read as metadata and fail somewhere after.
  bytes = good;
  poke<std::uint64_t>(bytes, 16, peek<std::uint64_t>(bytes, 16) + 1);
  EXPECT_TRUE(std::holds_alternative<GgufError>(GgufFile::parse(bytes)));
}

TEST_F(GgufDamage, HugeLengths) {
  auto bytes = good;
  poke<std::uint64_t>(bytes, entry("general.flag"), kHuge);
  expect_error(bytes, entry("general.flag"), "a metadata key's length declares 4611686018427387904 bytes");
  bytes = good;
  std::uint64_t count = value_type_field("tokenizer.ggml.tokens") + 8;  // after the element type
  poke<std::uint64_t>(bytes, count, kHuge);
  expect_error(bytes, count, "array element count is 4611686018427387904");
  bytes = good;
  poke<std::uint64_t>(bytes, count + 8, std::uint64_t{1} << 40);  // the first string's length
  expect_error(bytes, count + 8, "a string element's length declares 1099511627776 bytes");
  bytes = good;
  poke<std::uint64_t>(bytes, parsed->tensor("q.weight")->info_offset, kHuge);
  expect_error(bytes, parsed->tensor("q.weight")->info_offset, "a tensor name's length declares");
}

TEST_F(GgufDamage, BadValueTypes) {
  auto bytes = good;
  poke<std::uint32_t>(bytes, value_type_field("general.flag"), 13);
  expect_error(bytes, value_type_field("general.flag"), "value type of 'general.flag' 13 is not a GGUF value type");
  bytes = good;
  poke<std::uint32_t>(bytes, value_type_field("tokenizer.ggml.tokens") + 4, 99);
  expect_error(bytes, value_type_field("tokenizer.ggml.tokens") + 4, "array element type 99 is not a GGUF value type");
  bytes = good;
  poke<std::uint8_t>(bytes, value_type_field("general.flag") + 4, 2);
  expect_error(bytes, value_type_field("general.flag") + 4, "bool value 2 is neither 0 nor 1");
}

TEST_F(GgufDamage, ArraysNestedTooDeep) {
  // Hand-made: one key whose value is an array of arrays ... ten deep, ending in an empty u8 array.
  std::vector<std::byte> bytes;
  auto put = [&bytes](auto value) {
    auto* p = reinterpret_cast<const std::byte*>(&value);
    bytes.insert(bytes.end(), p, p + sizeof(value));
  };
  put(kMagic), put(std::uint32_t{3}), put(std::uint64_t{0}), put(std::uint64_t{1});
  put(std::uint64_t{1}), bytes.push_back(std::byte{'k'}), put(static_cast<std::uint32_t>(ValueType::array));
  std::uint64_t ninth = 0;
  for (int level = 1; level <= 10; ++level) {
    if (level == kMaxArrayDepth + 1) ninth = bytes.size();
    put(static_cast<std::uint32_t>(level < 10 ? ValueType::array : ValueType::u8));
    put(std::uint64_t{level < 10 ? 1u : 0u});
  }
  expect_error(bytes, ninth, "arrays nested deeper than 8 levels");
}

TEST_F(GgufDamage, Alignment) {
  GgufWriter writer = test::small_model_writer();
  writer.set("general.alignment", std::uint32_t{64});
  auto bytes = writer.to_bytes();
  GgufFile file = test::expect_file(GgufFile::parse(bytes));
  std::uint64_t at = file.find("general.alignment")->offset;
  std::uint64_t value = at + 8 + kAlignmentKey.size() + 4;
  auto damaged = bytes;
  poke<std::uint32_t>(damaged, value, 48);
  expect_error(damaged, at, "general.alignment 48 is not a power of two");
  poke<std::uint32_t>(damaged, value, 0);
  expect_error(damaged, at, "general.alignment 0 is not a power of two");
  damaged = bytes;
  poke<std::uint32_t>(damaged, value - 4, static_cast<std::uint32_t>(ValueType::i32));
  expect_error(damaged, at, "general.alignment is a i32, expected a u32");
}

TEST_F(GgufDamage, BadDimensions) {
  auto q = tensor("q.weight");
  auto bytes = good;
  poke<std::uint32_t>(bytes, q.n_dims, 0);
  expect_error(bytes, q.n_dims, "tensor 'q.weight' has 0 dimensions (1 to 4 allowed)");
  poke<std::uint32_t>(bytes, q.n_dims, 5);
  expect_error(bytes, q.n_dims, "has 5 dimensions");
  bytes = good;
  poke<std::uint64_t>(bytes, q.dims, std::uint64_t{1} << 63);
  expect_error(bytes, q.dims, "has dimension 9223372036854775808: its size overflows");
  bytes = good;
  poke<std::uint64_t>(bytes, q.dims, std::uint64_t{1} << 32);
  poke<std::uint64_t>(bytes, q.dims + 8, std::uint64_t{1} << 32);
  expect_error(bytes, q.dims + 8, "its size overflows");
  bytes = good;
  poke<std::uint64_t>(bytes, q.dims, 48);  // Q4_0 rows are whole blocks of 32
  expect_error(bytes, q.type, "rows of 48 elements, not a whole number of Q4_0 blocks of 32");
  bytes = good;
  poke<std::uint64_t>(bytes, q.dims + 8, std::uint64_t{1} << 40);  // rows: far more data than the file
  expect_error(bytes, parsed->tensor("q.weight")->info_offset, "is larger than the whole file");
  bytes = good;
  poke<std::uint64_t>(bytes, q.dims + 8, 20);  // more rows than there are: runs past the end
  expect_error(bytes, q.offset, "tensor 'q.weight' data [256, +720) runs past the end of the file");
}

TEST_F(GgufDamage, BadTensorTypes) {
  auto q = tensor("q.weight");
  auto bytes = good;
  poke<std::uint32_t>(bytes, q.type, 4);  // Q4_2: removed from the format
  expect_error(bytes, q.type, "tensor 'q.weight' has unknown type id 4");
  poke<std::uint32_t>(bytes, q.type, 1000);
  expect_error(bytes, q.type, "unknown type id 1000");
}

TEST_F(GgufDamage, BadTensorOffsets) {
  auto q = tensor("q.weight"), k = tensor("k.weight");
  auto bytes = good;
  poke<std::uint64_t>(bytes, k.offset, peek<std::uint64_t>(bytes, k.offset) + 1);
  expect_error(bytes, k.offset, "tensor 'k.weight' data offset 385 is not a multiple of the alignment 32");
  bytes = good;
  poke<std::uint64_t>(bytes, k.offset, std::uint64_t{1} << 40);
  expect_error(bytes, k.offset, "runs past the end of the file");
  bytes = good;
  poke<std::uint64_t>(bytes, k.offset, ~std::uint64_t{31});  // aligned, and offset + size overflows
  expect_error(bytes, k.offset, "runs past the end of the file");
  bytes = good;
  poke<std::uint64_t>(bytes, k.offset, peek<std::uint64_t>(bytes, q.offset));
  expect_error(bytes, k.offset, "tensor 'k.weight' data [256, +136) overlaps tensor 'q.weight' data [256, +108)");
}

TEST_F(GgufDamage, Duplicates) {
  GgufWriter writer;
  writer.set("key.a", std::uint8_t{1});
  writer.set("key.b", std::uint8_t{2});
  writer.add_tensor("t.a", TensorType::f32, {1}, std::vector<std::byte>(4));
  writer.add_tensor("t.b", TensorType::f32, {1}, std::vector<std::byte>(4));
  auto bytes = writer.to_bytes();
  GgufFile file = test::expect_file(GgufFile::parse(bytes));
  auto damaged = bytes;
  poke<char>(damaged, file.find("key.b")->offset + 8 + 4, 'a');
  expect_error(damaged, file.find("key.b")->offset, "metadata key 'key.a' appears twice");
  damaged = bytes;
  poke<char>(damaged, file.tensor("t.b")->info_offset + 8 + 2, 'a');
  expect_error(damaged, file.tensor("t.b")->info_offset, "tensor 't.a' appears twice");
  damaged = bytes;
  poke<std::uint64_t>(damaged, file.tensor("t.b")->info_offset, 0);  // empty name; the rest misread
  expect_error(damaged, file.tensor("t.b")->info_offset, "a tensor has an empty name");
}

TEST_F(GgufDamage, HostileNamesArePrintedSafely) {
  GgufWriter writer;
  writer.set("key", std::uint8_t{1});
  const std::string key = std::string("bad\x1b[31m\n") + std::string(200, 'x');
  writer.set(key, std::uint8_t{2});
  auto bytes = writer.to_bytes();
  GgufFile file = test::expect_file(GgufFile::parse(bytes));
  poke<std::uint32_t>(bytes, file.find(key)->offset + 8 + key.size(), 77);  // its value type
  auto result = GgufFile::parse(bytes);
  ASSERT_TRUE(std::holds_alternative<GgufError>(result));
  const std::string& detail = std::get<GgufError>(result).detail;
  EXPECT_NE(detail.find("'bad\\x1b[31m\\x0axxx"), std::string::npos) << detail;
  EXPECT_NE(detail.find("...'"), std::string::npos) << detail;
  EXPECT_LT(detail.size(), 200u);
}

}  // namespace
}  // namespace mqlm::model::gguf
