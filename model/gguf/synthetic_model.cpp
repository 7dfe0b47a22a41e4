#include "model/gguf/synthetic_model.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <numbers>
#include <stdexcept>

#include <fmt/format.h>

#include "model/gguf/synthetic_vocabulary.hpp"
#include "model/gguf/vocabulary_metadata.hpp"

namespace mqlm::model::gguf {

namespace {

constexpr std::uint64_t kPoolElements = std::uint64_t{4} << 20;
constexpr float kWeightStd = 0.02f;

// splitmix64 and Box-Muller: the same numbers on every machine and standard library.
class NormalGenerator {
 public:
  explicit NormalGenerator(std::uint64_t seed) : state_(seed) {}

  float next() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    double u1 = 1.0 - static_cast<double>(next_u64() >> 11) * 0x1.0p-53;  // (0, 1]
    double u2 = static_cast<double>(next_u64() >> 11) * 0x1.0p-53;
    double radius = std::sqrt(-2.0 * std::log(u1)), angle = 2.0 * std::numbers::pi * u2;
    spare_ = static_cast<float>(radius * std::sin(angle));
    has_spare_ = true;
    return static_cast<float>(radius * std::cos(angle));
  }

 private:
  std::uint64_t next_u64() {
    std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }

  std::uint64_t state_;
  float spare_ = 0;
  bool has_spare_ = false;
};

std::vector<float> normals(std::size_t count, float mean, float std, std::uint64_t seed) {
  NormalGenerator generator(seed);
  std::vector<float> values(count);
  for (auto& value : values) value = mean + std * generator.next();
  return values;
}

std::vector<std::byte> f32_bytes(const std::vector<float>& values) {
  std::vector<std::byte> bytes(values.size() * sizeof(float));
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

// llama.cpp's general.file_type (llama_ftype) for a model mostly of this type.
std::uint32_t file_type(gpu::WeightType type) {
  switch (type) {
    case gpu::WeightType::f32: return 0;
    case gpu::WeightType::f16: return 1;
    case gpu::WeightType::q4_0: return 2;
    case gpu::WeightType::q8_0: return 7;
    case gpu::WeightType::q4_k: return 14;  // Q4_K_S: every matrix Q4_K
    case gpu::WeightType::bf16: return 32;
    case gpu::WeightType::q4_1: return 3;
    case gpu::WeightType::q5_0: return 8;
    case gpu::WeightType::q5_1: return 9;
    case gpu::WeightType::q2_k: return 10;
    case gpu::WeightType::q3_k: return 11;  // Q3_K_S
    case gpu::WeightType::q5_k: return 16;  // Q5_K_S
    case gpu::WeightType::q6_k: return 18;
    case gpu::WeightType::iq4_nl: return 25;
    case gpu::WeightType::iq4_xs: return 30;
  }
  return 0;
}

enum class Role { matrix, norm, bias };

struct PlannedTensor {
  std::string name;
  std::vector<std::uint64_t> dims;  // dims[0] contiguous
  Role role;
  gpu::WeightType type = gpu::WeightType::f32;
};

std::vector<PlannedTensor> plan_tensors(const ModelShape& s) {
  std::uint64_t q = std::uint64_t{s.heads} * s.head_dim, kv = std::uint64_t{s.kv_heads} * s.head_dim;
  std::vector<PlannedTensor> plan{{"token_embd.weight", {s.hidden, s.vocab}, Role::matrix}};
  for (std::uint32_t layer = 0; layer < s.layers; ++layer) {
    auto blk = [layer](std::string_view what) { return fmt::format("blk.{}.{}", layer, what); };
    plan.push_back({blk("attn_norm.weight"), {s.hidden}, Role::norm});
    plan.push_back({blk("attn_q.weight"), {s.hidden, q}, Role::matrix});
    plan.push_back({blk("attn_k.weight"), {s.hidden, kv}, Role::matrix});
    plan.push_back({blk("attn_v.weight"), {s.hidden, kv}, Role::matrix});
    if (s.arch == "qwen2") {
      plan.push_back({blk("attn_q.bias"), {q}, Role::bias});
      plan.push_back({blk("attn_k.bias"), {kv}, Role::bias});
      plan.push_back({blk("attn_v.bias"), {kv}, Role::bias});
    }
    if (s.arch == "qwen3") {
      plan.push_back({blk("attn_q_norm.weight"), {s.head_dim}, Role::norm});
      plan.push_back({blk("attn_k_norm.weight"), {s.head_dim}, Role::norm});
    }
    plan.push_back({blk("attn_output.weight"), {q, s.hidden}, Role::matrix});
    plan.push_back({blk("ffn_norm.weight"), {s.hidden}, Role::norm});
    plan.push_back({blk("ffn_gate.weight"), {s.hidden, s.ffn}, Role::matrix});
    plan.push_back({blk("ffn_up.weight"), {s.hidden, s.ffn}, Role::matrix});
    plan.push_back({blk("ffn_down.weight"), {s.ffn, s.hidden}, Role::matrix});
  }
  plan.push_back({"output_norm.weight", {s.hidden}, Role::norm});
  if (!s.tied_embeddings) plan.push_back({"output.weight", {s.hidden, s.vocab}, Role::matrix});
  return plan;
}

// The type a matrix with rows of k elements is written in: the one asked if its blocks fit.
gpu::WeightType fitting_type(gpu::WeightType asked, std::uint64_t k) {
  if (k % gpu::block_elements(asked) == 0) return asked;
  if (k % gpu::block_elements(gpu::WeightType::q8_0) == 0) return gpu::WeightType::q8_0;
  return gpu::WeightType::f16;
}

// Random blocks of one weight type; tensors take consecutive blocks from it, wrapping around.
struct BlockPool {
  std::vector<std::byte> bytes;
  std::uint64_t block_bytes = 0;
  std::uint64_t blocks = 0;
  std::uint64_t cursor = 0;
};

GgufWriter::TensorData pool_data(const std::shared_ptr<BlockPool>& pool, std::uint64_t blocks) {
  std::uint64_t start = pool->cursor;
  pool->cursor = (pool->cursor + blocks) % pool->blocks;
  return [pool, start, blocks](const GgufWriter::Emit& emit) {
    std::uint64_t at = start, left = blocks;
    while (left > 0) {
      std::uint64_t take = std::min(left, pool->blocks - at);
      emit(std::span(pool->bytes).subspan(at * pool->block_bytes, take * pool->block_bytes));
      left -= take;
      at = 0;
    }
  };
}

void set_model_metadata(GgufWriter& w, const ModelShape& s, gpu::WeightType type, std::uint64_t seed,
                        const std::string& name) {
  const std::string& a = s.arch;
  w.set("general.architecture", a);
  w.set("general.name", name);
  w.set("general.description", fmt::format("random weights (seed {}) from mqlm make-model", seed));
  w.set("general.file_type", file_type(type));
  if (gpu::block_elements(type) > 1) w.set("general.quantization_version", std::uint32_t{2});
  w.set(a + ".vocab_size", s.vocab);
  w.set(a + ".context_length", s.context);
  w.set(a + ".embedding_length", s.hidden);
  w.set(a + ".block_count", s.layers);
  w.set(a + ".feed_forward_length", s.ffn);
  w.set(a + ".attention.head_count", s.heads);
  w.set(a + ".attention.head_count_kv", s.kv_heads);
  if (s.hidden % s.heads != 0 || s.hidden / s.heads != s.head_dim) {
    w.set(a + ".attention.key_length", s.head_dim);
    w.set(a + ".attention.value_length", s.head_dim);
  }
  w.set(a + ".rope.dimension_count", s.head_dim);
  w.set(a + ".rope.freq_base", s.rope_base);
  w.set(a + ".attention.layer_norm_rms_epsilon", s.rms_epsilon);
}

}  // namespace

std::optional<ModelShape> model_preset(std::string_view name) {
  if (name == "tiny") return ModelShape{};
  if (name == "llama3-1b") {
    return ModelShape{"llama", 16, 2048, 32, 8, 64, 8192, 128256, 131072, 500000.0f, 1e-5f, true};
  }
  if (name == "llama3-8b") {
    return ModelShape{"llama", 32, 4096, 32, 8, 128, 14336, 128256, 8192, 500000.0f, 1e-5f, false};
  }
  return std::nullopt;
}

std::vector<std::string_view> model_preset_names() { return {"tiny", "llama3-1b", "llama3-8b"}; }

std::optional<std::string> shape_problem(const ModelShape& s) {
  if (s.arch != "llama" && s.arch != "qwen2" && s.arch != "qwen3") {
    return "unknown architecture '" + s.arch + "' (llama, qwen2 and qwen3 can be made)";
  }
  constexpr std::uint32_t kLimit = 1u << 20;
  for (auto [what, value] : {std::pair{"layers", s.layers}, {"hidden", s.hidden}, {"heads", s.heads},
                             {"kv heads", s.kv_heads}, {"head dim", s.head_dim}, {"ffn", s.ffn},
                             {"context", s.context}}) {
    if (value == 0 || value > kLimit) return fmt::format("{} must be between 1 and {}, not {}", what, kLimit, value);
  }
  if (s.heads % s.kv_heads != 0) return fmt::format("{} heads do not share {} KV heads evenly", s.heads, s.kv_heads);
  if (s.head_dim % 2 != 0) return fmt::format("head dim {} is odd: RoPE rotates pairs", s.head_dim);
  if (s.vocab < kMinSyntheticVocabulary || s.vocab > (1u << 24)) {
    return fmt::format("vocab must be between {} and {} (the 256 byte tokens and 5 specials at least), not {}",
                       kMinSyntheticVocabulary, 1u << 24, s.vocab);
  }
  if (!(s.rope_base > 0) || !(s.rms_epsilon > 0)) return std::string("rope base and norm epsilon must be positive");
  return std::nullopt;
}

SyntheticModel make_synthetic_model(const ModelShape& shape, gpu::WeightType type, std::uint64_t seed,
                                    const std::string& name) {
  if (auto problem = shape_problem(shape)) throw std::invalid_argument(*problem);
  SyntheticModel model;
  set_model_metadata(model.writer, shape, type, seed, name);
  write_vocabulary(model.writer, make_byte_bpe_vocabulary(shape.vocab));

  std::vector<PlannedTensor> plan = plan_tensors(shape);
  std::map<gpu::WeightType, std::uint64_t> elements_of_type;
  for (auto& t : plan) {
    if (t.role != Role::matrix) continue;
    t.type = fitting_type(type, t.dims[0]);
    elements_of_type[t.type] += t.dims[0] * t.dims[1];
    if (t.type != type) {
      model.notes.push_back(fmt::format("{} is {}: rows of {} elements are not whole {} blocks of {}", t.name,
                                        gpu::weight_type_name(t.type), t.dims[0], gpu::weight_type_name(type),
                                        gpu::block_elements(type)));
    }
  }
  std::map<gpu::WeightType, std::shared_ptr<BlockPool>> pools;
  for (auto [pool_type, elements] : elements_of_type) {
    std::uint64_t count = (std::min(elements, kPoolElements) + 255) / 256 * 256;
    auto pool = std::make_shared<BlockPool>();
    pool->bytes = gpu::quantize(pool_type, normals(count, 0.0f, kWeightStd, seed * 1000003 + static_cast<int>(pool_type)), 256);
    pool->block_bytes = gpu::block_bytes(pool_type);
    pool->blocks = pool->bytes.size() / pool->block_bytes;
    pools[pool_type] = std::move(pool);
  }
  for (std::size_t i = 0; i < plan.size(); ++i) {
    PlannedTensor& t = plan[i];
    if (t.role == Role::matrix) {
      std::uint64_t blocks = t.dims[0] * t.dims[1] / gpu::block_elements(t.type);
      model.writer.add_tensor(t.name, to_tensor_type(t.type), t.dims, pool_data(pools.at(t.type), blocks));
    } else {
      float mean = t.role == Role::norm ? 1.0f : 0.0f;
      auto values = normals(t.dims[0], mean, kWeightStd, seed ^ (0xA5A5A5A5ull + i * 0x9E3779B97F4A7C15ull));
      model.writer.add_tensor(t.name, TensorType::f32, t.dims, f32_bytes(values));
    }
  }
  return model;
}

}  // namespace mqlm::model::gguf
