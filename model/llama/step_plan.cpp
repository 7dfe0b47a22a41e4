#include "model/llama/step_plan.hpp"

#include <algorithm>
#include <array>

namespace mqlm::model {

namespace ops = gpu::ops;

namespace {

std::uint32_t rows_of(const GpuTensor& w) { return static_cast<std::uint32_t>(w.rows); }
std::uint32_t cols_of(const GpuTensor& w) { return static_cast<std::uint32_t>(w.cols); }

// The choices for one step's width, each product's from its type and shape.
class Planner {
 public:
  Planner(const gpu::DeviceFeatures& features, const LlamaConfig& config, const ops::KernelChoice& kernels,
          std::uint32_t tokens)
      : features_(features), config_(config), kernels_(kernels), n_(tokens) {}

  // Batches too wide for the vector path take the tensor cores where the device and weights allow.
  bool narrow(const GpuTensor& w, std::uint32_t columns) const {
    return ops::narrow_matmul_preferred(features_, w.type, rows_of(w), cols_of(w), columns, kernels_);
  }
  bool narrow(const GpuTensor& w) const { return narrow(w, n_); }
  bool vector_path(const GpuTensor& w) const {
    return !narrow(w) && ops::choose_matmul_path(features_, n_) == ops::MatmulPath::vector;
  }
  // Decode steps take the vector path, which can fold a norm, silu(gate) * up or the residual add in.
  bool matvec(const GpuTensor& w) const { return vector_path(w) && ops::matvec_can_accumulate(w.type, cols_of(w), n_); }
  // Decode steps of quantized weights take the int8 vector path (the only one of some types).
  bool int8(const GpuTensor& w) const {
    return vector_path(w) && ops::matvec_q8_applies(features_, w.type, cols_of(w), n_, kernels_);
  }
  // Narrow products whose weights go through their F16 form (not a step the narrow path skips).
  bool dequantizes(const GpuTensor& w) const {
    return narrow(w) && ops::narrow_dequantizes(features_, w.type, rows_of(w), cols_of(w), n_);
  }
  std::uint64_t split_bytes(const GpuTensor& w) const {
    return narrow(w) ? ops::narrow_split_bytes(features_, rows_of(w), cols_of(w), n_, kernels_) : 0;
  }

  ProductPlan product(const GpuTensor& w, ProductPath path) const {
    return {path, path == ProductPath::narrow && dequantizes(w), path == ProductPath::narrow ? split_bytes(w) : 0};
  }
  // A residual product (x += w x in) on its own; one whose output is normed first (Gemma's) takes
  // no path that adds it as it makes it.
  ProductPlan residual(const GpuTensor& w) const {
    if (int8(w)) return product(w, ProductPath::int8);
    if (config_.post_norms()) return product(w, narrow(w) ? ProductPath::narrow : ProductPath::general);
    if (matvec(w)) return product(w, ProductPath::matvec);
    return product(w, narrow(w) ? ProductPath::narrow : ProductPath::general);
  }
  template <std::size_t N>
  NormInput norm_input(const std::array<const GpuTensor*, N>& ws) const {
    auto all = [&](auto&& pred) { return std::ranges::all_of(ws, [&](const GpuTensor* w) { return pred(*w); }); };
    if (all([&](const GpuTensor& w) { return int8(w); })) return NormInput::int8;
    if (all([&](const GpuTensor& w) { return matvec(w); })) return NormInput::fused;
    if (all([&](const GpuTensor& w) { return narrow(w); })) return NormInput::f16;
    return NormInput::f32;
  }
  // A product of a group reading one norm.
  ProductPlan grouped(const GpuTensor& w, NormInput input) const {
    switch (input) {
      case NormInput::int8: return product(w, ProductPath::int8);
      case NormInput::fused: return product(w, ProductPath::matvec);
      default: return product(w, narrow(w) ? ProductPath::narrow : ProductPath::general);
    }
  }
  // Decode on the int8 path with nothing between the q/k/v products and rope (no biases, no q/k
  // norms) and the normal rotary layout: the products write q turned, and k and v into the cache.
  bool writes_heads(const GpuLayer& L) const {
    if (L.bq.buffer || L.bk.buffer || L.bv.buffer || config_.qk_norm()) return false;
    const ops::RopeShape rope = rope_shape(config_, n_, config_.n_head);
    return std::ranges::all_of(std::array{&L.wq, &L.wk, &L.wv}, [&](const GpuTensor* w) {
      return int8(*w) && ops::matvec_q8_heads_applies(features_, w->type, rows_of(*w), cols_of(*w), n_, rope, kernels_);
    });
  }
  // The SwiGLU in one dispatch where the narrow path takes gate, up and down alike.
  bool glu(const GpuLayer& L) const {
    if (config_.gelu() || !narrow(L.w_gate) || !narrow(L.w_up) || !narrow(L.w_down) || matvec(L.w_gate)) return false;
    if (L.w_gate.type != L.w_up.type || L.w_gate.rows != L.w_up.rows || L.w_gate.cols != L.w_up.cols) return false;
    const gpu::WeightType type = dequantizes(L.w_gate) ? gpu::WeightType::f16 : L.w_gate.type;
    return ops::narrow_glu_applies(features_, type, rows_of(L.w_gate), cols_of(L.w_gate), n_, kernels_);
  }

  LayerPlan layer(const GpuLayer& L) const {
    LayerPlan p;
    p.qkv_input = norm_input(std::array{&L.wq, &L.wk, &L.wv});
    p.q = grouped(L.wq, p.qkv_input);
    p.k = grouped(L.wk, p.qkv_input);
    p.v = grouped(L.wv, p.qkv_input);
    p.qkv_write_heads = writes_heads(L);
    p.rope_sums_qkv = !L.bq.buffer && !L.bk.buffer && !L.bv.buffer && !config_.qk_norm();
    p.out = residual(L.wo);
    if (config_.moe()) return experts(L, p);  // the experts' block reads its own norm (record_experts)
    p.glu = glu(L);
    p.ffn_input = norm_input(std::array{&L.w_gate, &L.w_up});
    p.ffn_norm_f16 = p.glu || p.ffn_input == NormInput::f16;
    p.ffn_norm_q8 = config_.post_norms() && p.ffn_input == NormInput::int8;
    p.gate = grouped(L.w_gate, p.ffn_input);
    p.up = grouped(L.w_up, p.ffn_input);
    p.down = residual(L.w_down);
    return p;
  }

  // A wide step's expert products on the tensor cores (where they take all three matrices): which
  // matrices are decoded to F16 first.
  LayerPlan experts(const GpuLayer& L, LayerPlan p) const {
    const std::uint32_t n_ff = config_.n_ff_exp, n_embd = config_.n_embd;
    auto applies = [&](const GpuTensor& w, std::uint32_t m, std::uint32_t k) {
      return ops::experts_coopmat_applies(features_, w.type, m, k);
    };
    if (n_ <= ops::matvec_max_columns || !applies(L.w_gate, n_ff, n_embd) || !applies(L.w_up, n_ff, n_embd) ||
        !applies(L.w_down, n_embd, n_ff)) {
      return p;
    }
    auto dequantize = [&](const GpuTensor& w, std::uint32_t m, std::uint32_t k) {
      return ops::experts_dequantize(features_, w.type, m, k, kernels_);
    };
    p.gate.dequantize = dequantize(L.w_gate, n_ff, n_embd);
    p.up.dequantize = dequantize(L.w_up, n_ff, n_embd);
    p.down.dequantize = dequantize(L.w_down, n_embd, n_ff);
    auto f16 = [](const GpuTensor& w, const ProductPlan& q) { return w.type == gpu::WeightType::f16 || q.dequantize; };
    p.glu = f16(L.w_gate, p.gate) && f16(L.w_up, p.up) && ops::experts_glu_applies(features_, n_ff, n_embd);
    return p;
  }

  OutputPath output(const GpuTensor& w, std::uint32_t outputs) const {
    if (narrow(w, outputs)) {
      if (ops::narrow_reads_at(features_, w.type, outputs)) return OutputPath::narrow;
      // The other types would need a vocabulary-sized F16 scratch: the int8 mat-vec, its most
      // columns at a time.
      if (ops::matvec_q8_applies(features_, w.type, cols_of(w), 1, kernels_)) return OutputPath::int8;
      return OutputPath::general;
    }
    // From 2 columns the int8 input is quantized once rather than in each workgroup (H100, the
    // output matrix at 4 columns: 269 against 398 us); for one, the extra dispatch costs more where
    // the type has a kernel that quantizes in place (Q4_0, Q8_0).
    const bool in_place = ops::matvec_can_accumulate(w.type, cols_of(w), outputs) && ops::matvec_quantizes_in_place(w.type);
    if ((outputs >= 2 || !in_place) && ops::choose_matmul_path(features_, outputs) == ops::MatmulPath::vector &&
        ops::matvec_q8_applies(features_, w.type, cols_of(w), outputs, kernels_)) {
      return OutputPath::int8;
    }
    return OutputPath::general;
  }

  // The bytes the widest group of products recorded alongside each other needs, each bytes_of(w).
  // A mixture of experts' products (`experts`) are not among them.
  template <class BytesOf>
  static std::uint64_t widest_group(const GpuLayer& l, bool experts, BytesOf bytes_of) {
    std::uint64_t widest = 0;
    for (auto group : {std::vector<const GpuTensor*>{&l.wq, &l.wk, &l.wv}, {&l.w_gate, &l.w_up}, {&l.wo}, {&l.w_down}}) {
      if (experts && (group.front() == &l.w_gate || group.front() == &l.w_down)) continue;
      std::uint64_t sum = 0;
      for (const GpuTensor* w : group) sum += bytes_of(*w);
      widest = std::max(widest, sum);
    }
    return widest;
  }

 private:
  const gpu::DeviceFeatures& features_;
  const LlamaConfig& config_;
  const ops::KernelChoice& kernels_;
  std::uint32_t n_;
};

}  // namespace

StepPlan plan_step(const gpu::DeviceFeatures& features, const LlamaConfig& config, std::span<const GpuLayer> layers,
                   const GpuTensor& output, std::uint32_t tokens, std::uint32_t outputs,
                   const ops::KernelChoice& kernels) {
  const Planner planner(features, config, kernels, tokens);
  StepPlan plan;
  plan.kernels = kernels;
  plan.tokens = tokens;
  plan.outputs = outputs;
  plan.padded_tokens = ops::narrow_padded_columns(features, tokens, kernels);
  for (const GpuLayer& layer : layers) plan.layers.push_back(planner.layer(layer));
  // The norm a residual product may make along with its split sum: the next layer's attention
  // norm, where that layer reads it as F16 alone; or along with a post-norm add, as int8.
  for (std::size_t l = 0; l + 1 < plan.layers.size(); ++l) {
    const LayerPlan& next = plan.layers[l + 1];
    plan.layers[l].next_norm_f16 = !config.moe() && !next.qkv_write_heads && next.qkv_input == NormInput::f16;
    plan.layers[l].next_norm_q8 = !config.moe() && config.post_norms() && next.qkv_input == NormInput::int8;
  }
  plan.output = planner.output(output, outputs);
  // Every layer's: the types of a mixture differ from layer to layer.
  auto f16_bytes = [](const GpuTensor& w, const ProductPlan& p) { return p.dequantize ? w.rows * w.cols * 2 : 0; };
  for (std::size_t l = 0; l < layers.size(); ++l) {
    const GpuLayer& layer = layers[l];
    const LayerPlan& p = plan.layers[l];
    const bool experts = config.moe();
    plan.split_bytes = std::max(plan.split_bytes, Planner::widest_group(layer, experts, [&](const GpuTensor& w) {
      return planner.split_bytes(w);
    }));
    plan.weights16_bytes = std::max(plan.weights16_bytes, Planner::widest_group(layer, experts, [&](const GpuTensor& w) {
      return planner.dequantizes(w) ? std::uint64_t{w.rows} * w.cols * 2 : 0;
    }));
    if (experts) {  // gate and up decoded side by side, then down where they were
      plan.weights16_bytes = std::max({plan.weights16_bytes, f16_bytes(layer.w_gate, p.gate) + f16_bytes(layer.w_up, p.up),
                                       f16_bytes(layer.w_down, p.down)});
    }
  }
  return plan;
}

}  // namespace mqlm::model
