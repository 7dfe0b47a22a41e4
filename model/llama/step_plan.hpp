// Which kernels a step of the GPU forward pass records, chosen once per step from the device, the
// weights, the step's width and a gpu::ops::KernelChoice: GpuModel's recording follows the plan and
// decides nothing itself.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "gpu/device.hpp"
#include "gpu/ops.hpp"
#include "model/llama/gpu_model.hpp"
#include "model/llama/llama_config.hpp"

namespace mqlm::model {

// How one product (out = w x acts, or x += it for a residual product) is computed.
enum class ProductPath : std::uint8_t {
  int8,     // the vector path on int8 activations a dispatch before it quantized (decode, Q8_0/Q4_0)
  matvec,   // the vector path with its input's norm or silu(gate) * up, or the residual add, fused in
  narrow,   // the tensor cores on F16 activations (ops::matmul_narrow)
  general,  // ops::matmul on F32 activations; a residual product's add is a dispatch of its own
};

struct ProductPlan {
  ProductPath path = ProductPath::general;
  bool dequantize = false;        // narrow: the weights dequantized to F16 once this step (wide steps)
  std::uint64_t split_bytes = 0;  // narrow: scratch for its K slices (0: K is not split)
};

// How a group of products reads the rmsnorm(x) in front of them (q/k/v; gate/up).
enum class NormInput : std::uint8_t {
  int8,     // quantized with the norm in one dispatch; every product int8
  fused,    // each product normalises x as it loads it (matvec)
  f16,      // made as the tensor cores' F16 input in one dispatch; every product narrow
  f32,      // its own dispatch into h (and F16 from there where a product is narrow)
};

struct LayerPlan {
  NormInput qkv_input = NormInput::f32;
  ProductPlan q, k, v;
  // The int8 q/k/v products write q turned by the rotary embedding and k and v into the cache
  // (ops::matvec_q8_heads): no rope_kv_write.
  bool qkv_write_heads = false;
  // Nothing between the q/k/v products and rope (no biases, no q/k norms): rope_kv_write adds the
  // slices of those that split K.
  bool rope_sums_qkv = false;
  ProductPlan out;
  // The feed-forward block's norm as F16 alone (what the output product's split sum can make).
  bool ffn_norm_f16 = false;
  // Gemma's post-norms: the attention block's post-norm add makes the feed-forward block's norm's
  // int8 input too (ops::rms_norm_add_quantize_q8), where that block reads it alone.
  bool ffn_norm_q8 = false;
  // gate and up as one SwiGLU product on the narrow path (ops::matmul_narrow_glu); a mixture's: its
  // experts' F16 gate and up matrices (as they are or decoded first) in one (ops::matmul_experts_glu).
  bool glu = false;
  NormInput ffn_input = NormInput::f32;
  // A mixture of experts' gate, up and down matrices (every expert's) take only `dequantize`: a wide
  // step on the tensor cores decodes that matrix to F16 first (ops::experts_dequantize).
  ProductPlan gate, up, down;
  // The next layer's attention norm as F16 alone (what the down product's split sum can make).
  bool next_norm_f16 = false;
  // The next layer's attention norm as int8 alone (what the feed-forward block's post-norm add can make).
  bool next_norm_q8 = false;
};

// How the output matrix multiplies the rows whose logits are wanted (int8: matvec_q8, in groups of
// ops::matvec_max_columns rows where there are more).
enum class OutputPath : std::uint8_t { narrow, int8, general };

struct StepPlan {
  gpu::ops::KernelChoice kernels;
  std::uint32_t tokens = 0;          // the step's tokens (columns of every layer's products)
  std::uint32_t outputs = 0;         // rows whose logits are wanted
  std::uint32_t padded_tokens = 0;   // the narrow path's F16 rows for `tokens`
  std::vector<LayerPlan> layers;
  OutputPath output = OutputPath::general;
  // Scratch of the widest group of products recorded alongside each other (q/k/v, gate/up, or a
  // residual product alone; every layer's shapes): their K slices, their F16 weights (a mixture's
  // decoded gate and up matrices, then its down matrix in the same place).
  std::uint64_t split_bytes = 0, weights16_bytes = 0;
};

// The plan for a step of `tokens` tokens, `outputs` of them wanted, through these weights.
StepPlan plan_step(const gpu::DeviceFeatures& features, const LlamaConfig& config, std::span<const GpuLayer> layers,
                   const GpuTensor& output, std::uint32_t tokens, std::uint32_t outputs,
                   const gpu::ops::KernelChoice& kernels = {});

}  // namespace mqlm::model
