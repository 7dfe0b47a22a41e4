// The GGUF format's types: metadata values (the variant's index is the file's value type id),
// tensor types with their block layouts, and the error every reader function returns.
//
// A GGUF file (v2 and v3 differ only in that v3 may be big-endian; we read little-endian):
//   u32 magic "GGUF", u32 version, u64 tensor_count, u64 metadata_count
//   metadata_count x { string key, u32 value_type, value }
//   tensor_count   x { string name, u32 n_dims, u64 dims[n_dims], u32 tensor_type, u64 offset }
//   padding to general.alignment (default 32), then the tensor data; offsets count from there.
// A string is a u64 byte length and the bytes; an array is u32 element type, u64 count, elements.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "gpu/weight_formats.hpp"

namespace mqlm::model::gguf {

inline constexpr std::uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian u32
inline constexpr std::uint32_t kDefaultAlignment = 32;
inline constexpr std::uint32_t kMaxDims = 4;
inline constexpr int kMaxArrayDepth = 8;  // arrays of arrays: deeper is refused, not recursed into
inline constexpr std::string_view kAlignmentKey = "general.alignment";

// Value type ids as the file writes them; the order is MetadataValue's alternatives.
enum class ValueType : std::uint32_t { u8, i8, u16, i16, u32, i32, f32, boolean, string, array, u64, i64, f64 };
inline constexpr std::uint32_t kValueTypeCount = 13;
std::string_view value_type_name(ValueType type);  // "u32", "string", "array", ...

struct MetadataArray;
using ArrayElements =
    std::variant<std::vector<std::uint8_t>, std::vector<std::int8_t>, std::vector<std::uint16_t>,
                 std::vector<std::int16_t>, std::vector<std::uint32_t>, std::vector<std::int32_t>, std::vector<float>,
                 std::vector<bool>, std::vector<std::string>, std::vector<MetadataArray>, std::vector<std::uint64_t>,
                 std::vector<std::int64_t>, std::vector<double>>;

// An array value; the alternative held says the element type (nested arrays each have their own).
struct MetadataArray {
  ArrayElements elements;

  ValueType element_type() const { return static_cast<ValueType>(elements.index()); }
  std::size_t size() const;
  bool operator==(const MetadataArray&) const = default;
};

using MetadataValue = std::variant<std::uint8_t, std::int8_t, std::uint16_t, std::int16_t, std::uint32_t, std::int32_t,
                                   float, bool, std::string, MetadataArray, std::uint64_t, std::int64_t, double>;

inline ValueType type_of(const MetadataValue& value) { return static_cast<ValueType>(value.index()); }

// Tensor type ids as the file writes them (ggml's). Ids missing here were removed from the format.
enum class TensorType : std::uint32_t {
  f32 = 0, f16 = 1, q4_0 = 2, q4_1 = 3, q5_0 = 6, q5_1 = 7, q8_0 = 8, q8_1 = 9,
  q2_k = 10, q3_k = 11, q4_k = 12, q5_k = 13, q6_k = 14, q8_k = 15,
  iq2_xxs = 16, iq2_xs = 17, iq3_xxs = 18, iq1_s = 19, iq4_nl = 20, iq3_s = 21, iq2_s = 22, iq4_xs = 23,
  i8 = 24, i16 = 25, i32 = 26, i64 = 27, f64 = 28, iq1_m = 29, bf16 = 30, tq1_0 = 34, tq2_0 = 35, mxfp4 = 39,
};

struct TensorTypeTraits {
  TensorType type;
  std::string_view name;  // as llama.cpp prints it: "Q4_K", "BF16", ...
  std::uint32_t block_elements;
  std::uint32_t block_bytes;
};

// nullptr for an id no GGUF type has.
const TensorTypeTraits* tensor_type_traits(std::uint32_t id);
std::string_view tensor_type_name(TensorType type);
// The types mqlm computes with; nullopt for the others (recognised, but not supported).
std::optional<gpu::WeightType> to_weight_type(TensorType type);
TensorType to_tensor_type(gpu::WeightType type);

// What was wrong with a file, and where: the byte offset of the field that holds the bad value
// (or where a truncated field begins).
struct GgufError {
  std::uint64_t offset = 0;
  std::string detail;

  std::string message() const { return "at byte " + std::to_string(offset) + ": " + detail; }
};

template <typename T>
using GgufResult = std::variant<T, GgufError>;

}  // namespace mqlm::model::gguf
