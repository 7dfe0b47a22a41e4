#include "gpu/ops.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <numbers>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "gpu/vulkan_error.hpp"

namespace mqlm::gpu::ops {

namespace {

constexpr std::uint32_t max_groups = 65535;
constexpr std::uint32_t matvec_threads = 128, matvec_rows = 2, matvec_max_cols = matvec_max_columns;
// From 6 columns the tensor cores beat the float vector kernels, whose arithmetic grows with the
// columns: H100, llama3-8b Q4_0, a decode step of 4 / 6 / 8 sequences took 10.6 / 16.2 / 21.1 ms on
// them and 15.7 / 15.8 / 15.9 ms on the narrow path (bench/results/staged-matmul-2026-11-25-h100.md).
// The int8 vector kernels beat both up to 8 columns (narrow_matmul_preferred).
constexpr std::uint32_t narrow_min_columns = 6;
constexpr std::uint32_t tile_m = 64, tile_n = 64;
constexpr std::uint32_t topk_chunk = 1024;

std::uint32_t ceil_div(std::uint64_t a, std::uint64_t b) { return static_cast<std::uint32_t>((a + b - 1) / b); }

// A 1-D grid of `groups` workgroups spread over x and y (shaders use flat_group() and bounds).
std::pair<std::uint32_t, std::uint32_t> spread(std::uint32_t groups) {
  std::uint32_t x = std::min(groups, max_groups);
  return {std::max(x, 1u), std::max(ceil_div(groups, x == 0 ? 1 : x), 1u)};
}

const Kernel& kernel(KernelLibrary& lib, std::string shader, std::uint32_t buffers, std::uint32_t push_bytes,
                     std::vector<std::uint32_t> constants = {}, std::uint32_t subgroup = 0) {
  return lib.get({std::move(shader), buffers, push_bytes, std::move(constants), subgroup});
}

// The whole-block vector kernel on float activations (with a norm, silu(gate) * up or the residual
// add fused in) reads 16-byte words of float rows, so it needs K % 8 == 0 (quantized rows are whole
// blocks by construction); the generic kernel takes any K. The types read in units of eight
// (quant_units.glsl) have only its int8 form.
bool matvec_blocks(WeightType type, std::uint32_t k) {
  switch (type) {
    case WeightType::f32:
    case WeightType::f16:
    case WeightType::bf16: return k % 8 == 0;
    case WeightType::q8_0:
    case WeightType::q4_0:
    case WeightType::q4_k: return true;
    default: return false;
  }
}

// Threads and rows per workgroup of the whole-block vector kernel: enough rows that the
// activations loaded for a unit of K are reused, few enough that every SM gets many workgroups.
// Q4_0 and Q8_0 matrices of at most 4096 rows (attention output, down projection) take 256
// threads: one wave of the H100 then still has all its threads (128 threads: 7-16% slower there,
// 5-9% faster for the taller matrices; bench/results/int8-matvec-2026-11-25-h100.md).
// The other quantized types take a block of 32 a thread (quant_units.glsl; the fixed shapes need 4
// rows): as few rounds over K as 256 threads need, the blocks shared out evenly (K = 14,336, 448
// blocks: 224 threads twice each, where 128 threads went round 3.5 times and a quarter of them
// waited out the last round).
// Q4_0 and Q8_0 take quarter blocks a thread except where their modules read whole blocks
// (`whole_blocks`: matvec_q8_whole_blocks).
MatvecShape matvec_shape(WeightType type, std::uint32_t m, std::uint32_t k, bool whole_blocks,
                         const KernelChoice& choice) {
  if (choice.matvec_shape.threads != 0) return choice.matvec_shape;
  switch (type) {
    case WeightType::f32:
    case WeightType::f16:
    case WeightType::bf16: return {128, 2};
    case WeightType::q4_0:
    case WeightType::q8_0:
      if (!whole_blocks) return {m <= 4096 ? 256u : 128u, 4};
      [[fallthrough]];
    default: {
      const std::uint32_t blocks = std::max(k / 32, 1u), rounds = ceil_div(blocks, 256);
      return {std::min(256u, 32 * ceil_div(ceil_div(blocks, rounds), 32)), 4};
    }
  }
}

// The whole-block vector kernel's module for weights of `type` and activations `acts` (b32, b16,
// silu, rmsnorm): the int8 one where matvec_int8 says so.
std::string matvec_blocks_kernel(const DeviceFeatures& features, WeightType type, std::string_view acts,
                                 const KernelChoice& choice) {
  return fmt::format("mul_mat_vec_blocks_{}_{}{}", weight_type_name(type), acts,
                     matvec_quantizes_in_place(type) && matvec_int8(features, type, choice) ? "_i8" : "");
}

struct MatvecPush {
  std::uint32_t m, k, n;
};

// Whether the int8 module on activations quantized beforehand reads Q4_0 or Q8_0 as whole blocks a
// thread (shaders/CMakeLists.txt builds them so): Q8_0 always, Q4_0 in the modules of a fixed shape
// up to 4 columns (its quarter blocks are faster from 5 on: H200, llama3-8b Q4_0, one column 365 ->
// 404 tok/s, a batch of 8 9.3 -> 11.0 ms a step).
bool matvec_q8_whole_blocks(WeightType type, std::uint32_t n, bool fixed) {
  return type != WeightType::q4_0 || (fixed && n <= 4);
}

// Records the whole-block mat-vec module `module` (mul_mat_vec_blocks.comp) for weights of `type`
// (reading whole blocks a thread where they are quarter blocks elsewhere: `whole_blocks`): its
// workgroup shape for push.m rows, push.n columns, and whether it adds to the output.
template <class Push>
void dispatch_matvec_blocks(Recording& rec, KernelLibrary& lib, const std::string& module, WeightType type,
                            bool whole_blocks, std::initializer_list<BufferRange> buffers, const Push& push,
                            bool accumulate, const KernelChoice& choice) {
  const MatvecShape shape = matvec_shape(type, push.m, push.k, whole_blocks, choice);
  auto [gx, gy] = spread(ceil_div(push.m, shape.rows));
  rec.dispatch(kernel(lib, module, static_cast<std::uint32_t>(buffers.size()), sizeof push,
                      {shape.threads, shape.rows, push.n, accumulate ? 1u : 0u}),
               buffers, push, gx, gy);
}

struct RowsPush {
  std::uint32_t n, rows;
  float value;
};

}  // namespace

void rms_norm(Recording& rec, KernelLibrary& lib, BufferRange x, BufferRange weight, BufferRange out, std::uint32_t rows,
              std::uint32_t n, float eps) {
  RowsPush push{n, rows, eps};
  auto [gx, gy] = spread(rows);
  rec.dispatch(kernel(lib, "rms_norm", 3, sizeof push, {256}), {x, weight, out}, push, gx, gy);
}

void rms_norm_add(Recording& rec, KernelLibrary& lib, BufferRange x, BufferRange weight, BufferRange io,
                  std::uint32_t rows, std::uint32_t n, float eps) {
  RowsPush push{n, rows, eps};
  auto [gx, gy] = spread(rows);
  rec.dispatch(kernel(lib, "rms_norm_add", 3, sizeof push, {256}), {x, weight, io}, push, gx, gy);
}

namespace {
// The tensor cores' F16 input that `op` makes: padded_rows of n, at least `rows` of them.
void check_padded_f16(std::string_view op, BufferRange out16, std::uint32_t rows, std::uint32_t padded_rows,
                      std::uint32_t n) {
  if (padded_rows < rows) throw GpuError(fmt::format("{}: fewer padded rows than rows", op));
  if (out16.size < std::uint64_t{padded_rows} * n * 2) {
    throw GpuError(fmt::format("{}: the output is smaller than its padded rows", op));
  }
}
}  // namespace

void rms_norm_f16(Recording& rec, KernelLibrary& lib, BufferRange x, BufferRange weight, BufferRange out16,
                  std::uint32_t rows, std::uint32_t padded_rows, std::uint32_t n, float eps) {
  check_padded_f16("rms_norm_f16", out16, rows, padded_rows, n);
  struct {
    std::uint32_t n, rows;
    float eps;
    std::uint32_t padded;
  } push{n, rows, eps, padded_rows};
  auto [gx, gy] = spread(padded_rows);
  rec.dispatch(kernel(lib, "rms_norm_f16", 3, sizeof push, {256}), {x, weight, out16}, push, gx, gy);
}

void sum_splits_rms_norm_f16(Recording& rec, KernelLibrary& lib, BufferRange parts, std::uint32_t splits, BufferRange x,
                             BufferRange weight, BufferRange out16, std::uint32_t rows, std::uint32_t padded_rows,
                             std::uint32_t n, float eps) {
  check_padded_f16("sum_splits_rms_norm_f16", out16, rows, padded_rows, n);
  if (parts.size < std::uint64_t{splits} * rows * n * 4) {
    throw GpuError(fmt::format("sum_splits_rms_norm_f16: the parts hold fewer than {} slices of {} x {}", splits, rows, n));
  }
  struct {
    std::uint32_t n, rows;
    float eps;
    std::uint32_t padded, splits;
  } push{n, rows, eps, padded_rows, splits};
  auto [gx, gy] = spread(padded_rows);
  rec.dispatch(kernel(lib, "sum_splits_rms_norm_f16", 4, sizeof push, {256}), {x, weight, out16, parts}, push, gx, gy);
}

void softmax(Recording& rec, KernelLibrary& lib, BufferRange x, BufferRange out, std::uint32_t rows, std::uint32_t n,
             float scale) {
  RowsPush push{n, rows, scale};
  auto [gx, gy] = spread(rows);
  rec.dispatch(kernel(lib, "softmax", 2, sizeof push, {256}), {x, out}, push, gx, gy);
}

void add(Recording& rec, KernelLibrary& lib, BufferRange a, BufferRange b, BufferRange out, std::uint32_t n) {
  auto [gx, gy] = spread(ceil_div(n, 256));
  rec.dispatch(kernel(lib, "add", 3, 4), {a, b, out}, n, gx, gy);
}

void silu_mul(Recording& rec, KernelLibrary& lib, BufferRange gate, BufferRange up, BufferRange out, std::uint32_t n) {
  auto [gx, gy] = spread(ceil_div(n, 256));
  rec.dispatch(kernel(lib, "silu_mul", 3, 4), {gate, up, out}, n, gx, gy);
}

namespace {
void check_delta_net(const char* op, const DeltaNetShape& s) {
  if (s.sequences == 0 || s.tokens == 0 || s.k_heads == 0 || s.v_heads % s.k_heads != 0 || s.head_dim == 0 ||
      s.head_dim > delta_net_max_head_dim || s.conv_kernel < 2 || s.conv_kernel > delta_net_max_kernel ||
      s.sequences > max_groups) {
    throw GpuError(fmt::format("{}: {} sequences of {} tokens, {} k heads, {} v heads of {}, a kernel of {}", op,
                               s.sequences, s.tokens, s.k_heads, s.v_heads, s.head_dim, s.conv_kernel));
  }
}
}  // namespace

void short_conv(Recording& rec, KernelLibrary& lib, BufferRange x, BufferRange taps, BufferRange state,
                BufferRange slots, BufferRange out, const DeltaNetShape& s) {
  check_delta_net("short_conv", s);
  struct {
    std::uint32_t channels, kernel, tokens, sequences;
  } push{s.conv_dim(), s.conv_kernel, s.tokens, s.sequences};
  auto [gx, gy] = spread(ceil_div(std::uint64_t{push.channels} * s.sequences, 64));
  rec.dispatch(kernel(lib, "short_conv", 5, sizeof push), {x, taps, state, slots, out}, push, gx, gy);
}

void delta_rule(Recording& rec, KernelLibrary& lib, BufferRange qkv, BufferRange alpha, BufferRange beta,
                BufferRange dt_bias, BufferRange rate, BufferRange state, BufferRange slots, BufferRange out,
                const DeltaNetShape& s) {
  check_delta_net("delta_rule", s);
  struct {
    std::uint32_t tokens, k_heads, v_heads, dim;
    float eps;
  } push{s.tokens, s.k_heads, s.v_heads, s.head_dim, s.eps};
  rec.dispatch(kernel(lib, "delta_rule", 8, sizeof push, {s.head_dim}),
               {qkv, alpha, beta, dt_bias, rate, state, slots, out}, push, s.v_heads, s.sequences);
}

void gelu_mul(Recording& rec, KernelLibrary& lib, BufferRange gate, BufferRange up, BufferRange out, std::uint32_t n) {
  auto [gx, gy] = spread(ceil_div(n, 256));
  rec.dispatch(kernel(lib, "gelu_mul", 3, 4), {gate, up, out}, n, gx, gy);
}

namespace {
// out = f(x, value) elementwise: the shader's second input is not read (x bound again).
void unary(Recording& rec, KernelLibrary& lib, const char* shader, BufferRange x, BufferRange out, std::uint32_t n,
           float value) {
  struct {
    std::uint32_t n;
    float value;
  } push{n, value};
  auto [gx, gy] = spread(ceil_div(n, 256));
  rec.dispatch(kernel(lib, shader, 3, sizeof push), {x, x, out}, push, gx, gy);
}
}  // namespace

void scale(Recording& rec, KernelLibrary& lib, BufferRange x, BufferRange out, std::uint32_t n, float factor) {
  unary(rec, lib, "scale", x, out, n, factor);
}

void soft_cap(Recording& rec, KernelLibrary& lib, BufferRange x, BufferRange out, std::uint32_t n, float cap) {
  if (!(cap > 0)) throw GpuError(fmt::format("soft_cap: a cap of {}", cap));
  unary(rec, lib, "soft_cap", x, out, n, cap);
}

void silu_mul_f16(Recording& rec, KernelLibrary& lib, BufferRange gate, BufferRange up, BufferRange out16,
                  std::uint32_t rows, std::uint32_t padded_rows, std::uint32_t n) {
  check_padded_f16("silu_mul_f16", out16, rows, padded_rows, n);
  struct {
    std::uint32_t n, total;
  } push{rows * n, padded_rows * n};
  auto [gx, gy] = spread(ceil_div(push.total, 256));
  rec.dispatch(kernel(lib, "silu_mul_f16", 3, sizeof push), {gate, up, out16}, push, gx, gy);
}

void get_rows(Recording& rec, KernelLibrary& lib, WeightType type, BufferRange weights, BufferRange ids, BufferRange out,
              std::uint32_t k, std::uint32_t n_ids) {
  if (k % block_elements(type) != 0) (void)row_bytes(type, k);  // throws with the reason
  struct {
    std::uint32_t k, n_ids;
  } push{k, n_ids};
  if (n_ids > max_groups) throw GpuError(fmt::format("get_rows of {} ids: at most {} per dispatch", n_ids, max_groups));
  rec.dispatch(kernel(lib, fmt::format("get_rows_{}", weight_type_name(type)), 3, sizeof push), {weights, ids, out}, push,
               ceil_div(ceil_div(k, 4), 64), n_ids);
}

namespace {
struct RopePush {
  std::uint32_t head_dim, n_dims, heads, tokens;
  float mscale;
  std::uint32_t neox, kv_heads;
};
std::uint32_t rotary_dims(const RopeShape& s) { return s.rotary_dims == 0 ? s.head_dim : s.rotary_dims; }
void check_rope_frequencies(const RopeShape& s, BufferRange frequencies) {
  if (frequencies.size < std::uint64_t{rotary_dims(s) / 2} * 4) {
    throw GpuError(fmt::format("rope: {} bytes of frequencies for {} rotary dims", frequencies.size, rotary_dims(s)));
  }
}
RopePush rope_push(const RopeShape& s, std::uint32_t kv_heads) {
  const std::uint32_t dims = rotary_dims(s);
  if (s.head_dim % 2 != 0 || dims % 2 != 0 || dims > s.head_dim) {
    throw GpuError(fmt::format("rope needs even head_dim and rotary dims <= head_dim (got {} and {})", s.head_dim, dims));
  }
  return {s.head_dim, dims, s.heads, s.tokens, rope_magnitude(s), s.neox ? 1u : 0u, kv_heads};
}
}  // namespace

std::array<float, 2> rope_yarn_correction(const RopeShape& s) {
  if (s.yarn.ext_factor == 0.0f || s.yarn.original_context == 0) return {0.0f, 0.0f};  // no ramp
  const float dims = static_cast<float>(rotary_dims(s));
  const float context = static_cast<float>(s.yarn.original_context);
  // The pair that turns `turns` times over the original context.
  auto pair_of = [&](float turns) {
    return dims * std::log(context / (turns * 2.0f * std::numbers::pi_v<float>)) / (2.0f * std::log(s.freq_base));
  };
  return {std::max(0.0f, std::floor(pair_of(s.yarn.beta_fast))), std::min(dims - 1.0f, std::ceil(pair_of(s.yarn.beta_slow)))};
}

std::vector<float> rope_frequencies(const RopeShape& s) {
  const std::uint32_t dims = rotary_dims(s);
  if (!s.freq_factors.empty() && s.freq_factors.size() != dims / 2) {
    throw GpuError(fmt::format("rope: {} frequency factors for {} rotary dims", s.freq_factors.size(), dims));
  }
  const auto [low, high] = rope_yarn_correction(s);
  std::vector<float> freqs(dims / 2);
  for (std::uint32_t i = 0; i < freqs.size(); ++i) {
    const double extrapolated = std::pow(double{s.freq_base}, -2.0 * i / dims) / (s.freq_factors.empty() ? 1.0 : s.freq_factors[i]);
    const double ramp = 1.0 - std::clamp((static_cast<double>(i) - low) / std::max(0.001, double{high} - low), 0.0, 1.0);
    const double mix = ramp * s.yarn.ext_factor;  // 0 without YaRN: the scaled frequency alone
    freqs[i] = static_cast<float>(extrapolated * s.freq_scale * (1.0 - mix) + extrapolated * mix);
  }
  return freqs;
}

float rope_magnitude(const RopeShape& s) {
  return s.yarn.attn_factor * (s.yarn.ext_factor != 0.0f ? 1.0f + 0.1f * std::log(1.0f / s.freq_scale) : 1.0f);
}

void rope(Recording& rec, KernelLibrary& lib, BufferRange x, BufferRange positions, BufferRange frequencies,
          BufferRange out, const RopeShape& s) {
  const RopePush push = rope_push(s, 0);
  check_rope_frequencies(s, frequencies);
  auto [gy, gz] = spread(s.tokens * s.heads);
  // The plain kernel's push constants are the first six fields.
  rec.dispatch(kernel(lib, "rope", 4, sizeof push - 4), {x, positions, out, frequencies}, push,
               ceil_div(s.head_dim / 2, 64), gy, gz);
}

void rope_kv_write(Recording& rec, KernelLibrary& lib, BufferRange q, BufferRange k_new, BufferRange v_new,
                   BufferRange positions, BufferRange frequencies, BufferRange k_cache, BufferRange v_cache,
                   BufferRange slots, const RopeShape& s, std::uint32_t kv_heads, const QkvSlices& slices,
                   const QkNorms& norms) {
  const RopePush push = rope_push(s, kv_heads);
  check_rope_frequencies(s, frequencies);
  auto [gy, gz] = spread(s.tokens * (s.heads + kv_heads));
  const bool split = std::max({slices.q_splits, slices.k_splits, slices.v_splits}) > 1;
  if (norms.q.buffer != VK_NULL_HANDLE || norms.k.buffer != VK_NULL_HANDLE) {
    if (split || norms.q.buffer == VK_NULL_HANDLE || norms.k.buffer == VK_NULL_HANDLE) {
      throw GpuError("rope_kv_write: q and k norms come both or neither, and not with split products' slices");
    }
    if (std::min(norms.q.size, norms.k.size) < std::uint64_t{s.head_dim} * 4) {
      throw GpuError(fmt::format("rope_kv_write: q or k norm weights shorter than a head of {}", s.head_dim));
    }
    struct {
      RopePush rope;
      float eps;
    } push_norms{push, norms.eps};
    // One workgroup a row: its norm reads the whole head.
    rec.dispatch(kernel(lib, "rope_kv_write_qk_norm", 10, sizeof push_norms),
                 {q, positions, k_new, v_new, k_cache, v_cache, slots, frequencies, norms.q, norms.k}, push_norms, 1, gy,
                 gz);
    return;
  }
  const std::uint32_t gx = ceil_div(s.head_dim / 2, 64);
  if (!split) {
    rec.dispatch(kernel(lib, "rope_kv_write", 8, sizeof push),
                 {q, positions, k_new, v_new, k_cache, v_cache, slots, frequencies}, push, gx, gy, gz);
    return;
  }
  // Each split product's slices; an unsplit one's binding is its output, not read.
  auto parts = [&](BufferRange sliced, std::uint32_t splits, BufferRange out, std::uint32_t heads) {
    if (splits <= 1) return out;
    if (sliced.size < std::uint64_t{splits} * s.tokens * heads * s.head_dim * 4) {
      throw GpuError(fmt::format("rope_kv_write: fewer than {} slices of {} heads", splits, heads));
    }
    return sliced;
  };
  struct {
    RopePush rope;
    std::uint32_t q_splits, k_splits, v_splits;
  } push_splits{push, std::max(slices.q_splits, 1u), std::max(slices.k_splits, 1u), std::max(slices.v_splits, 1u)};
  rec.dispatch(kernel(lib, "rope_kv_write_splits", 11, sizeof push_splits),
               {q, positions, k_new, v_new, k_cache, v_cache, slots, frequencies, parts(slices.q, slices.q_splits, q, s.heads),
                parts(slices.k, slices.k_splits, k_new, kv_heads), parts(slices.v, slices.v_splits, v_new, kv_heads)},
               push_splits, gx, gy, gz);
}

std::string_view matmul_path_name(MatmulPath path) {
  switch (path) {
    case MatmulPath::automatic: return "automatic";
    case MatmulPath::vector: return "vector";
    case MatmulPath::tiled: return "tiled";
    case MatmulPath::cooperative: return "coopmat";
  }
  return "?";
}

MatmulPath choose_matmul_path(const DeviceFeatures& features, std::uint32_t n) {
  if (n <= matvec_max_cols) return MatmulPath::vector;
  return features.cooperative_matrix ? MatmulPath::cooperative : MatmulPath::tiled;
}

namespace {

// The staged kernel's workgroup shapes (in 16-column fragments; with 8-column tensor-core tiles TN
// doubles). The host picks by column count, the first of a list whose blocks of K per step divide
// K: up to 16 columns 128 x 16 tiles taking 4 blocks of K a step, up to 32 128 x 32 taking 4, up
// to 64 128 x 64 taking 2 (as 4 x 2 subgroups of 2 x 2 fragments for products of 8192 rows or
// more: gate and up, run side by side, fill the GPU with them), wider 128 x 128 taking 2. Each
// subgroup takes two 16-row fragments: every activation fragment it loads from shared memory then
// serves two products (one 16-row fragment each: the fragment loads, not the tensor cores, bound
// the multiply; H100, Q4_0, 32 columns: gate/up 151.7 -> 131.9 us, the output matrix 607 -> 514;
// bench/results/staged-rows-2026-11-26-h100.md). A step of K costs a workgroup about the same
// whatever its work, so fewer, deeper steps win (bench/results/staged-deep-2026-11-25-h100.md);
// where two stages do not fit in 48 KiB the kernel uses one. Each shape is its own module
// (shaders/CMakeLists.txt); the first eleven are built for both tensor-core tiles, the others are
// there for benchmarks to compare (the earlier choices among them).
constexpr StagedShape staged_shapes[] = {{4, 1, 2, 1, 4}, {4, 1, 2, 2, 4}, {4, 1, 2, 4, 2}, {4, 2, 2, 2, 2},
                                         {4, 2, 2, 4, 2}, {4, 1, 1, 1, 2}, {4, 1, 1, 2, 2}, {4, 1, 1, 1, 1},
                                         {4, 1, 1, 2, 1}, {4, 1, 1, 4, 1}, {4, 2, 2, 4, 1}, {4, 1, 1, 1, 8},
                                         {4, 1, 1, 2, 4}, {4, 1, 1, 4, 4}, {4, 1, 1, 4, 2}, {2, 2, 4, 4, 1},
                                         {4, 2, 2, 2, 1}, {2, 4, 4, 2, 1}, {4, 2, 2, 1, 2}, {8, 1, 1, 1, 4},
                                         {4, 1, 4, 2, 2}};
constexpr std::size_t staged_both_tiles = 11;
constexpr std::size_t for_16[] = {0, 5, 7}, for_32[] = {1, 6, 8}, for_64[] = {2, 9}, for_64_tall[] = {3, 9},
                      for_wide[] = {4, 10};
constexpr std::uint32_t tall_rows = 8192;

// Whether one of the first `count` shapes is s.
bool built_among(const StagedShape& s, std::size_t count) {
  return std::any_of(staged_shapes, staged_shapes + count, [&](const StagedShape& t) {
    return t.sg_m == s.sg_m && t.sg_n == s.sg_n && t.tm == s.tm && t.tn == s.tn && t.kb == s.kb;
  });
}

// The shape for an m x k product of n columns (every choice for n has the same column tile).
StagedShape staged_shape(std::uint32_t m, std::uint32_t n, std::uint32_t k, const KernelChoice& choice) {
  if (choice.staged_shape.sg_m != 0) return choice.staged_shape;
  using Choices = std::span<const std::size_t>;
  const Choices choices = n <= 16 ? Choices(for_16)
                          : n <= 32 ? Choices(for_32)
                          : n <= 64 ? (m >= tall_rows ? Choices(for_64_tall) : Choices(for_64))
                                    : Choices(for_wide);
  for (std::size_t i : choices) {
    if (k % (32 * staged_shapes[i].kb) == 0) return staged_shapes[i];
  }
  return staged_shapes[choices.back()];  // one block a step: K is whole blocks (narrow_matmul_applies)
}

std::uint32_t staged_columns(const StagedShape& s) { return s.sg_n * s.tn * 16; }

}  // namespace

std::uint32_t narrow_splits(const DeviceFeatures& features, std::uint32_t m, std::uint32_t k, std::uint32_t n,
                            const KernelChoice& choice) {
  if (!features.cooperative_matrix) return 1;
  const StagedShape s = staged_shape(m, n, k, choice);
  const std::uint32_t groups = ceil_div(m, 16 * s.sg_m * s.tm) * ceil_div(n, staged_columns(s));
  const std::uint32_t blocks = k / 32;
  // Decode batches whose grid would leave a large GPU (132 SMs on the H100) partly idle get enough
  // workgroups to fill it several times over, each with at least 16 blocks of K. Grids of 192
  // workgroups or more have enough work per workgroup to hide its loads (splitting them measured
  // slower: gate/up at 64 columns, 224 workgroups, in 3: 195 against 181 us). Wider products split
  // only grids of fewer workgroups than such a GPU has SMs: a prefill chunk of 512 tokens does not
  // gain (attn_out, 128 workgroups, in 4: 223 against 202 us), a step of one 128-token prompt and
  // some decodes does (the down product at 166 columns, 64 workgroups of 224 steps of K each, took
  // 413 us a layer against 107 at 64 columns).
  // Decode grids of at most 32 workgroups (the 128-row tiles of a 4,096-row product: the attention
  // output, the down projection) split in 4, one workgroup to an SM: in 8 or 16 (the rule above) the
  // workgroups share SMs (H100, Q4_0, 32 columns: down 69.4 -> 65.3 us, out 25.7 -> 24.3; 64: down
  // 96.3 -> 86.1; in 6, an uneven 192, 85.0 and 33.4; bench/results/staged-rows-2026-11-26-h100.md).
  if (choice.staged_splits == 0 && (n > 64 ? groups >= 128 : groups >= 192)) return 1;
  const std::uint32_t splits = choice.staged_splits != 0 ? choice.staged_splits
                               : n <= 64 && groups <= 32 ? 4
                                                         : ceil_div(512, groups);
  return std::clamp(splits, 1u, std::max(blocks / 16, 1u));
}

std::uint64_t narrow_split_bytes(const DeviceFeatures& features, std::uint32_t m, std::uint32_t k, std::uint32_t n,
                                 const KernelChoice& choice) {
  const std::uint32_t splits = narrow_splits(features, m, k, n, choice);
  return splits > 1 ? std::uint64_t{splits} * narrow_padded_columns(features, n, choice) * m * 4 : 0;
}

void sum_splits(Recording& rec, KernelLibrary& lib, BufferRange parts, BufferRange out, std::uint32_t count,
                std::uint32_t splits, bool accumulate) {
  struct {
    std::uint32_t count, splits, accumulate;
  } push{count, splits, accumulate ? 1u : 0u};
  auto [gx, gy] = spread(ceil_div(count, 256));
  rec.dispatch(kernel(lib, "sum_splits", 2, sizeof push), {parts, out}, push, gx, gy);
}

std::string staged_shape_problem(StagedShape s) {
  if (!built_among(s, std::size(staged_shapes))) {
    std::string built;
    for (const auto& t : staged_shapes) built += fmt::format(" {}x{}x{}x{}x{}", t.sg_m, t.sg_n, t.tm, t.tn, t.kb);
    return "no module is built for that shape; built:" + built;
  }
  return "";
}

std::string staged_module(WeightType type, const CooperativeMatrixShape& cm, StagedShape s, bool glu) {
  return fmt::format("mul_mm_staged_{}{}_{}x{}x{}_{}x{}x{}x{}x{}", glu ? "glu_" : "", weight_type_name(type), cm.m, cm.n,
                     cm.k, s.sg_m, s.sg_n, s.tm, s.tn, s.kb);
}

std::vector<std::string> staged_modules() {
  std::vector<std::string> names;
  for (WeightType type : {WeightType::f16, WeightType::q8_0, WeightType::q4_0}) {
    for (std::size_t i = 0; i < std::size(staged_shapes); ++i) {
      names.push_back(staged_module(type, {16, 16, 16}, staged_shapes[i]));
      if (i < staged_both_tiles) names.push_back(staged_module(type, {16, 8, 16}, staged_shapes[i]));
      if (i < staged_both_tiles && staged_shapes[i].tm == 2) {
        names.push_back(staged_module(type, {16, 16, 16}, staged_shapes[i], true));
        names.push_back(staged_module(type, {16, 8, 16}, staged_shapes[i], true));
      }
    }
  }
  // The other quantized types: the shapes picked up to unit_max_columns, 16x16x16 tiles.
  for (WeightType type : all_weight_types) {
    if (!quantized(type) || narrow_reads(type)) continue;
    for (auto list : {std::span<const std::size_t>(for_16), std::span<const std::size_t>(for_32),
                      std::span<const std::size_t>(for_64), std::span<const std::size_t>(for_64_tall)}) {
      for (std::size_t i : list) names.push_back(staged_module(type, {16, 16, 16}, staged_shapes[i]));
    }
  }
  return names;
}

bool narrow_reads(WeightType type) { return type == WeightType::f16 || type == WeightType::q8_0 || type == WeightType::q4_0; }

bool narrow_reads_at(const DeviceFeatures& features, WeightType type, std::uint32_t n) {
  if (narrow_reads(type)) return true;
  // The other quantized types' modules: 16x16x16 tiles, the shapes up to 64 columns (staged_modules).
  const auto& cm = features.cooperative_matrix;
  return quantized(type) && n <= unit_max_columns && cm && cm->n == 16;
}

bool narrow_matmul_applies(const DeviceFeatures& features, WeightType type, std::uint32_t m, std::uint32_t k) {
  const auto& cm = features.cooperative_matrix;
  if (!cm || cm->m != 16 || cm->k != 16 || (cm->n != 16 && cm->n != 8) || features.subgroup_size != 32) return false;
  if (k % 32 != 0 || m == 0) return false;
  switch (type) {
    case WeightType::f32:
    case WeightType::bf16: return false;
    case WeightType::q8_0:
    case WeightType::q4_0: return true;
    default: return m % 16 == 0;  // F16 tiles, read whole (F16 weights, or others dequantized to F16)
  }
}

bool narrow_matmul_preferred(const DeviceFeatures& features, WeightType type, std::uint32_t m, std::uint32_t k,
                             std::uint32_t n, const KernelChoice& choice) {
  if (n < narrow_min_columns || !narrow_matmul_applies(features, type, m, k)) return false;
  // Up to 8 columns the int8 mat-vec (its fixed-shape modules) beats the tensor cores on every
  // product (H100, Q4_0, 8 columns: gate/up 111 against 192 us, down 54 against 97 split, q/k/v 28
  // against 49, the attention output 26 against 34, the output matrix 461 against 748).
  const bool int8_wins = n <= matvec_max_cols && matvec_int8(features, type, choice);
  return !int8_wins;
}

std::uint32_t narrow_padded_columns(const DeviceFeatures& features, std::uint32_t n, const KernelChoice& choice) {
  if (!features.cooperative_matrix) return n;
  const std::uint32_t width = staged_columns(staged_shape(0, n, 64, choice));  // nor on m and k
  return ceil_div(std::max(n, 1u), width) * width;
}

namespace {

// The direct kernel's shapes, each built for 16, 32 and 64 columns (shaders/CMakeLists.txt); the
// first is the default.
constexpr DirectShape direct_shapes[] = {{2, 4, 4}, {1, 4, 4}, {2, 4, 2}, {1, 8, 4}, {2, 2, 4},
                                         {1, 4, 8}, {2, 4, 8}, {1, 8, 2}, {2, 8, 4}, {1, 8, 8}};

bool direct_built(const DirectShape& s, std::uint32_t columns) {
  return s.sg_k * s.tm * (columns / 8) * 512 <= 49152 &&
         std::any_of(std::begin(direct_shapes), std::end(direct_shapes),
                     [&](const DirectShape& t) { return t.tm == s.tm && t.sg_k == s.sg_k && t.depth == s.depth; });
}

// K slices for the direct kernel: enough subgroups to give each SM of a large GPU some 16 (the
// loads of one hide behind the others' products), each with at least 8 blocks, and never more
// than the staged kernel's rule, which sized the caller's scratch.
std::uint32_t direct_splits(const DeviceFeatures& features, const DirectShape& s, std::uint32_t m, std::uint32_t k,
                            std::uint32_t n, const KernelChoice& choice) {
  const std::uint32_t subgroups = ceil_div(m, 16 * s.tm) * s.sg_k;
  const std::uint32_t want = ceil_div(2048, subgroups), most = std::max(k / 32 / (8 * s.sg_k), 1u);
  return std::clamp(std::min(want, most), 1u, narrow_splits(features, m, k, n, choice));
}

}  // namespace

bool direct_matmul_applies(const KernelLibrary& lib, WeightType type, std::uint32_t m, std::uint32_t k, std::uint32_t n) {
  if (n <= 8 || n > 64 || !lib.direct_fragments().value_or(false)) return false;
  const auto& features = lib.device().features();
  if (!narrow_matmul_applies(features, type, m, k)) return false;
  return type == WeightType::q4_0 || type == WeightType::q8_0 || type == WeightType::f16;
}

std::string direct_shape_problem(DirectShape shape, std::uint32_t columns) {
  if (direct_built(shape, columns)) return "";
  std::string built;
  for (const auto& t : direct_shapes) built += fmt::format(" {}x{}x{}", t.tm, t.sg_k, t.depth);
  return fmt::format("no module is built for that shape at {} columns (TMxSG_KxDEPTH, where the sums fit in 48 KiB):{}",
                     columns, built);
}

DirectShape direct_shape(const KernelChoice& choice) {
  return choice.direct_shape.tm != 0 ? choice.direct_shape : direct_shapes[0];
}

std::string direct_module(WeightType type, DirectShape s, std::uint32_t n) {
  return fmt::format("mul_mm_direct_{}_{}x{}x{}x{}", weight_type_name(type), s.tm, s.sg_k, n / 8, s.depth);
}

std::vector<std::string> direct_modules() {
  std::vector<std::string> names;
  for (WeightType type : {WeightType::f16, WeightType::q8_0, WeightType::q4_0}) {
    for (const DirectShape& s : direct_shapes) {
      for (std::uint32_t columns : {16u, 32u, 64u}) {
        if (direct_built(s, columns)) names.push_back(direct_module(type, s, columns));
      }
    }
  }
  return names;
}

std::uint32_t matmul_narrow(Recording& rec, KernelLibrary& lib, WeightType type, BufferRange weights, BufferRange acts16,
                            BufferRange out, std::uint32_t m, std::uint32_t k, std::uint32_t n, bool accumulate,
                            BufferRange split_scratch, bool sum_later, const KernelChoice& choice) {
  const auto& features = lib.device().features();
  if (!narrow_reads_at(features, type, n) || !narrow_matmul_applies(features, type, m, k)) {
    throw GpuError(fmt::format("the narrow matmul does not take {} weights of {}x{} on {} (dequantize_f16 first)",
                               weight_type_name(type), m, k, features.name));
  }
  const std::uint32_t padded = narrow_padded_columns(features, n, choice);
  if (acts16.size < std::uint64_t{padded} * k * 2) {
    throw GpuError(fmt::format("the narrow matmul needs {} padded F16 activation rows", padded));
  }
  const auto& cm = *features.cooperative_matrix;
  struct {
    std::uint32_t m, k, n;
  } push{m, k, n};
  // The direct kernel for Q4_0 up to 16 columns: H100, generate --batch 16: 8.96 -> 7.90 ms a step.
  // At 32 and 64 columns it was slower (10.5 -> 11.9, 13.8 -> 15.6; with a shape for each product
  // at 32, 10.5 -> 11.0), and so were Q8_0 and F16 at 16 (11.65 -> 12.3-12.7, 9.5-9.7 -> 10.0-10.5):
  // bench/results/direct-matmul-2026-11-26-h100.md.
  const bool direct = choice.direct_use == DirectUse::always ||
                      (choice.direct_use == DirectUse::automatic && n <= direct_max_columns && type == WeightType::q4_0);
  // The module and grid of either kernel; K split over grid z where the scratch takes the partial
  // products, which are then summed into out.
  std::string module;
  std::uint32_t groups_x = 0, groups_y = 1, splits = 1;
  if (direct && direct_matmul_applies(lib, type, m, k, n)) {
    const std::uint32_t columns = padded;
    const DirectShape s = direct_shape(choice);
    if (!direct_built(s, columns)) {
      throw GpuError(
          fmt::format("the direct matmul shape {}x{}x{} is not built for {} columns", s.tm, s.sg_k, s.depth, columns));
    }
    module = direct_module(type, s, columns);
    groups_x = ceil_div(m, 16 * s.tm);
    splits = direct_splits(features, s, m, k, n, choice);
  } else {
    const StagedShape s = staged_shape(m, n, k, choice);
    if (choice.staged_shape.sg_m != 0) {
      if (auto problem = staged_shape_problem(s); !problem.empty()) throw GpuError("staged matmul shape: " + problem);
    }
    if (cm.n != 16 && !built_among(s, staged_both_tiles)) {
      throw GpuError(fmt::format("the staged matmul shape {}x{}x{}x{}x{} is built for 16x16x16 tiles only", s.sg_m,
                                 s.sg_n, s.tm, s.tn, s.kb));
    }
    if (k % (32 * s.kb) != 0) {
      throw GpuError(fmt::format("the staged matmul shape with {} blocks per stage needs K % {} == 0, not {}", s.kb,
                                 32 * s.kb, k));
    }
    module = staged_module(type, cm, s);
    groups_x = ceil_div(m, 16 * s.sg_m * s.tm);
    groups_y = ceil_div(n, staged_columns(s));
    splits = narrow_splits(features, m, k, n, choice);
  }
  const bool split = splits > 1 && split_scratch.size >= std::uint64_t{splits} * padded * m * 4;
  // Constant 0 (the workgroup size) and 1-4 (the shape) are fixed in the module; 5: accumulate.
  rec.dispatch(kernel(lib, module, 3, sizeof push, {0, 0, 0, 0, 0, accumulate && !split ? 1u : 0u}, 32),
               {weights, acts16, split ? split_scratch : out}, push, groups_x, groups_y, split ? splits : 1);
  if (split && !sum_later) sum_splits(rec, lib, split_scratch, out, m * n, splits, accumulate);
  return split ? splits : 1;
}

bool narrow_glu_applies(const DeviceFeatures& features, WeightType type, std::uint32_t m, std::uint32_t k,
                        std::uint32_t n, const KernelChoice& choice) {
  // From 17 columns (H100, Q4_0, ms a decode step, against gate and up side by side and
  // silu_mul_f16: 20 sequences 10.46 / 10.51 -> 10.35 / 10.38, 24: 10.69 / 10.66 -> 10.36 / 10.38,
  // 32: 10.37 / 10.33 -> 10.29 / 10.27, bench/results/batched-fusions-2026-11-27-h100.md; 64:
  // 14.88 / 14.90 -> 13.91 / 13.94, staged-rows-2026-11-26-h100.md). Up to 16 columns the direct
  // kernel takes gate and up.
  // Its modules read F16, Q8_0 and Q4_0 (the others' gate and up: through F16, or apart).
  if (n <= 16 || m == 0 || !narrow_reads(type) || !narrow_matmul_applies(features, type, 2 * m, k)) return false;
  const StagedShape s = staged_shape(2 * m, n, k, choice);
  // The GLU modules: the shapes built for both tensor-core tiles with two 16-row fragments a subgroup.
  return s.tm == 2 && built_among(s, staged_both_tiles) && k % (32 * s.kb) == 0;
}

void matmul_narrow_glu(Recording& rec, KernelLibrary& lib, WeightType type, BufferRange gate, BufferRange up,
                       BufferRange acts16, BufferRange out16, std::uint32_t m, std::uint32_t k, std::uint32_t n,
                       const KernelChoice& choice) {
  const auto& features = lib.device().features();
  if (!narrow_glu_applies(features, type, m, k, n, choice)) {
    throw GpuError(fmt::format("the narrow SwiGLU does not take {} weights of {}x{} at {} columns on {}",
                               weight_type_name(type), m, k, n, features.name));
  }
  const std::uint32_t padded = narrow_padded_columns(features, n, choice);
  if (acts16.size < std::uint64_t{padded} * k * 2 || out16.size < std::uint64_t{padded} * m * 2) {
    throw GpuError(fmt::format("the narrow SwiGLU needs {} padded F16 rows of input and of output", padded));
  }
  const StagedShape s = staged_shape(2 * m, n, k, choice);
  struct {
    std::uint32_t m, k, n;
  } push{m, k, padded};  // every padded column: its zero input makes the zero the down product reads
  rec.dispatch(kernel(lib, staged_module(type, *features.cooperative_matrix, s, true), 4, sizeof push, {0, 0, 0, 0, 0, 0}, 32),
               {gate, acts16, out16, up}, push, ceil_div(2 * m, 16 * s.sg_m * s.tm), ceil_div(padded, staged_columns(s)), 1);
}

bool narrow_dequantizes(const DeviceFeatures& features, WeightType type, std::uint32_t m, std::uint32_t k, std::uint32_t n) {
  // At 512 columns the F16 kernel is 25-40% faster than the Q4_0 and Q8_0 ones on the H100, which
  // pays for writing the F16 matrix once (bench/results/staged-matmul-2026-11-25-h100.md).
  // The others are read in place up to unit_max_columns only (decode batches: a step would write
  // the F16 matrix for a few columns; H100, Q4_K at 64 columns, see
  // bench/results/unit-types-staged-2026-11-28-h100.md).
  constexpr std::uint32_t min_columns = 512;
  if (type == WeightType::f16 || m % 16 != 0 || !narrow_matmul_applies(features, type, m, k)) return false;
  return !narrow_reads_at(features, type, n) || (narrow_reads(type) && n >= min_columns);
}

void dequantize_f16(Recording& rec, KernelLibrary& lib, WeightType type, BufferRange weights, BufferRange out16,
                    std::uint32_t m, std::uint32_t k) {
  if (!quantized(type) || k % block_elements(type) != 0) {
    throw GpuError(fmt::format("dequantize_f16 takes quantized rows of whole blocks, not {} with K {}",
                               weight_type_name(type), k));
  }
  if (out16.size < std::uint64_t{m} * k * 2) throw GpuError("dequantize_f16: the output is smaller than M x K F16");
  struct {
    std::uint32_t m, k;
  } push{m, k};
  // One invocation per half block of Q4_0 and Q8_0, per block of 32 weights of the others.
  const std::uint64_t invocations = std::uint64_t{m} * (narrow_reads(type) ? k / 16 : k / 32);
  auto [gx, gy] = spread(ceil_div(invocations, 256));
  rec.dispatch(kernel(lib, fmt::format("dequant_f16_{}", weight_type_name(type)), 2, sizeof push), {weights, out16}, push,
               gx, gy);
}

void to_f16(Recording& rec, KernelLibrary& lib, BufferRange in, BufferRange out, std::uint32_t rows, std::uint32_t n,
            std::uint32_t padded_rows) {
  struct {
    std::uint32_t count, total;
  } push{rows * n, padded_rows * n};
  auto [gx, gy] = spread(ceil_div(push.total, 256));
  rec.dispatch(kernel(lib, "to_f16", 2, sizeof push), {in, out}, push, gx, gy);
}

MatmulPath matmul(Recording& rec, KernelLibrary& lib, WeightType type, BufferRange weights, BufferRange acts, bool acts_f16,
                  BufferRange out, std::uint32_t m, std::uint32_t k, std::uint32_t n, MatmulPath path,
                  const KernelChoice& choice) {
  const auto& features = lib.device().features();
  if (path == MatmulPath::automatic) path = choose_matmul_path(features, n);
  if (k % block_elements(type) != 0) (void)row_bytes(type, k);
  struct {
    std::uint32_t m, k, n;
  } push{m, k, n};
  std::string suffix = fmt::format("{}_{}", weight_type_name(type), acts_f16 ? "b16" : "b32");
  switch (path) {
    case MatmulPath::vector: {
      if (n > matvec_max_cols) throw GpuError(fmt::format("the vector matmul takes at most {} columns, not {}", matvec_max_cols, n));
      if (matvec_blocks(type, k)) {
        dispatch_matvec_blocks(rec, lib, matvec_blocks_kernel(features, type, acts_f16 ? "b16" : "b32", choice), type,
                               false, {weights, acts, out}, push, false, choice);
        break;
      }
      auto [gx, gy] = spread(ceil_div(m, matvec_rows));
      rec.dispatch(kernel(lib, "mul_mat_vec_" + suffix, 3, sizeof push, {matvec_threads, matvec_rows}),
                   {weights, acts, out}, push, gx, gy);
      break;
    }
    case MatmulPath::tiled:
      rec.dispatch(kernel(lib, "mul_mm_" + suffix, 3, sizeof push, {256, tile_m, tile_n}), {weights, acts, out}, push,
                   ceil_div(m, tile_m), ceil_div(n, tile_n));
      break;
    case MatmulPath::cooperative: {
      if (!features.cooperative_matrix) {
        throw GpuError(features.name + " has no cooperative matrices (VK_NV_cooperative_matrix) for the coopmat matmul");
      }
      const auto& cm = *features.cooperative_matrix;
      rec.dispatch(kernel(lib, fmt::format("mul_mm_coopmat_{}_{}x{}x{}", suffix, cm.m, cm.n, cm.k), 3, sizeof push, {}, 32),
                   {weights, acts, out}, push, ceil_div(m, 64), ceil_div(n, 64));
      break;
    }
    case MatmulPath::automatic: break;
  }
  return path;
}

bool matvec_can_accumulate(WeightType type, std::uint32_t k, std::uint32_t n) {
  return n >= 1 && n <= matvec_max_cols && k % block_elements(type) == 0 && matvec_blocks(type, k);
}

namespace {
void record_matvec_accumulate(Recording& rec, KernelLibrary& lib, WeightType type, const std::string& acts_name,
                              std::initializer_list<BufferRange> buffers, std::uint32_t m, std::uint32_t k,
                              std::uint32_t n, const KernelChoice& choice) {
  if (!matvec_can_accumulate(type, k, n)) {
    throw GpuError(fmt::format("no accumulating mat-vec for {} with k {} and {} columns", weight_type_name(type), k, n));
  }
  dispatch_matvec_blocks(rec, lib, matvec_blocks_kernel(lib.device().features(), type, acts_name, choice), type,
                         false, buffers, MatvecPush{m, k, n}, true, choice);
}
}  // namespace

void matvec_accumulate(Recording& rec, KernelLibrary& lib, WeightType type, BufferRange weights, BufferRange acts,
                       bool acts_f16, BufferRange out, std::uint32_t m, std::uint32_t k, std::uint32_t n,
                       const KernelChoice& choice) {
  record_matvec_accumulate(rec, lib, type, acts_f16 ? "b16" : "b32", {weights, acts, out}, m, k, n, choice);
}

void matvec_accumulate_silu(Recording& rec, KernelLibrary& lib, WeightType type, BufferRange weights, BufferRange gate,
                            BufferRange up, BufferRange out, std::uint32_t m, std::uint32_t k, std::uint32_t n,
                            const KernelChoice& choice) {
  record_matvec_accumulate(rec, lib, type, "silu", {weights, gate, out, up}, m, k, n, choice);
}

void matvec_rms_norm(Recording& rec, KernelLibrary& lib, WeightType type, BufferRange weights, BufferRange x,
                     BufferRange norm_weight, float eps, BufferRange out, std::uint32_t m, std::uint32_t k,
                     std::uint32_t n, const KernelChoice& choice) {
  if (!matvec_can_accumulate(type, k, n) || k % 4 != 0) {
    throw GpuError(fmt::format("no normalising mat-vec for {} with k {} and {} columns", weight_type_name(type), k, n));
  }
  struct {
    std::uint32_t m, k, n;
    float eps;
  } push{m, k, n, eps};
  dispatch_matvec_blocks(rec, lib, matvec_blocks_kernel(lib.device().features(), type, "rmsnorm", choice), type,
                         false, {weights, x, out, norm_weight}, push, false, choice);
}

bool matvec_int8(const DeviceFeatures& features, WeightType type, const KernelChoice& choice) {
  const std::optional<bool> chosen = choice.matvec_int8;
  if (!features.integer_dot_product) return false;
  // By default for every quantized type: on the H100 int8 took Q4_0 decode from 213 to 244 tok/s
  // (its float kernel is bound by unpacking nibbles), and Q8_0 from 182 to 189 once the q/k/v
  // products wrote the KV cache themselves and the kernels had fixed shapes (170 before: the
  // quantizing dispatches cost it more than the dot products won); Q4_K's float kernel decoded at
  // 129 tok/s, the other types have no float one.
  return quantized(type) && chosen.value_or(true);
}

bool matvec_quantizes_in_place(WeightType type) { return type == WeightType::q4_0 || type == WeightType::q8_0; }

bool matvec_q8_applies(const DeviceFeatures& features, WeightType type, std::uint32_t k, std::uint32_t n,
                       const KernelChoice& choice) {
  return matvec_int8(features, type, choice) && n >= 1 && n <= matvec_max_cols && k % 32 == 0 &&
         k % block_elements(type) == 0;
}

std::uint64_t q8_acts_bytes(std::uint32_t k, std::uint32_t n) { return std::uint64_t{n} * k + std::uint64_t{n} * (k / 32) * 4; }

namespace {
// An int8 activation output (what q8_acts_bytes sizes) that holds n columns of k, or op's error.
void check_q8_output(std::string_view op, BufferRange out, std::uint32_t k, std::uint32_t n) {
  if (out.size < q8_acts_bytes(k, n)) throw GpuError(fmt::format("{}: the int8 output is smaller than q8_acts_bytes", op));
}

// groups_x: the workgroups a column (0: one per 2048 elements).
void record_quantize_q8(Recording& rec, KernelLibrary& lib, std::string_view variant,
                        std::initializer_list<BufferRange> buffers, const void* push, std::uint32_t push_bytes,
                        std::uint32_t k, std::uint32_t n, std::uint32_t groups_x = 0) {
  if (k % 32 != 0 || n == 0) throw GpuError(fmt::format("quantize_q8: K {} is not whole blocks of 32, or no columns", k));
  check_q8_output("quantize_q8", buffers.begin()[1], k, n);
  rec.dispatch(kernel(lib, std::string(variant), static_cast<std::uint32_t>(buffers.size()), push_bytes), buffers, push,
               groups_x != 0 ? groups_x : ceil_div(k, 2048), n);
}
}  // namespace

void quantize_q8(Recording& rec, KernelLibrary& lib, BufferRange x, BufferRange out, std::uint32_t k, std::uint32_t n) {
  record_quantize_q8(rec, lib, "quantize_q8", {x, out}, &k, sizeof k, k, n);
}

void quantize_q8_rms_norm(Recording& rec, KernelLibrary& lib, BufferRange x, BufferRange norm_weight, float eps,
                          BufferRange out, std::uint32_t k, std::uint32_t n) {
  struct {
    std::uint32_t k;
    float eps;
  } push{k, eps};
  record_quantize_q8(rec, lib, "quantize_q8_rmsnorm", {x, out, norm_weight}, &push, sizeof push, k, n);
}

// One workgroup a column: the x it adds to is read whole for the second norm.
void rms_norm_add_quantize_q8(Recording& rec, KernelLibrary& lib, BufferRange block, BufferRange post_weight,
                              BufferRange x, BufferRange norm_weight, float eps, BufferRange out, std::uint32_t k,
                              std::uint32_t n) {
  struct {
    std::uint32_t k;
    float eps;
  } push{k, eps};
  record_quantize_q8(rec, lib, "quantize_q8_post_norm", {block, out, norm_weight, x, post_weight}, &push, sizeof push, k,
                     n, 1);
}

void quantize_q8_silu(Recording& rec, KernelLibrary& lib, BufferRange gate, BufferRange up, BufferRange out,
                      std::uint32_t k, std::uint32_t n) {
  record_quantize_q8(rec, lib, "quantize_q8_silu", {gate, out, up}, &k, sizeof k, k, n);
}

void quantize_q8_gelu(Recording& rec, KernelLibrary& lib, BufferRange gate, BufferRange up, BufferRange out,
                      std::uint32_t k, std::uint32_t n) {
  record_quantize_q8(rec, lib, "quantize_q8_gelu", {gate, out, up}, &k, sizeof k, k, n);
}

namespace {
// Whether the int8 product has a module with its shape fixed at compile time for m x n (one per
// column count of the vector path, 4 rows: what matvec_shape gives quantized weights).
bool fixed_q8_module(WeightType type, std::uint32_t m, std::uint32_t k, std::uint32_t n, const KernelChoice& choice) {
  return n <= matvec_max_cols && matvec_shape(type, m, k, true, choice).rows == 4;
}
}  // namespace

void matvec_q8(Recording& rec, KernelLibrary& lib, WeightType type, BufferRange weights, BufferRange acts_q8,
               BufferRange out, std::uint32_t m, std::uint32_t k, std::uint32_t n, bool accumulate,
               const KernelChoice& choice) {
  if (!matvec_q8_applies(lib.device().features(), type, k, n, choice)) {
    throw GpuError(fmt::format("no int8 mat-vec for {} with k {} and {} columns on this device", weight_type_name(type), k, n));
  }
  // The module whose shape is fixed at compile time (every loop over rows and columns unrolled;
  // H100, Q4_0, 8 columns: gate/up 166 -> 111 us, 1 column: 31.3 -> 28.6); the one with the shape in
  // specialization constants for other shapes (choice.matvec_shape).
  if (fixed_q8_module(type, m, k, n, choice)) {
    dispatch_matvec_blocks(rec, lib, fmt::format("mul_mat_vec_blocks_{}_q8_c{}", weight_type_name(type), n), type,
                           matvec_q8_whole_blocks(type, n, true),
                           {weights, acts_q8, out}, MatvecPush{m, k, n}, accumulate, choice);
    return;
  }
  dispatch_matvec_blocks(rec, lib, fmt::format("mul_mat_vec_blocks_{}_q8", weight_type_name(type)), type,
                         matvec_q8_whole_blocks(type, n, false),
                         {weights, acts_q8, out}, MatvecPush{m, k, n}, accumulate, choice);
}

bool matvec_q8_heads_applies(const DeviceFeatures& features, WeightType type, std::uint32_t m, std::uint32_t k,
                             std::uint32_t n, const RopeShape& rope, const KernelChoice& choice) {
  const std::uint32_t dims = rotary_dims(rope);
  // The module's 4 rows hold whole pairs (2i, 2i + 1) of one head when head_dim is even.
  return matvec_q8_applies(features, type, k, n, choice) && fixed_q8_module(type, m, k, n, choice) &&
         !rope.neox && rope.head_dim % 2 == 0 && dims % 2 == 0 && dims <= rope.head_dim && m % rope.head_dim == 0;
}

void matvec_q8_heads(Recording& rec, KernelLibrary& lib, WeightType type, BufferRange weights, BufferRange acts_q8,
                     BufferRange out, BufferRange positions, BufferRange slots, BufferRange frequencies,
                     const RopeShape& rope, HeadsOutput what, std::uint32_t m, std::uint32_t k, std::uint32_t n,
                     const KernelChoice& choice) {
  if (!matvec_q8_heads_applies(lib.device().features(), type, m, k, n, rope, choice)) {
    throw GpuError(fmt::format("no int8 mat-vec writing heads for {} of {}x{}, {} columns, head_dim {}{}",
                               weight_type_name(type), m, k, n, rope.head_dim, rope.neox ? " (NeoX rope)" : ""));
  }
  check_rope_frequencies(rope, frequencies);
  struct {
    std::uint32_t m, k, n, head_dim, n_dims;
    float mscale;
    std::uint32_t mode;
  } push{m, k, n, rope.head_dim, rotary_dims(rope), rope_magnitude(rope), static_cast<std::uint32_t>(what)};
  dispatch_matvec_blocks(rec, lib, fmt::format("mul_mat_vec_blocks_{}_q8_rope_c{}", weight_type_name(type), n), type,
                         matvec_q8_whole_blocks(type, n, true),
                         {weights, acts_q8, out, positions, slots, frequencies}, push, false, choice);
}

void kv_write(Recording& rec, KernelLibrary& lib, BufferRange k_new, BufferRange v_new, BufferRange k_cache,
              BufferRange v_cache, BufferRange slots, std::uint32_t tokens, std::uint32_t row) {
  struct {
    std::uint32_t row, tokens;
  } push{row, tokens};
  if (tokens > max_groups) throw GpuError(fmt::format("kv_write of {} tokens: at most {} per dispatch", tokens, max_groups));
  rec.dispatch(kernel(lib, "kv_write", 5, sizeof push), {k_new, v_new, k_cache, v_cache, slots}, push, ceil_div(row, 256),
               tokens);
}

namespace {

constexpr std::uint32_t attention_tile = 32;             // keys per tile of attention_split.comp
// The split kernel wins at every batch size measured on the H100 (3.2x the one-pass kernel at a
// 512-token prefill, 4.8x at one decode token); the one-pass kernel stays for head dims that are
// not a multiple of 16 and for explicit requests.
constexpr std::uint32_t attention_split_max_tokens = 1u << 20;
constexpr std::uint32_t attention_target_groups = 512;   // enough to fill 132 SMs a few times
constexpr std::uint32_t attention_max_splits = 64;

void check_attention_shape(const AttentionShape& s) {
  if (s.head_dim == 0 || s.head_dim > attention_max_head_dim) {
    throw GpuError(fmt::format("attention head_dim {} (supported: 1 to {})", s.head_dim, attention_max_head_dim));
  }
  if (s.kv_heads == 0 || s.heads % s.kv_heads != 0) {
    throw GpuError(fmt::format("attention: {} query heads are not a multiple of {} KV heads", s.heads, s.kv_heads));
  }
}

// Query heads per workgroup of the split path: the largest divisor of a KV head's group up to 8,
// halved where that is 8 (or the shape's head_group). Groups of 8 (qwen3moe-30b-a3b's 32 heads over
// 4) in workgroups of 4: the H200's decode attention at 600 keys 12.5 -> 10.0 us (bench kernels
// --experts-only).
std::uint32_t attention_head_group(const AttentionShape& s) {
  std::uint32_t group = s.heads / s.kv_heads, hg = std::min(group, 8u);
  if (s.head_group != 0) {
    if (s.head_group > 8 || group % s.head_group != 0) {
      throw GpuError(fmt::format("attention: {} query heads a workgroup do not divide a group of {} (at most 8)",
                                 s.head_group, group));
    }
    return s.head_group;
  }
  while (group % hg != 0) --hg;
  return hg == 8 ? 4 : hg;
}

}  // namespace

AttentionPlan plan_attention(const AttentionShape& s) {
  check_attention_shape(s);
  // The split kernel gives each key four or eight threads of vec4 chunks: head dims that are
  // multiples of 16 (attention_tile.glsl).
  const bool split_fits = s.head_dim % 16 == 0;
  if (s.path == AttentionPath::split && !split_fits) {
    throw GpuError(fmt::format("split attention takes head dims that are multiples of 16, not {}", s.head_dim));
  }
  bool split = s.path == AttentionPath::split || (s.path == AttentionPath::automatic &&
                                                  s.tokens <= attention_split_max_tokens && split_fits);
  if (!split) return {AttentionPath::one_pass, 1};
  if (s.splits != 0) return {AttentionPath::split, s.splits};
  std::uint32_t groups = std::max(1u, s.heads / attention_head_group(s) * s.tokens);
  std::uint64_t keys = s.max_context != 0 ? s.max_context : std::uint64_t{s.page_size} * s.max_pages;
  if (s.window != 0) keys = std::min<std::uint64_t>(keys, s.window);
  std::uint32_t by_keys = std::max(1u, ceil_div(keys, attention_tile));
  return {AttentionPath::split,
          std::clamp(ceil_div(attention_target_groups, groups), 1u, std::min(attention_max_splits, by_keys))};
}

std::uint64_t attention_scratch_bytes(const AttentionShape& s) {
  auto plan = plan_attention(s);
  if (plan.splits == 1) return 16;
  return std::uint64_t{s.tokens} * s.heads * plan.splits * (s.head_dim + 2) * 4;
}

bool attention(Recording& rec, KernelLibrary& lib, BufferRange q, BufferRange k_cache, BufferRange v_cache,
               BufferRange block_tables, BufferRange token_seq_pos, BufferRange scratch, BufferRange out,
               const AttentionShape& s, const AttentionMerged& merged) {
  auto plan = plan_attention(s);
  if (plan.path == AttentionPath::one_pass) {
    struct {
      std::uint32_t heads, kv_heads, page_size, max_pages, tokens;
      float scale;
    } push{s.heads, s.kv_heads, s.page_size, s.max_pages, s.tokens, s.scale};
    rec.dispatch(kernel(lib, "attention", 6, sizeof push, {s.head_dim, s.window, std::bit_cast<std::uint32_t>(s.softcap)}),
                 {q, k_cache, v_cache, block_tables, token_seq_pos, out}, push, s.heads, s.tokens);
    return false;
  }
  if (s.tokens > max_groups || plan.splits > max_groups) {
    throw GpuError(
        fmt::format("split attention of {} tokens in {} splits: at most {} of each", s.tokens, plan.splits, max_groups));
  }
  if (scratch.size < attention_scratch_bytes(s)) {
    throw GpuError(fmt::format("attention scratch of {} bytes, {} needed", scratch.size, attention_scratch_bytes(s)));
  }
  struct {
    std::uint32_t heads, kv_heads, page_size, max_pages, tokens;
    float scale;
    std::uint32_t splits;
  } push{s.heads, s.kv_heads, s.page_size, s.max_pages, s.tokens, s.scale, plan.splits};
  std::uint32_t hg = attention_head_group(s);
  // One split writes the output itself: F16 where asked (and no int8 output is).
  const bool f16_here = plan.splits == 1 && merged.q8.buffer == VK_NULL_HANDLE && merged.f16.buffer != VK_NULL_HANDLE;
  if (f16_here) check_padded_f16("attention", merged.f16, s.tokens, merged.padded_rows, s.heads * s.head_dim);
  rec.dispatch(kernel(lib, f16_here ? "attention_split_f16" : "attention_split", 7, sizeof push,
                      {s.head_dim, hg, s.window, std::bit_cast<std::uint32_t>(s.softcap)}),
               {q, k_cache, v_cache, block_tables, token_seq_pos, f16_here ? merged.f16 : out, scratch}, push,
               s.heads / hg, f16_here ? merged.padded_rows : s.tokens, plan.splits);
  if (plan.splits == 1) return f16_here;
  struct {
    std::uint32_t heads, tokens, splits;
  } combine{s.heads, s.tokens, plan.splits};
  // A head holds whole blocks of 32 for the int8 output.
  const bool q8 = merged.q8.buffer != VK_NULL_HANDLE && s.head_dim % 32 == 0;
  const bool f16 = !q8 && merged.f16.buffer != VK_NULL_HANDLE;
  if (q8) check_q8_output("attention", merged.q8, s.heads * s.head_dim, s.tokens);
  if (f16) check_padded_f16("attention", merged.f16, s.tokens, merged.padded_rows, s.heads * s.head_dim);
  const char* module = q8 ? "attention_combine_q8" : f16 ? "attention_combine_f16" : "attention_combine";
  rec.dispatch(kernel(lib, module, 2, sizeof combine, {s.head_dim}), {scratch, q8 ? merged.q8 : f16 ? merged.f16 : out},
               combine, s.heads, f16 ? merged.padded_rows : s.tokens);
  return q8 || f16;
}

namespace {
// Pass 1 of argmax: chunks of at least 2048 elements (8 a thread), at most 256 a row.
struct ArgmaxSplit {
  std::uint32_t chunk, groups;
};
ArgmaxSplit argmax_split(std::uint32_t n) {
  const std::uint32_t chunk = std::max(2048u, ceil_div(ceil_div(n, 256), 256) * 256);
  return {chunk, ceil_div(n, chunk)};
}
}  // namespace

std::uint64_t argmax_scratch_bytes(std::uint32_t rows, std::uint32_t n) {
  return std::uint64_t{rows} * argmax_split(n).groups * 8;
}

void argmax(Recording& rec, KernelLibrary& lib, BufferRange x, BufferRange scratch, BufferRange out, std::uint32_t rows,
            std::uint32_t n) {
  if (rows == 0 || n == 0) throw GpuError("argmax: no rows or an empty row");
  if (rows > max_groups) throw GpuError(fmt::format("argmax: {} rows, at most {} at once", rows, max_groups));
  if (scratch.size < argmax_scratch_bytes(rows, n)) {
    throw GpuError("argmax: the scratch is smaller than argmax_scratch_bytes");
  }
  const ArgmaxSplit split = argmax_split(n);
  struct {
    std::uint32_t n, rows, chunk, groups;
  } push{n, rows, split.chunk, split.groups};
  rec.dispatch(kernel(lib, "argmax", 2, sizeof push), {x, scratch}, push, split.groups, rows);
  auto [gx, gy] = spread(rows);
  rec.dispatch(kernel(lib, "argmax_merge", 2, sizeof push), {scratch, out}, push, gx, gy);
}

namespace {

// Candidates per row after each round but the last.
std::vector<std::uint32_t> topk_rounds(std::uint32_t n, std::uint32_t k) {
  std::vector<std::uint32_t> sizes;
  while (n > topk_chunk) {
    n = ceil_div(n, topk_chunk) * k;
    sizes.push_back(n);
  }
  return sizes;
}

std::uint64_t align256(std::uint64_t n) { return (n + 255) / 256 * 256; }

}  // namespace

std::uint64_t topk_scratch_bytes(std::uint32_t rows, std::uint32_t n, std::uint32_t k) {
  auto rounds = topk_rounds(n, k);
  std::uint64_t largest = rounds.empty() ? 0 : *std::max_element(rounds.begin(), rounds.end());
  return 4 * align256(std::uint64_t{rows} * largest * 4) + 256;
}

void topk(Recording& rec, KernelLibrary& lib, BufferRange x, BufferRange scratch, BufferRange out_values,
          BufferRange out_indices, std::uint32_t rows, std::uint32_t n, std::uint32_t k) {
  if (k == 0 || k > 256 || k > n) throw GpuError(fmt::format("top-k with k = {} of {} (1 <= k <= min(n, 256))", k, n));
  if (rows > max_groups) throw GpuError(fmt::format("top-k over {} rows: at most {} per dispatch", rows, max_groups));
  auto rounds = topk_rounds(n, k);
  std::uint64_t area = rounds.empty() ? 0 : align256(std::uint64_t{rows} * *std::max_element(rounds.begin(), rounds.end()) * 4);
  if (scratch.size < topk_scratch_bytes(rows, n, k) - 256 && !rounds.empty()) {
    throw GpuError(fmt::format("top-k scratch of {} bytes, {} needed", scratch.size, topk_scratch_bytes(rows, n, k)));
  }
  auto part = [&](int i) { return BufferRange{scratch.buffer, scratch.offset + i * area, area}; };
  const auto& topk_kernel = kernel(lib, "topk", 4, 16);
  BufferRange in_v = x, in_i = x;
  std::uint32_t has_indices = 0, size = n;
  for (std::size_t r = 0; r <= rounds.size(); ++r) {
    bool last = r == rounds.size();
    BufferRange o_v = last ? out_values : part(2 * static_cast<int>(r % 2));
    BufferRange o_i = last ? out_indices : part(2 * static_cast<int>(r % 2) + 1);
    struct {
      std::uint32_t n, rows, k, has_indices;
    } push{size, rows, k, has_indices};
    rec.dispatch(topk_kernel, {in_v, in_i, o_v, o_i}, push, ceil_div(size, topk_chunk), rows);
    if (!last) {
      in_v = o_v;
      in_i = o_i;
      has_indices = 1;
      size = rounds[r];
    }
  }
}

namespace {
// sampling.glsl's CHUNK, BINS, CAP, PART_WORDS, SEL_WORDS and row_words().
constexpr std::uint32_t sample_chunk = 4096, sample_bins = 2048, sample_cap = 2048, sample_part_words = 6,
                        sample_sel_words = 16;
std::uint32_t sample_groups(std::uint32_t stride) { return ceil_div(stride, sample_chunk); }
}  // namespace

std::uint64_t sample_scratch_bytes(std::uint32_t rows, std::uint32_t stride) {
  const std::uint64_t words =
      (sample_part_words + 2ull) * sample_groups(stride) + sample_bins + sample_sel_words + 4ull * sample_cap + 2ull * sample_bins;
  return std::uint64_t{rows} * words * 4;
}

SampleNeeds sample_needs(std::span<const SampleRow> rows) {
  SampleNeeds needs{false, false, false};
  for (const SampleRow& r : rows) {
    const bool sampled = r.temperature > 0.0f;
    const bool top_logprobs = (r.flags & sample_flag_logprobs) != 0 && (r.flags & 0xFFu) != 0;
    const bool filtered = sampled && ((r.top_k > 0 && r.top_k < r.n) || r.top_p < 1.0f);
    needs.candidates = needs.candidates || filtered || top_logprobs;
    // Without top-k, top-p or min-p a row draws from STATS' sums; with them, a draw that reaches
    // past the candidates needs the whole-row pass.
    needs.draws = needs.draws || filtered || (sampled && r.min_p_offset > -std::numeric_limits<float>::infinity());
    needs.prepare = needs.prepare || r.entries_count > 0 || (r.flags & sample_flag_pending) != 0;
  }
  return needs;
}

void sample(Recording& rec, KernelLibrary& lib, const SampleBuffers& b, std::uint32_t rows, std::uint32_t stride,
            const SampleNeeds& needs, const std::function<void(const char*)>& after_pass) {
  if (rows == 0 || stride == 0) throw GpuError("sample: no rows or an empty row");
  if (rows > max_groups) throw GpuError(fmt::format("sample: {} rows, at most {} at once", rows, max_groups));
  if (b.scratch.size < sample_scratch_bytes(rows, stride) || b.out.size < std::uint64_t{rows} * sample_out_words * 4 ||
      b.ids.size < std::uint64_t{rows} * 4 || b.rows.size < std::uint64_t{rows} * sizeof(SampleRow) ||
      b.logits.size < std::uint64_t{rows} * stride * 4 || b.arrivals.size < std::uint64_t{rows} * sample_arrival_words * 4) {
    throw GpuError("sample: a buffer is smaller than the rows need");
  }
  const std::uint32_t groups = sample_groups(stride);
  struct {
    std::uint32_t rows, stride, groups, unused;
  } push{rows, stride, groups, 0};
  const std::initializer_list<BufferRange> buffers{b.logits,  b.rows, b.entries, b.mask,    b.prev_ids,
                                                   b.scratch, b.out,  b.ids,     b.arrivals};
  auto [gx, gy] = spread(rows);
  // Sums of weights in double where the device has it: a draw then lands where the CPU sampler's
  // (double) lands but within ~1e-12 of a boundary, rather than ~1e-6 over a long kept set.
  const char* sums = lib.device().features().float64 ? "_f64" : "";
  auto pass = [&](const char* name, bool per_chunk) {
    rec.dispatch(kernel(lib, std::string(name) + sums, 9, sizeof push), buffers, push, per_chunk ? groups : gx,
                 per_chunk ? rows : gy);
    if (after_pass) after_pass(name);
  };
  if (needs.prepare) pass("sample_prepare", false);
  pass("sample_stats", true);
  if (needs.candidates) {
    pass("sample_bins", true);
    pass("sample_gather", true);
  }
  if (needs.draws) pass("sample_draw", true);
}

void copy(Recording& rec, KernelLibrary& lib, BufferRange src, BufferRange dst, std::uint64_t bytes) {
  if (bytes % 16 != 0) throw GpuError("the copy kernel moves whole 16-byte words");
  auto words = static_cast<std::uint32_t>(bytes / 16);
  rec.dispatch(kernel(lib, "copy", 2, 4), {src, dst}, words, std::min(ceil_div(words, 256), 8192u));
}

void copy_gather(Recording& rec, KernelLibrary& lib, BufferRange src, BufferRange dst, BufferRange index,
                 std::uint64_t chunk_bytes, std::uint32_t count, std::uint64_t base, std::uint64_t stride) {
  if (chunk_bytes % 16 != 0 || base % 16 != 0 || stride % 16 != 0) {
    throw GpuError("the gather kernel moves whole 16-byte words");
  }
  if (count == 0) return;
  const std::uint64_t words_end = (base + std::uint64_t{count - 1} * stride + chunk_bytes) / 16;
  // The caller checks the indices against src (they are on the GPU by now).
  if (words_end > dst.size / 16 || words_end > std::numeric_limits<std::uint32_t>::max() ||
      src.size / 16 > std::numeric_limits<std::uint32_t>::max() || index.size < std::uint64_t{count} * 4) {
    throw GpuError(fmt::format("a gather of {} chunks of {} bytes does not fit its buffers", count, chunk_bytes));
  }
  struct {
    std::uint32_t chunk, count, base, stride;
  } push{static_cast<std::uint32_t>(chunk_bytes / 16), count, static_cast<std::uint32_t>(base / 16),
         static_cast<std::uint32_t>(stride / 16)};
  auto [gx, gy] = spread(count);
  rec.dispatch(kernel(lib, "copy_gather", 3, sizeof push), {src, dst, index}, push, gx, gy);
}

bool router_logits_applies(WeightType type, std::uint32_t n_expert, std::uint32_t k) {
  const bool float_type = type == WeightType::f32 || type == WeightType::f16 || type == WeightType::bf16;
  return float_type && n_expert > 0 && n_expert <= 256 && k > 0 && k % 4 == 0;
}

void router_logits(Recording& rec, KernelLibrary& lib, WeightType type, BufferRange w, BufferRange x, BufferRange logits,
                   std::uint32_t n_expert, std::uint32_t k, std::uint32_t rows) {
  if (!router_logits_applies(type, n_expert, k)) {
    throw GpuError(fmt::format("router_logits: {} weights of {} x {} (F32, F16 or BF16, at most 256 rows, K a "
                               "multiple of 4; ops::matmul takes the others)",
                               weight_type_name(type), n_expert, k));
  }
  struct {
    std::uint32_t n_expert, k, rows;
  } push{n_expert, k, rows};
  auto [gx, gy] = spread(ceil_div(rows, 4));  // router.comp's TOKENS rows a workgroup
  rec.dispatch(kernel(lib, fmt::format("router_{}", weight_type_name(type)), 3, sizeof push), {w, x, logits}, push,
               gx, gy);
}

void moe_route(Recording& rec, KernelLibrary& lib, BufferRange logits, BufferRange experts, BufferRange weights,
               std::uint32_t rows, std::uint32_t n_expert, std::uint32_t used) {
  if (used == 0 || used > n_expert || used > 64 || n_expert > 1024) {
    throw GpuError(fmt::format("moe_route: {} experts of {} a row (at most 64 of 1024)", used, n_expert));
  }
  struct {
    std::uint32_t n_expert, used, rows;
  } push{n_expert, used, rows};
  auto [gx, gy] = spread(rows);  // a workgroup a row
  rec.dispatch(kernel(lib, "moe_route", 3, sizeof push), {logits, experts, weights}, push, gx, gy);
}

bool experts_read_q8(WeightType type) { return quantized(type); }

namespace {
// What both expert products check: whole blocks of K, int8 activations only where taken.
void check_experts(WeightType type, const ExpertProduct& s) {
  if (s.k % block_elements(type) != 0) (void)row_bytes(type, s.k);  // throws with the reason
  if (s.acts_q8 != experts_read_q8(type)) {
    throw GpuError(fmt::format("expert products: {} weights take {} activations", weight_type_name(type),
                               experts_read_q8(type) ? "int8 (quantize_q8's)" : "F32"));
  }
}

// Records `module` over `groups` workgroup rows (y) of m / rows_per_group columns (x), at most
// max_groups rows a dispatch, each dispatch's first row in the push constants' fifth word; the
// router's width (ROUTED) and the pairs (GLU's output columns) after the sixth, for the modules of
// mul_mat_vec_experts.comp (experts_push_bytes; mul_mat_id.comp takes the first six words).
constexpr std::uint32_t experts_push_bytes = 32;
void dispatch_experts(Recording& rec, const Kernel& module, std::initializer_list<BufferRange> buffers,
                      const ExpertProduct& s, std::uint32_t rows_per_group, std::uint32_t groups,
                      std::uint32_t n_expert = 0) {
  const std::uint32_t pairs = s.rows * s.used, cols = s.acts_per_pair ? pairs : s.rows;
  for (std::uint32_t first = 0; first < groups; first += max_groups) {
    struct {
      std::uint32_t m, k, used, per_pair, first, cols, n_expert, pairs;
    } push{s.m, s.k, s.used, s.acts_per_pair ? 1u : 0u, first, cols, n_expert, pairs};
    rec.dispatch(module, buffers, push, ceil_div(s.m, rows_per_group), std::min(groups - first, max_groups));
  }
}

std::string experts_module(std::string_view shader, WeightType type, bool acts_q8) {
  return fmt::format("{}_{}{}", shader, weight_type_name(type), acts_q8 ? "_q8" : "");
}
}  // namespace

bool experts_int8(const DeviceFeatures& features, WeightType type) {
  return quantized(type) && features.integer_dot_product;
}

namespace {
// mul_mat_vec_experts.comp's threads a row for `items` blocks of 32 (a row's blocks, for every slot
// with the sum): about four items a thread, 4 to 32 of them (128 / lanes rows a workgroup). H200,
// qwen3moe-30b-a3b: gate and up (K 2048) 16, down with the sum (8 x 24 blocks) 32.
std::uint32_t experts_lanes(std::uint32_t items) {
  std::uint32_t lanes = 4;
  while (lanes < 32 && lanes * 4 < items) lanes *= 2;
  return lanes;
}

void check_experts_int8(const DeviceFeatures& features, WeightType type) {
  if (!experts_int8(features, type)) {
    throw GpuError(fmt::format("no int8 expert product for {} weights on this device", weight_type_name(type)));
  }
}
}  // namespace

void matvec_experts_sum(Recording& rec, KernelLibrary& lib, WeightType type, BufferRange weights, BufferRange acts_q8,
                        BufferRange experts, BufferRange expert_weights, BufferRange x, const ExpertProduct& s) {
  check_experts(type, s);
  check_experts_int8(lib.device().features(), type);
  if (!s.acts_per_pair) throw GpuError("matvec_experts_sum: the down product reads each pair's own activations");
  const std::uint32_t lanes = experts_lanes(s.used * (s.k / 32));
  dispatch_experts(rec, kernel(lib, experts_module("mul_mat_vec_experts_sum", type, false), 5, experts_push_bytes, {lanes}),
                   {weights, acts_q8, x, experts, expert_weights}, s, 128 / lanes, s.rows);
}

bool experts_glu_applies(const DeviceFeatures& features, WeightType gate, WeightType up, std::uint32_t m) {
  return gate == up && experts_int8(features, gate) && m % 32 == 0;
}

// 32 rows a workgroup (one int8 block of the output), in 32 * lanes threads.
void matvec_experts_glu(Recording& rec, KernelLibrary& lib, WeightType type, BufferRange gate, BufferRange up,
                        BufferRange acts_q8, const ExpertRoute& route, BufferRange out_q8, const ExpertProduct& s) {
  check_experts(type, s);
  if (!experts_glu_applies(lib.device().features(), type, type, s.m) || s.acts_per_pair) {
    throw GpuError(fmt::format("matvec_experts_glu: {} experts of {} rows on this device (int8 products, rows a "
                               "multiple of 32, each token's activations)",
                               weight_type_name(type), s.m));
  }
  const bool ranked = route.n_expert != 0;
  if (ranked && (route.n_expert > 1024 || s.used > 64 || s.used > route.n_expert)) {
    throw GpuError(fmt::format("matvec_experts_glu: {} experts of {} ranked a token (at most 64 of 1024)", s.used,
                               route.n_expert));
  }
  check_q8_output("matvec_experts_glu", out_q8, s.m, s.rows * s.used);
  const std::uint32_t lanes = experts_lanes(s.k / 32);
  // Unranked, the ids stand in for the outputs it then does not write.
  const BufferRange picks = ranked ? route.weights : route.experts;
  dispatch_experts(rec,
                   kernel(lib, experts_module("mul_mat_vec_experts_glu", type, false), 7, experts_push_bytes,
                          {lanes, ranked ? 1u : 0u, 32 * lanes}),
                   {gate, acts_q8, out_q8, ranked ? route.logits : route.experts, up, route.experts, picks}, s, 32,
                   s.rows * s.used, route.n_expert);
}

void matvec_experts(Recording& rec, KernelLibrary& lib, WeightType type, BufferRange weights, BufferRange acts,
                    BufferRange experts, BufferRange out, const ExpertProduct& s) {
  check_experts(type, s);
  if (experts_int8(lib.device().features(), type)) {
    const std::uint32_t lanes = experts_lanes(s.k / 32);
    dispatch_experts(rec, kernel(lib, experts_module("mul_mat_vec_experts", type, false), 4, experts_push_bytes, {lanes}),
                     {weights, acts, out, experts}, s, 128 / lanes, s.rows * s.used);
    return;
  }
  constexpr std::uint32_t kRows = 4;  // mul_mat_id.comp's ROWS
  dispatch_experts(rec, kernel(lib, experts_module("mul_mat_id", type, s.acts_q8), 4, 24), {weights, acts, experts, out},
                   s, kRows, s.rows * s.used);
}

namespace {
// moe_sort's chunks of pairs (a workgroup each, counting and scattering), and where in the tiles
// buffer each chunk's counts of pairs an expert go: past the most tiles there can be.
constexpr std::uint32_t sort_chunk = 256;
std::uint64_t sort_counts_at(std::uint32_t pairs, std::uint32_t n_expert) {
  return (std::uint64_t{ceil_div(pairs, experts_tile_pairs)} + n_expert + 1) * 16;
}
}  // namespace

std::uint64_t moe_tiles_bytes(std::uint32_t pairs, std::uint32_t n_expert) {
  return sort_counts_at(pairs, n_expert) + std::uint64_t{ceil_div(pairs, sort_chunk)} * n_expert * 4;
}

void moe_sort(Recording& rec, KernelLibrary& lib, BufferRange experts, BufferRange order, BufferRange tiles,
              std::uint32_t pairs, std::uint32_t n_expert, std::uint32_t tile) {
  if (n_expert > 1024) throw GpuError(fmt::format("moe_sort: {} experts, at most 1024", n_expert));
  if (tile < experts_tile_pairs) {
    throw GpuError(fmt::format("moe_sort: tiles of {} pairs, at least {}", tile, experts_tile_pairs));
  }
  if (tiles.size < moe_tiles_bytes(pairs, n_expert)) {
    throw GpuError(fmt::format("moe_sort: the tiles buffer holds fewer than moe_tiles_bytes({}, {})", pairs, n_expert));
  }
  // Counts a chunk, their prefix sums and the tiles (one workgroup), then each pair to its place.
  const std::uint32_t chunks = ceil_div(pairs, sort_chunk);
  struct {
    std::uint32_t pairs, n_expert, tile, counts, chunk, chunks;
  } push{pairs, n_expert, tile, static_cast<std::uint32_t>(sort_counts_at(pairs, n_expert) / 4), sort_chunk, chunks};
  auto [gx, gy] = spread(chunks);
  for (const char* pass : {"moe_sort_count", "moe_sort_offsets", "moe_sort_scatter"}) {
    const bool one = std::string_view(pass) == "moe_sort_offsets";
    rec.dispatch(kernel(lib, pass, 3, sizeof push), {experts, order, tiles}, push, one ? 1 : gx, one ? 1 : gy);
  }
}

void matmul_experts(Recording& rec, KernelLibrary& lib, WeightType type, BufferRange weights, BufferRange acts,
                    BufferRange order, BufferRange tiles, BufferRange out, const ExpertProduct& s,
                    std::uint32_t n_expert) {
  check_experts(type, s);
  constexpr std::uint32_t kRows = 64;  // mul_mm_id.comp's TM
  // As many tile rows as there can be tiles; those past the step's count end at once.
  const std::uint32_t tiles_at_most = ceil_div(s.rows * s.used, experts_tile_pairs) + n_expert;
  dispatch_experts(rec, kernel(lib, experts_module("mul_mm_id", type, s.acts_q8), 5, 24),
                   {weights, acts, order, tiles, out}, s, kRows, tiles_at_most);
}

bool experts_coopmat_applies(const DeviceFeatures& features, WeightType type, std::uint32_t m, std::uint32_t k) {
  const auto& cm = features.cooperative_matrix;
  return cm && cm->m == 16 && cm->n == 16 && cm->k == 16 && features.subgroup_size == 32 && m > 0 && k % 128 == 0 &&
         (type == WeightType::f16 || quantized(type));
}

void matmul_experts_coopmat(Recording& rec, KernelLibrary& lib, WeightType type, BufferRange weights,
                            BufferRange acts16, BufferRange order, BufferRange tiles, BufferRange out,
                            const ExpertProduct& s, std::uint32_t n_expert, std::uint32_t tile_pairs) {
  const auto& features = lib.device().features();
  if (!experts_coopmat_applies(features, type, s.m, s.k) || s.acts_q8 || (tile_pairs != 64 && tile_pairs != 32)) {
    throw GpuError(fmt::format("the tensor-core expert product does not take {} weights of {}x{} in tiles of {} on {}",
                               weight_type_name(type), s.m, s.k, tile_pairs, features.name));
  }
  const std::uint32_t tiles_at_most = ceil_div(s.rows * s.used, tile_pairs) + n_expert;
  dispatch_experts(rec, kernel(lib, experts_coopmat_module(type, tile_pairs), 5, 24, {0, 0, 0, 0, 0, 0}, 32),
                   {weights, acts16, out, order, tiles}, s, 128, tiles_at_most);
}

bool experts_dequantize(const DeviceFeatures& features, WeightType type, std::uint32_t m, std::uint32_t k,
                        const KernelChoice& choice) {
  return choice.experts_f16 && quantized(type) && m % 16 == 0 && experts_coopmat_applies(features, type, m, k);
}

std::string experts_coopmat_module(WeightType type, std::uint32_t tile_pairs, bool glu) {
  const StagedShape x = tile_pairs == 64 ? StagedShape{4, 1, 2, 4, 2} : StagedShape{4, 1, 2, 2, 4};
  return fmt::format("mul_mm_staged_experts_{}{}_16x16x16_{}x{}x{}x{}x{}", glu ? "glu_" : "", weight_type_name(type),
                     x.sg_m, x.sg_n, x.tm, x.tn, x.kb);
}

std::vector<std::string> experts_coopmat_modules() {
  std::vector<std::string> names;
  for (WeightType type : all_weight_types) {
    if (type != WeightType::f16 && !quantized(type)) continue;
    for (std::uint32_t tile_pairs : {64u, 32u}) names.push_back(experts_coopmat_module(type, tile_pairs));
  }
  for (std::uint32_t tile_pairs : {64u, 32u}) names.push_back(experts_coopmat_module(WeightType::f16, tile_pairs, true));
  return names;
}

bool experts_glu_applies(const DeviceFeatures& features, std::uint32_t m, std::uint32_t k) {
  return m % 16 == 0 && experts_coopmat_applies(features, WeightType::f16, m, k);
}

void matmul_experts_glu(Recording& rec, KernelLibrary& lib, BufferRange gate16, BufferRange up16, BufferRange acts16,
                        BufferRange order, BufferRange tiles, BufferRange out16, const ExpertProduct& s,
                        std::uint32_t n_expert, std::uint32_t tile_pairs) {
  const auto& features = lib.device().features();
  if (!experts_glu_applies(features, s.m, s.k) || s.acts_q8 || s.acts_per_pair || (tile_pairs != 64 && tile_pairs != 32)) {
    throw GpuError(fmt::format("the tensor-core experts' SwiGLU does not take F16 weights of {}x{} in tiles of {} on {}",
                               s.m, s.k, tile_pairs, features.name));
  }
  // A workgroup's 128 rows are 64 features of gate and up each.
  const std::uint32_t tiles_at_most = ceil_div(s.rows * s.used, tile_pairs) + n_expert;
  dispatch_experts(rec, kernel(lib, experts_coopmat_module(WeightType::f16, tile_pairs, true), 6, 24, {0, 0, 0, 0, 0, 0}, 32),
                   {gate16, acts16, out16, order, tiles, up16}, s, 64, tiles_at_most);
}

void moe_combine(Recording& rec, KernelLibrary& lib, BufferRange outputs, BufferRange weights, BufferRange x,
                 std::uint32_t rows, std::uint32_t n, std::uint32_t used) {
  struct {
    std::uint32_t n, used, total;
  } push{n, used, rows * n};
  auto [gx, gy] = spread(ceil_div(push.total, 64));
  rec.dispatch(kernel(lib, "moe_combine", 3, sizeof push), {outputs, weights, x}, push, gx, gy);
}

}  // namespace mqlm::gpu::ops
