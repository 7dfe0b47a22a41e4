#include "model/gguf/gguf_types.hpp"

#include <array>

namespace mqlm::model::gguf {

namespace {

// Block layouts of every type the format defines (ggml's type traits), so that the data size of
// a tensor we cannot compute with is still known and checked.
constexpr std::array<TensorTypeTraits, 32> kTensorTypes{{
    {TensorType::f32, "F32", 1, 4},         {TensorType::f16, "F16", 1, 2},
    {TensorType::q4_0, "Q4_0", 32, 18},     {TensorType::q4_1, "Q4_1", 32, 20},
    {TensorType::q5_0, "Q5_0", 32, 22},     {TensorType::q5_1, "Q5_1", 32, 24},
    {TensorType::q8_0, "Q8_0", 32, 34},     {TensorType::q8_1, "Q8_1", 32, 36},
    {TensorType::q2_k, "Q2_K", 256, 84},    {TensorType::q3_k, "Q3_K", 256, 110},
    {TensorType::q4_k, "Q4_K", 256, 144},   {TensorType::q5_k, "Q5_K", 256, 176},
    {TensorType::q6_k, "Q6_K", 256, 210},   {TensorType::q8_k, "Q8_K", 256, 292},
    {TensorType::iq2_xxs, "IQ2_XXS", 256, 66}, {TensorType::iq2_xs, "IQ2_XS", 256, 74},
    {TensorType::iq3_xxs, "IQ3_XXS", 256, 98}, {TensorType::iq1_s, "IQ1_S", 256, 50},
    {TensorType::iq4_nl, "IQ4_NL", 32, 18}, {TensorType::iq3_s, "IQ3_S", 256, 110},
    {TensorType::iq2_s, "IQ2_S", 256, 82},  {TensorType::iq4_xs, "IQ4_XS", 256, 136},
    {TensorType::i8, "I8", 1, 1},           {TensorType::i16, "I16", 1, 2},
    {TensorType::i32, "I32", 1, 4},         {TensorType::i64, "I64", 1, 8},
    {TensorType::f64, "F64", 1, 8},         {TensorType::iq1_m, "IQ1_M", 256, 56},
    {TensorType::bf16, "BF16", 1, 2},       {TensorType::tq1_0, "TQ1_0", 256, 54},
    {TensorType::tq2_0, "TQ2_0", 256, 66},  {TensorType::mxfp4, "MXFP4", 32, 17},
}};

}  // namespace

std::string_view value_type_name(ValueType type) {
  constexpr std::array<std::string_view, kValueTypeCount> names{"u8",   "i8",     "u16",   "i16", "u32",
                                                               "i32",  "f32",    "bool",  "string", "array",
                                                               "u64",  "i64",    "f64"};
  auto index = static_cast<std::uint32_t>(type);
  return index < names.size() ? names[index] : "unknown";
}

std::size_t MetadataArray::size() const {
  return std::visit([](const auto& values) { return values.size(); }, elements);
}

const TensorTypeTraits* tensor_type_traits(std::uint32_t id) {
  for (const auto& traits : kTensorTypes) {
    if (static_cast<std::uint32_t>(traits.type) == id) return &traits;
  }
  return nullptr;
}

std::string_view tensor_type_name(TensorType type) {
  const auto* traits = tensor_type_traits(static_cast<std::uint32_t>(type));
  return traits ? traits->name : "unknown";
}

std::optional<gpu::WeightType> to_weight_type(TensorType type) {
  switch (type) {
    case TensorType::f32: return gpu::WeightType::f32;
    case TensorType::f16: return gpu::WeightType::f16;
    case TensorType::bf16: return gpu::WeightType::bf16;
    case TensorType::q8_0: return gpu::WeightType::q8_0;
    case TensorType::q4_0: return gpu::WeightType::q4_0;
    case TensorType::q4_k: return gpu::WeightType::q4_k;
    case TensorType::q4_1: return gpu::WeightType::q4_1;
    case TensorType::q5_0: return gpu::WeightType::q5_0;
    case TensorType::q5_1: return gpu::WeightType::q5_1;
    case TensorType::q2_k: return gpu::WeightType::q2_k;
    case TensorType::q3_k: return gpu::WeightType::q3_k;
    case TensorType::q5_k: return gpu::WeightType::q5_k;
    case TensorType::q6_k: return gpu::WeightType::q6_k;
    case TensorType::iq4_nl: return gpu::WeightType::iq4_nl;
    case TensorType::iq4_xs: return gpu::WeightType::iq4_xs;
    default: return std::nullopt;
  }
}

TensorType to_tensor_type(gpu::WeightType type) {
  switch (type) {
    case gpu::WeightType::f32: return TensorType::f32;
    case gpu::WeightType::f16: return TensorType::f16;
    case gpu::WeightType::bf16: return TensorType::bf16;
    case gpu::WeightType::q8_0: return TensorType::q8_0;
    case gpu::WeightType::q4_0: return TensorType::q4_0;
    case gpu::WeightType::q4_k: return TensorType::q4_k;
    case gpu::WeightType::q4_1: return TensorType::q4_1;
    case gpu::WeightType::q5_0: return TensorType::q5_0;
    case gpu::WeightType::q5_1: return TensorType::q5_1;
    case gpu::WeightType::q2_k: return TensorType::q2_k;
    case gpu::WeightType::q3_k: return TensorType::q3_k;
    case gpu::WeightType::q5_k: return TensorType::q5_k;
    case gpu::WeightType::q6_k: return TensorType::q6_k;
    case gpu::WeightType::iq4_nl: return TensorType::iq4_nl;
    case gpu::WeightType::iq4_xs: return TensorType::iq4_xs;
  }
  return TensorType::f32;
}

}  // namespace mqlm::model::gguf
