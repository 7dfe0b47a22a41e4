// What the writer writes, the reader reads back: every metadata value type (arrays, nested arrays
// and empty ones included), tensors of every weight type and of one we do not compute with, both
// versions, a custom alignment, from memory and from a mapped file.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "tests/model/gguf/gguf_test_files.hpp"

namespace mqlm::model::gguf {
namespace {

using test::expect_file;

std::vector<std::pair<std::string, MetadataValue>> every_value_type() {
  using std::numeric_limits;
  std::vector<std::pair<std::string, MetadataValue>> values{
      {"u8", std::uint8_t{255}},
      {"i8", std::int8_t{-128}},
      {"u16", std::uint16_t{65535}},
      {"i16", std::int16_t{-32768}},
      {"u32", numeric_limits<std::uint32_t>::max()},
      {"i32", numeric_limits<std::int32_t>::min()},
      {"f32", 3.25f},
      {"f32.inf", -numeric_limits<float>::infinity()},
      {"bool.true", true},
      {"bool.false", false},
      {"string", std::string("h\xC3\xA9llo, \xE4\xB8\x96\xE7\x95\x8C")},
      {"string.empty", std::string()},
      {"string.nul", std::string("a\0b", 3)},
      {"u64", numeric_limits<std::uint64_t>::max()},
      {"i64", numeric_limits<std::int64_t>::min()},
      {"f64", 1e-300},
  };
  values.emplace_back("array.u8", MetadataArray{std::vector<std::uint8_t>{0, 1, 255}});
  values.emplace_back("array.i8", MetadataArray{std::vector<std::int8_t>{-1, 2}});
  values.emplace_back("array.u16", MetadataArray{std::vector<std::uint16_t>{7}});
  values.emplace_back("array.i16", MetadataArray{std::vector<std::int16_t>{-7, 7}});
  values.emplace_back("array.u32", MetadataArray{std::vector<std::uint32_t>{1, 2, 3}});
  values.emplace_back("array.i32", MetadataArray{std::vector<std::int32_t>{-1, 0, 1}});
  values.emplace_back("array.f32", MetadataArray{std::vector<float>{0.5f, -2.0f}});
  values.emplace_back("array.bool", MetadataArray{std::vector<bool>{true, false, true}});
  values.emplace_back("array.string", MetadataArray{std::vector<std::string>{"", "Ġthe", "x y"}});
  values.emplace_back("array.u64", MetadataArray{std::vector<std::uint64_t>{1ull << 40}});
  values.emplace_back("array.i64", MetadataArray{std::vector<std::int64_t>{-(1ll << 40)}});
  values.emplace_back("array.f64", MetadataArray{std::vector<double>{3.141592653589793}});
  values.emplace_back("array.empty", MetadataArray{std::vector<std::string>{}});
  MetadataArray inner_u32{std::vector<std::uint32_t>{4, 5}}, inner_strings{std::vector<std::string>{"p", "q"}};
  MetadataArray nested{std::vector<MetadataArray>{inner_u32, inner_strings, MetadataArray{std::vector<double>{}}}};
  values.emplace_back("array.nested", nested);
  values.emplace_back("array.nested3", MetadataArray{std::vector<MetadataArray>{nested, nested}});
  return values;
}

TEST(GgufRoundTrip, EveryMetadataTypeInOrder) {
  GgufWriter writer;
  auto values = every_value_type();
  for (const auto& [key, value] : values) writer.set(key, value);
  GgufFile file = expect_file(GgufFile::parse(writer.to_bytes()));
  EXPECT_EQ(file.version(), 3u);
  ASSERT_EQ(file.metadata().size(), values.size());
  for (std::size_t i = 0; i < values.size(); ++i) {
    EXPECT_EQ(file.metadata()[i].key, values[i].first);
    EXPECT_EQ(file.metadata()[i].value, values[i].second) << values[i].first;
  }
  EXPECT_TRUE(file.tensors().empty());
}

TEST(GgufRoundTrip, TypedGetters) {
  GgufWriter writer;
  for (const auto& [key, value] : every_value_type()) writer.set(key, value);
  writer.set("i32.positive", std::int32_t{12});
  GgufFile file = expect_file(GgufFile::parse(writer.to_bytes()));
  ASSERT_NE(file.get<std::uint32_t>("u32"), nullptr);
  EXPECT_EQ(*file.get<std::uint32_t>("u32"), 0xFFFFFFFFu);
  EXPECT_EQ(file.get<std::uint32_t>("i32"), nullptr);  // exact type only
  EXPECT_EQ(file.get_uint("u8"), 255u);
  EXPECT_EQ(file.get_uint("i32.positive"), 12u);
  EXPECT_EQ(file.get_uint("i32"), std::nullopt);  // negative
  EXPECT_EQ(file.get_uint("f32"), std::nullopt);
  EXPECT_EQ(file.get_int("i64"), std::numeric_limits<std::int64_t>::min());
  EXPECT_EQ(file.get_int("u64"), std::nullopt);  // past int64
  EXPECT_EQ(file.get_float("f32"), 3.25);
  EXPECT_EQ(file.get_float("f64"), 1e-300);
  EXPECT_EQ(file.get_bool("bool.true"), true);
  EXPECT_EQ(file.get_string("string.nul"), std::string_view("a\0b", 3));
  ASSERT_NE(file.get_array<std::string>("array.string"), nullptr);
  EXPECT_EQ(file.get_array<std::string>("array.string")->at(1), "Ġthe");
  EXPECT_EQ(file.get_array<std::int32_t>("array.string"), nullptr);
  EXPECT_EQ(file.get_array<MetadataArray>("array.nested")->at(1).element_type(), ValueType::string);
  EXPECT_EQ(file.get_uint("absent"), std::nullopt);

  GgufError missing = file.key_error("absent", "a u32");
  EXPECT_EQ(missing.detail, "metadata key 'absent' is missing");
  GgufError wrong = file.key_error("array.string", "a u32");
  EXPECT_EQ(wrong.detail, "metadata key 'array.string' is an array of string, expected a u32");
  EXPECT_EQ(wrong.offset, file.find("array.string")->offset);
}

TEST(GgufRoundTrip, TensorsOfEveryTypeAligned) {
  for (std::uint32_t version : {2u, 3u}) {
    for (std::uint32_t alignment : {32u, 64u, 1u}) {
      GgufWriter writer(version);
      if (alignment != kDefaultAlignment) writer.set("general.alignment", alignment);
      std::vector<std::pair<std::string, std::vector<std::byte>>> expected;
      std::uint64_t seed = 1;
      for (auto type : gpu::all_weight_types) {
        auto bytes = gpu::random_weights(type, 3, 256, seed++);
        std::string name = "w." + std::string(gpu::weight_type_name(type));
        writer.add_tensor(name, to_tensor_type(type), {256, 3}, bytes);
        expected.emplace_back(name, bytes);
      }
      std::vector<std::byte> iq2_xxs(2 * 66, std::byte{7});  // a type mqlm reads but does not compute with
      writer.add_tensor("w.iq2_xxs", TensorType::iq2_xxs, {256, 2}, iq2_xxs);
      expected.emplace_back("w.iq2_xxs", iq2_xxs);
      std::vector<std::byte> cube(2 * 3 * 4 * 5 * 4, std::byte{1});
      writer.add_tensor("cube", TensorType::f32, {2, 3, 4, 5}, cube);
      expected.emplace_back("cube", cube);

      auto bytes = writer.to_bytes();
      EXPECT_EQ(bytes.size(), writer.file_size());
      GgufFile file = expect_file(GgufFile::parse(bytes));
      EXPECT_EQ(file.version(), version);
      EXPECT_EQ(file.alignment(), alignment);
      EXPECT_EQ(file.data_offset() % alignment, 0u);
      ASSERT_EQ(file.tensors().size(), expected.size());
      for (const auto& [name, data] : expected) {
        const TensorInfo* t = file.tensor(name);
        ASSERT_NE(t, nullptr) << name;
        auto span = file.data(*t);
        EXPECT_EQ(std::vector<std::byte>(span.begin(), span.end()), data) << name;
        EXPECT_EQ(t->offset % alignment, 0u) << name;
      }
      const TensorInfo& q4_k = *file.tensor("w.q4_k");
      EXPECT_EQ(q4_k.type, TensorType::q4_k);
      EXPECT_EQ(q4_k.dims, (std::vector<std::uint64_t>{256, 3}));
      EXPECT_EQ(q4_k.rows(), 3u);
      EXPECT_EQ(std::get<gpu::WeightType>(weight_type(q4_k)), gpu::WeightType::q4_k);
      auto unsupported = weight_type(*file.tensor("w.iq2_xxs"));
      ASSERT_TRUE(std::holds_alternative<GgufError>(unsupported));
      EXPECT_NE(std::get<GgufError>(unsupported).detail.find("type IQ2_XXS, which mqlm does not compute with"),
                std::string::npos);
      EXPECT_EQ(file.tensor("cube")->elements(), 120u);
    }
  }
}

TEST(GgufRoundTrip, DataDequantizesToWhatWasQuantized) {
  std::vector<float> values(2 * 256);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = std::sin(0.1f * static_cast<float>(i));
  GgufWriter writer;
  for (auto type : gpu::all_weight_types) {
    writer.add_tensor(std::string(gpu::weight_type_name(type)), to_tensor_type(type), {256, 2},
                      gpu::quantize(type, values, 256));
  }
  GgufFile file = expect_file(GgufFile::parse(writer.to_bytes()));
  for (auto type : gpu::all_weight_types) {
    const TensorInfo& t = *file.tensor(gpu::weight_type_name(type));
    auto back = gpu::dequantize(type, file.data(t), 2, 256);
    auto direct = gpu::dequantize(type, gpu::quantize(type, values, 256), 2, 256);
    EXPECT_EQ(back, direct) << gpu::weight_type_name(type);
  }
}

TEST(GgufRoundTrip, MappedFile) {
  auto path = std::filesystem::temp_directory_path() / ("gguf_round_trip_" + std::to_string(::getpid()) + ".gguf");
  auto writer = test::small_model_writer();
  ASSERT_FALSE(writer.write(path).has_value());
  EXPECT_FALSE(std::filesystem::exists(path.string() + ".partial"));
  EXPECT_EQ(std::filesystem::file_size(path), writer.file_size());
  {
    GgufFile file = expect_file(GgufFile::open(path));
    EXPECT_EQ(file.get_uint("llama.block_count"), 2u);
    GgufFile moved = std::move(file);  // the mapping moves with it
    EXPECT_EQ(moved.data(*moved.tensor("q.weight")).size(), 3u * 2 * 18);
  }
  std::filesystem::remove(path);

  auto missing = GgufFile::open(path);
  ASSERT_TRUE(std::holds_alternative<GgufError>(missing));
  EXPECT_NE(std::get<GgufError>(missing).detail.find("cannot open"), std::string::npos);
  auto directory = GgufFile::open(std::filesystem::temp_directory_path());
  ASSERT_TRUE(std::holds_alternative<GgufError>(directory));
  EXPECT_NE(std::get<GgufError>(directory).detail.find("not a regular file"), std::string::npos);
}

// The file on disk equals the bytes in memory when small pieces (buffered) and large ones (written
// straight through) alternate: a large piece once overtook the buffered header and small tensors.
TEST(GgufRoundTrip, FileEqualsTheBytesWhateverTheSizesOfThePieces) {
  auto path = std::filesystem::temp_directory_path() / ("gguf_pieces_" + std::to_string(::getpid()) + ".gguf");
  GgufWriter writer;
  writer.set("general.architecture", std::string("llama"));
  auto bytes_of = [](std::size_t n, int salt) {
    std::vector<std::byte> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>((i * 31 + salt) & 0xff);
    return v;
  };
  writer.add_tensor("small.a", TensorType::f32, {64}, bytes_of(256, 1));
  writer.add_tensor("large.b", TensorType::f32, {(std::uint64_t{3} << 20) / 4}, bytes_of(std::size_t{3} << 20, 2));
  writer.add_tensor("small.c", TensorType::f32, {8}, bytes_of(32, 3));
  writer.add_tensor("large.d", TensorType::f32, {(std::uint64_t{1} << 20) / 4}, bytes_of(std::size_t{1} << 20, 4));
  ASSERT_FALSE(writer.write(path).has_value());
  std::ifstream in(path, std::ios::binary);
  std::vector<char> on_disk((std::istreambuf_iterator<char>(in)), {});
  std::vector<std::byte> expected = writer.to_bytes();
  ASSERT_EQ(on_disk.size(), expected.size());
  EXPECT_TRUE(std::memcmp(on_disk.data(), expected.data(), expected.size()) == 0);
  GgufFile file = expect_file(GgufFile::open(path));
  auto d = file.data(*file.tensor("large.d"));
  EXPECT_TRUE(std::equal(d.begin(), d.end(), bytes_of(std::size_t{1} << 20, 4).begin()));
  std::filesystem::remove(path);
}

TEST(GgufRoundTrip, WriterRejectsMisuse) {
  GgufWriter writer;
  EXPECT_THROW(writer.set("general.alignment", std::uint32_t{48}), std::invalid_argument);
  EXPECT_THROW(writer.set("general.alignment", std::uint64_t{64}), std::invalid_argument);
  EXPECT_THROW(writer.add_tensor("x", TensorType::q4_k, {255, 1}, std::vector<std::byte>{}), std::invalid_argument);
  writer.add_tensor("y", TensorType::f32, {4}, std::vector<std::byte>(15));
  EXPECT_THROW(writer.to_bytes(), std::logic_error);
  EXPECT_THROW(writer.add_tensor("y", TensorType::f32, {4}, std::vector<std::byte>(16)), std::invalid_argument);
}

}  // namespace
}  // namespace mqlm::model::gguf
