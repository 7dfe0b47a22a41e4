// Models held in memory for the forward-pass tests: tensors quantized from seeded random values.
#pragma once

#include <map>
#include <random>
#include <string>
#include <vector>

#include "model/llama/reference_model.hpp"

namespace mqlm::model::testing {

using gpu::WeightType;

struct MemoryModel {
  std::map<std::string, std::pair<TensorBytes, std::vector<std::byte>>> tensors;

  TensorSource source() const {
    return [this](const std::string& name) -> std::optional<TensorBytes> {
      auto it = tensors.find(name);
      if (it == tensors.end()) return std::nullopt;
      TensorBytes t = it->second.first;
      t.bytes = it->second.second;
      return t;
    };
  }
  void put(const std::string& name, WeightType type, std::uint64_t rows, std::uint64_t cols, const std::vector<float>& values) {
    auto bytes = gpu::quantize(type, values, cols);
    tensors[name] = {TensorBytes{type, rows, cols, {}}, std::move(bytes)};
  }
};

// A small model; the GPU takes head_dim up to 256.
inline LlamaConfig tiny(Architecture arch, std::uint32_t head_dim = 16) {
  LlamaConfig c;
  c.arch = arch;
  c.n_layers = 2;
  c.n_embd = 4 * head_dim;
  c.n_ff = 96;
  c.n_head = 4;
  c.n_head_kv = 2;
  c.head_dim = head_dim;
  c.n_vocab = 50;
  c.n_ctx_train = 128;
  c.rope_base = 10000.0f;
  c.rms_eps = 1e-5f;
  return c;
}

inline MemoryModel random_model(const LlamaConfig& c, WeightType type, std::uint64_t seed, bool tied = false) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.3f);
  MemoryModel m;
  for (const auto& spec : tensor_specs(c)) {
    if (spec.name == "output.weight" && tied) continue;
    std::vector<float> values(spec.rows * spec.cols);
    bool norm = spec.name.find("norm") != std::string::npos;
    for (auto& v : values) v = norm ? 1.0f + normal(rng) * 0.1f : normal(rng);
    m.put(spec.name, spec.matrix ? type : WeightType::f32, spec.rows, spec.cols, values);
  }
  return m;
}

}  // namespace mqlm::model::testing
