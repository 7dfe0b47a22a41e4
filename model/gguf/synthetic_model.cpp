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

// conv: a DeltaNet layer's convolution taps; decay: its ssm_a, -exp(A_log) as convert_hf_to_gguf
// writes it (random, near -0.05: a state that forgets over tens of tokens, so that a long prompt's
// early tokens still count).
enum class Role { matrix, norm, bias, rope_factors, router, conv, decay };

struct PlannedTensor {
  std::string name;
  std::vector<std::uint64_t> dims;  // dims[0] contiguous
  Role role;
  gpu::WeightType type = gpu::WeightType::f32;
};

std::uint32_t rotary_dims(const ModelShape& s) { return s.rotary_dims != 0 ? s.rotary_dims : s.head_dim; }
std::uint32_t expert_width(const ModelShape& s) { return s.expert_ffn != 0 ? s.expert_ffn : s.ffn; }
std::uint64_t elements(const std::vector<std::uint64_t>& dims) {
  std::uint64_t product = 1;
  for (std::uint64_t d : dims) product *= d;
  return product;
}

// A router's std: trained routers pick their experts by clear margins, and so do these (logits of
// std ~3 at hidden 256), so that an engine's rounding rarely changes a token's experts.
constexpr float kRouterStd = 0.2f;

// The router and each expert's gate, up and down, stacked (llama.cpp's 3-D layout).
void plan_experts(std::vector<PlannedTensor>& plan, const ModelShape& s, std::uint32_t layer) {
  auto blk = [layer](std::string_view what) { return fmt::format("blk.{}.{}", layer, what); };
  const std::uint64_t width = expert_width(s);
  plan.push_back({blk("ffn_gate_inp.weight"), {s.hidden, s.experts}, Role::router});
  plan.push_back({blk("ffn_gate_exps.weight"), {s.hidden, width, s.experts}, Role::matrix});
  plan.push_back({blk("ffn_up_exps.weight"), {s.hidden, width, s.experts}, Role::matrix});
  plan.push_back({blk("ffn_down_exps.weight"), {width, s.hidden, s.experts}, Role::matrix});
}

bool writes_rope_freqs(const ModelShape& s) {
  return s.rope_scaling.type == RopeScalingType::llama3 && s.rope_freqs_tensor;
}

// How many times a LongRoPE model's context is past its original one.
float longrope_scale(const ModelShape& s) {
  const std::uint32_t original = s.rope_scaling.original_context != 0 ? s.rope_scaling.original_context : s.context;
  return static_cast<float>(s.context) / static_cast<float>(original);
}

// The scaling as the file says it: LongRoPE's attention factor as convert_hf_to_gguf derives it
// from the context's stretch, unless one is given.
RopeScaling written_scaling(const ModelShape& s) {
  RopeScaling r = s.rope_scaling;
  if (r.type == RopeScalingType::longrope && r.attn_factor == 1.0f) {
    r.attn_factor = longrope_attn_factor(longrope_scale(s), r.original_context != 0 ? r.original_context : s.context);
  }
  return r;
}

// The values of a rope factor tensor: llama3's rope_freqs.weight, LongRoPE's long or short ones.
std::vector<float> rope_factor_values(const ModelShape& s, std::string_view name) {
  if (name == "rope_freqs.weight") return llama3_rope_factors(s.rope_scaling, s.rope_base, rotary_dims(s));
  return longrope_factors(longrope_scale(s), rotary_dims(s), name == "rope_factors_long.weight");
}

// qwen35's layer: attention every full_attention_interval (q and its gate in attn_q), Gated
// DeltaNet elsewhere; post_attention_norm before every feed-forward block (llama.cpp's names).
void plan_hybrid_layer(std::vector<PlannedTensor>& plan, const ModelShape& s, std::uint32_t layer) {
  auto blk = [layer](std::string_view what) { return fmt::format("blk.{}.{}", layer, what); };
  const std::uint64_t q = std::uint64_t{s.heads} * s.head_dim, kv = std::uint64_t{s.kv_heads} * s.head_dim;
  const std::uint64_t key = std::uint64_t{s.ssm_k_heads} * s.ssm_head_dim, value = std::uint64_t{s.ssm_v_heads} * s.ssm_head_dim;
  plan.push_back({blk("attn_norm.weight"), {s.hidden}, Role::norm});
  if ((layer + 1) % s.full_attention_interval == 0) {
    plan.push_back({blk("attn_q.weight"), {s.hidden, 2 * q}, Role::matrix});
    plan.push_back({blk("attn_k.weight"), {s.hidden, kv}, Role::matrix});
    plan.push_back({blk("attn_v.weight"), {s.hidden, kv}, Role::matrix});
    plan.push_back({blk("attn_output.weight"), {q, s.hidden}, Role::matrix});
    plan.push_back({blk("attn_q_norm.weight"), {s.head_dim}, Role::norm});
    plan.push_back({blk("attn_k_norm.weight"), {s.head_dim}, Role::norm});
  } else {
    plan.push_back({blk("attn_qkv.weight"), {s.hidden, 2 * key + value}, Role::matrix});
    plan.push_back({blk("attn_gate.weight"), {s.hidden, value}, Role::matrix});
    plan.push_back({blk("ssm_conv1d.weight"), {s.ssm_conv_kernel, 2 * key + value}, Role::conv});
    plan.push_back({blk("ssm_dt.bias"), {s.ssm_v_heads}, Role::bias});
    plan.push_back({blk("ssm_a"), {s.ssm_v_heads}, Role::decay});
    plan.push_back({blk("ssm_beta.weight"), {s.hidden, s.ssm_v_heads}, Role::matrix});
    plan.push_back({blk("ssm_alpha.weight"), {s.hidden, s.ssm_v_heads}, Role::matrix});
    plan.push_back({blk("ssm_norm.weight"), {s.ssm_head_dim}, Role::norm});
    plan.push_back({blk("ssm_out.weight"), {value, s.hidden}, Role::matrix});
  }
  plan.push_back({blk("post_attention_norm.weight"), {s.hidden}, Role::norm});
  plan.push_back({blk("ffn_gate.weight"), {s.hidden, s.ffn}, Role::matrix});
  plan.push_back({blk("ffn_up.weight"), {s.hidden, s.ffn}, Role::matrix});
  plan.push_back({blk("ffn_down.weight"), {s.ffn, s.hidden}, Role::matrix});
}

std::vector<PlannedTensor> plan_tensors(const ModelShape& s) {
  std::uint64_t q = std::uint64_t{s.heads} * s.head_dim, kv = std::uint64_t{s.kv_heads} * s.head_dim;
  const bool phi3 = s.arch == "phi3", gemma = s.arch == "gemma2" || s.arch == "gemma3";
  std::vector<PlannedTensor> plan{{"token_embd.weight", {s.hidden, s.vocab}, Role::matrix}};
  if (writes_rope_freqs(s)) plan.push_back({"rope_freqs.weight", {rotary_dims(s) / 2}, Role::rope_factors});
  if (s.rope_scaling.type == RopeScalingType::longrope) {  // Phi-3's, as convert_hf_to_gguf writes them
    plan.push_back({"rope_factors_long.weight", {rotary_dims(s) / 2}, Role::rope_factors});
    plan.push_back({"rope_factors_short.weight", {rotary_dims(s) / 2}, Role::rope_factors});
  }
  for (std::uint32_t layer = 0; layer < s.layers && s.arch == "qwen35"; ++layer) plan_hybrid_layer(plan, s, layer);
  for (std::uint32_t layer = 0; layer < s.layers && s.arch != "qwen35"; ++layer) {
    auto blk = [layer](std::string_view what) { return fmt::format("blk.{}.{}", layer, what); };
    plan.push_back({blk("attn_norm.weight"), {s.hidden}, Role::norm});
    if (phi3) {  // q, k and v as one matrix, as convert_hf_to_gguf writes Phi-3's
      plan.push_back({blk("attn_qkv.weight"), {s.hidden, q + 2 * kv}, Role::matrix});
    } else {
      plan.push_back({blk("attn_q.weight"), {s.hidden, q}, Role::matrix});
      plan.push_back({blk("attn_k.weight"), {s.hidden, kv}, Role::matrix});
      plan.push_back({blk("attn_v.weight"), {s.hidden, kv}, Role::matrix});
    }
    if (s.arch == "qwen2") {
      plan.push_back({blk("attn_q.bias"), {q}, Role::bias});
      plan.push_back({blk("attn_k.bias"), {kv}, Role::bias});
      plan.push_back({blk("attn_v.bias"), {kv}, Role::bias});
    }
    if (s.arch == "qwen3" || s.arch == "gemma3" || s.arch == "qwen3moe") {
      plan.push_back({blk("attn_q_norm.weight"), {s.head_dim}, Role::norm});
      plan.push_back({blk("attn_k_norm.weight"), {s.head_dim}, Role::norm});
    }
    plan.push_back({blk("attn_output.weight"), {q, s.hidden}, Role::matrix});
    if (gemma) plan.push_back({blk("post_attention_norm.weight"), {s.hidden}, Role::norm});
    plan.push_back({blk("ffn_norm.weight"), {s.hidden}, Role::norm});
    if (s.experts > 0) {
      plan_experts(plan, s, layer);
    } else if (phi3) {  // the gate's rows, then up's
      plan.push_back({blk("ffn_up.weight"), {s.hidden, 2 * s.ffn}, Role::matrix});
    } else {
      plan.push_back({blk("ffn_gate.weight"), {s.hidden, s.ffn}, Role::matrix});
      plan.push_back({blk("ffn_up.weight"), {s.hidden, s.ffn}, Role::matrix});
    }
    if (s.experts == 0) plan.push_back({blk("ffn_down.weight"), {s.ffn, s.hidden}, Role::matrix});
    if (gemma) plan.push_back({blk("post_ffw_norm.weight"), {s.hidden}, Role::norm});
  }
  plan.push_back({"output_norm.weight", {s.hidden}, Role::norm});
  if (!s.tied_embeddings && s.arch != "gemma2") plan.push_back({"output.weight", {s.hidden, s.vocab}, Role::matrix});
  return plan;
}

// Random blocks of one weight type, quantized when first written; tensors take consecutive
// blocks from it, wrapping around.
class BlockPool {
 public:
  BlockPool(gpu::WeightType type, std::uint64_t elements, std::uint64_t seed)
      : type_(type), elements_((std::min(elements, kPoolElements) + 255) / 256 * 256), seed_(seed) {}

  std::uint64_t blocks() const { return elements_ / gpu::block_elements(type_); }
  std::uint64_t block_bytes() const { return gpu::block_bytes(type_); }
  // The first block of a tensor of `count` blocks, the next tensor starting after it.
  std::uint64_t take(std::uint64_t count) {
    std::uint64_t start = cursor_;
    cursor_ = (cursor_ + count) % blocks();
    return start;
  }
  std::span<const std::byte> bytes() {
    if (bytes_.empty()) bytes_ = gpu::quantize(type_, normals(elements_, 0.0f, kWeightStd, seed_), 256);
    return bytes_;
  }

 private:
  gpu::WeightType type_;
  std::uint64_t elements_;  // whole rows of 256
  std::uint64_t seed_;
  std::uint64_t cursor_ = 0;
  std::vector<std::byte> bytes_;
};

GgufWriter::TensorData pool_data(const std::shared_ptr<BlockPool>& pool, std::uint64_t blocks) {
  return [pool, start = pool->take(blocks), blocks](const GgufWriter::Emit& emit) {
    std::uint64_t at = start, left = blocks;
    while (left > 0) {
      std::uint64_t take = std::min(left, pool->blocks() - at);
      emit(pool->bytes().subspan(at * pool->block_bytes(), take * pool->block_bytes()));
      left -= take;
      at = 0;
    }
  };
}

// qwen35's keys, as convert_hf_to_gguf writes Qwen3.5's.
void set_hybrid_metadata(GgufWriter& w, const ModelShape& s) {
  const std::string a = s.arch + ".";
  w.set(a + "ssm.conv_kernel", s.ssm_conv_kernel);
  w.set(a + "ssm.state_size", s.ssm_head_dim);
  w.set(a + "ssm.group_count", s.ssm_k_heads);
  w.set(a + "ssm.time_step_rank", s.ssm_v_heads);
  w.set(a + "ssm.inner_size", s.ssm_v_heads * s.ssm_head_dim);
  w.set(a + "full_attention_interval", s.full_attention_interval);
  w.set(a + "rope.dimension_sections",
        MetadataArray{std::vector<std::int32_t>(s.rope_sections.begin(), s.rope_sections.end())});
}

void set_model_metadata(GgufWriter& w, const ModelShape& s, FileType file_type, std::uint64_t seed,
                        const std::string& name) {
  const std::string& a = s.arch;
  w.set("general.architecture", a);
  w.set("general.name", name);
  w.set("general.description", fmt::format("random weights (seed {}) from mqlm make-model", seed));
  w.set("general.file_type", static_cast<std::uint32_t>(file_type));
  if (gpu::block_elements(default_weight_type(file_type)) > 1) w.set("general.quantization_version", std::uint32_t{2});
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
  w.set(a + ".rope.dimension_count", rotary_dims(s));
  w.set(a + ".rope.freq_base", s.rope_base);
  if (!writes_rope_freqs(s)) write_rope_scaling(w, a, written_scaling(s));
  w.set(a + ".attention.layer_norm_rms_epsilon", s.rms_epsilon);
  if (s.arch == "gemma2") {
    w.set(a + ".attn_logit_softcapping", s.attn_softcap);
    w.set(a + ".final_logit_softcapping", s.final_softcap);
  }
  if ((s.arch == "gemma2" || s.arch == "gemma3") && s.sliding_window != 0) {
    w.set(a + ".attention.sliding_window", s.sliding_window);
  }
  if (s.arch == "gemma3") w.set(a + ".rope.freq_base_swa", s.rope_base_local);
  if (s.arch == "qwen35") set_hybrid_metadata(w, s);
  if (s.experts > 0) {
    w.set(a + ".expert_count", s.experts);
    w.set(a + ".expert_used_count", s.experts_used);
    if (s.arch == "qwen3moe") w.set(a + ".expert_feed_forward_length", expert_width(s));
  }
}

void choose_matrix_types(std::vector<PlannedTensor>& plan, const QuantMixture& mixture, SyntheticModel& model) {
  for (auto& t : plan) {
    if (t.role != Role::matrix) continue;
    MatrixType choice = mixture.matrix_type(t.name, t.dims[0]);
    t.type = choice.type;
    model.matrix_types[t.name] = t.type;
    if (choice.type != choice.chosen) {
      model.notes.push_back(fmt::format("{} is {}: rows of {} elements are not whole {} blocks of {}", t.name,
                                        gpu::weight_type_name(t.type), t.dims[0], gpu::weight_type_name(choice.chosen),
                                        gpu::block_elements(choice.chosen)));
    }
  }
}

// One pool for each weight type the matrices have, as large as they are together (at most
// kPoolElements), each from its own seed.
std::map<gpu::WeightType, std::shared_ptr<BlockPool>> make_pools(const std::vector<PlannedTensor>& plan,
                                                                 std::uint64_t seed) {
  std::map<gpu::WeightType, std::uint64_t> elements_of_type;
  for (const auto& t : plan) {
    if (t.role == Role::matrix) elements_of_type[t.type] += elements(t.dims);
  }
  std::map<gpu::WeightType, std::shared_ptr<BlockPool>> pools;
  for (auto [type, elements] : elements_of_type) {
    pools[type] = std::make_shared<BlockPool>(type, elements, seed * 1000003 + static_cast<int>(type));
  }
  return pools;
}

// An F32 tensor's random values by its role: norms near 1, biases and routers near 0, convolution
// taps of std 0.3 (the products' outputs keep a scale a norm can read), decays near -0.05.
std::vector<float> vector_values(const PlannedTensor& t, std::uint64_t seed) {
  const std::uint64_t n = elements(t.dims);
  switch (t.role) {
    case Role::norm: return normals(n, 1.0f, kWeightStd, seed);
    case Role::router: return normals(n, 0.0f, kRouterStd, seed);
    case Role::conv: return normals(n, 0.0f, 0.3f, seed);
    case Role::decay: {
      auto values = normals(n, -3.0f, 0.5f, seed);
      for (float& v : values) v = -std::exp(v);
      return values;
    }
    default: return normals(n, 0.0f, kWeightStd, seed);
  }
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
  if (name == "phi3-mini") {  // Phi-3-mini-4k-instruct
    return ModelShape{"phi3", 32, 3072, 32, 32, 96, 8192, 32064, 4096, 10000.0f, 1e-5f, false};
  }
  if (name == "phi3-mini-128k") {  // Phi-3-mini-128k-instruct: LongRoPE past 4096
    ModelShape s{"phi3", 32, 3072, 32, 32, 96, 8192, 32064, 131072, 10000.0f, 1e-5f, false};
    s.rope_scaling = {.type = RopeScalingType::longrope, .original_context = 4096};
    return s;
  }
  if (name == "gemma2-2b") {
    ModelShape s{"gemma2", 26, 2304, 8, 4, 256, 9216, 256000, 8192, 10000.0f, 1e-6f, true};
    s.sliding_window = 4096;
    return s;
  }
  if (name == "gemma3-4b") {  // its global layers' RoPE stretched x8 (linear), the local ones' not
    ModelShape s{"gemma3", 34, 2560, 8, 4, 256, 10240, 262208, 131072, 1000000.0f, 1e-6f, true};
    s.sliding_window = 1024;
    s.rope_scaling = {.type = RopeScalingType::linear, .factor = 8.0f};
    return s;
  }
  if (name == "qwen3moe-30b-a3b") {  // Qwen3-30B-A3B: 128 experts of 768, 8 a token
    ModelShape s{"qwen3moe", 48, 2048, 32, 4, 128, 6144, 151936, 40960, 1000000.0f, 1e-6f, false};
    s.experts = 128;
    s.experts_used = 8;
    s.expert_ffn = 768;
    return s;
  }
  if (name == "tiny-qwen35") {  // 8 layers, 3 and 7 attending; 4 q/k heads and 8 v heads of 32
    ModelShape s{"qwen35", 8, 256, 4, 2, 64, 512, 1024, 2048, 10000000.0f, 1e-6f, false};
    s.rotary_dims = 16;  // a quarter of each head turns, as in Qwen3.5
    s.rope_sections = {3, 3, 2, 0};
    s.ssm_k_heads = 4;
    s.ssm_v_heads = 8;
    s.ssm_head_dim = 32;
    return s;
  }
  if (name == "qwen35-9b") {  // Qwen3.5-9B: 24 DeltaNet layers (16 q/k heads, 32 v heads of 128), 8 attending
    ModelShape s{"qwen35", 32, 4096, 16, 4, 256, 12288, 248320, 262144, 10000000.0f, 1e-6f, false};
    s.rotary_dims = 64;
    s.rope_sections = {11, 11, 10, 0};
    s.ssm_k_heads = 16;
    s.ssm_v_heads = 32;
    s.ssm_head_dim = 128;
    return s;
  }
  if (name == "mixtral-8x7b") {  // llama's blocks with 8 experts of 14336, 2 a token
    ModelShape s{"llama", 32, 4096, 32, 8, 128, 14336, 32000, 32768, 1000000.0f, 1e-5f, false};
    s.experts = 8;
    s.experts_used = 2;
    return s;
  }
  return std::nullopt;
}

std::vector<std::string_view> model_preset_names() {
  return {"tiny",      "llama3-1b", "llama3-8b",        "phi3-mini",   "phi3-mini-128k",
          "gemma2-2b", "gemma3-4b", "qwen3moe-30b-a3b", "mixtral-8x7b", "tiny-qwen35", "qwen35-9b"};
}

namespace {

std::optional<std::string> experts_problem(const ModelShape& s) {
  if (s.arch == "qwen3moe" && s.experts == 0) return std::string("qwen3moe needs experts");
  if (s.experts == 0) return std::nullopt;
  if (s.arch != "qwen3moe" && s.arch != "llama") return "only qwen3moe and llama (Mixtral) have experts, not " + s.arch;
  if (s.experts > 1024 || s.experts_used == 0 || s.experts_used > s.experts || s.experts_used > 32) {
    return fmt::format("{} experts, {} used: at most 1024 experts, 1 to 32 used and at most them", s.experts, s.experts_used);
  }
  if (s.arch == "llama" && s.expert_ffn != 0 && s.expert_ffn != s.ffn) {
    return std::string("Mixtral's experts are feed_forward_length wide: no expert ffn of their own");
  }
  return std::nullopt;
}

std::optional<std::string> hybrid_problem(const ModelShape& s) {
  if (s.arch != "qwen35") return std::nullopt;
  if (s.ssm_k_heads == 0 || s.ssm_v_heads == 0 || s.ssm_head_dim == 0 || s.ssm_v_heads % s.ssm_k_heads != 0 ||
      s.ssm_conv_kernel < 2 || s.full_attention_interval == 0) {
    return fmt::format("qwen35 needs ssm k heads, v heads a multiple of them, a head dim, a conv kernel of 2 or more and "
                       "an attention interval ({}, {}, {}, {}, {})",
                       s.ssm_k_heads, s.ssm_v_heads, s.ssm_head_dim, s.ssm_conv_kernel, s.full_attention_interval);
  }
  if (s.rope_sections[0] + s.rope_sections[1] + s.rope_sections[2] + s.rope_sections[3] == 0) {
    return std::string("qwen35 needs rope sections (rope.dimension_sections)");
  }
  return std::nullopt;
}

}  // namespace

std::optional<std::string> shape_problem(const ModelShape& s) {
  if (s.arch != "llama" && s.arch != "qwen2" && s.arch != "qwen3" && s.arch != "phi3" && s.arch != "gemma2" &&
      s.arch != "gemma3" && s.arch != "qwen3moe" && s.arch != "qwen35") {
    return "unknown architecture '" + s.arch +
           "' (llama, qwen2, qwen3, phi3, gemma2, gemma3, qwen3moe and qwen35 can be made)";
  }
  if (auto problem = experts_problem(s)) return problem;
  if (auto problem = hybrid_problem(s)) return problem;
  if (s.arch == "phi3" && s.heads * s.head_dim != s.hidden) {
    return fmt::format("phi3's heads times head dim must be the hidden size ({} x {} is not {})", s.heads, s.head_dim,
                       s.hidden);
  }
  if (!(s.rope_base_local > 0) || !(s.attn_softcap > 0) || !(s.final_softcap > 0)) {
    return std::string("the local layers' rope base and the soft caps must be positive");
  }
  constexpr std::uint32_t kLimit = 1u << 20;
  for (auto [what, value] : {std::pair{"layers", s.layers}, {"hidden", s.hidden}, {"heads", s.heads},
                             {"kv heads", s.kv_heads}, {"head dim", s.head_dim}, {"ffn", s.ffn},
                             {"context", s.context}}) {
    if (value == 0 || value > kLimit) return fmt::format("{} must be between 1 and {}, not {}", what, kLimit, value);
  }
  if (s.heads % s.kv_heads != 0) return fmt::format("{} heads do not share {} KV heads evenly", s.heads, s.kv_heads);
  if (s.head_dim % 2 != 0) return fmt::format("head dim {} is odd: RoPE rotates pairs", s.head_dim);
  if (rotary_dims(s) % 2 != 0 || rotary_dims(s) > s.head_dim) {
    return fmt::format("rotary dims {} must be even and at most the head dim {}", rotary_dims(s), s.head_dim);
  }
  const RopeScaling& r = s.rope_scaling;
  if (!(r.factor > 0) || !(r.attn_factor > 0) || !(r.low_freq_factor > 0) || !(r.high_freq_factor > r.low_freq_factor)) {
    return std::string("rope scaling factors must be positive, the high frequency factor above the low one");
  }
  const std::size_t least = min_vocabulary_size(s.vocabulary, s.arch == "phi3" ? 4 : 0);  // phi3's own four too
  if (s.vocab < least || s.vocab > (1u << 24)) {
    return fmt::format("vocab must be between {} and {} for a {} vocabulary, not {}", least, 1u << 24,
                       vocabulary_kind_name(s.vocabulary), s.vocab);
  }
  if (!(s.rope_base > 0) || !(s.rms_epsilon > 0)) return std::string("rope base and norm epsilon must be positive");
  if (r.type == RopeScalingType::longrope && s.arch != "phi3") {
    return "longrope scaling is Phi-3's: its factor tensors load in llama.cpp for phi3 only, not " + s.arch;
  }
  return std::nullopt;
}

MixtureModel mixture_model(const ModelShape& shape) {
  return {shape.arch, shape.layers, shape.heads, shape.kv_heads, shape.tied_embeddings, shape.experts};
}

SyntheticModel make_synthetic_model(const ModelShape& shape, const QuantMixture& mixture, std::uint64_t seed,
                                    const std::string& name) {
  if (auto problem = shape_problem(shape)) throw std::invalid_argument(*problem);
  SyntheticModel model;
  set_model_metadata(model.writer, shape, mixture.file_type(), seed, name);
  // llama.cpp marks Phi-3's own special tokens in a model named like it (general.name with "phi3"
  // or "phi-3") and cannot load one that lacks them (Phi-3's SentencePiece vocabulary has them).
  constexpr std::string_view kPhi3Specials[] = {"<unk>", "<s>", "</s>", "<|endoftext|>"};
  write_vocabulary(model.writer, make_vocabulary(shape.vocabulary, shape.vocab,
                                                 shape.arch == "phi3" ? std::span<const std::string_view>(kPhi3Specials)
                                                                      : std::span<const std::string_view>()));

  std::vector<PlannedTensor> plan = plan_tensors(shape);
  choose_matrix_types(plan, mixture, model);
  auto pools = make_pools(plan, seed);
  for (std::size_t i = 0; i < plan.size(); ++i) {
    PlannedTensor& t = plan[i];
    if (t.role == Role::matrix) {
      std::uint64_t blocks = elements(t.dims) / gpu::block_elements(t.type);
      model.writer.add_tensor(t.name, to_tensor_type(t.type), t.dims, pool_data(pools.at(t.type), blocks));
    } else if (t.role == Role::rope_factors) {
      model.writer.add_tensor(t.name, TensorType::f32, t.dims, f32_bytes(rope_factor_values(shape, t.name)));
    } else {
      model.writer.add_tensor(t.name, TensorType::f32, t.dims,
                              f32_bytes(vector_values(t, seed ^ (0xA5A5A5A5ull + i * 0x9E3779B97F4A7C15ull))));
    }
  }
  return model;
}

SyntheticModel make_synthetic_model(const ModelShape& shape, gpu::WeightType type, std::uint64_t seed,
                                    const std::string& name) {
  QuantMixture pure(file_type_of(type), mixture_model(shape), /*pure=*/true);
  return make_synthetic_model(shape, pure, seed, name);
}

}  // namespace mqlm::model::gguf
