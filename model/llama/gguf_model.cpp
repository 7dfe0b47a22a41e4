#include "model/llama/gguf_model.hpp"

#include <cmath>
#include <algorithm>
#include <cstring>
#include <optional>
#include <stdexcept>

#include "model/gguf/rope_scaling.hpp"

namespace mqlm::model {

namespace {

// What is wrong with the first tensor whose type mqlm does not compute with, or nothing.
std::optional<std::string> uncomputed_tensor(const gguf::GgufFile& file) {
  for (const gguf::TensorInfo& tensor : file.tensors()) {
    auto type = gguf::weight_type(tensor);
    if (auto* error = std::get_if<gguf::GgufError>(&type)) return error->detail;
  }
  return std::nullopt;
}

// The factors of a rope factor tensor (rope_freqs.weight, LongRoPE's): F32, one per pair of rotary
// dimensions.
std::variant<std::vector<float>, std::string> rope_factor_tensor(const gguf::GgufFile& file, const gguf::TensorInfo& t,
                                                                 std::uint32_t rotary_dims) {
  if (t.type != gguf::TensorType::f32 || t.elements() != rotary_dims / 2) {
    return t.name + " must be F32 with " + std::to_string(rotary_dims / 2) + " elements (one per pair of the " +
           std::to_string(rotary_dims) + " rotary dimensions)";
  }
  std::vector<float> factors(rotary_dims / 2);
  std::memcpy(factors.data(), file.data(t).data(), factors.size() * sizeof(float));
  return factors;
}

// The rope factor tensor the model runs with, if any: rope_freqs.weight, else Phi-3's LongRoPE
// factors as llama.cpp picks them (llama_model::get_rope_factors): the long ones where the context
// is past the original one (rope.scaling.original_context_length), the short ones where not. The
// context is the file's context_length, the most a sequence may hold here (llama.cpp's is the
// one it is given, context_length by default). A LongRoPE file without rope.scaling.attn_factor
// gets the factor convert_hf_to_gguf would have written (llama.cpp reads the key alone: every
// converted file has it).
const gguf::TensorInfo* rope_factors_in_use(const gguf::GgufFile& file, const std::string& a, const gguf::RopeScaling& s,
                                            LlamaConfig& c) {
  if (const gguf::TensorInfo* freqs = file.tensor("rope_freqs.weight")) return freqs;
  const gguf::TensorInfo* long_factors = file.tensor("rope_factors_long.weight");
  const gguf::TensorInfo* short_factors = file.tensor("rope_factors_short.weight");
  if (long_factors == nullptr && short_factors == nullptr) return nullptr;
  const std::uint32_t original = s.original_context != 0 ? s.original_context : c.n_ctx_train;
  const bool past_original = c.n_ctx_train > original;
  if (file.find(a + ".rope.scaling.attn_factor") == nullptr) {
    c.yarn_attn_factor = gguf::longrope_attn_factor(static_cast<float>(c.n_ctx_train) / static_cast<float>(original), original);
  }
  return past_original ? long_factors : short_factors;
}

// The file's RoPE scaling as llama.cpp applies it to the llama family (llama-context.cpp): linear
// and YaRN divide positions by the factor; YaRN's attention factor is llama.cpp's (1 for factors
// past 1: the kernel's magnitude 1 + 0.1 ln(factor) is the whole of it), times
// rope.scaling.attn_factor for any type; rope_freqs.weight, else Phi-3's LongRoPE factors, else
// llama3's keys, give each pair's frequency divisor.
std::string read_rope(const gguf::GgufFile& file, const std::string& a, LlamaConfig& c) {
  c.rope_base = static_cast<float>(file.get_float(a + ".rope.freq_base").value_or(10000.0));
  const std::uint64_t dims = file.get_uint(a + ".rope.dimension_count").value_or(c.head_dim);
  if (dims == 0 || dims > c.head_dim) return a + ".rope.dimension_count must be 1 to the head dimension";
  c.rope_dims = static_cast<std::uint32_t>(dims);
  auto read = gguf::read_rope_scaling(file, a);
  if (auto* why = std::get_if<std::string>(&read)) return *why;
  const auto& s = std::get<gguf::RopeScaling>(read);
  using Type = gguf::RopeScalingType;
  if (s.type == Type::linear || s.type == Type::yarn || s.type == Type::longrope) c.rope_scale = s.factor;
  c.yarn_attn_factor = s.attn_factor;
  if (s.type == Type::yarn) {
    c.yarn_ext_factor = s.yarn_ext_factor;
    c.yarn_beta_fast = s.yarn_beta_fast;
    c.yarn_beta_slow = s.yarn_beta_slow;
    c.yarn_original_context = s.original_context;
    if (c.yarn_ext_factor != 0.0f) {
      const float mscale = s.factor <= 1.0f ? 1.0f : 1.0f + 0.1f * std::log(s.factor);
      c.yarn_attn_factor *= mscale / (1.0f + 0.1f * std::log(s.factor));
    }
  }
  if (const gguf::TensorInfo* freqs = rope_factors_in_use(file, a, s, c)) {
    auto factors = rope_factor_tensor(file, *freqs, c.rotary_dims());
    if (auto* why = std::get_if<std::string>(&factors)) return *why;
    c.rope_freq_factors = std::get<std::vector<float>>(std::move(factors));
  } else if (s.type == Type::llama3) {
    c.rope_freq_factors = gguf::llama3_rope_factors(s, c.rope_base, c.rotary_dims());
  }
  return {};
}

// Gemma's keys as llama.cpp reads them (its gemma2.cpp, gemma3.cpp): the sliding window and its
// layer pattern (gemma2: every other layer, a window of 4096 by default; gemma3: five of six,
// where the file names a window), the local layers' RoPE (gemma2: the global one's; gemma3: base
// 10000, unscaled) and the soft caps (gemma2: 50 and 30 by default; gemma3: none, unless its file
// caps the logits). q's scale is 1 / sqrt(n_embd / n_head) in the 27B models, which llama.cpp
// knows by their layer counts (46, 62), else 1 / sqrt(head_dim).
std::string read_gemma(const gguf::GgufFile& file, const std::string& a, LlamaConfig& c) {
  const bool gemma2 = c.arch == Architecture::gemma2;
  auto get_float = [&](const std::string& key, float fallback) {
    return static_cast<float>(file.get_float(a + "." + key).value_or(fallback));
  };
  c.sliding_window = static_cast<std::uint32_t>(file.get_uint(a + ".attention.sliding_window").value_or(gemma2 ? 4096 : 0));
  if (c.sliding_window != 0) {
    const std::uint64_t pattern = file.get_uint(a + ".attention.sliding_window_pattern").value_or(gemma2 ? 2 : 6);
    if (pattern > 1024) return a + ".attention.sliding_window_pattern must be at most 1024";
    c.swa_pattern = static_cast<std::uint32_t>(pattern);
  }
  c.rope_base_local = get_float("rope.freq_base_swa", gemma2 ? c.rope_base : 10000.0f);
  c.rope_scale_local = gemma2 ? c.rope_scale : 1.0f;
  c.attn_softcap = gemma2 ? get_float("attn_logit_softcapping", 50.0f) : 0.0f;
  c.final_softcap = get_float("final_logit_softcapping", gemma2 ? 30.0f : 0.0f);
  const bool is_27b = c.n_layers == (gemma2 ? 46u : 62u);
  c.attn_scale = 1.0f / std::sqrt(static_cast<float>(is_27b ? c.n_embd / c.n_head : c.head_dim));
  return {};
}

// The experts' keys (none: a dense model): qwen3moe's expert_feed_forward_length is each
// expert's size (n_ff / n_expert_used without it, as llama.cpp has it); Mixtral's experts are
// feed_forward_length wide.
std::string read_experts(const gguf::GgufFile& file, const std::string& a, LlamaConfig& c) {
  auto get = [&](const char* key) { return file.get_uint(a + "." + key).value_or(0); };
  const std::uint64_t experts = get("expert_count"), used = get("expert_used_count");
  if (experts > 1024 || used > 1024) return a + ".expert_count and expert_used_count must be at most 1024";
  c.n_expert = static_cast<std::uint32_t>(experts);
  c.n_expert_used = static_cast<std::uint32_t>(used);
  if (experts == 0) return {};
  const std::uint64_t width = get("expert_feed_forward_length");
  if (width > (1u << 20)) return a + ".expert_feed_forward_length must be at most 2^20";
  c.n_ff_exp = static_cast<std::uint32_t>(width != 0                         ? width
                                          : c.arch == Architecture::qwen3moe ? c.n_ff / std::max(c.n_expert_used, 1u)
                                                                             : c.n_ff);
  return {};
}

// qwen35's Gated DeltaNet keys as llama.cpp reads them (qwen35.cpp): its value heads as wide as its
// key heads (ssm.inner_size = time_step_rank x state_size), the attention layers every
// full_attention_interval (4 without the key; a per-layer attention.recurrent_layers array is not
// read), and M-RoPE sections that give every rotary pair the text position, which makes the turn
// NeoX's over rope.dimension_count (interleaved sections: pair i of S = the sections' sum takes
// section i % 3, and the 4th, always position 0 for text, where i % 3 >= 3 x that section's size).
std::string read_hybrid(const gguf::GgufFile& file, const std::string& a, LlamaConfig& c) {
  auto get = [&](const char* key) { return file.get_uint(a + "." + key); };
  for (const char* key : {"ssm.conv_kernel", "ssm.inner_size", "ssm.state_size", "ssm.time_step_rank", "ssm.group_count"}) {
    if (!get(key) || *get(key) == 0 || *get(key) > 4096) return "metadata " + a + "." + key + " is missing or not 1 to 4096";
  }
  c.ssm_conv_kernel = static_cast<std::uint32_t>(*get("ssm.conv_kernel"));
  c.ssm_head_dim = static_cast<std::uint32_t>(*get("ssm.state_size"));
  c.ssm_v_heads = static_cast<std::uint32_t>(*get("ssm.time_step_rank"));
  c.ssm_k_heads = static_cast<std::uint32_t>(*get("ssm.group_count"));
  if (*get("ssm.inner_size") != std::uint64_t{c.ssm_v_heads} * c.ssm_head_dim) {
    return a + ".ssm.inner_size must be ssm.time_step_rank x ssm.state_size (value heads as wide as key heads)";
  }
  if (file.find(a + ".attention.recurrent_layers") != nullptr) return a + ".attention.recurrent_layers is not read yet";
  c.full_attention_interval = static_cast<std::uint32_t>(get("full_attention_interval").value_or(4));
  const auto* sections = file.get_array<std::int32_t>(a + ".rope.dimension_sections");
  if (sections == nullptr || sections->size() < 3) return a + ".rope.dimension_sections is missing (4 int32)";
  std::int64_t pairs = 0;
  for (std::int32_t s : *sections) pairs += std::max(s, 0);
  for (std::int64_t i = 0; i < c.rotary_dims() / 2; ++i) {
    if (pairs == 0 || i % pairs >= 3 * std::int64_t{(*sections)[static_cast<std::size_t>(i % pairs % 3)]}) {
      return a + ".rope.dimension_sections leave rotary pairs to the 4th section: not supported";
    }
  }
  return {};
}

}  // namespace

std::variant<LlamaConfig, std::string> read_llama_config(const gguf::GgufFile& file) {
  auto arch_name = file.get_string("general.architecture");
  if (!arch_name) return std::string("general.architecture is missing");
  LlamaConfig c;
  if (!parse_architecture(std::string(*arch_name), c.arch)) {
    return "architecture '" + std::string(*arch_name) + "' is not supported (mqlm runs llama, qwen2, qwen3, phi3, gemma2, gemma3, qwen3moe and qwen35)";
  }
  const std::string a(*arch_name);
  auto need = [&](const std::string& key, std::uint32_t& out) -> std::string {
    auto v = file.get_uint(a + "." + key);
    if (!v || *v == 0 || *v > 0xffffffffu) return "metadata " + a + "." + key + " is missing or not a positive integer";
    out = static_cast<std::uint32_t>(*v);
    return {};
  };
  for (auto [key, field] : {std::pair{"block_count", &c.n_layers}, std::pair{"embedding_length", &c.n_embd},
                            std::pair{"feed_forward_length", &c.n_ff}, std::pair{"attention.head_count", &c.n_head}}) {
    if (std::string why = need(key, *field); !why.empty()) return why;
  }
  c.n_head_kv = static_cast<std::uint32_t>(file.get_uint(a + ".attention.head_count_kv").value_or(c.n_head));
  c.head_dim = static_cast<std::uint32_t>(file.get_uint(a + ".attention.key_length").value_or(c.n_embd / c.n_head));
  if (auto v = file.get_uint(a + ".attention.value_length"); v && *v != c.head_dim) {
    return "attention.value_length differs from key_length: not supported";
  }
  c.n_ctx_train = static_cast<std::uint32_t>(file.get_uint(a + ".context_length").value_or(4096));
  c.rms_eps = static_cast<float>(file.get_float(a + ".attention.layer_norm_rms_epsilon").value_or(1e-5));
  if (std::string why = read_rope(file, a, c); !why.empty()) return why;
  if (c.gemma()) {
    if (std::string why = read_gemma(file, a, c); !why.empty()) return why;
  }
  if (std::string why = read_experts(file, a, c); !why.empty()) return why;
  if (c.hybrid()) {
    if (std::string why = read_hybrid(file, a, c); !why.empty()) return why;
  }
  const gguf::TensorInfo* embd = file.tensor("token_embd.weight");
  if (embd == nullptr) return std::string("the model has no tensor token_embd.weight");
  c.n_vocab = static_cast<std::uint32_t>(embd->rows());
  if (auto v = file.get_uint(a + ".vocab_size"); v && *v != c.n_vocab) {
    return "vocab_size " + std::to_string(*v) + " differs from token_embd.weight's " + std::to_string(c.n_vocab) + " rows";
  }
  c.tied_output = file.tensor("output.weight") == nullptr || c.arch == Architecture::gemma2;
  if (std::string why = c.check(); !why.empty()) return why;
  if (auto why = uncomputed_tensor(file)) return *why;
  return c;
}

TensorSource gguf_tensor_source(const gguf::GgufFile& file) {
  return [&file](const std::string& name) -> std::optional<TensorBytes> {
    const gguf::TensorInfo* info = file.tensor(name);
    if (info == nullptr) return std::nullopt;
    auto type = gguf::weight_type(*info);
    if (auto* error = std::get_if<gguf::GgufError>(&type)) throw std::runtime_error(error->message());
    // The experts' 3-D tensors are read as their matrices one after another.
    const bool experts = name.ends_with("_exps.weight") && info->dims.size() == 3;
    if (info->dims.size() > 2 && !experts) throw std::runtime_error(name + " has more than two dimensions");
    return TensorBytes{std::get<gpu::WeightType>(type), info->rows(), info->row_length(), file.data(*info)};
  };
}

}  // namespace mqlm::model
