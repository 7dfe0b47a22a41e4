// The hyper-parameters of a llama-family transformer (Llama 2 and 3, Mistral, TinyLlama, Qwen2,
// Qwen3, Phi-3), as GGUF metadata gives them, and the tensors such a model has.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace mqlm::gpu::ops {
struct RopeShape;
struct DeltaNetShape;
}

namespace mqlm::model {

// phi3: llama's blocks with NeoX's rotary layout, q/k/v as one matrix (attn_qkv) and gate and up
// as one (ffn_up, the gate's rows first); tensor_specs() names each part of them.
// gemma2: the embedding scaled by sqrt(n_embd), a norm after attention and after the feed-forward
// block too (before each residual add), GeGLU, sliding-window layers (every other one, from the
// first), attention scores and logits soft-capped. gemma3: gemma2's blocks with q/k norms, five
// sliding-window layers to one global, their own RoPE base, and no soft caps.
// qwen3moe: qwen3's attention, and a mixture of experts for its feed-forward block. A llama file
// with experts (expert_count > 0) is Mixtral's: llama's attention and the same mixture.
// qwen35 (Qwen3.5, a hybrid): three Gated DeltaNet layers to one of attention (full_attention_interval
// 4: layer l attends where (l + 1) % 4 == 0). Its attention layers are qwen3's with a gate: attn_q
// gives each head's q and then its gate, the attended heads times sigmoid(gate) before attn_output,
// and the rotary turn over the first rope.dimension_count of each head (its M-RoPE sections all the
// text position: NeoX's). Its DeltaNet layers (llama.cpp's qwen35.cpp and delta-net-base.cpp) keep
// per sequence a short convolution's last (conv_kernel - 1) inputs and, for each of its value heads,
// a (head_v, head_k) matrix the delta rule updates each token. Every layer's feed-forward input is
// normed by post_attention_norm.
enum class Architecture : std::uint8_t { llama, qwen2, qwen3, phi3, gemma2, gemma3, qwen3moe, qwen35 };

struct LlamaConfig {
  Architecture arch = Architecture::llama;
  std::uint32_t n_layers = 0;
  std::uint32_t n_embd = 0;     // hidden size
  std::uint32_t n_ff = 0;       // feed-forward size
  std::uint32_t n_head = 0;
  std::uint32_t n_head_kv = 0;  // grouped-query attention: n_head is a multiple of it
  std::uint32_t head_dim = 0;   // usually n_embd / n_head; Qwen3 sets it apart
  std::uint32_t n_vocab = 0;
  std::uint32_t n_ctx_train = 0;
  float rope_base = 10000.0f;
  float rope_scale = 1.0f;      // linear and YaRN scaling: positions are divided by it
  std::uint32_t rope_dims = 0;  // the rotary dimensions of a head (rope.dimension_count); 0: all
  // YaRN as llama.cpp applies it (ggml's rope_yarn; rope_scaling.hpp reads the keys): ext_factor 0
  // is off; attn_factor multiplies cos and sin whatever the scaling.
  float yarn_ext_factor = 0.0f, yarn_attn_factor = 1.0f, yarn_beta_fast = 32.0f, yarn_beta_slow = 1.0f;
  std::uint32_t yarn_original_context = 0;  // 0: n_ctx_train
  // (rotary dims / 2) each pair's frequency divided by it: the rope_freqs.weight tensor, or llama3
  // scaling's factors; empty: none.
  std::vector<float> rope_freq_factors;
  float rms_eps = 1e-5f;
  bool tied_output = false;     // no output.weight: the logits use token_embd.weight (set at load)
  // Gemma's (0 elsewhere): what q is scaled by before attention (0: 1 / sqrt(head_dim)); the soft
  // caps of attention scores and of the logits (0: none); the sliding window of local layers, and
  // their pattern as llama.cpp's set_swa_pattern has it (layer l is local where l % pattern <
  // pattern - 1); the local layers' RoPE base and linear scale.
  float attn_scale = 0.0f;
  float attn_softcap = 0.0f, final_softcap = 0.0f;
  std::uint32_t sliding_window = 0, swa_pattern = 0;
  float rope_base_local = 10000.0f, rope_scale_local = 1.0f;
  // A mixture of experts (0 experts: a dense feed-forward block): each token's router picks
  // n_expert_used of n_expert SwiGLU blocks of n_ff_exp rows (softmax over the router's logits,
  // the top ones, their weights renormalised to sum to 1) and adds their weighted outputs.
  std::uint32_t n_expert = 0, n_expert_used = 0, n_ff_exp = 0;
  // qwen35's Gated DeltaNet layers (ssm.* keys): ssm_k_heads heads of ssm_head_dim for q and k
  // (ssm.group_count, ssm.state_size), ssm_v_heads of ssm_head_dim for v (ssm.time_step_rank; value
  // head h reads key head h % ssm_k_heads, as llama.cpp's repeat has it), a causal convolution of
  // ssm_conv_kernel taps over q, k and v (ssm.conv_kernel); full_attention_interval: every how many
  // layers one attends (0: no DeltaNet layers).
  std::uint32_t ssm_k_heads = 0, ssm_v_heads = 0, ssm_head_dim = 0, ssm_conv_kernel = 0;
  std::uint32_t full_attention_interval = 0;

  bool rope_neox() const { return arch != Architecture::llama; }  // as llama.cpp applies them
  bool qkv_bias() const { return arch == Architecture::qwen2; }
  bool qk_norm() const {
    return arch == Architecture::qwen3 || arch == Architecture::gemma3 || arch == Architecture::qwen3moe ||
           arch == Architecture::qwen35;
  }
  bool moe() const { return n_expert > 0; }
  bool hybrid() const { return arch == Architecture::qwen35; }
  // Layer l is a Gated DeltaNet layer (no KV cache), not attention.
  bool recurrent_layer(std::uint32_t l) const {
    return hybrid() && full_attention_interval != 0 && (l + 1) % full_attention_interval != 0;
  }
  std::uint32_t ssm_key_dim() const { return ssm_k_heads * ssm_head_dim; }    // q's and k's width
  std::uint32_t ssm_value_dim() const { return ssm_v_heads * ssm_head_dim; }  // v's (ssm.inner_size)
  std::uint32_t ssm_conv_dim() const { return 2 * ssm_key_dim() + ssm_value_dim(); }
  // qwen35's attention layers: attn_q holds each head's q and then its output gate.
  bool gated_attention() const { return hybrid(); }
  bool gemma() const { return arch == Architecture::gemma2 || arch == Architecture::gemma3; }
  // Gemma's: x scaled by sqrt(n_embd) after the embedding; rmsnorm after attention's and the
  // feed-forward block's output products, before their residual adds; gelu(gate) * up.
  bool scaled_embedding() const { return gemma(); }
  bool post_norms() const { return gemma(); }
  bool gelu() const { return gemma(); }
  // Layer l attends over a sliding window (and turns with the local RoPE).
  bool local_layer(std::uint32_t l) const {
    return sliding_window != 0 && swa_pattern != 0 && l % swa_pattern < swa_pattern - 1;
  }
  std::uint32_t window(std::uint32_t l) const { return local_layer(l) ? sliding_window : 0; }
  float query_scale() const { return attn_scale != 0.0f ? attn_scale : 1.0f / std::sqrt(static_cast<float>(head_dim)); }
  std::uint32_t rotary_dims() const { return rope_dims != 0 ? rope_dims : head_dim; }
  std::uint32_t q_dim() const { return n_head * head_dim; }
  std::uint32_t kv_dim() const { return n_head_kv * head_dim; }

  // Empty if consistent; otherwise what is wrong, for a load-time error.
  std::string check() const;
  std::string hybrid_problem() const;  // check()'s part for qwen35
};

// The rotary embedding of `heads` heads of `tokens` tokens as the model turns them: its layout,
// rotary dims, frequency scaling (linear, YaRN) and factors. The shape's factors point into config.
// local: the local layers' (their base and scale, no YaRN and no factors).
gpu::ops::RopeShape rope_shape(const LlamaConfig& config, std::uint32_t tokens, std::uint32_t heads, bool local = false);
// qwen35's DeltaNet layers over `sequences` sequences of `tokens` tokens each.
gpu::ops::DeltaNetShape delta_net_shape(const LlamaConfig& config, std::uint32_t sequences, std::uint32_t tokens);

const char* architecture_name(Architecture arch);  // "llama", "qwen2", ..., "qwen3moe", "qwen35"
bool parse_architecture(const std::string& name, Architecture& out);

// One tensor the model needs: its GGUF name and logical shape (rows, cols); cols is the
// contiguous dimension (GGUF's ne[0]); vectors have rows == 1. The experts' 3-D tensors are their
// matrices one after another: (n_expert * rows of one, cols).
struct TensorSpec {
  std::string name;
  std::uint64_t rows = 1, cols = 0;
  bool matrix = false;  // weights a matmul reads (any weight type); else F32 (norms, biases)
  bool optional = false;
  // A part of a fused matrix (phi3's attn_qkv, ffn_up): its rows from first_row of the tensor named
  // `fused`, where the file has that tensor; else the tensor `name` itself.
  std::string fused;
  std::uint64_t first_row = 0;
};
std::vector<TensorSpec> tensor_specs(const LlamaConfig& config);

// Fills one layer's tensors in the order tensor_specs() lists them, next() giving each in turn;
// any layer type with these member names (the CPU reference's, the GPU model's) will do.
template <typename Layer, typename Next>
void assign_layer_tensors(const LlamaConfig& config, Layer& layer, Next&& next) {
  layer.attn_norm = next();
  layer.wq = next();
  layer.wk = next();
  layer.wv = next();
  layer.wo = next();
  if (config.qkv_bias()) {
    layer.bq = next();
    layer.bk = next();
    layer.bv = next();
  }
  if (config.qk_norm()) {
    layer.q_norm = next();
    layer.k_norm = next();
  }
  if (config.post_norms()) layer.post_attn_norm = next();
  layer.ffn_norm = next();
  if (config.moe()) layer.router = next();
  layer.w_gate = next();
  layer.w_up = next();
  layer.w_down = next();
  if (config.post_norms()) layer.post_ffn_norm = next();
}

// qwen35's layer l in the order tensor_specs() lists it: an attention layer's gated q, k, v,
// output and q/k norms, or a DeltaNet layer's tensors; then the feed-forward block's.
template <typename Layer, typename Next>
void assign_hybrid_layer_tensors(const LlamaConfig& config, std::uint32_t l, Layer& layer, Next&& next) {
  layer.attn_norm = next();
  if (config.recurrent_layer(l)) {
    layer.ssm_qkv = next();
    layer.ssm_gate = next();
    layer.ssm_conv = next();
    layer.ssm_dt_bias = next();
    layer.ssm_a = next();
    layer.ssm_beta = next();
    layer.ssm_alpha = next();
    layer.ssm_norm = next();
    layer.ssm_out = next();
  } else {
    layer.wq = next();
    layer.wk = next();
    layer.wv = next();
    layer.wo = next();
    layer.q_norm = next();
    layer.k_norm = next();
  }
  layer.ffn_norm = next();
  layer.w_gate = next();
  layer.w_up = next();
  layer.w_down = next();
}

}  // namespace mqlm::model
