#include "model/llama/reference_model.hpp"

#include <cmath>
#include <stdexcept>

#include "gpu/reference_ops.hpp"

namespace mqlm::model {

namespace ref = gpu::reference;
using Vec = std::vector<float>;

namespace {

Vec load_tensor(const TensorSource& source, const TensorSpec& spec) {
  auto tensor = find_tensor(source, spec);
  if (!tensor) return {};
  return gpu::dequantize(tensor->type, tensor->bytes, spec.rows, spec.cols);
}

// (tokens, n) rows of x, each plus the same bias.
void add_bias(Vec& x, const Vec& bias) {
  if (bias.empty()) return;
  for (std::size_t i = 0; i < x.size(); ++i) x[i] += bias[i % bias.size()];
}

// qwen35's q rows, each head's q and then its gate: the q heads, and the gates into `gate`.
Vec split_gate(const Vec& q_and_gate, std::size_t heads, std::size_t head_dim, Vec& gate) {
  Vec q(heads * head_dim);
  gate.resize(heads * head_dim);
  for (std::size_t h = 0; h < heads; ++h) {
    auto from = q_and_gate.begin() + static_cast<std::ptrdiff_t>(2 * h * head_dim);
    std::copy_n(from, head_dim, q.begin() + static_cast<std::ptrdiff_t>(h * head_dim));
    std::copy_n(from + static_cast<std::ptrdiff_t>(head_dim), head_dim, gate.begin() + static_cast<std::ptrdiff_t>(h * head_dim));
  }
  return q;
}

// Each DeltaNet layer's state before the first token: zeros; none for attention layers.
std::vector<RecurrentState> initial_states(const LlamaConfig& c) {
  std::vector<RecurrentState> states(c.n_layers);
  for (std::uint32_t l = 0; l < c.n_layers; ++l) {
    if (!c.recurrent_layer(l)) continue;
    states[l].conv.assign(std::size_t{c.ssm_conv_kernel - 1} * c.ssm_conv_dim(), 0.0f);
    states[l].delta.assign(std::size_t{c.ssm_v_heads} * c.ssm_head_dim * c.ssm_head_dim, 0.0f);
  }
  return states;
}

}  // namespace

Vec ReferenceSequence::product_input(const Vec& x) const {
  return model_.int8_activations ? ref::int8_blocks(x) : x;
}

namespace {

// The spec's rows of the fused matrix it is a part of, or nothing where the file has no such matrix.
std::optional<TensorBytes> fused_part(const TensorSource& source, const TensorSpec& spec) {
  if (spec.fused.empty()) return std::nullopt;
  auto whole = source(spec.fused);
  if (!whole) return std::nullopt;
  if (whole->cols != spec.cols || whole->rows < spec.first_row + spec.rows) {
    throw std::runtime_error(spec.fused + " is " + std::to_string(whole->rows) + " x " + std::to_string(whole->cols) +
                             ", too small for " + spec.name + "'s " + std::to_string(spec.rows) + " rows from row " +
                             std::to_string(spec.first_row));
  }
  const std::size_t row_bytes = whole->bytes.size() / whole->rows;  // rows are whole blocks of any type
  whole->bytes = whole->bytes.subspan(spec.first_row * row_bytes, spec.rows * row_bytes);
  whole->rows = spec.rows;
  return whole;
}

}  // namespace

std::optional<TensorBytes> find_tensor(const TensorSource& source, const TensorSpec& spec) {
  auto tensor = fused_part(source, spec);
  if (!tensor) tensor = source(spec.name);
  if (!tensor) {
    if (spec.optional) return std::nullopt;
    throw std::runtime_error("the model has no tensor " + spec.name);
  }
  if (tensor->rows != spec.rows || tensor->cols != spec.cols) {
    throw std::runtime_error(spec.name + " is " + std::to_string(tensor->rows) + " x " + std::to_string(tensor->cols) +
                             ", the configuration needs " + std::to_string(spec.rows) + " x " +
                             std::to_string(spec.cols));
  }
  if (!spec.matrix && tensor->type != gpu::WeightType::f32) {
    throw std::runtime_error(spec.name + " must be F32, it is " + std::string(gpu::weight_type_name(tensor->type)));
  }
  return tensor;
}

ReferenceModel ReferenceModel::load(LlamaConfig config, const TensorSource& source) {
  if (std::string why = config.check(); !why.empty()) throw std::runtime_error("bad model configuration: " + why);
  if (config.gemma()) {
    throw std::runtime_error(std::string("the CPU reference does not compute ") + architecture_name(config.arch) +
                             " (llama.cpp is the oracle of Gemma's blocks)");
  }
  ReferenceModel m;
  m.config = config;
  auto specs = tensor_specs(config);
  std::size_t i = 0;
  auto next = [&] { return load_tensor(source, specs.at(i++)); };
  m.token_embd = next();
  m.layers.resize(config.n_layers);
  for (std::uint32_t l = 0; l < config.n_layers; ++l) {
    ReferenceLayer& layer = m.layers[l];
    if (config.hybrid()) {
      assign_hybrid_layer_tensors(config, l, layer, next);
      continue;
    }
    assign_layer_tensors(config, layer, next);
    if (!config.moe()) continue;
    for (std::size_t j = 0; const char* part : {"gate", "up", "down"}) {
      auto t = source("blk." + std::to_string(l) + ".ffn_" + part + "_exps.weight");
      layer.experts_int8[j++] = t && gpu::quantized(t->type);
    }
  }
  m.output_norm = next();
  m.output = next();
  m.config.tied_output = m.output.empty();
  return m;
}

std::vector<float> ReferenceSequence::forward(std::span<const std::int32_t> tokens) {
  const LlamaConfig& c = model_.config;
  const std::size_t n = tokens.size();
  if (keys_.empty()) {
    keys_.resize(c.n_layers);
    values_.resize(c.n_layers);
    recurrent_ = initial_states(c);
  }
  std::vector<std::int32_t> positions(n);
  for (std::size_t t = 0; t < n; ++t) {
    if (tokens[t] < 0 || static_cast<std::uint32_t>(tokens[t]) >= c.n_vocab) {
      throw std::out_of_range("token id " + std::to_string(tokens[t]) + " is outside the vocabulary");
    }
    positions[t] = static_cast<std::int32_t>(positions_ + t);
  }

  Vec x(n * c.n_embd);  // (tokens, n_embd)
  for (std::size_t t = 0; t < n; ++t) {
    std::copy_n(model_.token_embd.begin() + static_cast<std::ptrdiff_t>(tokens[t]) * c.n_embd, c.n_embd,
                x.begin() + static_cast<std::ptrdiff_t>(t * c.n_embd));
  }
  for (std::size_t l = 0; l < c.n_layers; ++l) {
    const ReferenceLayer& layer = model_.layers[l];
    const Vec normed = ref::rms_norm(x, layer.attn_norm, n, c.n_embd, c.rms_eps);
    x = ref::add(x, c.recurrent_layer(static_cast<std::uint32_t>(l)) ? delta_net_block(layer, recurrent_[l], normed, n)
                                                                     : attention_block(layer, l, normed, positions));
    x = ref::add(x, ffn_block(layer, ref::rms_norm(x, layer.ffn_norm, n, c.n_embd, c.rms_eps), n));
  }
  positions_ += n;
  Vec normed = ref::rms_norm(x, model_.output_norm, n, c.n_embd, c.rms_eps);
  return ref::matmul(model_.output_matrix(), product_input(normed), c.n_vocab, c.n_embd, n);
}

std::vector<float> ReferenceSequence::attention_block(const ReferenceLayer& layer, std::size_t l, const Vec& x,
                                                      std::span<const std::int32_t> positions) {
  const LlamaConfig& c = model_.config;
  const std::size_t n = positions.size();
  const Vec in = product_input(x);
  Vec gate;  // qwen35's: (tokens, q_dim)
  Vec q = ref::matmul(layer.wq, in, c.gated_attention() ? 2 * c.q_dim() : c.q_dim(), c.n_embd, n);
  if (c.gated_attention()) q = split_gate(q, n * c.n_head, c.head_dim, gate);  // (tokens, n_head, head_dim)
  Vec k = ref::matmul(layer.wk, in, c.kv_dim(), c.n_embd, n);  // (tokens, n_head_kv, head_dim)
  Vec v = ref::matmul(layer.wv, in, c.kv_dim(), c.n_embd, n);
  add_bias(q, layer.bq);
  add_bias(k, layer.bk);
  add_bias(v, layer.bv);
  if (c.qk_norm()) {  // Qwen3: RMSNorm over each head, before RoPE
    q = ref::rms_norm(q, layer.q_norm, n * c.n_head, c.head_dim, c.rms_eps);
    k = ref::rms_norm(k, layer.k_norm, n * c.n_head_kv, c.head_dim, c.rms_eps);
  }
  std::vector<std::int32_t> pos(positions.begin(), positions.end());
  gpu::ops::RopeShape rope = rope_shape(c, static_cast<std::uint32_t>(n), c.n_head);
  q = ref::rope(q, pos, rope);
  rope.heads = c.n_head_kv;
  k = ref::rope(k, pos, rope);

  for (std::size_t t = 0; t < n; ++t) {
    keys_[l].emplace_back(k.begin() + static_cast<std::ptrdiff_t>(t * c.kv_dim()),
                          k.begin() + static_cast<std::ptrdiff_t>((t + 1) * c.kv_dim()));
    values_[l].emplace_back(v.begin() + static_cast<std::ptrdiff_t>(t * c.kv_dim()),
                            v.begin() + static_cast<std::ptrdiff_t>((t + 1) * c.kv_dim()));
  }
  ref::LogicalCache cache{{keys_[l]}, {values_[l]}};
  std::vector<std::uint32_t> seq(n, 0), at(pos.begin(), pos.end());
  gpu::ops::AttentionShape shape{static_cast<std::uint32_t>(n), c.n_head, c.n_head_kv, c.head_dim, 0, 0,
                                 1.0f / std::sqrt(static_cast<float>(c.head_dim))};
  Vec attended = ref::attention(q, cache, seq, at, shape);  // (tokens, n_head, head_dim)
  for (std::size_t i = 0; i < gate.size(); ++i) attended[i] *= static_cast<float>(1.0 / (1.0 + std::exp(-double{gate[i]})));
  return ref::matmul(layer.wo, product_input(attended), c.n_embd, c.q_dim(), n);
}

std::vector<float> ReferenceSequence::ffn_block(const ReferenceLayer& layer, const Vec& x, std::size_t n) const {
  const LlamaConfig& c = model_.config;
  if (c.moe()) return experts_block(layer, x, n);
  const Vec in = product_input(x);
  Vec gate = ref::matmul(layer.w_gate, in, c.n_ff, c.n_embd, n);
  Vec up = ref::matmul(layer.w_up, in, c.n_ff, c.n_embd, n);
  return ref::matmul(layer.w_down, product_input(ref::silu_mul(gate, up)), c.n_embd, c.n_ff, n);
}

// Each token through the experts its router picks, their outputs weighted and summed.
std::vector<float> ReferenceSequence::experts_block(const ReferenceLayer& layer, const Vec& x, std::size_t n) const {
  const LlamaConfig& c = model_.config;
  const std::size_t k = c.n_expert_used, ff = c.n_ff_exp, d = c.n_embd;
  const Vec in = product_input(x);
  Vec weights;
  std::vector<std::uint32_t> experts;
  ref::moe_route(ref::matmul(layer.router, in, c.n_expert, d, n), n, c.n_expert, k, weights, experts);
  // Expert e's rows of a stacked matrix.
  auto expert = [](const Vec& stacked, std::uint32_t e, std::size_t rows, std::size_t cols) {
    auto from = stacked.begin() + static_cast<std::ptrdiff_t>(e * rows * cols);
    return Vec(from, from + static_cast<std::ptrdiff_t>(rows * cols));
  };
  Vec out(n * d, 0.0f);
  // What an expert product reads: rounded to int8 blocks where its weights are block-quantized.
  auto rounded = [&](const Vec& v, std::size_t part) { return layer.experts_int8[part] ? ref::int8_blocks(v) : v; };
  for (std::size_t t = 0; t < n; ++t) {
    const Vec token(in.begin() + static_cast<std::ptrdiff_t>(t * d), in.begin() + static_cast<std::ptrdiff_t>((t + 1) * d));
    for (std::size_t j = 0; j < k; ++j) {
      const std::uint32_t e = experts[t * k + j];
      Vec gate = ref::matmul(expert(layer.w_gate, e, ff, d), rounded(token, 0), ff, d, 1);
      Vec up = ref::matmul(expert(layer.w_up, e, ff, d), rounded(token, 1), ff, d, 1);
      Vec y = ref::matmul(expert(layer.w_down, e, d, ff), rounded(ref::silu_mul(gate, up), 2), d, ff, 1);
      for (std::size_t i = 0; i < d; ++i) out[t * d + i] += weights[t * k + j] * y[i];
    }
  }
  return out;
}

}  // namespace mqlm::model
