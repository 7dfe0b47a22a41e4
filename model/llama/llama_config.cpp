#include "model/llama/llama_config.hpp"

#include <cmath>

#include "gpu/ops.hpp"

namespace mqlm::model {

const char* architecture_name(Architecture arch) {
  switch (arch) {
    case Architecture::llama: return "llama";
    case Architecture::qwen2: return "qwen2";
    case Architecture::qwen3: return "qwen3";
    case Architecture::phi3: return "phi3";
    case Architecture::gemma2: return "gemma2";
    case Architecture::gemma3: return "gemma3";
    case Architecture::qwen3moe: return "qwen3moe";
    case Architecture::qwen35: return "qwen35";
  }
  return "?";
}

bool parse_architecture(const std::string& name, Architecture& out) {
  for (Architecture a : {Architecture::llama, Architecture::qwen2, Architecture::qwen3, Architecture::phi3,
                         Architecture::gemma2, Architecture::gemma3, Architecture::qwen3moe, Architecture::qwen35}) {
    if (name == architecture_name(a)) {
      out = a;
      return true;
    }
  }
  return false;
}

gpu::ops::RopeShape rope_shape(const LlamaConfig& c, std::uint32_t tokens, std::uint32_t heads, bool local) {
  if (local) {
    return {tokens, heads, c.head_dim, c.rotary_dims(), c.rope_base_local, 1.0f / c.rope_scale_local, c.rope_neox()};
  }
  gpu::ops::RopeShape s{tokens, heads, c.head_dim, c.rotary_dims(), c.rope_base, 1.0f / c.rope_scale, c.rope_neox()};
  s.yarn = {c.yarn_ext_factor, c.yarn_attn_factor, c.yarn_beta_fast, c.yarn_beta_slow,
            c.yarn_original_context != 0 ? c.yarn_original_context : c.n_ctx_train};
  s.freq_factors = c.rope_freq_factors;
  return s;
}

gpu::ops::DeltaNetShape delta_net_shape(const LlamaConfig& c, std::uint32_t sequences, std::uint32_t tokens) {
  return {sequences, tokens, c.ssm_k_heads, c.ssm_v_heads, c.ssm_head_dim, c.ssm_conv_kernel, c.rms_eps};
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
  for (float v : {attn_scale, attn_softcap, final_softcap}) {
    if (!(v >= 0) || !std::isfinite(v)) return "the attention scale and soft caps must be finite and not negative";
  }
  if (!(rope_base_local > 0) || !(rope_scale_local > 0)) return "the local layers' rope base and scale must be positive";
  if (arch == Architecture::qwen3moe && !moe()) return "qwen3moe needs expert_count and expert_used_count";
  if (moe() && (n_expert > 1024 || n_expert_used == 0 || n_expert_used > n_expert || n_expert_used > 32 ||
                !positive(n_ff_exp))) {
    return "expert_count must be at most 1024, expert_used_count 1 to 32 and at most it, the expert feed-forward size "
           "positive";
  }
  if (moe() && gemma()) return "Gemma with experts is not supported";
  return hybrid() ? hybrid_problem() : std::string();
}

std::string LlamaConfig::hybrid_problem() const {
  if (moe()) return "qwen35 with experts (qwen35moe) is not supported";
  if (full_attention_interval == 0 || full_attention_interval > n_layers) {
    return "qwen35's full_attention_interval must be 1 to block_count";
  }
  auto positive = [](std::uint32_t v) { return v > 0 && v <= 4096; };
  if (!positive(ssm_k_heads) || !positive(ssm_v_heads) || !positive(ssm_head_dim) || ssm_conv_kernel < 2 ||
      ssm_conv_kernel > 64) {
    return "qwen35's ssm.group_count, ssm.time_step_rank and ssm.state_size must be 1 to 4096, ssm.conv_kernel 2 to 64";
  }
  if (ssm_v_heads % ssm_k_heads != 0) return "qwen35's ssm.time_step_rank must be a multiple of ssm.group_count";
  return {};
}

namespace {

// qwen35's layer l, in assign_hybrid_layer_tensors' order.
void hybrid_layer_specs(const LlamaConfig& c, std::uint32_t l, std::vector<TensorSpec>& specs) {
  auto matrix = [&](std::string name, std::uint64_t rows, std::uint64_t cols) {
    specs.push_back({std::move(name), rows, cols, true, false, {}, 0});
  };
  auto f32 = [&](std::string name, std::uint64_t rows, std::uint64_t cols) {
    specs.push_back({std::move(name), rows, cols, false, false, {}, 0});
  };
  const std::string p = "blk." + std::to_string(l) + ".";
  f32(p + "attn_norm.weight", 1, c.n_embd);
  if (c.recurrent_layer(l)) {
    matrix(p + "attn_qkv.weight", c.ssm_conv_dim(), c.n_embd);
    matrix(p + "attn_gate.weight", c.ssm_value_dim(), c.n_embd);
    f32(p + "ssm_conv1d.weight", c.ssm_conv_dim(), c.ssm_conv_kernel);
    f32(p + "ssm_dt.bias", 1, c.ssm_v_heads);
    f32(p + "ssm_a", 1, c.ssm_v_heads);
    matrix(p + "ssm_beta.weight", c.ssm_v_heads, c.n_embd);
    matrix(p + "ssm_alpha.weight", c.ssm_v_heads, c.n_embd);
    f32(p + "ssm_norm.weight", 1, c.ssm_head_dim);
    matrix(p + "ssm_out.weight", c.n_embd, c.ssm_value_dim());
  } else {
    matrix(p + "attn_q.weight", 2 * std::uint64_t{c.q_dim()}, c.n_embd);
    matrix(p + "attn_k.weight", c.kv_dim(), c.n_embd);
    matrix(p + "attn_v.weight", c.kv_dim(), c.n_embd);
    matrix(p + "attn_output.weight", c.n_embd, c.q_dim());
    f32(p + "attn_q_norm.weight", 1, c.head_dim);
    f32(p + "attn_k_norm.weight", 1, c.head_dim);
  }
  f32(p + "post_attention_norm.weight", 1, c.n_embd);
  matrix(p + "ffn_gate.weight", c.n_ff, c.n_embd);
  matrix(p + "ffn_up.weight", c.n_ff, c.n_embd);
  matrix(p + "ffn_down.weight", c.n_embd, c.n_ff);
}

}  // namespace

std::vector<TensorSpec> tensor_specs(const LlamaConfig& c) {
  std::vector<TensorSpec> specs;
  // Weights a matmul reads (rows, cols), the part of `fused` from first_row where given; F32 vectors.
  auto matrix = [&](std::string name, std::uint64_t rows, std::uint64_t cols, std::string fused = {},
                    std::uint64_t first_row = 0) {
    specs.push_back({std::move(name), rows, cols, true, false, std::move(fused), first_row});
  };
  auto vector = [&](std::string name, std::uint64_t n) { specs.push_back({std::move(name), 1, n, false, false, {}, 0}); };
  matrix("token_embd.weight", c.n_vocab, c.n_embd);
  for (std::uint32_t l = 0; l < c.n_layers && c.hybrid(); ++l) hybrid_layer_specs(c, l, specs);
  for (std::uint32_t l = 0; l < c.n_layers && !c.hybrid(); ++l) {
    std::string p = "blk." + std::to_string(l) + ".";
    vector(p + "attn_norm.weight", c.n_embd);
    // phi3's q, k and v are one matrix where its file has attn_qkv.
    const std::string qkv = c.arch == Architecture::phi3 ? p + "attn_qkv.weight" : "";
    matrix(p + "attn_q.weight", c.q_dim(), c.n_embd, qkv, 0);
    matrix(p + "attn_k.weight", c.kv_dim(), c.n_embd, qkv, c.q_dim());
    matrix(p + "attn_v.weight", c.kv_dim(), c.n_embd, qkv, c.q_dim() + c.kv_dim());
    matrix(p + "attn_output.weight", c.n_embd, c.q_dim());
    if (c.qkv_bias()) {
      vector(p + "attn_q.bias", c.q_dim());
      vector(p + "attn_k.bias", c.kv_dim());
      vector(p + "attn_v.bias", c.kv_dim());
    }
    if (c.qk_norm()) {
      vector(p + "attn_q_norm.weight", c.head_dim);
      vector(p + "attn_k_norm.weight", c.head_dim);
    }
    if (c.post_norms()) vector(p + "post_attention_norm.weight", c.n_embd);
    vector(p + "ffn_norm.weight", c.n_embd);
    if (c.moe()) {  // the router, then each expert's gate, up and down, stacked
      matrix(p + "ffn_gate_inp.weight", c.n_expert, c.n_embd);
      matrix(p + "ffn_gate_exps.weight", std::uint64_t{c.n_expert} * c.n_ff_exp, c.n_embd);
      matrix(p + "ffn_up_exps.weight", std::uint64_t{c.n_expert} * c.n_ff_exp, c.n_embd);
      matrix(p + "ffn_down_exps.weight", std::uint64_t{c.n_expert} * c.n_embd, c.n_ff_exp);
      continue;
    }
    // phi3's ffn_up holds the gate's rows, then up's (llama.cpp's swiglu of the one product).
    const std::string gate_up = c.arch == Architecture::phi3 ? p + "ffn_up.weight" : "";
    matrix(p + "ffn_gate.weight", c.n_ff, c.n_embd, gate_up, 0);
    matrix(p + "ffn_up.weight", c.n_ff, c.n_embd, gate_up, c.n_ff);
    matrix(p + "ffn_down.weight", c.n_embd, c.n_ff);
    if (c.post_norms()) vector(p + "post_ffw_norm.weight", c.n_embd);
  }
  vector("output_norm.weight", c.n_embd);
  // Absent in models that tie the output to the embedding; not asked for of gemma2, whose logits
  // use the embedding whatever else the file holds (as llama.cpp's do).
  if (c.arch != Architecture::gemma2) specs.push_back({"output.weight", c.n_vocab, c.n_embd, true, true, {}, 0});
  return specs;
}

}  // namespace mqlm::model
