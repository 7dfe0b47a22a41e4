// The slow, simple CPU forward pass the GPU one is tested against: every weight dequantized to
// F32 once at load, every op from gpu/reference_ops (double precision inside), one sequence at
// a time with a growing KV cache. Readable top to bottom, in the spirit of llama2.c.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "gpu/weight_formats.hpp"
#include "model/llama/llama_config.hpp"

namespace mqlm::model {

// A tensor as a file holds it: its type, logical (rows, cols) and its bytes in GGUF layout.
struct TensorBytes {
  gpu::WeightType type = gpu::WeightType::f32;
  std::uint64_t rows = 1, cols = 0;
  std::span<const std::byte> bytes;
};
// Finds a tensor by name; nothing if the model has none of that name.
using TensorSource = std::function<std::optional<TensorBytes>(const std::string& name)>;

// The tensor the spec asks for, checked against it; nothing when it is optional and absent.
// Throws std::runtime_error naming a missing tensor, a wrong shape, or a norm or bias not in F32.
std::optional<TensorBytes> find_tensor(const TensorSource& source, const TensorSpec& spec);

struct ReferenceLayer {
  std::vector<float> attn_norm;                // (n_embd)
  std::vector<float> wq, wk, wv;               // (q_dim, n_embd), (kv_dim, n_embd) x2; qwen35's wq (2 q_dim, n_embd)
  std::vector<float> bq, bk, bv;               // qwen2: (q_dim), (kv_dim) x2; else empty
  std::vector<float> q_norm, k_norm;           // qwen3: (head_dim) each; else empty
  std::vector<float> wo;                       // (n_embd, q_dim)
  std::vector<float> ffn_norm;                 // (n_embd); qwen35's post_attention_norm
  // qwen35's Gated DeltaNet layers (empty elsewhere): q, k and v in one product; the output gate z;
  // the convolution's taps, each channel's oldest first; the decay's bias and rate, per value head;
  // the update strength's and the decay's products; the output norm, one value head wide.
  std::vector<float> ssm_qkv;                  // (conv_dim, n_embd)
  std::vector<float> ssm_gate;                 // (value_dim, n_embd)
  std::vector<float> ssm_conv;                 // (conv_dim, conv_kernel)
  std::vector<float> ssm_dt_bias, ssm_a;       // (ssm_v_heads)
  std::vector<float> ssm_beta, ssm_alpha;      // (ssm_v_heads, n_embd)
  std::vector<float> ssm_norm;                 // (ssm_head_dim)
  std::vector<float> ssm_out;                  // (n_embd, value_dim)
  std::vector<float> router;                   // experts: (n_expert, n_embd); else empty
  std::vector<float> w_gate, w_up;             // (n_ff, n_embd); experts: (n_expert, n_ff_exp, n_embd)
  std::vector<float> w_down;                   // (n_embd, n_ff); experts: (n_expert, n_embd, n_ff_exp)
  std::vector<float> post_attn_norm, post_ffn_norm;  // Gemma's, which this reference does not compute: empty
  // Experts of a block-quantized type (gate, up, down) read their activations rounded to int8
  // blocks, as the GPU's and llama.cpp's products of them do (gpu::ops::experts_read_q8).
  std::array<bool, 3> experts_int8{};
};

struct ReferenceModel {
  LlamaConfig config;
  std::vector<float> token_embd;               // (n_vocab, n_embd)
  std::vector<ReferenceLayer> layers;          // (n_layers)
  std::vector<float> output_norm;              // (n_embd)
  std::vector<float> output;                   // (n_vocab, n_embd); empty when tied to token_embd
  // The matrix products see their activations rounded to int8 blocks (gpu::reference::int8_blocks),
  // as the GPU's int8 mat-vec does (gpu::ops::matvec_int8); tests set it to compare at a tight bound.
  bool int8_activations = false;

  // Throws std::runtime_error naming the tensor that is missing or has the wrong shape.
  static ReferenceModel load(LlamaConfig config, const TensorSource& source);
  const std::vector<float>& output_matrix() const { return output.empty() ? token_embd : output; }
};

// What a Gated DeltaNet layer carries from one token to the next, for one sequence: the last
// (conv_kernel - 1) inputs of its convolution and each value head's state matrix.
struct RecurrentState {
  std::vector<float> conv;   // (conv_kernel - 1, conv_dim), oldest first
  std::vector<float> delta;  // (ssm_v_heads, ssm_head_dim key columns, ssm_head_dim value rows)
};

// One sequence: feed it tokens, get the logits of each.
class ReferenceSequence {
 public:
  explicit ReferenceSequence(const ReferenceModel& model) : model_(model) {}
  // Runs the tokens at the next positions; returns their logits, (tokens, n_vocab).
  std::vector<float> forward(std::span<const std::int32_t> tokens);
  std::uint32_t length() const { return static_cast<std::uint32_t>(positions_); }

 private:
  std::vector<float> attention_block(const ReferenceLayer& layer, std::size_t layer_index, const std::vector<float>& x,
                                     std::span<const std::int32_t> positions);
  std::vector<float> ffn_block(const ReferenceLayer& layer, const std::vector<float>& x, std::size_t tokens) const;
  // qwen35's DeltaNet layer over the tokens (reference_delta_net.cpp), carrying its state on.
  std::vector<float> delta_net_block(const ReferenceLayer& layer, RecurrentState& state, const std::vector<float>& x,
                                     std::size_t tokens) const;
  std::vector<float> experts_block(const ReferenceLayer& layer, const std::vector<float>& x, std::size_t tokens) const;
  // x as the matrix products see it (rounded to int8 blocks where the model says so).
  std::vector<float> product_input(const std::vector<float>& x) const;

  const ReferenceModel& model_;
  std::vector<std::vector<std::vector<float>>> keys_, values_;  // [layer][position] -> (kv_dim)
  std::vector<RecurrentState> recurrent_;                       // [layer]; empty for attention layers
  std::size_t positions_ = 0;
};

}  // namespace mqlm::model
