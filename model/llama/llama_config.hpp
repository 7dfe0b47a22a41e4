// The hyper-parameters of a llama-family transformer (Llama 2 and 3, Mistral, TinyLlama, Qwen2,
// Qwen3), as GGUF metadata gives them, and the tensors such a model has.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mqlm::gpu::ops {
struct RopeShape;
}

namespace mqlm::model {

enum class Architecture : std::uint8_t { llama, qwen2, qwen3 };

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

  bool rope_neox() const { return arch != Architecture::llama; }  // as llama.cpp applies them
  bool qkv_bias() const { return arch == Architecture::qwen2; }
  bool qk_norm() const { return arch == Architecture::qwen3; }
  std::uint32_t rotary_dims() const { return rope_dims != 0 ? rope_dims : head_dim; }
  std::uint32_t q_dim() const { return n_head * head_dim; }
  std::uint32_t kv_dim() const { return n_head_kv * head_dim; }

  // Empty if consistent; otherwise what is wrong, for a load-time error.
  std::string check() const;
};

// The rotary embedding of `heads` heads of `tokens` tokens as the model turns them: its layout,
// rotary dims, frequency scaling (linear, YaRN) and factors. The shape's factors point into config.
gpu::ops::RopeShape rope_shape(const LlamaConfig& config, std::uint32_t tokens, std::uint32_t heads);

const char* architecture_name(Architecture arch);  // "llama", "qwen2", "qwen3"
bool parse_architecture(const std::string& name, Architecture& out);

// One tensor the model needs: its GGUF name and logical shape (rows, cols); cols is the
// contiguous dimension (GGUF's ne[0]); vectors have rows == 1.
struct TensorSpec {
  std::string name;
  std::uint64_t rows = 1, cols = 0;
  bool matrix = false;  // weights a matmul reads (any weight type); else F32 (norms, biases)
  bool optional = false;
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
  layer.ffn_norm = next();
  layer.w_gate = next();
  layer.w_up = next();
  layer.w_down = next();
}

}  // namespace mqlm::model
