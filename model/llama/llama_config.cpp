#include "model/llama/llama_config.hpp"

#include <cmath>

#include "gpu/ops.hpp"

namespace mqlm::model {

const char* architecture_name(Architecture arch) {
  switch (arch) {
    case Architecture::llama: return "llama";
    case Architecture::qwen2: return "qwen2";
    case Architecture::qwen3: return "qwen3";
  }
  return "?";
}

bool parse_architecture(const std::string& name, Architecture& out) {
  for (Architecture a : {Architecture::llama, Architecture::qwen2, Architecture::qwen3}) {
    if (name == architecture_name(a)) {
      out = a;
      return true;
    }
  }
  return false;
}

gpu::ops::RopeShape rope_shape(const LlamaConfig& c, std::uint32_t tokens, std::uint32_t heads) {
  gpu::ops::RopeShape s{tokens, heads, c.head_dim, c.rotary_dims(), c.rope_base, 1.0f / c.rope_scale, c.rope_neox()};
  s.yarn = {c.yarn_ext_factor, c.yarn_attn_factor, c.yarn_beta_fast, c.yarn_beta_slow,
            c.yarn_original_context != 0 ? c.yarn_original_context : c.n_ctx_train};
  s.freq_factors = c.rope_freq_factors;
  return s;
}

std::string LlamaConfig::check() const {
  auto positive = [](std::uint32_t v) { return v > 0 && v <= (1u << 20); };
  if (!positive(n_layers) || n_layers > 1024) return "block_count must be 1 to 1024";
  if (!positive(n_embd) || !positive(n_ff) || !positive(head_dim)) return "embedding, feed-forward and head sizes must be 1 to 2^20";
  if (n_head == 0 || n_head_kv == 0 || n_head > 1024 || n_head % n_head_kv != 0) {
    return "head_count must be a positive multiple of head_count_kv (at most 1024)";
  }
  if (head_dim % 2 != 0) return "the head dimension must be even for RoPE";
  if (n_vocab == 0 || n_vocab > (1u << 24)) return "the vocabulary must have 1 to 2^24 tokens";
  if (!(rope_base > 0) || !(rope_scale > 0) || !(rms_eps > 0)) return "rope base, rope scale and epsilon must be positive";
  if (rotary_dims() % 2 != 0 || rotary_dims() > head_dim) {
    return "rope.dimension_count must be even and at most the head dimension";
  }
  if (!rope_freq_factors.empty() && rope_freq_factors.size() != rotary_dims() / 2) {
    return "rope_freqs.weight must hold one factor per pair of rotary dimensions (" + std::to_string(rotary_dims() / 2) +
           ")";
  }
  for (float f : rope_freq_factors) {
    if (!(f > 0) || !std::isfinite(f)) return "rope_freqs.weight holds a factor that is not a positive number";
  }
  if (!(yarn_attn_factor > 0) || !std::isfinite(yarn_ext_factor)) return "the YaRN factors must be finite, attn positive";
  return {};
}

std::vector<TensorSpec> tensor_specs(const LlamaConfig& c) {
  std::vector<TensorSpec> specs;
  specs.push_back({"token_embd.weight", c.n_vocab, c.n_embd, true, false});
  for (std::uint32_t l = 0; l < c.n_layers; ++l) {
    std::string p = "blk." + std::to_string(l) + ".";
    specs.push_back({p + "attn_norm.weight", 1, c.n_embd, false, false});
    specs.push_back({p + "attn_q.weight", c.q_dim(), c.n_embd, true, false});
    specs.push_back({p + "attn_k.weight", c.kv_dim(), c.n_embd, true, false});
    specs.push_back({p + "attn_v.weight", c.kv_dim(), c.n_embd, true, false});
    specs.push_back({p + "attn_output.weight", c.n_embd, c.q_dim(), true, false});
    if (c.qkv_bias()) {
      specs.push_back({p + "attn_q.bias", 1, c.q_dim(), false, false});
      specs.push_back({p + "attn_k.bias", 1, c.kv_dim(), false, false});
      specs.push_back({p + "attn_v.bias", 1, c.kv_dim(), false, false});
    }
    if (c.qk_norm()) {
      specs.push_back({p + "attn_q_norm.weight", 1, c.head_dim, false, false});
      specs.push_back({p + "attn_k_norm.weight", 1, c.head_dim, false, false});
    }
    specs.push_back({p + "ffn_norm.weight", 1, c.n_embd, false, false});
    specs.push_back({p + "ffn_gate.weight", c.n_ff, c.n_embd, true, false});
    specs.push_back({p + "ffn_up.weight", c.n_ff, c.n_embd, true, false});
    specs.push_back({p + "ffn_down.weight", c.n_embd, c.n_ff, true, false});
  }
  specs.push_back({"output_norm.weight", 1, c.n_embd, false, false});
  // Absent in models that tie the output to the embedding.
  specs.push_back({"output.weight", c.n_vocab, c.n_embd, true, true});
  return specs;
}

}  // namespace mqlm::model
