// Every transformer kernel, as a function that records it into a step. Shapes are in elements;
// tensors are row-major and contiguous (the last dimension named is the contiguous one).
// Activations are F32 unless a parameter says otherwise; KV caches are F16.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <limits>
#include <span>
#include <optional>
#include <string>
#include <vector>

#include "gpu/compute_queue.hpp"
#include "gpu/kernel_library.hpp"
#include "gpu/weight_formats.hpp"

namespace mqlm::gpu::ops {

// x: (rows, n), weight: (n), out: (rows, n).
void rms_norm(Recording& rec, KernelLibrary& lib, BufferRange x, BufferRange weight, BufferRange out, std::uint32_t rows,
              std::uint32_t n, float eps);
// io += rmsnorm(x) * weight, (rows, n) each: Gemma's norm of a block's output and the residual add
// in one dispatch.
void rms_norm_add(Recording& rec, KernelLibrary& lib, BufferRange x, BufferRange weight, BufferRange io,
                  std::uint32_t rows, std::uint32_t n, float eps);
// out = a + b, n elements.
void add(Recording& rec, KernelLibrary& lib, BufferRange a, BufferRange b, BufferRange out, std::uint32_t n);
// out = silu(gate) * up, n elements.
void silu_mul(Recording& rec, KernelLibrary& lib, BufferRange gate, BufferRange up, BufferRange out, std::uint32_t n);
// out = gelu(gate) * up (GELU's tanh form: GeGLU), n elements.
void gelu_mul(Recording& rec, KernelLibrary& lib, BufferRange gate, BufferRange up, BufferRange out, std::uint32_t n);
// out = x * factor, n elements.
void scale(Recording& rec, KernelLibrary& lib, BufferRange x, BufferRange out, std::uint32_t n, float factor);
// out = cap * tanh(x / cap), n elements (Gemma's logit soft-capping).
void soft_cap(Recording& rec, KernelLibrary& lib, BufferRange x, BufferRange out, std::uint32_t n, float cap);
// x, out: (rows, n); out = softmax(x * scale) per row.
void softmax(Recording& rec, KernelLibrary& lib, BufferRange x, BufferRange out, std::uint32_t rows, std::uint32_t n,
             float scale);
// weights: (vocab, k) of `type`; ids: (n_ids) uint32; out: (n_ids, k).
void get_rows(Recording& rec, KernelLibrary& lib, WeightType type, BufferRange weights, BufferRange ids, BufferRange out,
              std::uint32_t k, std::uint32_t n_ids);

// YaRN as ggml's rope_yarn has it: pairs that turn fewer than beta_slow times over the original
// context take the scaled frequency (interpolation), those that turn more than beta_fast times keep
// theirs (extrapolation), a ramp between, weighed by ext_factor (0: YaRN off, 1: in full); cos and
// sin are multiplied by attn_factor, and by 1 + 0.1 ln(1 / freq_scale) where ext_factor is not 0.
struct RopeYarn {
  float ext_factor = 0.0f, attn_factor = 1.0f;
  float beta_fast = 32.0f, beta_slow = 1.0f;
  std::uint32_t original_context = 0;
};
// qwen35's Gated DeltaNet recurrence: `sequences` sequences of `tokens` tokens each (token t of
// sequence s in row s * tokens + t), each with its state in slot slots[s] of the state buffers.
// q and k have k_heads heads, v v_heads (value head h reads key head h % k_heads), all head_dim
// wide; the convolution has conv_kernel taps per channel of q, k and v.
struct DeltaNetShape {
  std::uint32_t sequences = 0, tokens = 0;
  std::uint32_t k_heads = 0, v_heads = 0, head_dim = 0, conv_kernel = 0;
  float eps = 1e-6f;  // of q's and k's L2 norms
  std::uint32_t key_dim() const { return k_heads * head_dim; }
  std::uint32_t value_dim() const { return v_heads * head_dim; }
  std::uint32_t conv_dim() const { return 2 * key_dim() + value_dim(); }
};
inline constexpr std::uint32_t delta_net_max_kernel = 8, delta_net_max_head_dim = 256;
// The causal convolution of a DeltaNet layer and silu: x and out (sequences x tokens, conv_dim);
// taps (conv_dim, conv_kernel), oldest first; state (slots, conv_kernel - 1, conv_dim): each
// sequence's last inputs before these, left holding its last inputs after them. One invocation per
// (sequence, channel) walks the tokens.
void short_conv(Recording& rec, KernelLibrary& lib, BufferRange x, BufferRange taps, BufferRange state,
                BufferRange slots, BufferRange out, const DeltaNetShape& shape);
// The gated delta rule (reference::delta_rule says what it computes): qkv the convolution's output,
// alpha and beta the raw (sequences x tokens, v_heads) products, dt_bias and rate (v_heads) the
// decay's bias and ssm_a; state (slots, v_heads, head_dim x head_dim: a head's value row r, key column c at
// c * head_dim + r), updated in place; out (sequences x tokens, value_dim). One workgroup per (sequence, value head), a thread
// per value row, the tokens in order inside the dispatch.
void delta_rule(Recording& rec, KernelLibrary& lib, BufferRange qkv, BufferRange alpha, BufferRange beta,
                BufferRange dt_bias, BufferRange rate, BufferRange state, BufferRange slots, BufferRange out,
                const DeltaNetShape& shape);

struct RopeShape {
  std::uint32_t tokens = 0, heads = 0, head_dim = 0;
  std::uint32_t rotary_dims = 0;  // 0: all of head_dim
  float freq_base = 10000.0f;
  float freq_scale = 1.0f;        // linear scaling: positions are multiplied by it
  bool neox = false;              // pairs (i, i + d/2) instead of (2i, 2i + 1)
  RopeYarn yarn = {};
  std::span<const float> freq_factors = {};  // (rotary dims / 2) each pair's frequency divided by it; empty: 1
};
// What the rope kernels read (their `frequencies`, uploaded once per model): pair i's angle per
// position, freq_base^(-2i / rotary dims) / freq_factors[i], scaled by freq_scale or YaRN's blend.
std::vector<float> rope_frequencies(const RopeShape& shape);
// What cos and sin are multiplied by (YaRN's magnitude; attn_factor otherwise).
float rope_magnitude(const RopeShape& shape);
// YaRN's correction range: the pairs from which the ramp starts and where it ends (ggml's
// ggml_rope_yarn_corr_dims).
std::array<float, 2> rope_yarn_correction(const RopeShape& shape);
// x, out: (tokens, heads, head_dim); positions: (tokens) int32; frequencies: rope_frequencies(shape).
void rope(Recording& rec, KernelLibrary& lib, BufferRange x, BufferRange positions, BufferRange frequencies,
          BufferRange out, const RopeShape& shape);
// Where the q/k/v products split K (matmul_narrow with sum_later): their slices, which
// rope_kv_write then adds (as sum_splits would) as it reads them, instead of the products' outputs.
// A count of 1: that product did not split, its output is read.
struct QkvSlices {
  BufferRange q = {}, k = {}, v = {};
  std::uint32_t q_splits = 1, k_splits = 1, v_splits = 1;
};
// The per-head RMS norms of q and k (Qwen3's, Gemma's), (head_dim) weights each, which
// rope_kv_write then makes before it turns them. Empty: none.
struct QkNorms {
  BufferRange q = {}, k = {};
  float eps = 0.0f;
};
// One dispatch for what a layer does between its q/k/v products and attention: q (tokens,
// shape.heads, head_dim) rotated in place; k (tokens, kv_heads, head_dim) rotated and v as it is
// written into their cache slots as kv_write does. Same results as rope on q and k, then kv_write.
// With slices, q, k and v are first the sums of their products' slices (q's written to q); with
// norms (not with slices), q and k are first normed: the same as rms_norm on each head of q and k.
void rope_kv_write(Recording& rec, KernelLibrary& lib, BufferRange q, BufferRange k_new, BufferRange v_new,
                   BufferRange positions, BufferRange frequencies, BufferRange k_cache, BufferRange v_cache,
                   BufferRange slots, const RopeShape& shape, std::uint32_t kv_heads, const QkvSlices& slices = {},
                   const QkNorms& norms = {});

// The vector path's workgroup shape for whole-block weights: threads per workgroup and rows per
// workgroup. {0, 0}: the shape tuned per type.
struct MatvecShape {
  std::uint32_t threads = 0, rows = 0;
};
// The staged kernel's workgroup (shaders/mul_mm_staged.comp): subgroups along M and N, 16-row and
// 16-column fragments per subgroup, blocks of 32 along K per stage. One module is built per shape;
// staged_shape_problem says whether one is. All 0: the shape tuned per column count.
struct StagedShape {
  std::uint32_t sg_m = 0, sg_n = 0, tm = 0, tn = 0, kb = 1;
};
// The direct kernel's shape (shaders/mul_mm_direct.comp): 16-row fragments a subgroup (tm),
// subgroups a workgroup sharing K (sg_k), blocks of weights each subgroup keeps in flight (depth);
// the columns make the rest. All 0: the tuned shape.
struct DirectShape {
  std::uint32_t tm = 0, sg_k = 0, depth = 0;
};
// Where the narrow path takes the direct kernel: for Q4_0 products of up to direct_max_columns
// columns (automatic: where it measured faster in the model), for everything it can take
// (always), or never.
enum class DirectUse { automatic, always, never };

// Which kernels and shapes the products take where several could: a plain value every op that
// depends on it takes as an argument. Its defaults are the tuned choices a model step takes;
// tests and benchmarks pass others to compare.
struct KernelChoice {
  // The int8 mat-vec (activations quantized per 32-element block, integer dot products) for
  // quantized weights where the device has integer dot products. nullopt or true: for every
  // quantized type (measured faster on the H100); false: for none (Q8_0, Q4_0 and Q4_K then take
  // their float kernels, the other types the generic ones).
  std::optional<bool> matvec_int8;
  MatvecShape matvec_shape;
  StagedShape staged_shape;
  std::uint32_t staged_splits = 0;  // K slices of the narrow path's split products; 0: tuned
  DirectUse direct_use = DirectUse::automatic;
  DirectShape direct_shape;
  // Whether a wide step's expert products of quantized weights decode every expert's matrix to F16
  // first and multiply F16 weights (experts_dequantize); false, the default: the weights decoded in
  // each tile (decoding first measured slower: experts_dequantize).
  bool experts_f16 = false;
  // A decode step's expert products: true routes each token inside the products from the router's
  // logits and makes silu(gate) * up in the gate and up product (matvec_experts_glu, then
  // matvec_experts_sum: two dispatch levels after the router); false runs moe_route, gate and up,
  // quantize_q8_silu and the down product (four), for comparison.
  bool experts_fused = true;
};

enum class MatmulPath : std::uint8_t { automatic, vector, tiled, cooperative };
// The most columns the vector path (and matvec_q8) takes in one dispatch.
inline constexpr std::uint32_t matvec_max_columns = 8;
std::string_view matmul_path_name(MatmulPath path);
// The path `automatic` takes for n columns on this device.
MatmulPath choose_matmul_path(const DeviceFeatures& features, std::uint32_t n);
// out(n, m) = acts(n, k) x weights(m, k)^T; weights of `type` in their GGUF layout; acts F32, or
// F16 when acts_f16. The vector path takes at most 8 columns; the cooperative path needs
// features().cooperative_matrix. Returns the path used.
MatmulPath matmul(Recording& rec, KernelLibrary& lib, WeightType type, BufferRange weights, BufferRange acts, bool acts_f16,
                  BufferRange out, std::uint32_t m, std::uint32_t k, std::uint32_t n,
                  MatmulPath path = MatmulPath::automatic, const KernelChoice& choice = {});
// Whether the vector path takes the int8 mat-vec for weights of `type` (choice.matvec_int8): its
// activations quantized to int8 per 32-element block (the scale is the block's largest magnitude
// / 127) and integer dot products, where the device enabled them (features().integer_dot_product).
// Every quantized type has it (Q4_K and the types of quant_units.glsl only on activations quantized
// beforehand: matvec_q8).
bool matvec_int8(const DeviceFeatures& features, WeightType type, const KernelChoice& choice = {});
// Whether the vector path's int8 kernels on F32 activations quantize them themselves (Q4_0, Q8_0);
// the other types' take them quantized beforehand (quantize_q8*, matvec_q8).
bool matvec_quantizes_in_place(WeightType type);
// Whether matvec_q8 takes weights of `type` with rows of k for n columns on this device.
bool matvec_q8_applies(const DeviceFeatures& features, WeightType type, std::uint32_t k, std::uint32_t n,
                       const KernelChoice& choice = {});

// Decode's int8 mat-vecs read activations quantized once per step instead of in every workgroup:
// quantize_q8* write n columns of k (k % 32 == 0) as int8 blocks with their scales (the rounding
// reference::int8_blocks makes) into q8_acts_bytes(k, n) bytes; the input is x, rmsnorm(x) *
// norm_weight, silu(gate) * up or gelu(gate) * up (GELU's tanh form). matvec_q8 then computes out = weights x acts (or out += with
// `accumulate`) where matvec_q8_applies says so.
std::uint64_t q8_acts_bytes(std::uint32_t k, std::uint32_t n);
void quantize_q8(Recording& rec, KernelLibrary& lib, BufferRange x, BufferRange out, std::uint32_t k, std::uint32_t n);
void quantize_q8_rms_norm(Recording& rec, KernelLibrary& lib, BufferRange x, BufferRange norm_weight, float eps,
                          BufferRange out, std::uint32_t k, std::uint32_t n);
void quantize_q8_silu(Recording& rec, KernelLibrary& lib, BufferRange gate, BufferRange up, BufferRange out,
                      std::uint32_t k, std::uint32_t n);
void quantize_q8_gelu(Recording& rec, KernelLibrary& lib, BufferRange gate, BufferRange up, BufferRange out,
                      std::uint32_t k, std::uint32_t n);
// x += rmsnorm(block) * post_weight (as rms_norm_add: Gemma's norm of a block's output and the
// residual add), then out as quantize_q8_rms_norm makes it from the new x: the next block's int8
// input in the same dispatch. block, x: (n, k).
void rms_norm_add_quantize_q8(Recording& rec, KernelLibrary& lib, BufferRange block, BufferRange post_weight,
                              BufferRange x, BufferRange norm_weight, float eps, BufferRange out, std::uint32_t k,
                              std::uint32_t n);
void matvec_q8(Recording& rec, KernelLibrary& lib, WeightType type, BufferRange weights, BufferRange acts_q8,
               BufferRange out, std::uint32_t m, std::uint32_t k, std::uint32_t n, bool accumulate,
               const KernelChoice& choice = {});

// matvec_q8 for the q, k or v projection of a decode step, its output written where attention
// reads it: what rope_kv_write does after the three products, without that dispatch. q: turned by
// the rotary embedding into out (n x m floats); k: turned, and v: as it is, as F16 into the cache
// rows slots[c] of out (m = kv_heads x head_dim wide). positions: n int32; slots: n uint32;
// frequencies: rope_frequencies(rope).
// matvec_q8_heads_applies says where it is built: the int8 path's fixed shapes (up to 8 columns),
// the normal rotary layout (pairs 2i, 2i + 1), whole heads of even head_dim.
enum class HeadsOutput : std::uint32_t { q = 0, k_cache = 1, v_cache = 2 };
bool matvec_q8_heads_applies(const DeviceFeatures& features, WeightType type, std::uint32_t m, std::uint32_t k,
                             std::uint32_t n, const RopeShape& rope, const KernelChoice& choice = {});
void matvec_q8_heads(Recording& rec, KernelLibrary& lib, WeightType type, BufferRange weights, BufferRange acts_q8,
                     BufferRange out, BufferRange positions, BufferRange slots, BufferRange frequencies,
                     const RopeShape& rope, HeadsOutput what,
                     std::uint32_t m, std::uint32_t k, std::uint32_t n, const KernelChoice& choice = {});

// The narrow path: the tensor cores for every product wider than the vector path (decode batches
// and prefill chunks), shaders/mul_mm_staged.comp. A workgroup owns a tile of up to 128 rows and
// up to 128 columns; each weight block is read from memory once per tile's columns, dequantized
// to F16 in shared memory; the activations are F16 with their columns padded to whole tiles.
// Needs VK_NV_cooperative_matrix with 16-row, 16-deep tiles and subgroups of 32; takes F16, Q8_0
// and Q4_0 weights with K % 32 == 0 (and M % 16 == 0 for F16).
// Whether the narrow kernels read weights of `type` in place at every width (F16, Q8_0, Q4_0);
// narrow_reads_at: or for n columns, where the other quantized types are read in place too (decode
// batches of up to unit_max_columns, on 16x16x16 tiles). Elsewhere those reach the tensor cores
// through dequantize_f16 (narrow_dequantizes).
bool narrow_reads(WeightType type);
inline constexpr std::uint32_t unit_max_columns = 64;
bool narrow_reads_at(const DeviceFeatures& features, WeightType type, std::uint32_t n);
bool narrow_matmul_applies(const DeviceFeatures& features, WeightType type, std::uint32_t m, std::uint32_t k);
// Whether callers should take the narrow path for n columns: where it applies, from 6 columns (up
// to 8 it takes the place of the vector path, which it beats there on the H100).
bool narrow_matmul_preferred(const DeviceFeatures& features, WeightType type, std::uint32_t m, std::uint32_t k,
                             std::uint32_t n, const KernelChoice& choice = {});
// The activation rows (columns of the product) the narrow path reads for n: n rounded up to its tiles.
std::uint32_t narrow_padded_columns(const DeviceFeatures& features, std::uint32_t n, const KernelChoice& choice = {});
// out(n, m) = acts16(n, k) x weights(m, k)^T, or out += it with accumulate (the residual add);
// acts16: F16 with narrow_padded_columns(n) rows (what to_f16 writes).
// With split_scratch of narrow_split_bytes(m, k, n) or more, a product whose grid is too small to
// fill the GPU splits K over several workgroups, whose partial products go to the scratch and are
// then added (in a fixed order) into out. Products recorded to run alongside each other take
// scratches of their own and sum_later: each returns its split count (1: none, out written), and
// the caller records sum_splits(split_scratch, out, m * n, splits, accumulate) for each after them.
std::uint32_t matmul_narrow(Recording& rec, KernelLibrary& lib, WeightType type, BufferRange weights, BufferRange acts16,
                            BufferRange out, std::uint32_t m, std::uint32_t k, std::uint32_t n, bool accumulate,
                            BufferRange split_scratch = {}, bool sum_later = false, const KernelChoice& choice = {});
// A feed-forward block's SwiGLU in one dispatch of the narrow path: out16(padded n, m) =
// silu(acts16 x gate^T) * (acts16 x up^T) as F16, the down product's input (its padded columns
// zero). gate and up: m x k matrices of one type. narrow_glu_applies: for more than 16 columns,
// where the narrow path takes both and its shape for 2m rows and n columns gives each subgroup two
// 16-row fragments (one of gate, one of up, for the same features).
bool narrow_glu_applies(const DeviceFeatures& features, WeightType type, std::uint32_t m, std::uint32_t k,
                        std::uint32_t n, const KernelChoice& choice = {});
void matmul_narrow_glu(Recording& rec, KernelLibrary& lib, WeightType type, BufferRange gate, BufferRange up,
                       BufferRange acts16, BufferRange out16, std::uint32_t m, std::uint32_t k, std::uint32_t n,
                       const KernelChoice& choice = {});
// How many slices of K the narrow path cuts an m x k product of n columns into (1: none), and the
// scratch bytes that takes (0 for none).
std::uint32_t narrow_splits(const DeviceFeatures& features, std::uint32_t m, std::uint32_t k, std::uint32_t n,
                            const KernelChoice& choice = {});
std::uint64_t narrow_split_bytes(const DeviceFeatures& features, std::uint32_t m, std::uint32_t k, std::uint32_t n,
                                 const KernelChoice& choice = {});
// out[i] (+)= sum over z < splits of parts[z * count + i], i < count.
void sum_splits(Recording& rec, KernelLibrary& lib, BufferRange parts, BufferRange out, std::uint32_t count,
                std::uint32_t splits, bool accumulate);
// Why no staged module is built for `shape` ("" where one is).
std::string staged_shape_problem(StagedShape shape);
// The staged kernel's module for weights of `type`, tensor-core tiles `cm` and workgroup shape s;
// staged_modules: every module the host may ask for (each listed shape for 16x16x16 tiles, those
// also built for 16x8x16 tiles for them too, and the GLU modules of those with two 16-row
// fragments a subgroup), which shaders/CMakeLists.txt must build.
std::string staged_module(WeightType type, const CooperativeMatrixShape& cm, StagedShape s, bool glu = false);
std::vector<std::string> staged_modules();
// The direct kernel (shaders/mul_mm_direct.comp) can take the narrow path's products of 9 to 64
// columns where the library's device lays fragments out as it builds them (probe_fragment_layout,
// in gpu/fragment_layout.hpp, found it so): F16, Q8_0 and Q4_0 weights, the same inputs, outputs
// and K splits. matmul_narrow takes it as choice.direct_use says.
inline constexpr std::uint32_t direct_max_columns = 16;
bool direct_matmul_applies(const KernelLibrary& lib, WeightType type, std::uint32_t m, std::uint32_t k, std::uint32_t n);
std::string direct_shape_problem(DirectShape shape, std::uint32_t columns = 16);
// The shape the direct kernel takes (choice.direct_shape, where set), and its module for n padded columns.
DirectShape direct_shape(const KernelChoice& choice = {});
std::string direct_module(WeightType type, DirectShape s, std::uint32_t n);
std::vector<std::string> direct_modules();
// Whether a product of n columns takes dequantize_f16 into a scratch matrix and the narrow path on
// F16 weights: where that is faster than the blocks in place (wide prefill chunks of Q4_0 and Q8_0
// weights), and for the other quantized types wider than the narrow kernels read them (narrow_reads_at).
bool narrow_dequantizes(const DeviceFeatures& features, WeightType type, std::uint32_t m, std::uint32_t k, std::uint32_t n);
// out16(m, k) F16 = quantized weights (m, k), rows of whole blocks.
void dequantize_f16(Recording& rec, KernelLibrary& lib, WeightType type, BufferRange weights, BufferRange out16,
                    std::uint32_t m, std::uint32_t k);
// out(padded_rows, n) F16 = in(rows, n) F32, the rows past `rows` zero.
void to_f16(Recording& rec, KernelLibrary& lib, BufferRange in, BufferRange out, std::uint32_t rows, std::uint32_t n,
            std::uint32_t padded_rows);
// The same for a norm's and silu_mul's results, made in one dispatch instead of two: out16
// (padded_rows, n) F16 = rms_norm(x) or silu(gate) * up of (rows, n), the rows past `rows` zero.
void rms_norm_f16(Recording& rec, KernelLibrary& lib, BufferRange x, BufferRange weight, BufferRange out16,
                  std::uint32_t rows, std::uint32_t padded_rows, std::uint32_t n, float eps);
// A split residual product's sum and the norm after it in one dispatch: x(rows, n) += the
// splits slices of parts (what sum_splits(parts, x, rows * n, splits, true) adds, in its order),
// then out16 as rms_norm_f16 makes it from the new x.
void sum_splits_rms_norm_f16(Recording& rec, KernelLibrary& lib, BufferRange parts, std::uint32_t splits, BufferRange x,
                             BufferRange weight, BufferRange out16, std::uint32_t rows, std::uint32_t padded_rows,
                             std::uint32_t n, float eps);
void silu_mul_f16(Recording& rec, KernelLibrary& lib, BufferRange gate, BufferRange up, BufferRange out16,
                  std::uint32_t rows, std::uint32_t padded_rows, std::uint32_t n);

// out(n, m) += acts(n, k) x weights(m, k)^T: the vector path with the residual add fused in (out
// is read and written by the same thread, so it may be the residual stream itself). Only where
// matvec_can_accumulate says so (at most 8 columns, weights the block kernel reads).
bool matvec_can_accumulate(WeightType type, std::uint32_t k, std::uint32_t n);
void matvec_accumulate(Recording& rec, KernelLibrary& lib, WeightType type, BufferRange weights, BufferRange acts,
                       bool acts_f16, BufferRange out, std::uint32_t m, std::uint32_t k, std::uint32_t n,
                       const KernelChoice& choice = {});
// The same with F32 activations silu(gate) * up, computed as the kernel loads them (the
// feed-forward's down projection with silu_mul and the residual add fused in).
void matvec_accumulate_silu(Recording& rec, KernelLibrary& lib, WeightType type, BufferRange weights, BufferRange gate,
                            BufferRange up, BufferRange out, std::uint32_t m, std::uint32_t k, std::uint32_t n,
                            const KernelChoice& choice = {});

// out(n, m) = rmsnorm(x, norm_weight, eps)(n, k) x weights(m, k)^T: the vector path normalising
// its input as it loads it (each workgroup computes the row scales itself). Where
// matvec_can_accumulate says the vector path applies.
void matvec_rms_norm(Recording& rec, KernelLibrary& lib, WeightType type, BufferRange weights, BufferRange x,
                     BufferRange norm_weight, float eps, BufferRange out, std::uint32_t m, std::uint32_t k,
                     std::uint32_t n, const KernelChoice& choice = {});

// k_new, v_new: (tokens, row) F32 with row = kv_heads * head_dim; the caches: (slots, row) F16;
// slots: (tokens) uint32, page * page_size + offset.
void kv_write(Recording& rec, KernelLibrary& lib, BufferRange k_new, BufferRange v_new, BufferRange k_cache,
              BufferRange v_cache, BufferRange slots, std::uint32_t tokens, std::uint32_t row);

// one_pass: one workgroup per (token, head) over all its keys (prefill). split: flash-decoding,
// the keys of each token cut into ranges handled by separate workgroups and merged (decode).
enum class AttentionPath : std::uint8_t { automatic, one_pass, split };
// The largest head dimension attention takes (Gemma's); the split path takes multiples of 16 up
// to it, the one-pass kernel any.
constexpr std::uint32_t attention_max_head_dim = 256;
struct AttentionShape {
  std::uint32_t tokens = 0, heads = 0, kv_heads = 0, head_dim = 0;  // head_dim up to 256
  std::uint32_t page_size = 0, max_pages = 0;  // block tables are (sequences, max_pages)
  float scale = 0;                             // usually 1 / sqrt(head_dim)
  AttentionPath path = AttentionPath::automatic;  // tests and benchmarks force one
  std::uint32_t splits = 0;                       // key ranges per token of the split path; 0: chosen
  std::uint32_t max_context = 0;  // the most keys a token of the step sees; 0: max_pages * page_size
  std::uint32_t window = 0;       // a token sees the keys of its last `window` positions only; 0: all
  float softcap = 0;              // scores s (scale included) become softcap tanh(s / softcap); 0: none
  // Query heads a workgroup of the split path takes (dividing heads / kv_heads, at most 8); 0: all of
  // a KV head's group up to 8. Benchmarks compare: fewer make more, shorter workgroups.
  std::uint32_t head_group = 0;
};
struct AttentionPlan {
  AttentionPath path = AttentionPath::one_pass;
  std::uint32_t splits = 1;
};
// What attention() runs for this shape: `automatic` takes the split path for up to 64 tokens,
// with enough key ranges for a few hundred workgroups, but no more than tiles of keys in
// max_context (or max_pages * page_size).
AttentionPlan plan_attention(const AttentionShape& shape);
// The scratch attention() needs for the partial results of the split path (at least 16 bytes).
std::uint64_t attention_scratch_bytes(const AttentionShape& shape);
// q, out: (tokens, heads, head_dim); token_seq_pos: (tokens) pairs of uint32 (sequence, position);
// a token sees positions 0 .. its own of its sequence, through block_tables. scratch: at least
// attention_scratch_bytes(shape). With merged given, the split path writes its output there
// instead, in the form the product after it reads, and returns true (a decode step's output
// product: one dispatch fewer): int8 where it merges more than one split, F16 also from one split;
// every other way writes out and returns false.
struct AttentionMerged {
  // int8 blocks (q8_acts_bytes(heads * head_dim, tokens)) as quantize_q8 would make them from out,
  BufferRange q8 = {};
  // or F16 (padded_rows, heads * head_dim) as to_f16(out, f16, tokens, heads * head_dim, padded_rows).
  BufferRange f16 = {};
  std::uint32_t padded_rows = 0;
};
bool attention(Recording& rec, KernelLibrary& lib, BufferRange q, BufferRange k_cache, BufferRange v_cache,
               BufferRange block_tables, BufferRange token_seq_pos, BufferRange scratch, BufferRange out,
               const AttentionShape& shape, const AttentionMerged& merged = {});

// out: (rows) uint32, the index of each row's largest value (the lowest on ties). Two passes:
// chunks of each row in many workgroups, their winners into scratch (at least
// argmax_scratch_bytes(rows, n)), then one workgroup a row.
std::uint64_t argmax_scratch_bytes(std::uint32_t rows, std::uint32_t n);
void argmax(Recording& rec, KernelLibrary& lib, BufferRange x, BufferRange scratch, BufferRange out, std::uint32_t rows,
            std::uint32_t n);

// The k largest of each row of x (rows, n), ordered (larger first, lower index on ties), into
// out_values (rows, k) F32 and out_indices (rows, k) uint32. k <= 256 and k <= n. scratch holds
// the intermediate rounds: at least topk_scratch_bytes(rows, n, k).
std::uint64_t topk_scratch_bytes(std::uint32_t rows, std::uint32_t n, std::uint32_t k);
void topk(Recording& rec, KernelLibrary& lib, BufferRange x, BufferRange scratch, BufferRange out_values,
          BufferRange out_indices, std::uint32_t rows, std::uint32_t n, std::uint32_t k);

// Sampling on the GPU (shaders/sample.comp): one token for each row of logits (rows, stride),
// with the CPU sampler's semantics (model/sampling/sampler.hpp), each row by its own SampleRow.
// The logits are changed in place (bias, penalties, mask). out: (rows, sample_out_words) uint32:
// the token (0xFFFFFFFF where no logit is finite), its logprob's float bits, then top_logprobs
// pairs (id, logprob bits), NO_INDEX after the row's count; ids: (rows) the tokens alone, what a
// next step reads (0 where none). entries: (token, bias bits, in window, count) uvec4s; mask: bit
// words; prev_ids: the step before's ids, read by rows flagged pending. scratch: at least
// sample_scratch_bytes(rows, stride). arrivals: (rows, sample_arrival_words) uint32, zero before
// (the passes leave it zero): each wide pass's last workgroup of a row takes the row's decisions.
struct SampleRow {
  float temperature = 0.0f, inv_temperature = 1.0f, top_p = 1.0f, min_p_offset = -std::numeric_limits<float>::infinity();
  float repetition = 1.0f, inv_repetition = 1.0f, presence = 0.0f, frequency = 0.0f;
  std::uint32_t top_k = 0, seed_lo = 0, seed_hi = 0, counter = 0, n = 0;
  std::uint32_t entries_offset = 0, entries_count = 0, mask_offset = 0xFFFFFFFFu, flags = 0;
};
static_assert(sizeof(SampleRow) == 68);
inline constexpr std::uint32_t sample_flag_logprobs = 0x100, sample_flag_pending = 0x200, sample_flag_window = 0x400;
inline constexpr std::uint32_t sample_max_top_logprobs = 20;
inline constexpr std::uint32_t sample_out_words = 2 + 2 * sample_max_top_logprobs;
inline constexpr std::uint32_t sample_arrival_words = 4;
struct SampleBuffers {
  BufferRange logits, rows, entries, mask, prev_ids, scratch, out, ids, arrivals;
};
std::uint64_t sample_scratch_bytes(std::uint32_t rows, std::uint32_t stride);
// The passes the rows need (sample_needs): those no row needs are not recorded.
struct SampleNeeds {
  bool prepare = true;     // bias, penalties or a pending token
  bool candidates = true;  // top-k, top-p or top logprobs
  bool draws = true;       // a draw that may reach past the candidates: top-k, top-p or min-p
};
SampleNeeds sample_needs(std::span<const SampleRow> rows);
// after_pass, when given, is called with each pass's name after it is recorded (a step's profile
// marks the passes).
void sample(Recording& rec, KernelLibrary& lib, const SampleBuffers& buffers, std::uint32_t rows, std::uint32_t stride,
            const SampleNeeds& needs = {}, const std::function<void(const char*)>& after_pass = {});

// dst = src, `bytes` a multiple of 16: the copy-bandwidth probe.
void copy(Recording& rec, KernelLibrary& lib, BufferRange src, BufferRange dst, std::uint64_t bytes);

// Chunks of `chunk_bytes` (a multiple of 16): chunk index[i] of src into dst at byte
// base + i * stride, for i < count (index: uint32). One dispatch however scattered the chunks.
void copy_gather(Recording& rec, KernelLibrary& lib, BufferRange src, BufferRange dst, BufferRange index,
                 std::uint64_t chunk_bytes, std::uint32_t count, std::uint64_t base, std::uint64_t stride);

// A mixture of experts' router in wide steps (router.comp): logits (rows, n_expert) = x (rows, k)
// times w (n_expert, k) transposed, a workgroup per 4 rows with the weights read from L2, where the
// tiled products walked k in a chain of dependent steps. The sums run in another order than
// matmul's. router_logits_applies: F32, F16 or BF16 weights, n_expert at most 256, k a multiple of 4.
bool router_logits_applies(WeightType type, std::uint32_t n_expert, std::uint32_t k);
void router_logits(Recording& rec, KernelLibrary& lib, WeightType type, BufferRange w, BufferRange x, BufferRange logits,
                   std::uint32_t n_expert, std::uint32_t k, std::uint32_t rows);

// A mixture of experts (gpu::reference::moe_route and the model's experts block say what each
// computes). moe_route: each row of router logits (rows, n_expert) gives its `used` experts, (rows,
// used) uint32 ids, and their weights, (rows, used) F32.
void moe_route(Recording& rec, KernelLibrary& lib, BufferRange logits, BufferRange experts, BufferRange weights,
               std::uint32_t rows, std::uint32_t n_expert, std::uint32_t used);
// out(pair, m) = expert(pair)'s (m, k) matrix x acts, pair = row * used + slot, for rows * used
// pairs, reading only the chosen experts' weights (weights: every expert's matrix in turn, of any
// type the mat-vec reads).
struct ExpertProduct {
  std::uint32_t m = 0, k = 0;        // one expert's matrix
  std::uint32_t rows = 0, used = 0;  // tokens, and experts a token
  bool acts_per_pair = false;        // acts (rows * used, k), each pair its own; else (rows, k)
  bool acts_q8 = false;              // acts as quantize_q8 makes them: where experts_read_q8
};
// Whether the expert products of `type` read int8 activations (quantize_q8's), as they must: block-
// quantized weights, whose products llama.cpp also makes on rounded activations; F32 otherwise.
bool experts_read_q8(WeightType type);
void matvec_experts(Recording& rec, KernelLibrary& lib, WeightType type, BufferRange weights, BufferRange acts,
                    BufferRange experts, BufferRange out, const ExpertProduct& shape);
// Whether matvec_experts reads weights of `type` as whole blocks with integer dot products (block-
// quantized weights on a device with them), and whether matvec_experts_sum applies: the down
// product and moe_combine in one dispatch, x(row, m) += sum over the row's slots of
// weight(row, slot) * expert(row * used + slot)'s (m, k) matrix x acts(row * used + slot) (acts per
// pair, int8), each row's slots added in a fixed order.
bool experts_int8(const DeviceFeatures& features, WeightType type);
void matvec_experts_sum(Recording& rec, KernelLibrary& lib, WeightType type, BufferRange weights, BufferRange acts_q8,
                        BufferRange experts, BufferRange expert_weights, BufferRange x, const ExpertProduct& shape);
// Where matvec_experts_glu finds each pair's expert: the ids moe_route wrote (experts), or, where
// n_expert is set, the router's logits, which each workgroup ranks itself as moe_route does (no
// routing dispatch before it; n_expert <= 1024, at most 64 experts a token), writing the ids and
// weights moe_route would write into experts and weights for matvec_experts_sum.
struct ExpertRoute {
  BufferRange experts{}, weights{};  // (rows, used) uint32 and F32
  BufferRange logits{};              // (rows, n_expert) F32
  std::uint32_t n_expert = 0;
};
// A SwiGLU's gate and up expert products for every pair in one dispatch, written as the down
// product's int8 input: out = quantize_q8_silu(gate product, up product) over (rows * used, m), the
// same bytes (shape: gate's, acts the tokens' int8 rows). Where experts_glu_applies: gate and up of
// one type that experts_int8 takes, m a multiple of 32.
bool experts_glu_applies(const DeviceFeatures& features, WeightType gate, WeightType up, std::uint32_t m);
void matvec_experts_glu(Recording& rec, KernelLibrary& lib, WeightType type, BufferRange gate, BufferRange up,
                        BufferRange acts_q8, const ExpertRoute& route, BufferRange out_q8, const ExpertProduct& shape);
// The same for wide steps: the pairs grouped by expert (moe_sort), each expert's weights read once
// for every tile of up to experts_tile_pairs of its pairs. order and tiles as moe_sort wrote them.
inline constexpr std::uint32_t experts_tile_pairs = 16;  // mul_mm_id.comp's TN
std::uint64_t moe_tiles_bytes(std::uint32_t pairs, std::uint32_t n_expert);
// order: (pairs) uint32, the pairs expert by expert; tiles: moe_tiles_bytes, the tiles of them, at
// most `tile` pairs each (experts_tile_pairs or more), and past them the sort's own counts. Three
// dispatches: each chunk of pairs counted per expert, the counts' prefix sums and the tiles, the
// pairs scattered to their places.
void moe_sort(Recording& rec, KernelLibrary& lib, BufferRange experts, BufferRange order, BufferRange tiles,
              std::uint32_t pairs, std::uint32_t n_expert, std::uint32_t tile = experts_tile_pairs);
void matmul_experts(Recording& rec, KernelLibrary& lib, WeightType type, BufferRange weights, BufferRange acts,
                    BufferRange order, BufferRange tiles, BufferRange out, const ExpertProduct& shape,
                    std::uint32_t n_expert);
// matmul_experts on the tensor cores (mul_mm_staged.comp's EXPERTS): a workgroup multiplies 128 rows
// of one expert by one tile of up to tile_pairs of its pairs (64 or 32: moe_sort's `tile`), the
// weights decoded to F16 as they are loaded, once a tile, the activations gathered by the pairs'
// order. acts16: F16 rows of k (rows, or rows * used with acts_per_pair; no padding), shape.acts_q8
// false. experts_coopmat_applies: the types the narrow path reads (F16 and every quantized one, not
// F32 or BF16), on 16x16x16 tiles and subgroups of 32, K a multiple of 128.
inline constexpr std::uint32_t experts_coopmat_pairs = 64;
bool experts_coopmat_applies(const DeviceFeatures& features, WeightType type, std::uint32_t m, std::uint32_t k);
void matmul_experts_coopmat(Recording& rec, KernelLibrary& lib, WeightType type, BufferRange weights,
                            BufferRange acts16, BufferRange order, BufferRange tiles, BufferRange out,
                            const ExpertProduct& shape, std::uint32_t n_expert,
                            std::uint32_t tile_pairs = experts_coopmat_pairs);
// Its module for tile_pairs (128 rows, 4 subgroups of two 16-row fragments, by 64 or 32 columns, 2 or
// 4 blocks of K a stage: the narrow path's shapes for 64 and 32 columns), and every one the host may
// ask for, which shaders/CMakeLists.txt must build.
std::string experts_coopmat_module(WeightType type, std::uint32_t tile_pairs, bool glu = false);
std::vector<std::string> experts_coopmat_modules();
// A wide step's gate and up expert products and silu(gate) * up in one dispatch (mul_mm_staged.comp's
// EXPERTS with GLU), as matmul_experts_coopmat makes each (tiles of tile_pairs, acts16 a row a token)
// from F16 gate and up matrices (every expert's m x k in turn, each): out16 (pairs, m) F16, the down
// product's input, with no gate or up output and no silu_mul_f16. experts_glu_applies: F16 weights
// where matmul_experts_coopmat takes them, m % 16 == 0.
bool experts_glu_applies(const DeviceFeatures& features, std::uint32_t m, std::uint32_t k);
void matmul_experts_glu(Recording& rec, KernelLibrary& lib, BufferRange gate16, BufferRange up16, BufferRange acts16,
                        BufferRange order, BufferRange tiles, BufferRange out16, const ExpertProduct& shape,
                        std::uint32_t n_expert, std::uint32_t tile_pairs = experts_coopmat_pairs);
// Whether a wide step first decodes every expert's m x k matrix of quantized `type` to F16
// (dequantize_f16 of the whole tensor, n_expert * m rows, into a step's scratch) and gives
// matmul_experts_coopmat the F16 matrices, instead of decoding the weights in every tile: where
// choice.experts_f16 asks and the tensor-core product takes them. Decoding first writes and reads 4
// bytes a weight more, once a step; in the tiles the decoding holds each workgroup's loads up (H200,
// qwen3moe-30b-a3b at 512 tokens: 21-24 TFLOP/s). Decoding first was slower where measured (H200,
// qwen3moe-30b-a3b Q4_K_M, 512-token prefill, 32 pairs an expert: 6,430 -> 6,030 tok/s,
// bench/results/final-2026-11-29-h200), so it is not the default, nor its 805 MB of F16 scratch.
bool experts_dequantize(const DeviceFeatures& features, WeightType type, std::uint32_t m, std::uint32_t k,
                        const KernelChoice& choice = {});
// x(row, n) += sum over the row's slots of weight(row, slot) * outputs(row * used + slot, n).
void moe_combine(Recording& rec, KernelLibrary& lib, BufferRange outputs, BufferRange weights, BufferRange x,
                 std::uint32_t rows, std::uint32_t n, std::uint32_t used);

}  // namespace mqlm::gpu::ops
