// Small GGUF files for the tests, and helpers to damage them at known fields.
#pragma once

#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "gpu/weight_formats.hpp"
#include "model/gguf/gguf_file.hpp"
#include "model/gguf/gguf_writer.hpp"

namespace mqlm::model::gguf::test {

// A few metadata entries of different types and three tensors (F32 vector, Q4_0 and Q8_0
// matrices), the shape of a model file in miniature.
inline GgufWriter small_model_writer() {
  GgufWriter w;
  w.set("general.architecture", std::string("llama"));
  w.set("llama.block_count", std::uint32_t{2});
  w.set("general.flag", true);
  w.set("tokenizer.ggml.tokens", MetadataArray{std::vector<std::string>{"a", "b", "cd"}});
  w.add_tensor("norm.weight", TensorType::f32, {64}, gpu::random_weights(gpu::WeightType::f32, 1, 64, 1));
  w.add_tensor("q.weight", TensorType::q4_0, {64, 3}, gpu::random_weights(gpu::WeightType::q4_0, 3, 64, 2));
  w.add_tensor("k.weight", TensorType::q8_0, {64, 2}, gpu::random_weights(gpu::WeightType::q8_0, 2, 64, 3));
  return w;
}

template <typename T>
void poke(std::vector<std::byte>& bytes, std::uint64_t offset, T value) {
  std::memcpy(bytes.data() + offset, &value, sizeof(T));
}

template <typename T>
T peek(const std::vector<std::byte>& bytes, std::uint64_t offset) {
  T value;
  std::memcpy(&value, bytes.data() + offset, sizeof(T));
  return value;
}

// Where the fields of a parsed tensor info lie in the file.
struct TensorFields {
  std::uint64_t n_dims, dims, type, offset;
};
inline TensorFields fields_of(const TensorInfo& t) {
  std::uint64_t n_dims = t.info_offset + 8 + t.name.size();
  std::uint64_t dims = n_dims + 4;
  std::uint64_t type = dims + 8 * t.dims.size();
  return {n_dims, dims, type, type + 4};
}

// The file, or the test fails with the reader's message.
inline GgufFile expect_file(GgufResult<GgufFile>&& result) {
  if (const auto* error = std::get_if<GgufError>(&result)) throw std::runtime_error(error->message());
  return std::get<GgufFile>(std::move(result));
}

}  // namespace mqlm::model::gguf::test
