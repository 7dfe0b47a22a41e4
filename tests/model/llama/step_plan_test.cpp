// The kernels a step plans (plan_step) for Llama-3-8B's shapes, one case a row: on an H100's
// features (tensor cores, int8 dot products) and on a device with neither, by weight type, step
// width and kernel choice. No GPU: the plan reads shapes, types and features only.
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "model/llama/step_plan.hpp"

namespace mqlm::model {
namespace {

using gpu::WeightType;

gpu::DeviceFeatures h100() {
  gpu::DeviceFeatures f;
  f.subgroup_size = 32;
  f.cooperative_matrix = gpu::CooperativeMatrixShape{16, 16, 16};
  f.integer_dot_product = true;
  return f;
}

gpu::DeviceFeatures plain_device() {
  gpu::DeviceFeatures f;
  f.subgroup_size = 8;
  return f;
}

LlamaConfig llama3_8b(Architecture arch) {
  LlamaConfig c;
  c.arch = arch;
  c.n_layers = 2;
  c.n_embd = 4096;
  c.n_ff = 14336;
  c.n_head = 32;
  c.n_head_kv = 8;
  c.head_dim = 128;
  c.n_vocab = 128256;
  return c;
}

GpuTensor matrix(WeightType type, std::uint64_t rows, std::uint64_t cols) { return {type, rows, cols, {}}; }

std::vector<GpuLayer> layers_of(const LlamaConfig& c, WeightType type) {
  std::vector<GpuLayer> layers(c.n_layers);
  for (GpuLayer& l : layers) {
    l.wq = matrix(type, c.q_dim(), c.n_embd);
    l.wk = matrix(type, c.kv_dim(), c.n_embd);
    l.wv = matrix(type, c.kv_dim(), c.n_embd);
    l.wo = matrix(type, c.n_embd, c.q_dim());
    l.w_gate = matrix(type, c.n_ff, c.n_embd);
    l.w_up = matrix(type, c.n_ff, c.n_embd);
    l.w_down = matrix(type, c.n_embd, c.n_ff);
  }
  return layers;
}

struct Case {
  std::string name;
  bool tensor_cores;  // h100() or plain_device()
  Architecture arch;
  WeightType type;
  std::uint32_t tokens, outputs;
  std::optional<bool> int8;  // KernelChoice::matvec_int8
  // What the plan must say of the first layer and the output.
  NormInput qkv_input;
  bool write_heads;
  ProductPath out;
  bool glu;
  NormInput ffn_input;
  ProductPath down;
  bool dequantize, split, next_norm_f16;  // split: the k product's K (1,024 rows: a small grid)
  OutputPath output;
};

using P = ProductPath;
using N = NormInput;
using O = OutputPath;
constexpr auto llama = Architecture::llama, qwen3 = Architecture::qwen3, gemma2 = Architecture::gemma2,
               gemma3 = Architecture::gemma3;

const Case cases[] = {
    // name                        cores  arch   type              n    out  int8          qkv       heads  out         glu    ffn       down        deq    split  next   output
    {"decode 1, Q4_0",             true,  llama, WeightType::q4_0, 1,   1,   std::nullopt, N::int8,  true,  P::int8,   false, N::int8,  P::int8,   false, false, false, O::general},
    {"decode 4, Q4_0",             true,  llama, WeightType::q4_0, 4,   4,   std::nullopt, N::int8,  true,  P::int8,   false, N::int8,  P::int8,   false, false, false, O::int8},
    {"decode 8, Q8_0",             true,  llama, WeightType::q8_0, 8,   8,   std::nullopt, N::int8,  true,  P::int8,   false, N::int8,  P::int8,   false, false, false, O::int8},
    {"decode 8, Q4_0 without int8", true, llama, WeightType::q4_0, 8,   8,   false,        N::f16,   false, P::narrow, false, N::f16,   P::narrow, false, true,  true,  O::narrow},
    {"decode 4, Q4_0 without int8", true, llama, WeightType::q4_0, 4,   4,   false,        N::fused, false, P::matvec, false, N::fused, P::matvec, false, false, false, O::general},
    {"decode 32, Q4_0",            true,  llama, WeightType::q4_0, 32,  32,  std::nullopt, N::f16,   false, P::narrow, true,  N::f16,   P::narrow, false, true,  true,  O::narrow},
    {"prefill 600, Q4_0",          true,  llama, WeightType::q4_0, 600, 1,   std::nullopt, N::f16,   false, P::narrow, true,  N::f16,   P::narrow, true,  true,  true,  O::general},
    {"decode 1, F16",              true,  llama, WeightType::f16,  1,   1,   std::nullopt, N::fused, false, P::matvec, false, N::fused, P::matvec, false, false, false, O::general},
    {"decode 1, Q4_0, q/k norms",  true,  qwen3, WeightType::q4_0, 1,   1,   std::nullopt, N::int8,  false, P::int8,   false, N::int8,  P::int8,   false, false, false, O::general},
    // Gemma's norms after each block: on the int8 path their adds make the next norm's int8 input.
    {"decode 1, Q4_K, gemma3",     true,  gemma3, WeightType::q4_k, 1,  1,   std::nullopt, N::int8,  false, P::int8,   false, N::int8,  P::int8,   false, false, false, O::int8},
    {"decode 1, Q4_0, gemma2",     true,  gemma2, WeightType::q4_0, 1,  1,   std::nullopt, N::int8,  false, P::int8,   false, N::int8,  P::int8,   false, false, false, O::general},
    {"prefill 600, Q4_0, gemma3",  true,  gemma3, WeightType::q4_0, 600, 1,  std::nullopt, N::f16,   false, P::narrow, false, N::f16,   P::narrow, true,  true,  true,  O::general},
    {"decode 32, F32, no cores",   false, llama, WeightType::f32,  32,  32,  std::nullopt, N::f32,   false, P::general, false, N::f32,  P::general, false, false, false, O::general},
    {"decode 2, Q8_0, no cores",   false, llama, WeightType::q8_0, 2,   2,   std::nullopt, N::fused, false, P::matvec, false, N::fused, P::matvec, false, false, false, O::general},
    // The other quantized types: int8 decode; the tensor cores reading the blocks up to 64 columns
    // (no SwiGLU module of their own), through F16 wider; the output matrix past 64 rows on the int8
    // mat-vec (an F16 form of it would be a vocabulary-sized scratch).
    {"decode 1, Q4_K",             true,  llama, WeightType::q4_k, 1,   1,   std::nullopt, N::int8,  true,  P::int8,   false, N::int8,  P::int8,   false, false, false, O::int8},
    {"decode 1, Q6_K",             true,  llama, WeightType::q6_k, 1,   1,   std::nullopt, N::int8,  true,  P::int8,   false, N::int8,  P::int8,   false, false, false, O::int8},
    {"decode 32, Q5_K",            true,  llama, WeightType::q5_k, 32,  32,  std::nullopt, N::f16,   false, P::narrow, false, N::f16,   P::narrow, false, true,  true,  O::narrow},
    {"decode 96, Q5_K",            true,  llama, WeightType::q5_k, 96,  96,  std::nullopt, N::f16,   false, P::narrow, true,  N::f16,   P::narrow, true,  true,  true,  O::int8},
    {"prefill 600, IQ4_XS",        true,  llama, WeightType::iq4_xs, 600, 1, std::nullopt, N::f16,   false, P::narrow, true,  N::f16,   P::narrow, true,  true,  true,  O::int8},
    {"decode 2, Q6_K, no cores",   false, llama, WeightType::q6_k, 2,   2,   std::nullopt, N::f32,   false, P::general, false, N::f32,  P::general, false, false, false, O::general},
};

TEST(StepPlan, ChoosesTheKernelsOfEachCase) {
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const LlamaConfig config = llama3_8b(c.arch);
    const auto layers = layers_of(config, c.type);
    const GpuTensor output = matrix(c.type, config.n_vocab, config.n_embd);
    gpu::ops::KernelChoice choice;
    choice.matvec_int8 = c.int8;
    const StepPlan plan = plan_step(c.tensor_cores ? h100() : plain_device(), config, layers, output, c.tokens,
                                    c.outputs, choice);
    ASSERT_EQ(plan.layers.size(), config.n_layers);
    const LayerPlan& first = plan.layers.front();
    EXPECT_EQ(first.qkv_input, c.qkv_input);
    EXPECT_EQ(first.qkv_write_heads, c.write_heads);
    EXPECT_EQ(first.rope_sums_qkv, !config.qk_norm());
    EXPECT_EQ(first.out.path, c.out);
    EXPECT_EQ(first.glu, c.glu);
    EXPECT_EQ(first.ffn_input, c.ffn_input);
    EXPECT_EQ(first.down.path, c.down);
    EXPECT_EQ(first.q.dequantize, c.dequantize);
    EXPECT_EQ(plan.weights16_bytes > 0, c.dequantize);
    EXPECT_EQ(first.k.split_bytes > 0, c.split);
    EXPECT_EQ(plan.split_bytes > 0, c.split);
    EXPECT_EQ(first.next_norm_f16, c.next_norm_f16);
    EXPECT_FALSE(plan.layers.back().next_norm_f16);  // no layer after the last
    EXPECT_EQ(first.ffn_norm_f16, c.glu || c.ffn_input == N::f16);
    EXPECT_EQ(first.ffn_norm_q8, config.post_norms() && c.ffn_input == N::int8);
    EXPECT_EQ(first.next_norm_q8, config.post_norms() && c.qkv_input == N::int8);
    EXPECT_FALSE(plan.layers.back().next_norm_q8);
    EXPECT_EQ(plan.output, c.output);
  }
}

// A mixture's layers differ: the scratch for F16 weights is sized for whichever layer needs most,
// not the first (here F16, which needs none).
TEST(StepPlan, SizesTheF16ScratchOverEveryLayerOfAMixture) {
  const LlamaConfig config = llama3_8b(llama);
  auto layers = layers_of(config, WeightType::f16);
  layers.back() = std::move(layers_of(config, WeightType::q4_k).back());
  const GpuTensor output = matrix(WeightType::q6_k, config.n_vocab, config.n_embd);
  const StepPlan plan = plan_step(h100(), config, layers, output, 128, 128);  // past the blocks read in place
  EXPECT_FALSE(plan.layers.front().gate.dequantize);
  EXPECT_TRUE(plan.layers.back().gate.dequantize);
  EXPECT_EQ(plan.weights16_bytes, std::uint64_t{2} * config.n_ff * config.n_embd * 2);  // gate and up, F16
  EXPECT_EQ(plan.output, OutputPath::int8);
}

// qwen3moe-30b-a3b's experts (128 of 768, 8 a token, n_embd 2048) in Q4_K, its attention in F16
// (which needs no F16 scratch): a wide step on the tensor cores decodes gate, up and down to F16
// first from 24 pairs an expert (384 tokens), or as the kernel choice says; the scratch holds gate
// and up side by side (down goes where they were).
TEST(StepPlan, DecodesTheExpertsToF16ForWideSteps) {
  LlamaConfig config = llama3_8b(Architecture::qwen3moe);
  config.n_embd = 2048;
  config.n_head = 32;
  config.n_head_kv = 4;
  config.n_expert = 128;
  config.n_expert_used = 8;
  config.n_ff_exp = 768;
  std::vector<GpuLayer> layers = layers_of(config, WeightType::f16);
  for (GpuLayer& l : layers) {
    l.router = matrix(WeightType::f32, config.n_expert, config.n_embd);
    l.w_gate = matrix(WeightType::q4_k, std::uint64_t{config.n_expert} * config.n_ff_exp, config.n_embd);
    l.w_up = matrix(WeightType::q4_k, std::uint64_t{config.n_expert} * config.n_ff_exp, config.n_embd);
    l.w_down = matrix(WeightType::q6_k, std::uint64_t{config.n_expert} * config.n_embd, config.n_ff_exp);
  }
  const GpuTensor output = matrix(WeightType::f16, config.n_vocab, config.n_embd);
  const std::uint64_t gate_up16 = std::uint64_t{2} * config.n_expert * config.n_ff_exp * config.n_embd * 2;
  auto plan = [&](std::uint32_t tokens, bool f16, const gpu::DeviceFeatures& features) {
    gpu::ops::KernelChoice choice;
    choice.experts_f16 = f16;
    return plan_step(features, config, layers, output, tokens, 1, choice);
  };
  for (auto [tokens, f16, features, decoded] :
       {std::tuple{512u, true, h100(), true}, {512u, false, h100(), false}, {383u, false, h100(), false},
        {16u, true, h100(), true}, {8u, true, h100(), false},  // decode: the mat-vec
        {512u, false, plain_device(), false}, {512u, true, plain_device(), false}}) {
    const StepPlan p = plan(tokens, f16, features);
    const LayerPlan& last = p.layers.back();
    EXPECT_EQ(last.gate.dequantize, decoded) << tokens;
    EXPECT_EQ(last.up.dequantize, decoded) << tokens;
    EXPECT_EQ(last.down.dequantize, decoded) << tokens;
    EXPECT_EQ(p.weights16_bytes, decoded ? gate_up16 : 0) << tokens;
  }
}

}  // namespace
}  // namespace mqlm::model
