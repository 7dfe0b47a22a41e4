// Plain C++ versions of every GPU op, written for clarity, in double precision: what the
// kernels are checked against. Shapes as in gpu/ops.hpp.
#pragma once

#include <cstdint>
#include <vector>

#include "gpu/ops.hpp"

namespace mqlm::gpu::reference {

using Vec = std::vector<float>;

Vec rms_norm(const Vec& x, const Vec& weight, std::size_t rows, std::size_t n, float eps);
Vec add(const Vec& a, const Vec& b);
Vec silu_mul(const Vec& gate, const Vec& up);
Vec gelu_mul(const Vec& gate, const Vec& up);  // GELU's tanh form
Vec soft_cap(const Vec& x, float cap);          // cap * tanh(x / cap)
Vec softmax(const Vec& x, std::size_t rows, std::size_t n, float scale);
Vec rope(const Vec& x, const std::vector<std::int32_t>& positions, const ops::RopeShape& shape);
// weights: (m, k) already dequantized; acts: (n, k); returns (n, m).
Vec matmul(const Vec& weights, const Vec& acts, std::size_t m, std::size_t k, std::size_t n);
// Activations as the int8 mat-vec sees them (ops::matvec_int8): each block of 32 rounded to
// multiples of its largest magnitude / 127. Size a multiple of 32.
Vec int8_blocks(const Vec& acts);

// The logical cache: keys[seq][pos] is one (kv_heads * head_dim) row; same for values.
struct LogicalCache {
  std::vector<std::vector<Vec>> keys, values;
};
// q: (tokens, heads, head_dim); token t is (seq[t], pos[t]) and sees positions 0 .. pos[t].
Vec attention(const Vec& q, const LogicalCache& cache, const std::vector<std::uint32_t>& seq,
              const std::vector<std::uint32_t>& pos, const ops::AttentionShape& shape);

// qwen35's Gated DeltaNet recurrence for one sequence (shape.sequences 1) of shape.tokens tokens,
// as llama.cpp computes it (ggml's ssm_conv, gated_delta_net). short_conv: silu of the causal
// convolution of x (tokens, conv_dim) with taps (conv_dim, kernel), state (kernel - 1, conv_dim) the
// inputs before x, left holding the last ones. delta_rule: per token and value head h (key head
// h % k_heads), q and k L2-normalised, decay = exp(softplus(alpha + dt_bias) * rate), b =
// sigmoid(beta), and the head's state S (value rows r, key columns c; (r, c) at c * head_dim + r):
//   S *= decay;  d = b (v - S k);  S += d k^T;  out = S q / sqrt(head_dim).
Vec short_conv(const Vec& x, const Vec& taps, Vec& state, const ops::DeltaNetShape& shape);
Vec delta_rule(const Vec& qkv, const Vec& alpha, const Vec& beta, const Vec& dt_bias, const Vec& rate, Vec& state,
               const ops::DeltaNetShape& shape);

std::vector<std::uint32_t> argmax(const Vec& x, std::size_t rows, std::size_t n);
// The k best (value, index) of each row, larger value first, lower index on ties.
void topk(const Vec& x, std::size_t rows, std::size_t n, std::size_t k, Vec& values, std::vector<std::uint32_t>& indices);
// A mixture of experts' routing of each row of router logits (rows, n): the k experts of highest
// softmax probability (lower index on ties) and their probabilities renormalised to sum to 1, as
// (rows, k) each.
void moe_route(const Vec& logits, std::size_t rows, std::size_t n, std::size_t k, Vec& weights,
               std::vector<std::uint32_t>& experts);

}  // namespace mqlm::gpu::reference
