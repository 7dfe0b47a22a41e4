// Models with seeded random weights, laid out as llama.cpp lays out llama / qwen2 / qwen3 GGUF
// files, for tests (preset tiny: a few MB) and benchmarks (llama3-8b: written in seconds).
//
// Matrices are normal(0, 0.02) in the weight type asked; norm weights are 1 + normal(0, 0.02) and
// biases normal(0, 0.02), in F32. Large models repeat a pool of 4M random elements per weight
// type (each tensor starts where the previous one stopped), which is as good as fresh numbers
// for a benchmark and takes no time to make; a model smaller than the pool repeats nothing.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gpu/weight_formats.hpp"
#include "model/gguf/gguf_writer.hpp"

namespace mqlm::model::gguf {

struct ModelShape {
  std::string arch = "llama";  // "llama"; "qwen2" adds q/k/v biases; "qwen3" adds per-head q/k norms
  std::uint32_t layers = 2;
  std::uint32_t hidden = 256;
  std::uint32_t heads = 4;
  std::uint32_t kv_heads = 2;
  std::uint32_t head_dim = 64;
  std::uint32_t ffn = 768;
  std::uint32_t vocab = 1024;
  std::uint32_t context = 2048;
  float rope_base = 500000.0f;
  float rms_epsilon = 1e-5f;
  bool tied_embeddings = false;  // no output.weight: the output projection is token_embd's
};

// "tiny", "llama3-1b" (Llama 3.2 1B's shape), "llama3-8b".
std::optional<ModelShape> model_preset(std::string_view name);
std::vector<std::string_view> model_preset_names();
// Why a shape cannot be made (zero sizes, heads not a multiple of KV heads, odd head dim, a
// vocabulary below the byte tokens and specials, an unknown arch), or nullopt.
std::optional<std::string> shape_problem(const ModelShape& shape);

struct SyntheticModel {
  GgufWriter writer;               // ready to write(); tensor data is made as it is written
  std::vector<std::string> notes;  // tensors written in another type than asked, and why
};

// The shape must have no shape_problem (std::invalid_argument otherwise). A matrix whose row
// length is not a whole number of `type`'s blocks (Q4_K needs 256) falls back to Q8_0, or to F16
// when not even that fits, and says so in notes. Same arguments, same bytes.
SyntheticModel make_synthetic_model(const ModelShape& shape, gpu::WeightType type, std::uint64_t seed,
                                    const std::string& name);

}  // namespace mqlm::model::gguf
