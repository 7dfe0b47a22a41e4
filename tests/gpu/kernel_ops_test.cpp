// One table-driven test: every GPU op and weight type against the plain C++ reference, by
// normalised squared error (sum (gpu - ref)^2 / sum ref^2), on odd sizes: shapes that are not
// multiples of tiles, one token and many, contexts longer than one KV page. Adding an op or a
// shape means adding rows to the table in all_cases().
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "gpu/fragment_layout.hpp"
#include "gpu/ops.hpp"
#include "gpu_fixture.hpp"
#include "gpu/reference_ops.hpp"
#include "shaders/embedded_shaders.hpp"

namespace mqlm::gpu {
namespace {

using testing::Gpu;
using testing::normalised_error;
using testing::random_vec;
using testing::run_step;
using testing::shared_gpu;
using Vec = std::vector<float>;

struct Outcome {
  std::vector<double> got, want;
};

struct OpCase {
  std::string name;
  double tolerance;  // on the normalised squared error; 0: must match exactly
  std::function<Outcome(Gpu&)> run;
};

std::ostream& operator<<(std::ostream& os, const OpCase& c) { return os << c.name; }


// Integers in [0, levels): rows with many ties.
Vec tied_vec(std::size_t n, std::uint64_t seed, int levels) {
  std::mt19937_64 rng(seed);
  Vec v(n);
  for (auto& x : v) x = static_cast<float>(std::uniform_int_distribution<int>(0, levels - 1)(rng)) - levels / 2;
  return v;
}

template <class T>
std::vector<double> doubles(const std::vector<T>& v) {
  return std::vector<double>(v.begin(), v.end());
}

// The activations a mat-vec of `type` on F32 or F16 activations works on: int8 blocks where the
// device takes that path (the types whose kernels quantize them in place).
Vec as_matvec_sees(Gpu& gpu, WeightType type, const Vec& acts) {
  const bool int8 = ops::matvec_int8(gpu.device.features(), type) && ops::matvec_quantizes_in_place(type);
  return int8 ? reference::int8_blocks(acts) : acts;
}

// Int8 activations: one rounding may land the other way on the GPU (its 1 / amax is a few ulp
// off), an error of amax / 127 on one product term, which this bound allows a few of.
constexpr double int8_tolerance = 1e-6;

BufferRange r(const PoolBuffer& b) { return b.range(); }

std::size_t k_for(WeightType type, bool large) {
  switch (block_elements(type)) {
    case 256: return large ? 1024 : 512;
    case 32: return large ? 1024 : 160;
    default: return large ? 1021 : 97;
  }
}

void add_elementwise_cases(std::vector<OpCase>& cases) {
  for (auto [rows, n] : {std::pair{1, 1}, {7, 1000}, {3, 4099}}) {
    cases.push_back({fmt::format("rms_norm_{}x{}", rows, n), 1e-10, [rows, n](Gpu& gpu) {
                       auto x = random_vec(rows * n, 1), w = random_vec(n, 2);
                       auto bx = gpu.up(x), bw = gpu.up(w), out = gpu.scratch(x.size() * 4);
                       run_step(gpu, [&](Recording& rec) { ops::rms_norm(rec, gpu.kernels, r(bx), r(bw), r(out), rows, n, 1e-5f); });
                       return Outcome{doubles(gpu.down<float>(out, x.size())), doubles(reference::rms_norm(x, w, rows, n, 1e-5f))};
                     }});
    cases.push_back({fmt::format("rms_norm_add_{}x{}", rows, n), 1e-10, [rows, n](Gpu& gpu) {
                       auto x = random_vec(rows * n, 11), w = random_vec(n, 12), io = random_vec(rows * n, 13);
                       auto bx = gpu.up(x), bw = gpu.up(w), bio = gpu.up(io);
                       run_step(gpu, [&](Recording& rec) { ops::rms_norm_add(rec, gpu.kernels, r(bx), r(bw), r(bio), rows, n, 1e-5f); });
                       return Outcome{doubles(gpu.down<float>(bio, io.size())),
                                      doubles(reference::add(io, reference::rms_norm(x, w, rows, n, 1e-5f)))};
                     }});
  }
  for (int n : {1, 1000, 70001}) {
    cases.push_back({fmt::format("add_{}", n), 0, [n](Gpu& gpu) {
                       auto a = random_vec(n, 3), b = random_vec(n, 4);
                       auto ba = gpu.up(a), bb = gpu.up(b), out = gpu.scratch(n * 4);
                       run_step(gpu, [&](Recording& rec) { ops::add(rec, gpu.kernels, r(ba), r(bb), r(out), n); });
                       return Outcome{doubles(gpu.down<float>(out, n)), doubles(reference::add(a, b))};
                     }});
    cases.push_back({fmt::format("silu_mul_{}", n), 1e-10, [n](Gpu& gpu) {
                       auto a = random_vec(n, 5, 3.0f), b = random_vec(n, 6);
                       auto ba = gpu.up(a), bb = gpu.up(b), out = gpu.scratch(n * 4);
                       run_step(gpu, [&](Recording& rec) { ops::silu_mul(rec, gpu.kernels, r(ba), r(bb), r(out), n); });
                       return Outcome{doubles(gpu.down<float>(out, n)), doubles(reference::silu_mul(a, b))};
                     }});
  }
  for (int n : {1, 70001}) {
    cases.push_back({fmt::format("gelu_mul_{}", n), 1e-10, [n](Gpu& gpu) {
                       auto a = random_vec(n, 5, 6.0f), b = random_vec(n, 6);
                       auto ba = gpu.up(a), bb = gpu.up(b), out = gpu.scratch(n * 4);
                       run_step(gpu, [&](Recording& rec) { ops::gelu_mul(rec, gpu.kernels, r(ba), r(bb), r(out), n); });
                       return Outcome{doubles(gpu.down<float>(out, n)), doubles(reference::gelu_mul(a, b))};
                     }});
    cases.push_back({fmt::format("scale_{}", n), 0, [n](Gpu& gpu) {
                       auto a = random_vec(n, 7), want = a;
                       for (float& v : want) v *= 45.25f;
                       auto ba = gpu.up(a);
                       run_step(gpu, [&](Recording& rec) { ops::scale(rec, gpu.kernels, r(ba), r(ba), n, 45.25f); });
                       return Outcome{doubles(gpu.down<float>(ba, n)), doubles(want)};
                     }});
    // Values far past the cap too (tanh's argument up to 20).
    cases.push_back({fmt::format("soft_cap_{}", n), 1e-10, [n](Gpu& gpu) {
                       auto a = random_vec(n, 8, 600.0f);
                       auto ba = gpu.up(a), out = gpu.scratch(n * 4);
                       run_step(gpu, [&](Recording& rec) { ops::soft_cap(rec, gpu.kernels, r(ba), r(out), n, 30.0f); });
                       return Outcome{doubles(gpu.down<float>(out, n)), doubles(reference::soft_cap(a, 30.0f))};
                     }});
  }
  for (auto [rows, n] : {std::pair{1, 1}, {5, 37}, {2, 3000}}) {
    cases.push_back({fmt::format("softmax_{}x{}", rows, n), 1e-10, [rows, n](Gpu& gpu) {
                       auto x = random_vec(rows * n, 7, 4.0f);
                       auto bx = gpu.up(x), out = gpu.scratch(x.size() * 4);
                       run_step(gpu, [&](Recording& rec) { ops::softmax(rec, gpu.kernels, r(bx), r(out), rows, n, 0.7f); });
                       return Outcome{doubles(gpu.down<float>(out, x.size())), doubles(reference::softmax(x, rows, n, 0.7f))};
                     }});
  }
  struct RopeCase {
    const char* name;
    ops::RopeShape shape;
  };
  // Llama 3.1's factors (1 for the fast pairs, 8 for the slow, a blend between) and ones far off.
  static const std::vector<float> llama3_factors = [] {
    std::vector<float> f(32);
    for (std::size_t i = 0; i < f.size(); ++i) f[i] = i < 10 ? 1.0f : i > 20 ? 8.0f : 1.0f + 0.7f * float(i - 10);
    return f;
  }();
  static const std::vector<float> wild_factors(16, 1000.0f);
  const ops::RopeYarn yarn{1.0f, 0.9f, 32.0f, 1.0f, 64};  // 4x past a context of 64
  for (auto c : {RopeCase{"normal_1tok_d64", {1, 4, 64, 0, 10000.0f, 1.0f, false}},
                 RopeCase{"neox_5tok_d128", {5, 3, 128, 0, 500000.0f, 1.0f, true}},
                 RopeCase{"neox_linear_scaled", {7, 2, 64, 0, 10000.0f, 0.25f, true}},
                 RopeCase{"normal_partial_dims", {3, 2, 64, 32, 10000.0f, 1.0f, false}},
                 RopeCase{"neox_partial_dims", {3, 2, 64, 16, 10000.0f, 1.0f, true}},
                 RopeCase{"normal_llama3_factors", {6, 2, 64, 0, 500000.0f, 1.0f, false, {}, llama3_factors}},
                 RopeCase{"neox_partial_wild_factors", {4, 2, 64, 32, 10000.0f, 1.0f, true, {}, wild_factors}},
                 RopeCase{"normal_yarn", {7, 2, 64, 0, 10000.0f, 0.25f, false, yarn}},
                 RopeCase{"neox_yarn_d128", {7, 2, 128, 0, 1000000.0f, 0.25f, true, yarn}}}) {
    cases.push_back({fmt::format("rope_{}", c.name), 1e-9, [c](Gpu& gpu) {
                       const auto& s = c.shape;
                       auto x = random_vec(s.tokens * s.heads * s.head_dim, 8);
                       std::vector<std::int32_t> pos(s.tokens);
                       for (std::size_t t = 0; t < pos.size(); ++t) pos[t] = static_cast<std::int32_t>(3 + 37 * t);
                       auto bx = gpu.up(x), bp = gpu.up(pos), bf = gpu.up(ops::rope_frequencies(s));
                       auto out = gpu.scratch(x.size() * 4);
                       run_step(gpu, [&](Recording& rec) { ops::rope(rec, gpu.kernels, r(bx), r(bp), r(bf), r(out), s); });
                       return Outcome{doubles(gpu.down<float>(out, x.size())), doubles(reference::rope(x, pos, s))};
                     }});
  }
}

void add_weight_cases(std::vector<OpCase>& cases) {
  for (auto type : all_weight_types) {
    std::string tname(weight_type_name(type));
    cases.push_back({"get_rows_" + tname, 1e-12, [type](Gpu& gpu) {
                       std::size_t vocab = 37, k = k_for(type, false);
                       auto bytes = quantize(type, random_vec(vocab * k, 9), k);
                       auto table = dequantize(type, bytes, vocab, k);
                       std::vector<std::uint32_t> ids = {0, 36, 5, 5, 17};
                       auto bw = gpu.up(bytes), bi = gpu.up(ids), out = gpu.scratch(ids.size() * k * 4);
                       run_step(gpu, [&](Recording& rec) {
                         ops::get_rows(rec, gpu.kernels, type, r(bw), r(bi), r(out), k, ids.size());
                       });
                       Vec want;
                       for (auto id : ids) want.insert(want.end(), table.begin() + id * k, table.begin() + (id + 1) * k);
                       return Outcome{doubles(gpu.down<float>(out, want.size())), doubles(want)};
                     }});
    struct Shape {
      ops::MatmulPath path;
      std::size_t m, n;
      bool large_k;
      bool aligned = false;
    };
    // `aligned`: K a multiple of 256, which takes the whole-block vector kernel for float types too
    // (odd K takes the generic one).
    for (auto shape : {Shape{ops::MatmulPath::vector, 67, 1, false}, Shape{ops::MatmulPath::vector, 33, 5, true},
                       Shape{ops::MatmulPath::vector, 3, 8, false}, Shape{ops::MatmulPath::tiled, 67, 9, false},
                       Shape{ops::MatmulPath::tiled, 130, 70, true}, Shape{ops::MatmulPath::vector, 131, 1, false, true},
                       Shape{ops::MatmulPath::vector, 9, 2, false, true}, Shape{ops::MatmulPath::vector, 5, 8, false, true}}) {
      for (bool f16 : {false, true}) {
        std::size_t k = shape.aligned ? 768 : k_for(type, shape.large_k);
        std::string name = fmt::format("matmul_{}_{}_{}x{}x{}_{}", tname, ops::matmul_path_name(shape.path), shape.m, k,
                                       shape.n, f16 ? "f16acts" : "f32acts");
        const bool int8 = shape.path == ops::MatmulPath::vector && ops::matvec_quantizes_in_place(type);
        cases.push_back({name, int8 ? int8_tolerance : 1e-10, [type, shape, f16, k](Gpu& gpu) {
                           auto bytes = quantize(type, random_vec(shape.m * k, 10), k);
                           auto weights = dequantize(type, bytes, shape.m, k);
                           auto acts = random_vec(shape.n * k, 11);
                           std::vector<std::uint16_t> halves(acts.size());
                           for (std::size_t i = 0; i < acts.size(); ++i) {
                             halves[i] = float_to_half(acts[i]);
                             if (f16) acts[i] = half_to_float(halves[i]);
                           }
                           auto bw = gpu.up(bytes), out = gpu.scratch(shape.n * shape.m * 4);
                           auto ba = f16 ? gpu.up(halves) : gpu.up(acts);
                           run_step(gpu, [&](Recording& rec) {
                             ops::matmul(rec, gpu.kernels, type, r(bw), r(ba), f16, r(out), shape.m, k, shape.n, shape.path);
                           });
                           if (shape.path == ops::MatmulPath::vector) acts = as_matvec_sees(gpu, type, acts);
                           return Outcome{doubles(gpu.down<float>(out, shape.n * shape.m)),
                                          doubles(reference::matmul(weights, acts, shape.m, k, shape.n))};
                         }});
      }
    }
  }
}

// A paged KV cache filled through kv_write: every position of every sequence, pages handed out
// in a shuffled order so that no sequence's pages are contiguous.
struct PagedCache {
  reference::LogicalCache logical;  // values rounded to F16, as the cache stores them
  std::vector<std::uint32_t> block_tables;
  std::uint32_t max_pages = 0, slots = 0;
  PoolBuffer k_cache, v_cache, tables;
  bool written_exactly = false;
};

PagedCache build_cache(Gpu& gpu, const std::vector<std::uint32_t>& lengths, std::uint32_t row, std::uint32_t page_size) {
  PagedCache c;
  std::uint32_t pages = 0;
  for (auto len : lengths) {
    std::uint32_t p = (len + page_size - 1) / page_size;
    c.max_pages = std::max(c.max_pages, p);
    pages += p;
  }
  std::vector<std::uint32_t> order(pages + 1);  // one spare page nobody uses
  std::iota(order.begin(), order.end(), 0u);
  std::shuffle(order.begin(), order.end(), std::mt19937(12));
  c.block_tables.assign(lengths.size() * c.max_pages, 0);
  std::size_t next = 0;
  Vec k_new, v_new;
  std::vector<std::uint32_t> slots;
  for (std::size_t s = 0; s < lengths.size(); ++s) {
    for (std::uint32_t p = 0; p * page_size < lengths[s]; ++p) c.block_tables[s * c.max_pages + p] = order[next++];
    auto k = random_vec(lengths[s] * row, 100 + s), v = random_vec(lengths[s] * row, 200 + s);
    c.logical.keys.emplace_back();
    c.logical.values.emplace_back();
    for (std::uint32_t j = 0; j < lengths[s]; ++j) {
      Vec kr(k.begin() + j * row, k.begin() + (j + 1) * row), vr(v.begin() + j * row, v.begin() + (j + 1) * row);
      k_new.insert(k_new.end(), kr.begin(), kr.end());
      v_new.insert(v_new.end(), vr.begin(), vr.end());
      for (auto& x : kr) x = half_to_float(float_to_half(x));
      for (auto& x : vr) x = half_to_float(float_to_half(x));
      c.logical.keys[s].push_back(kr);
      c.logical.values[s].push_back(vr);
      slots.push_back(c.block_tables[s * c.max_pages + j / page_size] * page_size + j % page_size);
    }
  }
  c.slots = (pages + 1) * page_size;
  c.k_cache = gpu.pool.allocate(std::uint64_t{c.slots} * row * 2, "kv");
  c.v_cache = gpu.pool.allocate(std::uint64_t{c.slots} * row * 2, "kv");
  c.tables = gpu.up(c.block_tables);
  auto bk = gpu.up(k_new), bv = gpu.up(v_new), bs = gpu.up(slots);
  run_step(gpu, [&](Recording& rec) {
    ops::kv_write(rec, gpu.kernels, r(bk), r(bv), r(c.k_cache), r(c.v_cache), r(bs), slots.size(), row);
  });
  auto k_cache = gpu.down<std::uint16_t>(c.k_cache, std::size_t{c.slots} * row);
  auto v_cache = gpu.down<std::uint16_t>(c.v_cache, std::size_t{c.slots} * row);
  c.written_exactly = true;
  for (std::size_t t = 0; t < slots.size(); ++t) {
    for (std::uint32_t i = 0; i < row; ++i) {
      c.written_exactly &= k_cache[slots[t] * row + i] == float_to_half(k_new[t * row + i]);
      c.written_exactly &= v_cache[slots[t] * row + i] == float_to_half(v_new[t * row + i]);
    }
  }
  return c;
}

void add_attention_cases(std::vector<OpCase>& cases) {
  struct AttnCase {
    std::string name;
    std::uint32_t heads, kv_heads, head_dim;
    std::vector<std::uint32_t> lengths;           // of each sequence in the cache
    std::vector<std::pair<std::uint32_t, std::uint32_t>> queries;  // (sequence, position)
    ops::AttentionPath path = ops::AttentionPath::automatic;
    std::uint32_t splits = 0;
    std::uint32_t window = 0;
    float softcap = 0;
    std::uint32_t head_group = 0;
  };
  using Path = ops::AttentionPath;
  std::vector<AttnCase> table;
  // The head dims models use (their scores: four threads a key at 16 and 80, eight a pair of keys
  // for the others; their value loops: 120 of 128 threads at 80 and 96, two dimensions a thread of
  // the one-pass kernel at 256), and two no model here uses: 48 (ten key subsets of 12 chunks, four
  // keys a thread) and 160 (three of 40, eleven keys a thread, the last past the tile).
  for (std::uint32_t d : {16u, 32u, 48u, 64u, 80u, 96u, 128u, 160u, 256u}) {
    table.push_back({fmt::format("decode_4seqs_d{}", d), 8, 2, d, {1, 17, 40, 130}, {{0, 0}, {1, 16}, {2, 39}, {3, 129}}});
  }
  for (std::uint32_t d : {64u, 80u, 96u, 128u, 256u}) {
    std::vector<std::pair<std::uint32_t, std::uint32_t>> chunk;
    for (std::uint32_t p = 16; p < 37; ++p) chunk.push_back({1, p});
    table.push_back({fmt::format("prefill_chunk_d{}", d), 4, 4, d, {5, 37}, chunk});
    table.push_back({fmt::format("prefill_chunk_one_pass_d{}", d), 4, 4, d, {5, 37}, chunk, Path::one_pass});
    // Decode of sequences 1, 17, 300 and 2000 long: the split path (most splits of the short
    // ones are empty), the same with fixed split counts (1 writes the output directly), and the
    // one-pass kernel.
    for (auto [heads, kv_heads] : {std::pair{4u, 4u}, {8u, 2u}}) {
      std::string name = fmt::format("decode_ctx1_17_300_2000_gqa{}_d{}", heads / kv_heads, d);
      std::vector<std::pair<std::uint32_t, std::uint32_t>> decode{{0, 0}, {1, 16}, {2, 299}, {3, 1999}};
      table.push_back({name, heads, kv_heads, d, {1, 17, 300, 2000}, decode});
      table.push_back({name + "_split1", heads, kv_heads, d, {1, 17, 300, 2000}, decode, Path::split, 1});
      table.push_back({name + "_split7", heads, kv_heads, d, {1, 17, 300, 2000}, decode, Path::split, 7});
      table.push_back({name + "_one_pass", heads, kv_heads, d, {1, 17, 300, 2000}, decode, Path::one_pass});
    }
  }
  table.push_back({"decode_ctx2000_gqa8_d128", 16, 2, 128, {2000}, {{0, 1999}}});
  // qwen3moe-30b-a3b's groups of 8 query heads in workgroups of 4 and of 2 (AttentionShape::head_group).
  for (std::uint32_t hg : {4u, 2u}) {
    table.push_back({fmt::format("decode_ctx1_17_300_2000_gqa8_d128_hg{}", hg), 16, 2, 128, {1, 17, 300, 2000},
                     {{0, 0}, {1, 16}, {2, 299}, {3, 1999}}, Path::automatic, 0, 0, 0, hg});
  }
  // Head dims the one-pass kernel alone takes (not multiples of 16).
  table.push_back({"prefill_chunk_d40", 4, 2, 40, {5, 37}, {{1, 30}, {1, 31}, {0, 4}}});
  table.push_back({"decode_ctx33_gqa3_d64", 6, 2, 64, {40}, {{0, 32}}, Path::split, 2});
  std::vector<std::pair<std::uint32_t, std::uint32_t>> full;
  for (std::uint32_t p = 0; p < 150; ++p) full.push_back({0, p});
  table.push_back({"prefill_150_gqa8_d64", 8, 1, 64, {150}, full});
  table.push_back({"prefill_150_gqa8_d64_split3", 8, 1, 64, {150}, full, Path::split, 3});
  // Gemma's sliding window (positions before it, at it, past it by one and far past it) and score
  // soft cap (the scores scaled up so that the cap bites), on every path.
  for (std::uint32_t d : {128u, 256u}) {
    const std::vector<std::pair<std::uint32_t, std::uint32_t>> decode{{0, 0}, {1, 16}, {2, 299}, {3, 1999}};
    for (auto [path, splits, label] : {std::tuple{Path::automatic, 0u, ""}, {Path::split, 1u, "_split1"},
                                       {Path::split, 7u, "_split7"}, {Path::one_pass, 0u, "_one_pass"}}) {
      table.push_back({fmt::format("decode_window17_softcap_d{}{}", d, label), 8, 2, d, {1, 17, 300, 2000}, decode, path,
                       splits, 17, 0.5f});
      table.push_back({fmt::format("prefill_150_window40_d{}{}", d, label), 4, 2, d, {150}, full, path, splits, 40});
    }
  }

  for (const auto& c : table) {
    cases.push_back({"attention_" + c.name, 1e-9, [c](Gpu& gpu) {
                       const std::uint32_t page_size = 16;
                       auto cache = build_cache(gpu, c.lengths, c.kv_heads * c.head_dim, page_size);
                       ops::AttentionShape s{static_cast<std::uint32_t>(c.queries.size()), c.heads, c.kv_heads, c.head_dim,
                                             page_size, cache.max_pages, 1.0f / std::sqrt(float(c.head_dim)), c.path,
                                             c.splits};
                       s.window = c.window;
                       s.softcap = c.softcap;
                       s.head_group = c.head_group;
                       auto q = random_vec(s.tokens * s.heads * s.head_dim, 13);
                       std::vector<std::uint32_t> seq_pos, seq, pos;
                       for (auto [sq, p] : c.queries) {
                         seq_pos.insert(seq_pos.end(), {sq, p});
                         seq.push_back(sq);
                         pos.push_back(p);
                       }
                       auto bq = gpu.up(q), bsp = gpu.up(seq_pos), out = gpu.scratch(q.size() * 4);
                       auto scratch = gpu.scratch(ops::attention_scratch_bytes(s));
                       run_step(gpu, [&](Recording& rec) {
                         ops::attention(rec, gpu.kernels, r(bq), r(cache.k_cache), r(cache.v_cache), r(cache.tables), r(bsp),
                                        r(scratch), r(out), s);
                       });
                       auto want = doubles(reference::attention(q, cache.logical, seq, pos, s));
                       auto got = doubles(gpu.down<float>(out, q.size()));
                       if (!cache.written_exactly) got.assign(got.size(), NAN);  // kv_write put something wrong in a page
                       return Outcome{got, want};
                     }});
  }
}

void add_sampling_cases(std::vector<OpCase>& cases) {
  // One chunk, several, a vocabulary's worth; with 4 levels the largest value comes many times in
  // each thread's share and each chunk: the lowest index must win everywhere.
  for (auto [n, levels] : {std::pair{1u, 50}, {1000u, 50}, {5000u, 4}, {130000u, 4}}) {
    cases.push_back({fmt::format("argmax_3x{}", n), 0, [n, levels](Gpu& gpu) {
                       auto x = tied_vec(3 * n, 14, levels);
                       auto bx = gpu.up(x), out = gpu.scratch(3 * 4);
                       auto scratch = gpu.scratch(ops::argmax_scratch_bytes(3, n));
                       run_step(gpu, [&](Recording& rec) {
                         ops::argmax(rec, gpu.kernels, r(bx), r(scratch), r(out), 3, n);
                       });
                       return Outcome{doubles(gpu.down<std::uint32_t>(out, 3)), doubles(reference::argmax(x, 3, n))};
                     }});
  }
  for (auto [n, k] : {std::pair{5u, 5u}, {1000u, 1u}, {3000u, 40u}, {130000u, 64u}, {5000u, 256u}}) {
    cases.push_back({fmt::format("topk_2x{}_k{}", n, k), 0, [n, k](Gpu& gpu) {
                       std::uint32_t rows = 2;
                       auto x = tied_vec(rows * n, 15, 5000);
                       auto bx = gpu.up(x), values = gpu.scratch(rows * k * 4), indices = gpu.scratch(rows * k * 4);
                       auto scratch = gpu.scratch(ops::topk_scratch_bytes(rows, n, k));
                       run_step(gpu, [&](Recording& rec) {
                         ops::topk(rec, gpu.kernels, r(bx), r(scratch), r(values), r(indices), rows, n, k);
                       });
                       Vec want_v;
                       std::vector<std::uint32_t> want_i;
                       reference::topk(x, rows, n, k, want_v, want_i);
                       auto got = doubles(gpu.down<float>(values, rows * k));
                       auto got_i = doubles(gpu.down<std::uint32_t>(indices, rows * k));
                       got.insert(got.end(), got_i.begin(), got_i.end());
                       auto want = doubles(want_v);
                       want.insert(want.end(), want_i.begin(), want_i.end());
                       return Outcome{got, want};
                     }});
  }
}

// Each pair's output row (pair, m): its expert's (m, k) matrix of `weights` (every expert's in turn)
// times its row of acts (its token's, or its own with per_pair).
Vec experts_reference(const Vec& weights, const Vec& acts, const std::vector<std::uint32_t>& ids, std::uint32_t m,
                      std::uint32_t k, std::uint32_t used, bool per_pair) {
  Vec want;
  for (std::uint32_t pair = 0; pair < ids.size(); ++pair) {
    const std::size_t row = per_pair ? pair : pair / used;
    Vec w(weights.begin() + std::size_t{ids[pair]} * m * k, weights.begin() + std::size_t{ids[pair] + 1} * m * k);
    Vec x(acts.begin() + row * k, acts.begin() + (row + 1) * k);
    auto y = reference::matmul(w, x, m, k, 1);
    want.insert(want.end(), y.begin(), y.end());
  }
  return want;
}

// Every pair's product with its expert, one row of the input a token or one a pair (per_pair), by
// the mat-vec or, for 40 tokens of 2 pairs over 4 experts (tiles of 16, a last one part full; 70
// rows: two row groups), by the tiled product after moe_sort.
Outcome expert_product_outcome(Gpu& gpu, WeightType type, bool per_pair, bool tiled, bool q8) {
  const std::uint32_t experts = 4, m = tiled ? 70 : 33, k = static_cast<std::uint32_t>(k_for(type, false)),
                      rows = tiled ? 40 : 3, used = 2, pairs = rows * used, cols = per_pair ? pairs : rows;
  auto bytes = quantize(type, random_vec(std::size_t{experts} * m * k, 12), k);
  auto weights = dequantize(type, bytes, std::size_t{experts} * m, k);
  auto acts = random_vec(std::size_t{cols} * k, 13);
  std::vector<std::uint32_t> ids(pairs);
  for (std::uint32_t i = 0; i < pairs; ++i) ids[i] = (i * 7 + i / 5) % experts;
  auto bw = gpu.up(bytes), ba = gpu.up(acts), bi = gpu.up(ids), out = gpu.scratch(pairs * m * 4);
  auto a8 = gpu.scratch(ops::q8_acts_bytes(k, cols));
  auto order = gpu.scratch(pairs * 4), tiles = gpu.scratch(ops::moe_tiles_bytes(pairs, experts));
  run_step(gpu, [&](Recording& rec) {
    if (q8) ops::quantize_q8(rec, gpu.kernels, r(ba), r(a8), k, cols);
    const ops::ExpertProduct shape{m, k, rows, used, per_pair, q8};
    if (tiled) {
      ops::moe_sort(rec, gpu.kernels, r(bi), r(order), r(tiles), pairs, experts);
      ops::matmul_experts(rec, gpu.kernels, type, r(bw), q8 ? r(a8) : r(ba), r(order), r(tiles), r(out), shape, experts);
    } else {
      ops::matvec_experts(rec, gpu.kernels, type, r(bw), q8 ? r(a8) : r(ba), r(bi), r(out), shape);
    }
  });
  const Vec want = experts_reference(weights, q8 ? reference::int8_blocks(acts) : acts, ids, m, k, used, per_pair);
  return Outcome{doubles(gpu.down<float>(out, want.size())), doubles(want)};
}

// The down product and the weighted sum in one (matvec_experts_sum): x += each token's slots'
// products, each pair its own int8 input row, 33 rows (a last row group part full).
Outcome experts_sum_outcome(Gpu& gpu, WeightType type, std::uint32_t used) {
  const std::uint32_t experts = 2 * used, m = 33, k = static_cast<std::uint32_t>(k_for(type, false)), rows = 3,
                      pairs = rows * used;
  auto bytes = quantize(type, random_vec(std::size_t{experts} * m * k, 12), k);
  auto weights = dequantize(type, bytes, std::size_t{experts} * m, k);
  auto acts = random_vec(std::size_t{pairs} * k, 13), slot_weights = random_vec(pairs, 14);
  auto x = random_vec(rows * m, 15);
  std::vector<std::uint32_t> ids(pairs);
  for (std::uint32_t i = 0; i < pairs; ++i) ids[i] = (i * 7 + i / 5) % experts;
  auto bw = gpu.up(bytes), ba = gpu.up(acts), bi = gpu.up(ids), bs = gpu.up(slot_weights), bx = gpu.up(x);
  auto a8 = gpu.scratch(ops::q8_acts_bytes(k, pairs));
  run_step(gpu, [&](Recording& rec) {
    ops::quantize_q8(rec, gpu.kernels, r(ba), r(a8), k, pairs);
    ops::matvec_experts_sum(rec, gpu.kernels, type, r(bw), r(a8), r(bi), r(bs), r(bx), {m, k, rows, used, true, true});
  });
  const Vec seen = reference::int8_blocks(acts);
  Vec want = x;
  for (std::uint32_t pair = 0; pair < pairs; ++pair) {
    Vec w(weights.begin() + std::size_t{ids[pair]} * m * k, weights.begin() + std::size_t{ids[pair] + 1} * m * k);
    auto y = reference::matmul(w, Vec(seen.begin() + pair * k, seen.begin() + (pair + 1) * k), m, k, 1);
    for (std::uint32_t i = 0; i < m; ++i) want[pair / used * m + i] += slot_weights[pair] * y[i];
  }
  return Outcome{doubles(gpu.down<float>(bx, want.size())), doubles(want)};
}

// A mixture of experts' routing (ties of logits broken toward the lower index), its products
// (every weight type; one input row a token, or one a pair; int8 inputs where the type takes them)
// and its weighted sum.
void add_experts_cases(std::vector<OpCase>& cases) {
  for (auto [rows, n_expert, used, levels] :
       {std::tuple{5u, 8u, 2u, 0}, {3u, 128u, 8u, 0}, {4u, 16u, 4u, 3}, {2u, 200u, 8u, 4}}) {
    cases.push_back({fmt::format("moe_route_{}x{}_top{}{}", rows, n_expert, used, levels ? "_ties" : ""), 1e-12,
                     [=](Gpu& gpu) {
                       auto logits = levels ? tied_vec(rows * n_expert, 11, levels) : random_vec(rows * n_expert, 11, 3.0f);
                       auto bl = gpu.up(logits), ids = gpu.scratch(rows * used * 4), w = gpu.scratch(rows * used * 4);
                       run_step(gpu, [&](Recording& rec) { ops::moe_route(rec, gpu.kernels, r(bl), r(ids), r(w), rows, n_expert, used); });
                       Vec want_w;
                       std::vector<std::uint32_t> want_ids;
                       reference::moe_route(logits, rows, n_expert, used, want_w, want_ids);
                       auto got = doubles(gpu.down<std::uint32_t>(ids, rows * used)), want = doubles(want_ids);
                       for (float v : gpu.down<float>(w, rows * used)) got.push_back(v);
                       want.insert(want.end(), want_w.begin(), want_w.end());
                       return Outcome{got, want};
                     }});
  }
  // The router's product in wide steps: rows not a multiple of its 4 a workgroup, K over one chunk
  // of 1024 and not a multiple of it, 256 experts (a slot per lane on subgroups of 8 too).
  for (auto type : {WeightType::f32, WeightType::f16, WeightType::bf16}) {
    for (auto [n_expert, k, rows] : {std::tuple{8u, 64u, 5u}, {128u, 2048u, 40u}, {200u, 96u, 9u}, {256u, 1100u, 3u}}) {
      cases.push_back({fmt::format("router_logits_{}_{}x{}x{}", weight_type_name(type), n_expert, k, rows), 1e-10,
                       [=](Gpu& gpu) {
                         auto bytes = quantize(type, random_vec(n_expert * k, 17), k);
                         auto weights = dequantize(type, bytes, n_expert, k);
                         auto acts = random_vec(rows * k, 18);
                         auto bw = gpu.up(bytes), ba = gpu.up(acts), out = gpu.scratch(rows * n_expert * 4);
                         run_step(gpu, [&](Recording& rec) {
                           ops::router_logits(rec, gpu.kernels, type, r(bw), r(ba), r(out), n_expert, k, rows);
                         });
                         return Outcome{doubles(gpu.down<float>(out, rows * n_expert)),
                                        doubles(reference::matmul(weights, acts, n_expert, k, rows))};
                       }});
    }
  }
  for (auto type : all_weight_types) {
    for (auto [per_pair, tiled] : {std::pair{false, false}, {true, false}, {false, true}, {true, true}}) {
      const bool q8 = ops::experts_read_q8(type);
      cases.push_back({fmt::format("{}_experts_{}{}", tiled ? "matmul" : "matvec", weight_type_name(type),
                                   per_pair ? "_per_pair" : ""),
                       q8 ? int8_tolerance : 1e-10, [type, per_pair, tiled, q8](Gpu& gpu) {
                         return expert_product_outcome(gpu, type, per_pair, tiled, q8);
                       }});
    }
  }
  for (auto type : all_weight_types) {
    if (!ops::experts_read_q8(type)) continue;
    for (std::uint32_t used : {2u, 8u}) {
      cases.push_back({fmt::format("matvec_experts_sum_{}_top{}", weight_type_name(type), used), int8_tolerance,
                       [type, used](Gpu& gpu) {
                         if (!ops::experts_int8(gpu.device.features(), type)) return Outcome{};
                         return experts_sum_outcome(gpu, type, used);
                       }});
    }
  }
  cases.push_back({"moe_combine_3x100_top2", 1e-12, [](Gpu& gpu) {
                     const std::uint32_t rows = 3, n = 100, used = 2;
                     auto y = random_vec(rows * used * n, 14), w = random_vec(rows * used, 15), x = random_vec(rows * n, 16);
                     auto by = gpu.up(y), bw = gpu.up(w), bx = gpu.up(x);
                     run_step(gpu, [&](Recording& rec) { ops::moe_combine(rec, gpu.kernels, r(by), r(bw), r(bx), rows, n, used); });
                     Vec want = x;
                     for (std::uint32_t i = 0; i < rows * n; ++i) {
                       for (std::uint32_t j = 0; j < used; ++j) want[i] += w[i / n * used + j] * y[(i / n * used + j) * n + i % n];
                     }
                     return Outcome{doubles(gpu.down<float>(bx, want.size())), doubles(want)};
                   }});
}

// qwen35's DeltaNet recurrence: the short convolution and then the delta rule over several
// sequences, each from a random state in its own slot (slot 2s + 1 of twice as many), against the
// reference one sequence at a time; the outputs and the states left behind.
Outcome delta_net_outcome(Gpu& gpu, const ops::DeltaNetShape& s) {
  const std::size_t rows = std::size_t{s.sequences} * s.tokens, conv = s.conv_dim(), past = s.conv_kernel - 1;
  const std::size_t delta_size = std::size_t{s.v_heads} * s.head_dim * s.head_dim;
  const Vec x = random_vec(rows * conv, 41), taps = random_vec(conv * s.conv_kernel, 42, 0.5f);
  const Vec alpha = random_vec(rows * s.v_heads, 43), beta = random_vec(rows * s.v_heads, 44, 2.0f);
  const Vec bias = random_vec(s.v_heads, 45, 0.5f), rate = random_vec(s.v_heads, 46, 0.1f);
  Vec conv_state = random_vec(2 * s.sequences * past * conv, 47), delta_state = random_vec(2 * s.sequences * delta_size, 48, 0.1f);
  std::vector<std::uint32_t> slots(s.sequences);
  for (std::uint32_t q = 0; q < s.sequences; ++q) slots[q] = 2 * q + 1;
  auto bx = gpu.up(x), btaps = gpu.up(taps), balpha = gpu.up(alpha), bbeta = gpu.up(beta), bbias = gpu.up(bias),
       brate = gpu.up(rate), bconv = gpu.up(conv_state), bdelta = gpu.up(delta_state), bslots = gpu.up(slots);
  auto mixed = gpu.scratch(rows * conv * 4), out = gpu.scratch(rows * s.value_dim() * 4);
  run_step(gpu, [&](Recording& rec) {
    ops::short_conv(rec, gpu.kernels, r(bx), r(btaps), r(bconv), r(bslots), r(mixed), s);
    ops::delta_rule(rec, gpu.kernels, r(mixed), r(balpha), r(bbeta), r(bbias), r(brate), r(bdelta), r(bslots), r(out), s);
  });
  Outcome o{doubles(gpu.down<float>(out, rows * s.value_dim())), {}};
  for (double v : doubles(gpu.down<float>(bdelta, delta_state.size()))) o.got.push_back(v);
  for (double v : doubles(gpu.down<float>(bconv, conv_state.size()))) o.got.push_back(v);
  ops::DeltaNetShape one = s;
  one.sequences = 1;
  auto part = [](const Vec& v, std::size_t index, std::size_t size) {
    return Vec(v.begin() + static_cast<std::ptrdiff_t>(index * size), v.begin() + static_cast<std::ptrdiff_t>((index + 1) * size));
  };
  for (std::uint32_t q = 0; q < s.sequences; ++q) {
    Vec cs = part(conv_state, slots[q], past * conv), ds = part(delta_state, slots[q], delta_size);
    const Vec mixed_q = reference::short_conv(part(x, q, s.tokens * conv), taps, cs, one);
    const Vec out_q = reference::delta_rule(mixed_q, part(alpha, q, s.tokens * s.v_heads), part(beta, q, s.tokens * s.v_heads),
                                            bias, rate, ds, one);
    o.want.insert(o.want.end(), out_q.begin(), out_q.end());
    std::copy(ds.begin(), ds.end(), delta_state.begin() + static_cast<std::ptrdiff_t>(slots[q] * delta_size));
    std::copy(cs.begin(), cs.end(), conv_state.begin() + static_cast<std::ptrdiff_t>(slots[q] * past * conv));
  }
  for (float v : delta_state) o.want.push_back(v);
  for (float v : conv_state) o.want.push_back(v);
  return o;
}

void add_delta_net_cases(std::vector<OpCase>& cases) {
  for (auto [sequences, tokens, dim] : {std::array{1u, 1u, 32u}, {5u, 1u, 32u}, {1u, 37u, 32u}, {3u, 9u, 128u}}) {
    const ops::DeltaNetShape shape{sequences, tokens, 2, 4, dim, 4, 1e-6f};
    cases.push_back({fmt::format("delta_net_{}x{}_dim{}", sequences, tokens, dim), 1e-9,
                     [shape](Gpu& gpu) { return delta_net_outcome(gpu, shape); }});
  }
}

std::vector<OpCase> all_cases() {
  std::vector<OpCase> cases;
  add_delta_net_cases(cases);
  add_experts_cases(cases);
  add_elementwise_cases(cases);
  add_weight_cases(cases);
  add_attention_cases(cases);
  add_sampling_cases(cases);
  return cases;
}

class KernelOps : public ::testing::TestWithParam<OpCase> {};

TEST_P(KernelOps, MatchesTheCpuReference) {
  auto outcome = GetParam().run(shared_gpu());
  ASSERT_EQ(outcome.got.size(), outcome.want.size());
  if (GetParam().tolerance == 0) {
    for (std::size_t i = 0; i < outcome.got.size(); ++i) ASSERT_EQ(outcome.got[i], outcome.want[i]) << "element " << i;
    return;
  }
  double err = 0, norm = 0;
  for (std::size_t i = 0; i < outcome.got.size(); ++i) {
    ASSERT_TRUE(std::isfinite(outcome.got[i])) << "element " << i;
    err += (outcome.got[i] - outcome.want[i]) * (outcome.got[i] - outcome.want[i]);
    norm += outcome.want[i] * outcome.want[i];
  }
  EXPECT_LE(err / std::max(norm, 1e-30), GetParam().tolerance);
}

INSTANTIATE_TEST_SUITE_P(AllOps, KernelOps, ::testing::ValuesIn(all_cases()),
                         [](const ::testing::TestParamInfo<OpCase>& info) { return info.param.name; });

// Decode takes the split path with enough workgroups to fill a large GPU; a long prefill fills it
// without splitting the keys; head dims that are not a multiple of 16 take the one-pass kernel,
// and head dims past 256 none.
TEST(AttentionPlan, SplitsDecodeAndNotPrefill) {
  ops::AttentionShape decode{1, 32, 8, 128, 16, 41, 0.088f};  // Llama-3-8B, 656 keys
  auto plan = ops::plan_attention(decode);
  EXPECT_EQ(plan.path, ops::AttentionPath::split);
  EXPECT_EQ(plan.splits, 21u);  // one 32-key tile each: 168 workgroups
  EXPECT_GE(ops::attention_scratch_bytes(decode), std::uint64_t{32} * 21 * 130 * 4);
  ops::AttentionShape batch{32, 32, 8, 128, 16, 41, 0.088f};
  EXPECT_EQ(ops::plan_attention(batch).splits, 2u);
  ops::AttentionShape prefill{512, 32, 8, 128, 16, 32, 0.088f};
  EXPECT_EQ(ops::plan_attention(prefill).path, ops::AttentionPath::split);
  EXPECT_EQ(ops::plan_attention(prefill).splits, 1u);
  EXPECT_EQ(ops::plan_attention(ops::AttentionShape{512, 4, 4, 62, 16, 32, 0.1f}).path, ops::AttentionPath::one_pass);
  EXPECT_EQ(ops::plan_attention(ops::AttentionShape{1, 4, 4, 64, 16, 1, 0.125f}).splits, 1u);
  for (std::uint32_t d : {16u, 80u, 96u, 256u}) {
    EXPECT_EQ(ops::plan_attention(ops::AttentionShape{1, 4, 4, d, 16, 41, 0.1f}).path, ops::AttentionPath::split) << d;
  }
  EXPECT_EQ(ops::plan_attention(ops::AttentionShape{1, 4, 4, 40, 16, 41, 0.1f}).path, ops::AttentionPath::one_pass);
  EXPECT_THROW(ops::plan_attention(ops::AttentionShape{1, 4, 4, 40, 16, 41, 0.1f, ops::AttentionPath::split}), GpuError);
  EXPECT_THROW(ops::plan_attention(ops::AttentionShape{1, 4, 4, 272, 16, 41, 0.1f}), GpuError);
}

// The narrow (tensor-core) path is chosen only where it can run: tiles of 16 x 16 x 16 or 16 x 8
// x 16, subgroups of 32, whole blocks; its activations are padded to whole column tiles of its
// workgroup shape for that many columns. (Its output is checked on the H100 by `mqlm bench kernels` against the
// tiled path, and end to end by bench/check-batched-greedy.sh: lavapipe has no tensor cores.)
TEST(NarrowMatmul, AppliesWhereItCanRunAndPadsColumnsToTiles) {
  DeviceFeatures lavapipe;
  lavapipe.subgroup_size = 8;
  EXPECT_FALSE(ops::narrow_matmul_applies(lavapipe, WeightType::q4_0, 4096, 4096));
  EXPECT_FALSE(ops::narrow_matmul_preferred(lavapipe, WeightType::q4_0, 4096, 4096, 32));
  EXPECT_EQ(ops::narrow_padded_columns(lavapipe, 13), 13u);

  DeviceFeatures h100;
  h100.subgroup_size = 32;
  h100.cooperative_matrix = CooperativeMatrixShape{16, 16, 16};
  EXPECT_TRUE(ops::narrow_matmul_applies(h100, WeightType::q4_0, 6144, 4096));
  EXPECT_TRUE(ops::narrow_matmul_applies(h100, WeightType::q8_0, 100, 4096));   // rows past M are clamped
  EXPECT_FALSE(ops::narrow_matmul_applies(h100, WeightType::f16, 100, 4096));   // F16 tiles are loaded whole
  EXPECT_TRUE(ops::narrow_matmul_applies(h100, WeightType::f16, 4096, 4096));
  EXPECT_TRUE(ops::narrow_matmul_applies(h100, WeightType::q4_k, 4096, 4096));  // as F16 (narrow_dequantizes)
  EXPECT_FALSE(ops::narrow_matmul_applies(h100, WeightType::q6_k, 100, 4096));  // ... whose tiles are loaded whole
  EXPECT_FALSE(ops::narrow_matmul_applies(h100, WeightType::q4_0, 4096, 4080));  // not whole blocks
  EXPECT_FALSE(ops::narrow_matmul_preferred(h100, WeightType::q4_0, 4096, 4096, 5));  // the vector path's
  EXPECT_TRUE(ops::narrow_matmul_preferred(h100, WeightType::q4_0, 4096, 4096, 6));
  EXPECT_FALSE(ops::narrow_matmul_preferred(h100, WeightType::bf16, 4096, 4096, 8));  // not a type it reads
  EXPECT_TRUE(ops::narrow_matmul_preferred(h100, WeightType::q4_0, 4096, 4096, 9));
  // With integer dot products, Q4_0 and Q8_0 products of every size stay on the int8 mat-vec up to
  // 8 columns.
  EXPECT_TRUE(ops::narrow_matmul_preferred(h100, WeightType::q4_0, 28672, 4096, 8));
  h100.integer_dot_product = true;
  EXPECT_FALSE(ops::narrow_matmul_preferred(h100, WeightType::q4_0, 28672, 4096, 8));
  EXPECT_FALSE(ops::narrow_matmul_preferred(h100, WeightType::q4_0, 4096, 14336, 6));
  EXPECT_FALSE(ops::narrow_matmul_preferred(h100, WeightType::q4_0, 4096, 4096, 8));
  EXPECT_TRUE(ops::narrow_matmul_preferred(h100, WeightType::q4_0, 28672, 4096, 9));
  EXPECT_FALSE(ops::narrow_matmul_preferred(h100, WeightType::q8_0, 28672, 4096, 8));  // Q8_0 too
  EXPECT_TRUE(ops::narrow_matmul_preferred(h100, WeightType::q8_0, 28672, 4096, 9));
  h100.integer_dot_product = false;
  // Decode batches take tiles of 16, 32 or 64 columns; wider products tiles of 128.
  for (auto [n, padded] : std::vector<std::pair<std::uint32_t, std::uint32_t>>{
           {1, 16}, {16, 16}, {17, 32}, {33, 64}, {64, 64}, {65, 128}, {100, 128}, {129, 256}}) {
    EXPECT_EQ(ops::narrow_padded_columns(h100, n), padded) << n;
  }
  // K is split where the grid of 128-row tiles is small (a decode batch through the down
  // projection), never for prefill chunks, and never into slices of fewer than 16 blocks.
  EXPECT_EQ(ops::narrow_splits(h100, 4096, 14336, 64), 4u);
  EXPECT_EQ(ops::narrow_split_bytes(h100, 4096, 14336, 64), 4ull * 64 * 4096 * 4);
  EXPECT_EQ(ops::narrow_splits(h100, 6144, 4096, 32), 8u);
  EXPECT_EQ(ops::narrow_splits(h100, 28672, 4096, 64), 1u);
  EXPECT_EQ(ops::narrow_split_bytes(h100, 28672, 4096, 64), 0u);
  EXPECT_EQ(ops::narrow_splits(h100, 4096, 4096, 512), 1u);
  EXPECT_EQ(ops::narrow_splits(h100, 4096, 1024, 16), 2u);
  h100.cooperative_matrix = CooperativeMatrixShape{16, 8, 16};
  EXPECT_EQ(ops::narrow_padded_columns(h100, 9), 16u);
  EXPECT_EQ(ops::narrow_padded_columns(h100, 65), 128u);
  h100.subgroup_size = 64;
  EXPECT_FALSE(ops::narrow_matmul_applies(h100, WeightType::q4_0, 4096, 4096));

  EXPECT_EQ(ops::staged_shape_problem({4, 1, 1, 4}), "");
  EXPECT_NE(ops::staged_shape_problem({5, 1, 1, 1}), "");  // no module is built for it
  EXPECT_NE(ops::staged_shape_problem({1, 0, 1, 1}), "");
  EXPECT_NE(ops::staged_shape_problem({1, 64, 1, 1}), "");
}

// Every staged module the host may ask for is built (the shape list lives in gpu/ops.cpp and in
// shaders/CMakeLists.txt: a shape in one and not the other fails here, not on some device).
TEST(NarrowMatmul, EveryShapeTheHostPicksIsBuilt) {
  const auto names = ops::staged_modules();
  EXPECT_GT(names.size(), 30u);
  for (const std::string& name : names) EXPECT_NO_THROW((void)shaders::spirv(name)) << name;
}

// Matrices of every quantized type dequantized to F16 on the GPU are the CPU's dequantization
// rounded to F16, bit for bit: each weight is the CPU's F32 value rounded once (Q4_0 and Q8_0's
// d * q is exact in F32, so rounding it once is what the packed halves do; IQ4's d * level is
// exact in F32 too, so a table of float levels and one multiplication give the same).
TEST(DequantizeF16, IsTheCpuDequantizationRoundedToHalf) {
  Gpu& g = shared_gpu();
  const std::uint32_t m = 37;
  for (WeightType type : {WeightType::q4_0, WeightType::q8_0, WeightType::q4_1, WeightType::q5_0, WeightType::q5_1,
                          WeightType::iq4_nl, WeightType::q2_k, WeightType::q3_k, WeightType::q4_k, WeightType::q5_k,
                          WeightType::q6_k, WeightType::iq4_xs}) {
    const std::uint32_t k = 3 * static_cast<std::uint32_t>(block_elements(type));
    auto bytes = random_weights(type, m, k, 5);
    Vec want = dequantize(type, bytes, m, k);
    PoolBuffer w = g.up(std::vector<std::byte>(bytes)), out = g.pool.allocate(std::uint64_t{m} * k * 2, "test");
    auto rec = g.queue.begin();
    ops::dequantize_f16(rec, g.kernels, type, w.range(), out.range(), m, k);
    g.queue.submit_and_wait(rec);
    auto got = g.down<std::uint16_t>(out, std::size_t{m} * k);
    for (std::size_t i = 0; i < got.size(); ++i) {
      ASSERT_EQ(got[i], float_to_half(want[i])) << weight_type_name(type) << " at row " << i / k << ", column " << i % k;
    }
    auto rec2 = g.queue.begin();
    EXPECT_THROW(ops::dequantize_f16(rec2, g.kernels, WeightType::f32, w.range(), out.range(), m, k), GpuError);
  }
  DeviceFeatures h100;
  h100.subgroup_size = 32;
  h100.cooperative_matrix = CooperativeMatrixShape{16, 16, 16};
  EXPECT_TRUE(ops::narrow_dequantizes(h100, WeightType::q4_0, 14336, 4096, 2048));
  EXPECT_FALSE(ops::narrow_dequantizes(h100, WeightType::q4_0, 14336, 4096, 64));  // decode batches: in place
  EXPECT_FALSE(ops::narrow_dequantizes(h100, WeightType::f16, 14336, 4096, 2048));
  EXPECT_FALSE(ops::narrow_dequantizes(h100, WeightType::q8_0, 100, 4096, 2048));  // F16 tiles need M % 16 == 0
  // The other quantized types are read in place by decode batches (up to 64 columns, 16x16x16
  // tiles), as F16 wider.
  EXPECT_FALSE(ops::narrow_dequantizes(h100, WeightType::q6_k, 14336, 4096, 16));
  EXPECT_FALSE(ops::narrow_dequantizes(h100, WeightType::q4_k, 4096, 4096, 64));
  EXPECT_TRUE(ops::narrow_dequantizes(h100, WeightType::q4_k, 4096, 4096, 65));
  EXPECT_TRUE(ops::narrow_dequantizes(h100, WeightType::iq4_xs, 14336, 4096, 512));
  DeviceFeatures only_16x8 = h100;
  only_16x8.cooperative_matrix = CooperativeMatrixShape{16, 8, 16};
  EXPECT_TRUE(ops::narrow_dequantizes(only_16x8, WeightType::q5_k, 4096, 4096, 32));  // built for 16x16x16 only
}

// moe_sort puts every pair once in `order`, expert by expert (in expert order), and cuts each
// expert's run into tiles of at most `tile` pairs, in order: over several chunks of pairs (1,000
// pairs, 600 of them on 3 experts, 2 experts with none), for the tiled kernel's tiles and the
// tensor cores'.
TEST(MoeSort, GroupsEveryPairByExpertInTiles) {
  Gpu& g = shared_gpu();
  const std::uint32_t pairs = 1000, n_expert = 37;
  std::vector<std::uint32_t> ids(pairs);
  for (std::uint32_t i = 0; i < pairs; ++i) ids[i] = i % 5 < 3 ? i % 5 : 5 + (i * 13) % (n_expert - 5);
  for (std::uint32_t tile : {16u, 32u, 64u}) {
    auto bi = g.up(ids), order = g.scratch(pairs * 4), tiles = g.scratch(ops::moe_tiles_bytes(pairs, n_expert));
    auto rec = g.queue.begin();
    ops::moe_sort(rec, g.kernels, r(bi), r(order), r(tiles), pairs, n_expert, tile);
    g.queue.submit_and_wait(rec);
    const auto got = g.down<std::uint32_t>(order, pairs);
    const auto words = g.down<std::uint32_t>(tiles, ops::moe_tiles_bytes(pairs, n_expert) / 4);
    std::vector<std::uint32_t> seen(pairs, 0);
    std::uint32_t at = 0;
    for (std::uint32_t t = 0; t < words[0]; ++t) {
      const std::uint32_t expert = words[4 * (t + 1)], first = words[4 * (t + 1) + 1], count = words[4 * (t + 1) + 2];
      ASSERT_EQ(first, at) << "tile " << t << " of " << tile;
      ASSERT_TRUE(count >= 1 && count <= tile) << "tile " << t << " of " << tile;
      if (t > 0) {
        ASSERT_GE(expert, words[4 * t]) << "experts in order";
      }
      for (std::uint32_t i = first; i < first + count; ++i) {
        ASSERT_EQ(ids[got[i]], expert) << "pair at " << i;
        ++seen[got[i]];
      }
      at += count;
    }
    EXPECT_EQ(at, pairs);
    EXPECT_EQ(std::count(seen.begin(), seen.end(), 1u), pairs);
    std::vector<std::uint32_t> per(n_expert, 0);
    for (std::uint32_t id : ids) ++per[id];
    std::uint32_t want_tiles = 0;
    for (std::uint32_t n : per) want_tiles += (n + tile - 1) / tile;
    EXPECT_EQ(words[0], want_tiles) << "tiles of " << tile;
  }
}

// A decode step's experts in two dispatches (GpuModel's default, KernelChoice::experts_fused) make
// the bits of the four they replace: matvec_experts_glu's int8 output is what moe_route, gate and up
// by matvec_experts and quantize_q8_silu make, with the experts given or ranked from the logits in
// the product, and ranking them it writes the ids and weights moe_route writes (for
// matvec_experts_sum). Every type the int8 products take: one token of 8 experts of 10 with K 2048
// (16 threads a row, as qwen3moe-30b-a3b's gate and up), three of 2 of 6 with tied logits and K
// 512; 256 rows (8 blocks).
TEST(ExpertsFused, MakeTheBitsOfRouteProductsAndQuantizeQ8Silu) {
  Gpu& g = shared_gpu();
  if (!g.device.features().integer_dot_product) GTEST_SKIP() << "no integer dot products on this device";
  const std::uint32_t m = 256;
  for (WeightType type : all_weight_types) {
    if (!ops::experts_int8(g.device.features(), type)) continue;
    ASSERT_TRUE(ops::experts_glu_applies(g.device.features(), type, type, m));
    for (auto [rows, used, experts, k, levels] : {std::tuple{1u, 8u, 10u, 2048u, 0}, {3u, 2u, 6u, 512u, 3}}) {
      const std::uint32_t pairs = rows * used;
      auto gate = g.up(random_weights(type, std::size_t{experts} * m, k, 1));
      auto up = g.up(random_weights(type, std::size_t{experts} * m, k, 2));
      auto logits = g.up(levels ? tied_vec(rows * experts, 4, levels) : random_vec(rows * experts, 4, 3.0f));
      auto x = g.up(random_vec(std::size_t{rows} * k, 5)), x8 = g.scratch(ops::q8_acts_bytes(k, rows));
      auto ids = g.scratch(pairs * 4), ws = g.scratch(pairs * 4), ranked_ids = g.scratch(pairs * 4),
           ranked_ws = g.scratch(pairs * 4), gate_out = g.scratch(pairs * m * 4), up_out = g.scratch(pairs * m * 4);
      const std::uint64_t glu_bytes = ops::q8_acts_bytes(m, pairs);
      auto glu_want = g.scratch(glu_bytes), glu_given = g.scratch(glu_bytes), glu_ranked = g.scratch(glu_bytes);
      const ops::ExpertProduct shape{m, k, rows, used, false, true};
      run_step(g, [&](Recording& rec) {
        ops::quantize_q8(rec, g.kernels, r(x), r(x8), k, rows);
        ops::moe_route(rec, g.kernels, r(logits), r(ids), r(ws), rows, experts, used);
        ops::matvec_experts(rec, g.kernels, type, r(gate), r(x8), r(ids), r(gate_out), shape);
        ops::matvec_experts(rec, g.kernels, type, r(up), r(x8), r(ids), r(up_out), shape);
        ops::quantize_q8_silu(rec, g.kernels, r(gate_out), r(up_out), r(glu_want), m, pairs);
        ops::matvec_experts_glu(rec, g.kernels, type, r(gate), r(up), r(x8), {.experts = r(ids)}, r(glu_given), shape);
        ops::matvec_experts_glu(rec, g.kernels, type, r(gate), r(up), r(x8), {r(ranked_ids), r(ranked_ws), r(logits), experts},
                                r(glu_ranked), shape);
      });
      const std::string what = fmt::format("{}, {} tokens of {} experts", weight_type_name(type), rows, used);
      const auto want = g.down<std::uint32_t>(glu_want, glu_bytes / 4);
      EXPECT_NE(want, std::vector<std::uint32_t>(want.size(), 0u)) << what;
      EXPECT_EQ(g.down<std::uint32_t>(glu_given, glu_bytes / 4), want) << what;
      EXPECT_EQ(g.down<std::uint32_t>(glu_ranked, glu_bytes / 4), want) << what;
      EXPECT_EQ(g.down<std::uint32_t>(ranked_ids, pairs), g.down<std::uint32_t>(ids, pairs)) << what;
      EXPECT_EQ(g.down<std::uint32_t>(ranked_ws, pairs), g.down<std::uint32_t>(ws, pairs)) << what;
    }
  }
}

// The wide expert products on the tensor cores: where they apply (16x16x16 tiles, subgroups of 32,
// K a multiple of 128, every type but F32 and BF16), every module the host may ask for built, and
// where the device has them (skipped on lavapipe) each pair's output row as the CPU makes it from
// the F16-rounded weights and activations: 4 experts of 200 rows (a last row tile part full), 72
// tokens of 2 pairs (36 an expert: in tiles of 32, a second tile of 4), one input row a token or
// one a pair; for quantized weights, also every expert decoded to F16 first (dequantize_f16) and
// the F16 product, as a wide step takes it where ops::experts_dequantize says.
TEST(NarrowExperts, MultiplyEachPairByItsExpertFromF16) {
  DeviceFeatures h100;
  h100.subgroup_size = 32;
  h100.cooperative_matrix = CooperativeMatrixShape{16, 16, 16};
  EXPECT_TRUE(ops::experts_coopmat_applies(h100, WeightType::q4_k, 768, 2048));
  EXPECT_TRUE(ops::experts_coopmat_applies(h100, WeightType::q6_k, 2048, 768));
  EXPECT_TRUE(ops::experts_coopmat_applies(h100, WeightType::f16, 100, 256));
  EXPECT_FALSE(ops::experts_coopmat_applies(h100, WeightType::bf16, 768, 2048));
  EXPECT_FALSE(ops::experts_coopmat_applies(h100, WeightType::q4_0, 768, 2080));  // K % 128 != 0
  EXPECT_FALSE(ops::experts_coopmat_applies(DeviceFeatures{}, WeightType::q4_k, 768, 2048));
  // Decoded to F16 first: quantized types where the choice asks; not by default (slower where
  // measured).
  ops::KernelChoice choice;
  choice.experts_f16 = true;
  EXPECT_TRUE(ops::experts_dequantize(h100, WeightType::q4_k, 768, 2048, choice));
  EXPECT_TRUE(ops::experts_dequantize(h100, WeightType::q6_k, 2048, 768, choice));
  EXPECT_FALSE(ops::experts_dequantize(h100, WeightType::f16, 768, 2048, choice));  // F16 already
  EXPECT_FALSE(ops::experts_dequantize(h100, WeightType::q4_k, 200, 2048, choice));  // M % 16 != 0
  EXPECT_FALSE(ops::experts_dequantize(DeviceFeatures{}, WeightType::q4_k, 768, 2048, choice));
  EXPECT_FALSE(ops::experts_dequantize(h100, WeightType::q4_k, 768, 2048));  // the default
  choice.experts_f16 = false;
  EXPECT_FALSE(ops::experts_dequantize(h100, WeightType::q4_k, 768, 2048, choice));
  h100.cooperative_matrix = CooperativeMatrixShape{16, 8, 16};
  EXPECT_FALSE(ops::experts_coopmat_applies(h100, WeightType::q4_k, 768, 2048));  // built for 16x16x16 only
  for (const std::string& name : ops::experts_coopmat_modules()) EXPECT_NO_THROW((void)shaders::spirv(name)) << name;

  Gpu& g = shared_gpu();
  const std::uint32_t experts = 4, m = 200, k = 512, rows = 72, used = 2, pairs = rows * used;
  if (!ops::experts_coopmat_applies(g.device.features(), WeightType::q4_k, m, k)) {
    GTEST_SKIP() << "no tensor-core expert products on this device";
  }
  std::vector<std::uint32_t> ids(pairs);
  for (std::uint32_t i = 0; i < pairs; ++i) ids[i] = (i * 7 + i / 5) % experts;
  for (WeightType type : all_weight_types) {
    if (!ops::experts_coopmat_applies(g.device.features(), type, m, k)) continue;
    auto bytes = random_weights(type, std::size_t{experts} * m, k, 31);
    Vec weights = dequantize(type, bytes, std::size_t{experts} * m, k);
    for (auto& w : weights) w = half_to_float(float_to_half(w));
    for (bool per_pair : {false, true}) {
      for (std::uint32_t tile : {64u, 32u}) {
        const std::uint32_t cols = per_pair ? pairs : rows;
        Vec acts = random_vec(std::size_t{cols} * k, 32);
        std::vector<std::uint16_t> halves(acts.size());
        for (std::size_t i = 0; i < acts.size(); ++i) acts[i] = half_to_float(halves[i] = float_to_half(acts[i]));
        auto bw = g.up(bytes), ba = g.up(halves), bi = g.up(ids), out = g.scratch(std::uint64_t{pairs} * m * 4);
        auto order = g.scratch(pairs * 4), tiles = g.scratch(ops::moe_tiles_bytes(pairs, experts));
        auto rec = g.queue.begin();
        ops::moe_sort(rec, g.kernels, r(bi), r(order), r(tiles), pairs, experts, tile);
        ops::matmul_experts_coopmat(rec, g.kernels, type, r(bw), r(ba), r(order), r(tiles), r(out),
                                    {m, k, rows, used, per_pair}, experts, tile);
        // And every expert decoded to F16 first (ops::experts_dequantize), then the F16 product.
        auto w16 = g.scratch(std::uint64_t{experts} * m * k * 2), out16 = g.scratch(out.size());
        if (quantized(type)) {
          ops::dequantize_f16(rec, g.kernels, type, r(bw), r(w16), experts * m, k);
          ops::matmul_experts_coopmat(rec, g.kernels, WeightType::f16, r(w16), r(ba), r(order), r(tiles), r(out16),
                                      {m, k, rows, used, per_pair}, experts, tile);
        }
        g.queue.submit_and_wait(rec);
        const Vec want = experts_reference(weights, acts, ids, m, k, used, per_pair);
        // Not tighter: the GPU's decoded weights may round to the other neighbouring half (as in
        // StagedBlocks); a pair with another's row or expert is off by ~1.
        EXPECT_LT(normalised_error(g.down<float>(out, want.size()), want), 1e-5)
            << weight_type_name(type) << (per_pair ? " per pair" : "") << ", tiles of " << tile;
        if (quantized(type)) {
          EXPECT_LT(normalised_error(g.down<float>(out16, want.size()), want), 1e-5)
              << weight_type_name(type) << " through F16" << (per_pair ? " per pair" : "") << ", tiles of " << tile;
        }
      }
    }
  }
}

// The experts' SwiGLU in one dispatch (matmul_experts_glu): each pair's silu(gate x a) * (up x a)
// as F16, against the CPU's from the same F16-rounded weights and activations: 4 experts of 208
// features (416 rows of gate and up: a last row tile part full), 72 tokens of 2 pairs, tiles of 64
// and 32 (36 pairs an expert: a second tile of 4). Where the device has tensor-core expert products
// (skipped on lavapipe).
TEST(NarrowExperts, SwiGluIsSiluOfTheGateTimesTheUpProduct) {
  DeviceFeatures h100;
  h100.subgroup_size = 32;
  h100.cooperative_matrix = CooperativeMatrixShape{16, 16, 16};
  EXPECT_TRUE(ops::experts_glu_applies(h100, 768, 2048));
  EXPECT_FALSE(ops::experts_glu_applies(h100, 200, 2048));  // m % 16 != 0
  EXPECT_FALSE(ops::experts_glu_applies(DeviceFeatures{}, 768, 2048));
  Gpu& g = shared_gpu();
  const std::uint32_t experts = 4, m = 208, k = 256, rows = 72, used = 2, pairs = rows * used;
  if (!ops::experts_glu_applies(g.device.features(), m, k)) GTEST_SKIP() << "no tensor-core expert products on this device";
  std::vector<std::uint32_t> ids(pairs);
  for (std::uint32_t i = 0; i < pairs; ++i) ids[i] = (i * 7 + i / 5) % experts;
  auto halves_of = [](Vec& v) {
    std::vector<std::uint16_t> halves(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = half_to_float(halves[i] = float_to_half(v[i]));
    return halves;
  };
  Vec gate = random_vec(std::size_t{experts} * m * k, 41), up = random_vec(gate.size(), 42),
      acts = random_vec(std::size_t{rows} * k, 43);
  auto bg = g.up(halves_of(gate)), bu = g.up(halves_of(up)), ba = g.up(halves_of(acts)), bi = g.up(ids);
  const Vec gate_out = experts_reference(gate, acts, ids, m, k, used, false),
            up_out = experts_reference(up, acts, ids, m, k, used, false);
  Vec want(gate_out.size());
  for (std::size_t i = 0; i < want.size(); ++i) want[i] = gate_out[i] / (1.0f + std::exp(-gate_out[i])) * up_out[i];
  for (std::uint32_t tile : {64u, 32u}) {
    auto out = g.scratch(std::uint64_t{pairs} * m * 2), order = g.scratch(pairs * 4),
         tiles = g.scratch(ops::moe_tiles_bytes(pairs, experts));
    auto rec = g.queue.begin();
    ops::moe_sort(rec, g.kernels, r(bi), r(order), r(tiles), pairs, experts, tile);
    ops::matmul_experts_glu(rec, g.kernels, r(bg), r(bu), r(ba), r(order), r(tiles), r(out), {m, k, rows, used},
                            experts, tile);
    g.queue.submit_and_wait(rec);
    Vec got;
    for (std::uint16_t h : g.down<std::uint16_t>(out, want.size())) got.push_back(half_to_float(h));
    EXPECT_LT(normalised_error(got, want), 2e-3) << "tiles of " << tile;  // the output rounded to F16
  }
}

// The SwiGLU in one dispatch is silu(gate) * up of the two narrow products, each made alone, in
// F16: edge features (40 rows, so the last tile's second fragment is partly past them) and padded
// columns (zero) included. Runs where the device has cooperative matrices (the H100), skips on
// lavapipe, where the narrow path does not exist.
TEST(NarrowGlu, IsSiluOfTheGateTimesTheUpProduct) {
  DeviceFeatures h100;
  h100.subgroup_size = 32;
  h100.cooperative_matrix = CooperativeMatrixShape{16, 16, 16};
  EXPECT_TRUE(ops::narrow_glu_applies(h100, WeightType::q4_0, 14336, 4096, 64));
  EXPECT_TRUE(ops::narrow_glu_applies(h100, WeightType::f16, 14336, 4096, 2048));
  EXPECT_TRUE(ops::narrow_glu_applies(h100, WeightType::q4_0, 14336, 4096, 17));
  EXPECT_FALSE(ops::narrow_glu_applies(h100, WeightType::q4_0, 14336, 4096, 16));  // the direct kernel's there
  // K % 64 != 0 at 64 columns: the shape for it has one 16-row fragment a subgroup.
  EXPECT_FALSE(ops::narrow_glu_applies(h100, WeightType::q4_0, 14336, 4128, 64));
  EXPECT_FALSE(ops::narrow_glu_applies(DeviceFeatures{}, WeightType::q4_0, 14336, 4096, 64));

  Gpu& g = shared_gpu();
  const DeviceFeatures& features = g.device.features();
  const std::uint32_t m = 40, k = 256;
  for (std::uint32_t n : {24u, 40u}) {  // 128 x 32 tiles (17 to 32 columns), and wider ones
    if (!ops::narrow_glu_applies(features, WeightType::q4_0, m, k, n)) GTEST_SKIP() << "no narrow path on this device";
    const std::uint32_t padded = ops::narrow_padded_columns(features, n);
    std::mt19937_64 rng(11);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    std::vector<std::uint16_t> acts(std::size_t{padded} * k, 0);
    for (std::size_t i = 0; i < std::size_t{n} * k; ++i) acts[i] = float_to_half(dist(rng));
    for (WeightType type : {WeightType::q4_0, WeightType::q8_0}) {
      PoolBuffer gate = g.up(random_weights(type, m, k, 21)), up = g.up(random_weights(type, m, k, 22)), a = g.up(acts);
      PoolBuffer gate_out = g.scratch(std::uint64_t{padded} * m * 4), up_out = g.scratch(std::uint64_t{padded} * m * 4);
      PoolBuffer glu = g.up(std::vector<std::uint16_t>(std::size_t{padded} * m, 0x7BFF));  // not zero: the pad is written
      auto rec = g.queue.begin();
      ops::matmul_narrow(rec, g.kernels, type, gate.range(), a.range(), gate_out.range(), m, k, n, false);
      ops::matmul_narrow(rec, g.kernels, type, up.range(), a.range(), up_out.range(), m, k, n, false);
      ops::matmul_narrow_glu(rec, g.kernels, type, gate.range(), up.range(), a.range(), glu.range(), m, k, n);
      g.queue.submit_and_wait(rec);
      const Vec gv = g.down<float>(gate_out, std::size_t{n} * m), uv = g.down<float>(up_out, std::size_t{n} * m);
      const auto got = g.down<std::uint16_t>(glu, std::size_t{padded} * m);
      for (std::uint32_t col = 0; col < padded; ++col) {
        for (std::uint32_t row = 0; row < m; ++row) {
          const std::size_t i = std::size_t{col} * m + row;
          if (col >= n) {
            ASSERT_EQ(got[i], 0u) << weight_type_name(type) << " n " << n << ": padded column " << col << ", row " << row;
            continue;
          }
          const float want = gv[i] / (1.0f + std::exp(-gv[i])) * uv[i];
          EXPECT_NEAR(half_to_float(got[i]), want, 2e-3f * std::max(1.0f, std::abs(want)))
              << weight_type_name(type) << " n " << n << ": column " << col << ", row " << row;
        }
      }
    }
  }
}

// The fragment-layout check accepts exactly the layout the direct matmul builds (NVIDIA's, see
// gpu/fragment_layout.hpp: invocation 4 g + t holds A (g + 8 [e >= 4], 2t + e % 2 + 8 [e / 2 odd]),
// B and the accumulator (g + 8 [e >= 2], 2t + e % 2)), and names what differs in any other, such
// as the PTX mma.m16n8k16 order of A or its column-major B.
TEST(FragmentLayout, AcceptsOnlyTheLayoutTheDirectMatmulBuilds) {
  std::vector<float> probe(fragment_probe_floats);
  for (std::uint32_t l = 0; l < 32; ++l) {
    const std::uint32_t g = l / 4, t = l % 4;
    for (std::uint32_t e = 0; e < 8; ++e) probe[l * 8 + e] = float((g + 8 * (e / 4)) * 16 + 2 * t + e % 2 + 8 * ((e / 2) % 2));
    for (std::uint32_t e = 0; e < 4; ++e) {
      probe[256 + l * 4 + e] = float((g + 8 * (e / 2)) * 8 + 2 * t + e % 2);
      probe[384 + l * 4 + e] = float((g + 8 * (e / 2)) * 8 + 2 * t + e % 2);
    }
  }
  probe[512] = 8;
  probe[513] = 4;
  probe[514] = 4;
  EXPECT_EQ(fragment_layout_problem(probe), "");
  auto swapped = probe;
  std::swap(swapped[256 + 5 * 4 + 1], swapped[256 + 5 * 4 + 2]);  // B of invocation 5, elements 1 and 2
  EXPECT_NE(fragment_layout_problem(swapped).find("B: invocation 5"), std::string::npos) << fragment_layout_problem(swapped);
  auto mma = probe;  // A in mma.m16n8k16's order: the row changes at element 2
  for (std::uint32_t l = 0; l < 32; ++l) {
    for (std::uint32_t e = 0; e < 8; ++e) mma[l * 8 + e] = float((l / 4 + 8 * ((e / 2) % 2)) * 16 + 2 * (l % 4) + e % 2 + 8 * (e / 4));
  }
  EXPECT_NE(fragment_layout_problem(mma).find("A: invocation 0"), std::string::npos) << fragment_layout_problem(mma);
  auto longer = probe;
  longer[512] = 16;
  EXPECT_NE(fragment_layout_problem(longer), "");
  EXPECT_NE(fragment_layout_problem(std::span(probe).first(100)), "");

  // On this device: the probe ran when the fixture was made; without 16x8x16 tensor-core tiles
  // (lavapipe) it answers no without running.
  Gpu& g = shared_gpu();
  ASSERT_TRUE(g.kernels.direct_fragments().has_value());
  if (!g.device.features().cooperative_matrix_16x8) {
    EXPECT_FALSE(*g.kernels.direct_fragments());
  }
  EXPECT_EQ(probe_fragment_layout(g.kernels, g.queue, g.pool), *g.kernels.direct_fragments());
  if (!*g.kernels.direct_fragments()) {
    EXPECT_FALSE(ops::direct_matmul_applies(g.kernels, WeightType::q4_0, 4096, 4096, 32));
  }
}

// Every direct module the host may ask for is built.
TEST(DirectMatmul, EveryShapeTheHostPicksIsBuilt) {
  const auto names = ops::direct_modules();
  EXPECT_GT(names.size(), 60u);
  for (const std::string& name : names) EXPECT_NO_THROW((void)shaders::spirv(name)) << name;
  EXPECT_EQ(ops::direct_shape_problem({2, 4, 4}), "");
  EXPECT_NE(ops::direct_shape_problem({3, 4, 2}), "");
  EXPECT_NE(ops::direct_shape_problem({2, 8, 4}, 64), "");  // its sums would take 64 KiB
  EXPECT_EQ(ops::direct_shape_problem({2, 8, 4}, 32), "");
}

// got (n columns of m) is the CPU's product of weights w (m x k, F32 holding F16 values) and F16
// activations acts (columns of k), plus start where it is not empty, within F32 rounding (a
// fraction `tolerance` of the sum of the terms' magnitudes).
void expect_cpu_product(const Vec& got, const Vec& w, const std::vector<std::uint16_t>& acts, const Vec& start,
                        std::uint32_t m, std::uint32_t k, std::uint32_t n, const std::string& what,
                        double tolerance = 1e-5) {
  for (std::uint32_t col = 0; col < n; ++col) {
    for (std::uint32_t row = 0; row < m; ++row) {
      double sum = 0, size = 0;
      for (std::uint32_t i = 0; i < k; ++i) {
        const double term = double(w[std::size_t{row} * k + i]) * half_to_float(acts[std::size_t{col} * k + i]);
        sum += term;
        size += std::abs(term);
      }
      const std::size_t at = std::size_t{col} * m + row;
      if (!start.empty()) sum += start[at];
      ASSERT_NEAR(got[at], sum, tolerance * size + 1e-5) << what << ": row " << row << ", column " << col;
    }
  }
}

// The staged kernel reading the other quantized types' blocks in place (decode batches): each type
// against a CPU product of its dequantization rounded to F16 (what the kernel multiplies), at each
// column tile up to 64 (padded columns zero), rows past the last whole tile, written, accumulated
// and with K split. Runs where the narrow path has 16x16x16 tiles (the H100); skips on lavapipe.
TEST(StagedBlocks, MatchTheCpuProductOfTheirHalves) {
  Gpu& g = shared_gpu();
  const DeviceFeatures& features = g.device.features();
  if (!ops::narrow_reads_at(features, WeightType::q4_k, 64)) GTEST_SKIP() << "no narrow path reading blocks here";
  const std::uint32_t m = 144, k = 256 * 9;  // 128 rows and 16 more; K of whole super-blocks and of 4 blocks a stage
  std::mt19937_64 rng(13);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  PoolBuffer parts = g.scratch(std::uint64_t{16} * 64 * m * 4);
  for (WeightType type : all_weight_types) {
    if (!quantized(type) || ops::narrow_reads(type)) continue;
    const auto bytes = random_weights(type, m, k, 51);
    Vec w = dequantize(type, bytes, m, k);
    for (float& x : w) x = half_to_float(float_to_half(x));
    PoolBuffer weights = g.up(std::vector<std::byte>(bytes));
    for (std::uint32_t n : {9u, 30u, 64u}) {
      ASSERT_FALSE(ops::narrow_dequantizes(features, type, m, k, n));
      const std::uint32_t padded = ops::narrow_padded_columns(features, n);
      std::vector<std::uint16_t> acts(std::size_t{padded} * k, 0);
      for (std::size_t i = 0; i < std::size_t{n} * k; ++i) acts[i] = float_to_half(dist(rng));
      Vec start(std::size_t{n} * m);
      for (float& x : start) x = dist(rng);
      PoolBuffer a = g.up(acts);
      for (bool split : {false, true}) {
        const bool accumulate = split;
        PoolBuffer out = g.up(start);
        auto rec = g.queue.begin();
        ops::matmul_narrow(rec, g.kernels, type, weights.range(), a.range(), out.range(), m, k, n, accumulate,
                           split ? parts.range() : BufferRange{}, /*sum_later=*/false);
        g.queue.submit_and_wait(rec);
        expect_cpu_product(g.down<float>(out, std::size_t{n} * m), w, acts, accumulate ? start : Vec{}, m, k, n,
                           fmt::format("{}, {} columns, accumulate and split {}", weight_type_name(type), n, split),
                           1e-4);  // the GPU's F32 weights may round to the other neighbouring half
      }
    }
  }
}

// The direct matmul (fragments built in registers) against a CPU product of the same F16 weights
// and activations: every weight type it reads; 9 to 64 columns (each tile width, padded columns
// zero); rows past the last whole tile; K of 67 blocks (uneven shares between the subgroups, a last
// iteration with fewer blocks); written, accumulated, and with K split in slices. Runs where the
// probe found the layout it builds (the H100); skips on lavapipe.
TEST(DirectMatmul, MatchesTheCpuProductOfTheSameHalves) {
  Gpu& g = shared_gpu();
  if (!g.kernels.direct_fragments().value_or(false)) GTEST_SKIP() << "fragments laid out otherwise here";
  const DeviceFeatures& features = g.device.features();
  const std::uint32_t k = 32 * 67;
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  ops::KernelChoice always;  // the model takes it up to 16 columns only
  always.direct_use = ops::DirectUse::always;
  for (WeightType type : {WeightType::q4_0, WeightType::q8_0, WeightType::f16}) {
    const std::uint32_t m = type == WeightType::f16 ? 48 : 40;
    const auto bytes = random_weights(type, m, k, 31);
    Vec w = dequantize(type, bytes, m, k);
    for (float& x : w) x = half_to_float(float_to_half(x));  // the kernel's F16 weights
    PoolBuffer weights = g.up(std::vector<std::byte>(bytes));
    for (std::uint32_t n : {9u, 16u, 17u, 33u, 64u}) {
      ASSERT_TRUE(ops::direct_matmul_applies(g.kernels, type, m, k, n)) << n;
      const std::uint32_t padded = ops::narrow_padded_columns(features, n);
      std::vector<std::uint16_t> acts(std::size_t{padded} * k, 0);
      for (std::size_t i = 0; i < std::size_t{n} * k; ++i) acts[i] = float_to_half(dist(rng));
      Vec start(std::size_t{n} * m);
      for (float& x : start) x = dist(rng);
      PoolBuffer a = g.up(acts), parts = g.scratch(std::uint64_t{16} * padded * m * 4);
      for (bool accumulate : {false, true}) {
        for (bool split : {false, true}) {
          PoolBuffer out = g.up(start);
          auto rec = g.queue.begin();
          const std::uint32_t splits = ops::matmul_narrow(rec, g.kernels, type, weights.range(), a.range(), out.range(), m,
                                                          k, n, accumulate, split ? parts.range() : BufferRange{},
                                                          /*sum_later=*/false, always);
          g.queue.submit_and_wait(rec);
          EXPECT_EQ(splits > 1, split) << "K in " << splits;
          expect_cpu_product(g.down<float>(out, std::size_t{n} * m), w, acts, accumulate ? start : Vec{}, m, k, n,
                             fmt::format("{}, {} columns, accumulate {}, split {}", weight_type_name(type), n,
                                         accumulate, split));
        }
      }
    }
  }
}

// The partial products of a split K are added in order into the output, or onto it.
TEST(SumSplits, AddsTheSlicesIntoOrOntoTheOutput) {
  Gpu& g = shared_gpu();
  const std::uint32_t count = 1000, splits = 5;
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  Vec parts(std::size_t{count} * splits), start(count);
  for (auto& v : parts) v = dist(rng);
  for (auto& v : start) v = dist(rng);
  for (bool accumulate : {false, true}) {
    PoolBuffer p = g.up(parts), out = g.up(start);
    auto rec = g.queue.begin();
    ops::sum_splits(rec, g.kernels, p.range(), out.range(), count, splits, accumulate);
    g.queue.submit_and_wait(rec);
    Vec got = g.down<float>(out, count);
    for (std::uint32_t i = 0; i < count; ++i) {
      float want = accumulate ? start[i] : 0.0f;
      for (std::uint32_t z = 0; z < splits; ++z) want += parts[std::size_t{z} * count + i];
      ASSERT_FLOAT_EQ(got[i], want) << "accumulate " << accumulate << " at " << i;
    }
  }
}

// The fused mat-vecs' element-wise bound: float kernels sum in another order; int8 ones may also
// round one activation the other way (see int8_tolerance), up to amax / 127 times a weight.
double bound(WeightType type) { return ops::matvec_quantizes_in_place(type) ? 2e-2 : 1e-3; }

// The int8 mat-vec quantizes each block of 32 activations by its own scale: blocks 10^4 times
// larger than their neighbours do not cost the small ones their precision (one scale per column
// would round those to zero). The large blocks meet zero weights, so the product is the small
// blocks' alone. Both kernels, int8 and float, run and are checked here.
TEST(MatvecInt8, QuantizesEachBlockByItsOwnScale) {
  Gpu& g = shared_gpu();
  if (!g.device.features().integer_dot_product) GTEST_SKIP() << "no integer dot products on this device";
  const std::uint32_t m = 70, k = 1024;
  auto large = [](std::size_t i) { return (i / 32) % 3 == 0; };
  for (WeightType type : {WeightType::q8_0, WeightType::q4_0}) {
    for (std::uint32_t n : {1u, 3u}) {
      Vec w_in = random_vec(std::size_t{m} * k, 40 + n);
      for (std::size_t i = 0; i < w_in.size(); ++i) if (large(i % k)) w_in[i] = 0;
      auto bytes = quantize(type, w_in, k);
      Vec weights = dequantize(type, bytes, m, k);
      Vec acts = random_vec(std::size_t{n} * k, 50 + n);
      for (std::size_t i = 0; i < acts.size(); ++i) acts[i] *= large(i % k) ? 100.0f : 0.01f;
      PoolBuffer w = g.up(bytes), a = g.up(acts), out = g.scratch(std::uint64_t{n} * m * 4);
      auto run = [&](bool int8) {
        ops::KernelChoice choice;
        choice.matvec_int8 = int8;
        run_step(g, [&](Recording& rec) {
          ops::matmul(rec, g.kernels, type, w.range(), a.range(), false, out.range(), m, k, n, ops::MatmulPath::vector,
                      choice);
        });
        return g.down<float>(out, std::size_t{n} * m);
      };
      Vec exact = reference::matmul(weights, acts, m, k, n);
      Vec blocks = reference::matmul(weights, reference::int8_blocks(acts), m, k, n);
      Vec int8 = run(true), floats = run(false);
      EXPECT_LT(normalised_error(int8, blocks), int8_tolerance) << weight_type_name(type) << " n " << n;
      EXPECT_LT(normalised_error(int8, exact), 1e-3) << weight_type_name(type) << " n " << n;
      EXPECT_GT(normalised_error(int8, exact), 1e-12) << "the int8 kernel did not quantize";
      EXPECT_LT(normalised_error(floats, exact), 1e-10) << "the float kernel";
    }
  }
}

// rope_kv_write does in one dispatch what rope on q and k, then kv_write, do in three: the same
// q, and the same bits in every slot of both caches (the ones it should not touch stay zero).
TEST(RopeKvWrite, MatchesRopeThenKvWrite) {
  Gpu& g = shared_gpu();
  const std::uint32_t heads = 4, kv_heads = 2, slots_total = 12;
  const std::vector<std::uint32_t> slots{5, 0, 9};
  for (ops::RopeShape shape : {ops::RopeShape{3, heads, 64, 0, 10000.0f, 1.0f, false},
                               ops::RopeShape{3, heads, 128, 0, 500000.0f, 0.5f, true},
                               ops::RopeShape{3, heads, 64, 32, 10000.0f, 1.0f, true},
                               ops::RopeShape{3, heads, 80, 0, 10000.0f, 0.25f, true, {1.0f, 1.0f, 32.0f, 1.0f, 64}}}) {
    const std::uint32_t d = shape.head_dim, row = kv_heads * d;
    const Vec freqs = ops::rope_frequencies(shape);
    Vec q = random_vec(std::size_t{3} * heads * d, 1), k = random_vec(std::size_t{3} * row, 2),
        v = random_vec(std::size_t{3} * row, 3);
    std::vector<std::int32_t> pos{7, 0, 300};
    std::vector<std::uint16_t> zeros(std::size_t{slots_total} * row, 0);
    auto run = [&](bool fused) {
      PoolBuffer bq = g.up(q), bk = g.up(k), bv = g.up(v), bp = g.up(pos), bs = g.up(slots), bf = g.up(freqs);
      PoolBuffer kc = g.up(zeros), vc = g.up(zeros);
      run_step(g, [&](Recording& rec) {
        if (fused) {
          ops::rope_kv_write(rec, g.kernels, r(bq), r(bk), r(bv), r(bp), r(bf), r(kc), r(vc), r(bs), shape, kv_heads);
          return;
        }
        ops::rope(rec, g.kernels, r(bq), r(bp), r(bf), r(bq), shape);
        ops::RopeShape kshape = shape;
        kshape.heads = kv_heads;
        ops::rope(rec, g.kernels, r(bk), r(bp), r(bf), r(bk), kshape);
        ops::kv_write(rec, g.kernels, r(bk), r(bv), r(kc), r(vc), r(bs), 3, row);
      });
      return std::tuple{g.down<float>(bq, q.size()), g.down<std::uint16_t>(kc, zeros.size()),
                        g.down<std::uint16_t>(vc, zeros.size())};
    };
    auto [q1, k1, v1] = run(true);
    auto [q3, k3, v3] = run(false);
    EXPECT_EQ(q1, q3) << "d " << d << (shape.neox ? " neox" : "");
    EXPECT_EQ(k1, k3);
    EXPECT_EQ(v1, v3);
    EXPECT_NE(q1, q);  // something turned
    EXPECT_NE(k1, zeros);
  }
}

// rope_kv_write reading split products' slices adds them as sum_splits does, bit for bit: the
// same q (written to q) and caches as the sums' dispatches then rope_kv_write; a product that did
// not split (count 1) is read from its output.
TEST(RopeKvWrite, AddsTheSlicesOfSplitProducts) {
  Gpu& g = shared_gpu();
  const std::uint32_t heads = 4, kv_heads = 2, tokens = 3, slots_total = 12, d = 64, row = kv_heads * d;
  const ops::RopeShape shape{tokens, heads, d, 0, 10000.0f, 1.0f, false};
  const std::vector<std::uint32_t> slots{5, 0, 9};
  const std::vector<std::int32_t> pos{7, 0, 300};
  const Vec freqs = ops::rope_frequencies(shape);
  const std::uint32_t q_size = tokens * heads * d, kv_size = tokens * row;
  for (auto [q_splits, k_splits, v_splits] : {std::tuple{4u, 16u, 16u}, {2u, 1u, 3u}}) {
    Vec q_parts = random_vec(std::size_t{q_splits} * q_size, 4), k_parts = random_vec(std::size_t{k_splits} * kv_size, 5),
        v_parts = random_vec(std::size_t{v_splits} * kv_size, 6);
    Vec k_plain = random_vec(kv_size, 7);  // the output of a product that did not split
    const std::vector<std::uint16_t> zeros(std::size_t{slots_total} * row, 0);
    auto run = [&](bool fused) {
      PoolBuffer bqp = g.up(q_parts), bkp = g.up(k_parts), bvp = g.up(v_parts), bq = g.scratch(q_size * 4),
                 bk = k_splits == 1 ? g.up(k_plain) : g.scratch(kv_size * 4), bv = g.scratch(kv_size * 4), bp = g.up(pos),
                 bs = g.up(slots), kc = g.up(zeros), vc = g.up(zeros), bf = g.up(freqs);
      run_step(g, [&](Recording& rec) {
        if (fused) {
          ops::QkvSlices slices{r(bqp), r(bkp), r(bvp), q_splits, k_splits, v_splits};
          ops::rope_kv_write(rec, g.kernels, r(bq), r(bk), r(bv), r(bp), r(bf), r(kc), r(vc), r(bs), shape, kv_heads,
                             slices);
          return;
        }
        ops::sum_splits(rec, g.kernels, r(bqp), r(bq), q_size, q_splits, false);
        rec.next_runs_alongside();
        if (k_splits > 1) ops::sum_splits(rec, g.kernels, r(bkp), r(bk), kv_size, k_splits, false);
        rec.next_runs_alongside();
        ops::sum_splits(rec, g.kernels, r(bvp), r(bv), kv_size, v_splits, false);
        ops::rope_kv_write(rec, g.kernels, r(bq), r(bk), r(bv), r(bp), r(bf), r(kc), r(vc), r(bs), shape, kv_heads);
      });
      return std::tuple{g.down<float>(bq, q_size), g.down<std::uint16_t>(kc, zeros.size()),
                        g.down<std::uint16_t>(vc, zeros.size())};
    };
    auto [q1, k1, v1] = run(true);
    auto [q2, k2, v2] = run(false);
    const std::string what = fmt::format("splits {} {} {}", q_splits, k_splits, v_splits);
    EXPECT_EQ(q1, q2) << what;
    EXPECT_EQ(k1, k2) << what;
    EXPECT_EQ(v1, v2) << what;
    EXPECT_NE(k1, zeros) << what;
    EXPECT_NE(v1, zeros) << what;
  }
}

// The int8 blocks of n columns of k in q (n * k signed bytes, then n * k / 32 float scales) hold
// `acts` as reference::int8_blocks rounds them: each value at most one rounding apart, few the
// other way. Returns the reference's rounding.
Vec expect_int8_blocks(Gpu& g, const PoolBuffer& q, const Vec& acts, std::uint32_t k, std::uint32_t n) {
  auto bytes = g.down<std::int8_t>(q, ops::q8_acts_bytes(k, n));
  Vec scales(std::size_t{n} * k / 32);
  std::memcpy(scales.data(), bytes.data() + std::size_t{n} * k, scales.size() * 4);
  Vec want = reference::int8_blocks(acts);
  std::size_t off_by_one = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const float got = scales[i / 32] * bytes[i];
    EXPECT_NEAR(got, want[i], scales[i / 32] * 1.01f) << "element " << i;  // at most one rounding apart
    if (std::abs(got - want[i]) > scales[i / 32] * 1.01f) break;
    off_by_one += std::abs(got - want[i]) > 1e-3f * scales[i / 32];
  }
  EXPECT_LE(off_by_one, want.size() / 1000) << "roundings the other way";
  return want;
}

// Decode's int8 path in two dispatches: quantize_q8* makes the activations (x, rmsnorm(x) *
// weight, silu(gate) * up or gelu(gate) * up) as int8 blocks once; matvec_q8 multiplies (and adds to the output).
// The quantized buffer itself is checked against the reference's rounding, then the products.
TEST(MatvecQ8, QuantizedOnceThenMultiplied) {
  Gpu& g = shared_gpu();
  if (!g.device.features().integer_dot_product) GTEST_SKIP() << "no integer dot products on this device";
  const std::uint32_t m = 37, k = 2048 + 512;  // two workgroups of quantize_q8, the second partly idle
  enum class Input { plain, rmsnorm, silu, gelu };
  for (Input input : {Input::plain, Input::rmsnorm, Input::silu, Input::gelu}) {
    for (std::uint32_t n : {1u, 3u, 8u}) {
      std::mt19937_64 rng(n * 10 + static_cast<int>(input));
      std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
      Vec a(std::size_t{n} * k), b(input == Input::rmsnorm ? k : std::size_t{n} * k);
      for (auto* v : {&a, &b}) for (auto& x : *v) x = dist(rng);
      Vec acts = input == Input::plain     ? a
                 : input == Input::rmsnorm ? reference::rms_norm(a, b, n, k, 1e-5f)
                 : input == Input::silu    ? reference::silu_mul(a, b)
                                           : reference::gelu_mul(a, b);
      PoolBuffer ab = g.up(a), bb = g.up(b), q = g.scratch(ops::q8_acts_bytes(k, n));
      run_step(g, [&](Recording& rec) {
        if (input == Input::plain) ops::quantize_q8(rec, g.kernels, ab.range(), q.range(), k, n);
        if (input == Input::rmsnorm) ops::quantize_q8_rms_norm(rec, g.kernels, ab.range(), bb.range(), 1e-5f, q.range(), k, n);
        if (input == Input::silu) ops::quantize_q8_silu(rec, g.kernels, ab.range(), bb.range(), q.range(), k, n);
        if (input == Input::gelu) ops::quantize_q8_gelu(rec, g.kernels, ab.range(), bb.range(), q.range(), k, n);
      });
      const Vec want = expect_int8_blocks(g, q, acts, k, n);
      if (::testing::Test::HasFailure()) return;

      for (WeightType type : {WeightType::q8_0, WeightType::q4_0}) {
        auto wbytes = random_weights(type, m, k, 3 + n);
        Vec weights = dequantize(type, wbytes, m, k);
        Vec residual = random_vec(std::size_t{n} * m, 7);
        PoolBuffer w = g.up(std::vector<std::byte>(wbytes)), out = g.up(residual), plain = g.scratch(std::uint64_t{n} * m * 4);
        run_step(g, [&](Recording& rec) {
          ops::matvec_q8(rec, g.kernels, type, w.range(), q.range(), out.range(), m, k, n, true);
          rec.next_runs_alongside();
          ops::matvec_q8(rec, g.kernels, type, w.range(), q.range(), plain.range(), m, k, n, false);
        });
        Vec product = reference::matmul(weights, want, m, k, n);
        Vec got = g.down<float>(out, residual.size()), got_plain = g.down<float>(plain, residual.size());
        for (std::size_t i = 0; i < got.size(); ++i) {
          ASSERT_NEAR(got[i], residual[i] + product[i], bound(type) * (1 + std::abs(product[i])))
              << weight_type_name(type) << " n " << n << " at " << i;
          ASSERT_NEAR(got_plain[i], product[i], bound(type) * (1 + std::abs(product[i])));
        }
      }
    }
  }
}

// Gemma's post-norm add and the next norm's int8 input in one dispatch: x += rmsnorm(block) *
// post, as the reference adds it, and the int8 blocks of rmsnorm(x) * weight of the new x; K past
// one workgroup's 2048 elements and not a multiple of 256 threads' units.
TEST(QuantizeQ8, PostNormAddThenTheNextNorm) {
  Gpu& g = shared_gpu();
  for (std::uint32_t k : {32u, 2560u, 4096u + 96u}) {
    for (std::uint32_t n : {1u, 3u}) {
      const Vec block = random_vec(std::size_t{n} * k, 81, 3.0f), x = random_vec(std::size_t{n} * k, 82),
                post = random_vec(k, 83), weight = random_vec(k, 84);
      PoolBuffer bb = g.up(block), bx = g.up(x), bp = g.up(post), bw = g.up(weight), q = g.scratch(ops::q8_acts_bytes(k, n));
      run_step(g, [&](Recording& rec) {
        ops::rms_norm_add_quantize_q8(rec, g.kernels, r(bb), r(bp), r(bx), r(bw), 1e-6f, r(q), k, n);
      });
      const Vec want_x = reference::add(x, reference::rms_norm(block, post, n, k, 1e-6f));
      const Vec got_x = g.down<float>(bx, x.size());
      EXPECT_LT(normalised_error(got_x, want_x), 1e-10) << "k " << k << " n " << n;
      expect_int8_blocks(g, q, reference::rms_norm(want_x, weight, n, k, 1e-6f), k, n);
    }
  }
}

// rope_kv_write with q and k norms: what rms_norm on each head of q and of k, then rope_kv_write,
// make (q, and both caches within an F16 rounding), at head sizes 64 to 256, both layouts and
// partial rotary dims.
TEST(RopeKvWrite, NormsQAndKFirst) {
  Gpu& g = shared_gpu();
  const std::uint32_t heads = 4, kv_heads = 2, tokens = 3, slots_total = 12;
  const std::vector<std::uint32_t> slots{5, 0, 9};
  const std::vector<std::int32_t> pos{7, 0, 300};
  for (ops::RopeShape shape : {ops::RopeShape{tokens, heads, 256, 0, 10000.0f, 1.0f, true},
                               ops::RopeShape{tokens, heads, 128, 0, 1000000.0f, 1.0f, false},
                               ops::RopeShape{tokens, heads, 64, 32, 10000.0f, 1.0f, true}}) {
    const std::uint32_t d = shape.head_dim, row = kv_heads * d;
    const Vec freqs = ops::rope_frequencies(shape);
    const Vec q = random_vec(std::size_t{tokens} * heads * d, 91, 4.0f), k = random_vec(std::size_t{tokens} * row, 92),
              v = random_vec(std::size_t{tokens} * row, 93), q_norm = random_vec(d, 94), k_norm = random_vec(d, 95);
    const std::vector<std::uint16_t> zeros(std::size_t{slots_total} * row, 0);
    auto run = [&](bool fused) {
      PoolBuffer bq = g.up(q), bk = g.up(k), bv = g.up(v), bp = g.up(pos), bs = g.up(slots), bf = g.up(freqs),
                 kc = g.up(zeros), vc = g.up(zeros), bqn = g.up(q_norm), bkn = g.up(k_norm);
      run_step(g, [&](Recording& rec) {
        if (!fused) {
          ops::rms_norm(rec, g.kernels, r(bq), r(bqn), r(bq), tokens * heads, d, 1e-6f);
          ops::rms_norm(rec, g.kernels, r(bk), r(bkn), r(bk), tokens * kv_heads, d, 1e-6f);
        }
        const ops::QkNorms norms = fused ? ops::QkNorms{r(bqn), r(bkn), 1e-6f} : ops::QkNorms{};
        ops::rope_kv_write(rec, g.kernels, r(bq), r(bk), r(bv), r(bp), r(bf), r(kc), r(vc), r(bs), shape, kv_heads, {},
                           norms);
      });
      auto floats = [](const std::vector<std::uint16_t>& h) {
        Vec f(h.size());
        for (std::size_t i = 0; i < h.size(); ++i) f[i] = half_to_float(h[i]);
        return f;
      };
      return std::tuple{g.down<float>(bq, q.size()), floats(g.down<std::uint16_t>(kc, zeros.size())),
                        g.down<std::uint16_t>(vc, zeros.size())};
    };
    auto [q1, k1, v1] = run(true);
    auto [q2, k2, v2] = run(false);
    const std::string what = fmt::format("d {}{}", d, shape.neox ? " neox" : "");
    EXPECT_LT(normalised_error(q1, q2), 1e-12) << what;
    EXPECT_LT(normalised_error(k1, k2), 1e-6) << what;  // F16: a rounding may land the other way
    EXPECT_EQ(v1, v2) << what;
    EXPECT_GT(normalised_error(q1, q), 1e-3) << what;  // normed and turned
  }
}

// Attention writing its output as the int8 mat-vec's input (a decode step's output product) makes
// the bytes and scales quantize_q8 makes from its F32 output, bit for bit, and as the tensor cores'
// F16 input what to_f16 makes of it, its padded rows zero (also from one split, which writes the
// output itself); where it has no dispatch to do it (int8 from one split, or the one-pass kernel) it
// says so and writes out.
TEST(AttentionQ8, TheMergeQuantizesAsQuantizeQ8Does) {
  Gpu& g = shared_gpu();
  const std::uint32_t page_size = 16;
  const std::vector<std::uint32_t> lengths{1, 17, 300, 2000};
  std::vector<std::uint32_t> seq_pos;
  for (std::uint32_t i = 0; i < lengths.size(); ++i) seq_pos.insert(seq_pos.end(), {i, lengths[i] - 1});
  using Path = ops::AttentionPath;
  for (std::uint32_t d : {32u, 64u, 80u, 128u, 256u}) {  // 80: no int8 output (a head holds 2.5 blocks)
    for (auto [path, splits] : {std::pair{Path::automatic, 0u}, {Path::split, 7u}, {Path::split, 1u}, {Path::one_pass, 0u}}) {
      const std::uint32_t heads = 8, kv_heads = 2, tokens = static_cast<std::uint32_t>(lengths.size()), k = heads * d;
      auto cache = build_cache(g, lengths, kv_heads * d, page_size);
      ops::AttentionShape s{tokens, heads, kv_heads, d, page_size, cache.max_pages, 1.0f / std::sqrt(float(d)), path, splits};
      auto q = random_vec(std::size_t{tokens} * k, 71 + d);
      auto bq = g.up(q), bsp = g.up(seq_pos), out = g.scratch(q.size() * 4), out2 = g.scratch(q.size() * 4);
      auto scratch = g.scratch(ops::attention_scratch_bytes(s));
      auto want_q8 = g.scratch(ops::q8_acts_bytes(k, tokens)), got_q8 = g.scratch(ops::q8_acts_bytes(k, tokens));
      const std::uint32_t padded = tokens + 3;
      const std::vector<std::uint16_t> stale(std::size_t{padded} * k, 0x3C00);
      auto want_f16 = g.up(stale), got_f16 = g.up(stale), out3 = g.scratch(q.size() * 4);
      bool wrote_q8 = false, wrote_f16 = false, plain = true;
      run_step(g, [&](Recording& rec) {
        plain = ops::attention(rec, g.kernels, r(bq), r(cache.k_cache), r(cache.v_cache), r(cache.tables), r(bsp), r(scratch),
                               r(out), s);
        ops::quantize_q8(rec, g.kernels, r(out), r(want_q8), k, tokens);
        wrote_q8 = ops::attention(rec, g.kernels, r(bq), r(cache.k_cache), r(cache.v_cache), r(cache.tables), r(bsp),
                                  r(scratch), r(out2), s, {.q8 = r(got_q8)});
        ops::to_f16(rec, g.kernels, r(out), r(want_f16), tokens, k, padded);
        wrote_f16 = ops::attention(rec, g.kernels, r(bq), r(cache.k_cache), r(cache.v_cache), r(cache.tables), r(bsp),
                                   r(scratch), r(out3), s, {.f16 = r(got_f16), .padded_rows = padded});
      });
      const std::string what = fmt::format("d {} path {} splits {}", d, static_cast<int>(path), splits);
      EXPECT_FALSE(plain) << what;
      const auto plan = ops::plan_attention(s);
      EXPECT_EQ(wrote_q8, plan.path == Path::split && plan.splits > 1 && d % 32 == 0) << what;
      if (wrote_q8) {
        EXPECT_EQ(g.down<std::uint32_t>(got_q8, ops::q8_acts_bytes(k, tokens) / 4),
                  g.down<std::uint32_t>(want_q8, ops::q8_acts_bytes(k, tokens) / 4))
            << what;
      } else {
        EXPECT_EQ(g.down<float>(out2, q.size()), g.down<float>(out, q.size())) << what;
      }
      EXPECT_EQ(wrote_f16, plan.path == Path::split) << what;
      if (wrote_f16) {
        EXPECT_EQ(g.down<std::uint16_t>(got_f16, stale.size()), g.down<std::uint16_t>(want_f16, stale.size())) << what;
      } else {
        EXPECT_EQ(g.down<std::uint16_t>(got_f16, stale.size()), stale) << what << ": the F16 output untouched";
        EXPECT_EQ(g.down<float>(out3, q.size()), g.down<float>(out, q.size())) << what;
      }
    }
  }
}

// The tensor cores' F16 input made in one dispatch from a norm or silu_mul equals the two
// dispatches it replaces (the F32 op, then to_f16), padded rows zero; a pad left over from an
// earlier, wider step is overwritten.
TEST(F16Inputs, NormAndSiluMakeWhatToF16Makes) {
  Gpu& g = shared_gpu();
  const std::uint32_t rows = 3, padded = 16, n = 1000;
  Vec a = random_vec(std::size_t{rows} * n, 61, 3.0f), b = random_vec(std::size_t{rows} * n, 62), w = random_vec(n, 63);
  const std::vector<std::uint16_t> stale(std::size_t{padded} * n, 0x3C00);  // 1.0 everywhere
  PoolBuffer ba = g.up(a), bb = g.up(b), bw = g.up(w), f32 = g.scratch(std::uint64_t{rows} * n * 4);
  for (bool norm : {true, false}) {
    PoolBuffer one = g.up(stale), two = g.up(stale);
    run_step(g, [&](Recording& rec) {
      if (norm) {
        ops::rms_norm_f16(rec, g.kernels, ba.range(), bw.range(), one.range(), rows, padded, n, 1e-5f);
        ops::rms_norm(rec, g.kernels, ba.range(), bw.range(), f32.range(), rows, n, 1e-5f);
      } else {
        ops::silu_mul_f16(rec, g.kernels, ba.range(), bb.range(), one.range(), rows, padded, n);
        ops::silu_mul(rec, g.kernels, ba.range(), bb.range(), f32.range(), rows * n);
      }
      ops::to_f16(rec, g.kernels, f32.range(), two.range(), rows, n, padded);
    });
    auto got = g.down<std::uint16_t>(one, stale.size()), want = g.down<std::uint16_t>(two, stale.size());
    EXPECT_EQ(got, want) << (norm ? "rms_norm" : "silu_mul");
    Vec reference = norm ? reference::rms_norm(a, w, rows, n, 1e-5f) : reference::silu_mul(a, b);
    for (std::size_t i = 0; i < got.size(); ++i) {
      if (i >= reference.size()) {
        ASSERT_EQ(got[i], 0) << "padded row " << i / n;
        continue;
      }
      ASSERT_NEAR(half_to_float(got[i]), reference[i], 2e-3f * (1 + std::abs(reference[i]))) << i;
    }
  }
}

// A split residual product's sum and the next norm in one dispatch equal sum_splits then
// rms_norm_f16, bit for bit: x, the F16 rows, and the padded rows zero.
TEST(F16Inputs, SumOfSplitsThenNormIsOneDispatch) {
  Gpu& g = shared_gpu();
  const std::uint32_t rows = 3, padded = 16;
  for (std::uint32_t n : {1000u, 998u}) {  // whole vec4 rows, and not
    for (std::uint32_t splits : {1u, 2u, 4u}) {
      Vec x = random_vec(std::size_t{rows} * n, 64 + n, 3.0f), w = random_vec(n, 65);
      Vec parts = random_vec(std::size_t{splits} * rows * n, 66 + splits);
      const std::vector<std::uint16_t> stale(std::size_t{padded} * n, 0x3C00);
      PoolBuffer bparts = g.up(parts), bw = g.up(w), x_one = g.up(x), x_two = g.up(x), one = g.up(stale), two = g.up(stale);
      run_step(g, [&](Recording& rec) {
        ops::sum_splits_rms_norm_f16(rec, g.kernels, bparts.range(), splits, x_one.range(), bw.range(), one.range(), rows,
                                     padded, n, 1e-5f);
        ops::sum_splits(rec, g.kernels, bparts.range(), x_two.range(), rows * n, splits, true);
        ops::rms_norm_f16(rec, g.kernels, x_two.range(), bw.range(), two.range(), rows, padded, n, 1e-5f);
      });
      const std::string what = fmt::format("n {} splits {}", n, splits);
      const Vec summed = g.down<float>(x_one, x.size());
      EXPECT_EQ(summed, g.down<float>(x_two, x.size())) << what;
      EXPECT_NE(summed, x) << what;
      const auto got = g.down<std::uint16_t>(one, stale.size());
      EXPECT_EQ(got, g.down<std::uint16_t>(two, stale.size())) << what;
      for (std::size_t i = std::size_t{rows} * n; i < got.size(); ++i) ASSERT_EQ(got[i], 0) << what << " padded row " << i / n;
    }
  }
  PoolBuffer small = g.scratch(4), x = g.scratch(4 * 8), out = g.scratch(2 * 16 * 8);
  auto rec = g.queue.begin();
  EXPECT_THROW(ops::sum_splits_rms_norm_f16(rec, g.kernels, small.range(), 2, x.range(), x.range(), out.range(), 1, 16, 8,
                                            1e-5f),
               GpuError);
}

// Decode's q/k/v products writing where attention reads (matvec_q8_heads) against the same
// products followed by rope_kv_write: q turned in place, k turned and v as it is in their cache
// rows (F16), every other cache row untouched.
TEST(MatvecQ8Heads, MatchesProductsThenRopeKvWrite) {
  Gpu& g = shared_gpu();
  if (!g.device.features().integer_dot_product) GTEST_SKIP() << "no integer dot products on this device";
  const std::uint32_t heads = 4, kv_heads = 2, k = 512, slots_total = 12;
  for (WeightType type : {WeightType::q4_0, WeightType::q8_0}) {
    for (ops::RopeShape shape : {ops::RopeShape{0, heads, 64, 0, 10000.0f, 1.0f, false},
                                 ops::RopeShape{0, heads, 32, 16, 500000.0f, 0.5f, false},
                                 ops::RopeShape{0, heads, 64, 0, 10000.0f, 0.25f, false, {1.0f, 0.8f, 32.0f, 1.0f, 128}}}) {
      for (std::uint32_t n : {1u, 3u, 8u}) {
        shape.tokens = n;
        const std::uint32_t d = shape.head_dim, mq = heads * d, mkv = kv_heads * d;
        PoolBuffer bf = g.up(ops::rope_frequencies(shape));
        ASSERT_TRUE(ops::matvec_q8_heads_applies(g.device.features(), type, mq, k, n, shape));
        std::vector<std::int32_t> pos(n);
        std::vector<std::uint32_t> slots(n);
        for (std::uint32_t t = 0; t < n; ++t) {
          pos[t] = static_cast<std::int32_t>(t * 37 % 301);  // t = 0 sits at position 0: nothing turns
          slots[t] = (t * 5 + 3) % slots_total;
        }
        Vec x = random_vec(std::size_t{n} * k, 40 + n);
        auto wq = random_weights(type, mq, k, 41), wk = random_weights(type, mkv, k, 42), wv = random_weights(type, mkv, k, 43);
        PoolBuffer bwq = g.up(std::vector<std::byte>(wq)), bwk = g.up(std::vector<std::byte>(wk)),
                   bwv = g.up(std::vector<std::byte>(wv)), bx = g.up(x), bp = g.up(pos), bs = g.up(slots),
                   q8 = g.scratch(ops::q8_acts_bytes(k, n));
        const std::vector<std::uint16_t> zeros(std::size_t{slots_total} * mkv, 0);
        auto run = [&](bool fused) {
          PoolBuffer q = g.scratch(std::uint64_t{n} * mq * 4), kc = g.up(zeros), vc = g.up(zeros),
                     kn = g.scratch(std::uint64_t{n} * mkv * 4), vn = g.scratch(std::uint64_t{n} * mkv * 4);
          run_step(g, [&](Recording& rec) {
            ops::quantize_q8(rec, g.kernels, bx.range(), q8.range(), k, n);
            if (fused) {
              ops::matvec_q8_heads(rec, g.kernels, type, bwq.range(), q8.range(), q.range(), bp.range(), bs.range(),
                                   bf.range(), shape, ops::HeadsOutput::q, mq, k, n);
              ops::matvec_q8_heads(rec, g.kernels, type, bwk.range(), q8.range(), kc.range(), bp.range(), bs.range(),
                                   bf.range(), shape, ops::HeadsOutput::k_cache, mkv, k, n);
              ops::matvec_q8_heads(rec, g.kernels, type, bwv.range(), q8.range(), vc.range(), bp.range(), bs.range(),
                                   bf.range(), shape, ops::HeadsOutput::v_cache, mkv, k, n);
              return;
            }
            ops::matvec_q8(rec, g.kernels, type, bwq.range(), q8.range(), q.range(), mq, k, n, false);
            ops::matvec_q8(rec, g.kernels, type, bwk.range(), q8.range(), kn.range(), mkv, k, n, false);
            ops::matvec_q8(rec, g.kernels, type, bwv.range(), q8.range(), vn.range(), mkv, k, n, false);
            ops::rope_kv_write(rec, g.kernels, q.range(), kn.range(), vn.range(), bp.range(), bf.range(), kc.range(), vc.range(),
                               bs.range(), shape, kv_heads);
          });
          return std::tuple{g.down<float>(q, std::size_t{n} * mq), g.down<std::uint16_t>(kc, zeros.size()),
                            g.down<std::uint16_t>(vc, zeros.size())};
        };
        auto [q1, k1, v1] = run(true);
        auto [q2, k2, v2] = run(false);
        const std::string what = fmt::format("{} head_dim {} n {}", weight_type_name(type), d, n);
        for (std::size_t i = 0; i < q1.size(); ++i) {
          ASSERT_NEAR(q1[i], q2[i], 1e-5f * (1 + std::abs(q2[i]))) << what << " q " << i;
        }
        for (std::size_t i = 0; i < k1.size(); ++i) {
          // The same sums and the same turn: F16 at most one step apart where the float sums differ in a last bit.
          ASSERT_LE(std::abs(int{k1[i]} - int{k2[i]}), 1) << what << " k " << i;
          ASSERT_LE(std::abs(int{v1[i]} - int{v2[i]}), 1) << what << " v " << i;
          const bool written = std::find(slots.begin(), slots.end(), i / mkv) != slots.end();
          if (!written) {
            ASSERT_EQ(k1[i], 0) << what << " cache row " << i / mkv << " is no token's";
          }
        }
        EXPECT_NE(k1, zeros);
        EXPECT_NE(v1, zeros);
      }
    }
  }
  const ops::RopeShape neox{1, heads, 64, 0, 10000.0f, 1.0f, true};
  EXPECT_FALSE(ops::matvec_q8_heads_applies(g.device.features(), WeightType::q4_0, heads * 64, k, 1, neox));
  EXPECT_FALSE(ops::matvec_q8_heads_applies(g.device.features(), WeightType::q4_0, heads * 64, k, 9, ops::RopeShape{1, heads, 64}));
}

// The reference must itself be able to fail: a wrong answer is caught by the same bound.
// The accumulating mat-vec adds the product to what the output held (the residual stream).
TEST(MatvecAccumulate, AddsTheProductToTheOutput) {
  Gpu& g = shared_gpu();
  const std::uint32_t m = 37, k = 512;
  for (WeightType type : all_weight_types) {
    if (!ops::matvec_can_accumulate(type, k, 1)) continue;  // int8 only: matvec_q8 (quant_kernels_oracle_test)
    for (std::uint32_t n : {1u, 3u, 8u}) {
      ASSERT_TRUE(ops::matvec_can_accumulate(type, k, n));
      auto bytes = random_weights(type, m, k, 17 + n);
      Vec weights = dequantize(type, bytes, m, k);
      std::mt19937_64 rng(n);
      std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
      Vec acts(std::size_t{n} * k), residual(std::size_t{n} * m);
      for (auto& v : acts) v = dist(rng);
      for (auto& v : residual) v = dist(rng);
      PoolBuffer w = g.up(std::vector<std::byte>(bytes)), a = g.up(acts), out = g.up(residual);
      auto rec = g.queue.begin();
      ops::matvec_accumulate(rec, g.kernels, type, w.range(), a.range(), false, out.range(), m, k, n);
      g.queue.submit_and_wait(rec);
      Vec got = g.down<float>(out, residual.size());
      Vec product = reference::matmul(weights, as_matvec_sees(g, type, acts), m, k, n);
      for (std::size_t i = 0; i < got.size(); ++i) {
        ASSERT_NEAR(got[i], residual[i] + product[i], bound(type) * (1 + std::abs(product[i])))
            << weight_type_name(type) << " n " << n << " at " << i;
      }
    }
  }
  EXPECT_FALSE(ops::matvec_can_accumulate(WeightType::f16, 512, 9));  // more columns than the vector path takes
  EXPECT_FALSE(ops::matvec_can_accumulate(WeightType::q6_k, 512, 1));  // its vector kernel is int8 alone
}

// The q/k/v and gate/up inputs' fused form: out = W * rmsnorm(x) * norm weight.
TEST(MatvecAccumulate, RmsNormOfTheInputIsTheInput) {
  Gpu& g = shared_gpu();
  const std::uint32_t m = 45, k = 1024;
  for (WeightType type : {WeightType::f32, WeightType::f16, WeightType::q8_0, WeightType::q4_0, WeightType::q4_k}) {
    for (std::uint32_t n : {1u, 5u}) {
      auto bytes = random_weights(type, m, k, 9 + n);
      Vec weights = dequantize(type, bytes, m, k);
      std::mt19937_64 rng(n + 200);
      std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
      Vec x(std::size_t{n} * k), norm(k);
      for (auto& v : x) v = dist(rng);
      for (auto& v : norm) v = 1.0f + 0.25f * dist(rng);
      PoolBuffer w = g.up(std::vector<std::byte>(bytes)), xb = g.up(x), nb = g.up(norm);
      PoolBuffer out = g.scratch(std::uint64_t{n} * m * 4);
      auto rec = g.queue.begin();
      ops::matvec_rms_norm(rec, g.kernels, type, w.range(), xb.range(), nb.range(), 1e-5f, out.range(), m, k, n);
      g.queue.submit_and_wait(rec);
      Vec got = g.down<float>(out, std::size_t{n} * m);
      Vec expected = reference::matmul(weights, as_matvec_sees(g, type, reference::rms_norm(x, norm, n, k, 1e-5f)), m, k, n);
      for (std::size_t i = 0; i < got.size(); ++i) {
        ASSERT_NEAR(got[i], expected[i], 2 * bound(type) * (1 + std::abs(expected[i])))
            << weight_type_name(type) << " n " << n << " at " << i;
      }
    }
  }
}

// The down projection's fused form: out += W * (silu(gate) * up).
TEST(MatvecAccumulate, SiluOfTheGateTimesUpIsTheInput) {
  Gpu& g = shared_gpu();
  const std::uint32_t m = 29, k = 768;
  for (WeightType type : {WeightType::f16, WeightType::q8_0, WeightType::q4_0, WeightType::q4_k}) {
    for (std::uint32_t n : {1u, 4u}) {
      auto bytes = random_weights(type, m, k, 5 + n);
      Vec weights = dequantize(type, bytes, m, k);
      std::mt19937_64 rng(n + 100);
      std::uniform_real_distribution<float> dist(-3.0f, 3.0f);
      Vec gate(std::size_t{n} * k), up(std::size_t{n} * k), residual(std::size_t{n} * m);
      for (auto* v : {&gate, &up, &residual}) for (auto& x : *v) x = dist(rng);
      PoolBuffer w = g.up(std::vector<std::byte>(bytes)), gb = g.up(gate), ub = g.up(up), out = g.up(residual);
      auto rec = g.queue.begin();
      ops::matvec_accumulate_silu(rec, g.kernels, type, w.range(), gb.range(), ub.range(), out.range(), m, k, n);
      g.queue.submit_and_wait(rec);
      Vec got = g.down<float>(out, residual.size());
      Vec product = reference::matmul(weights, as_matvec_sees(g, type, reference::silu_mul(gate, up)), m, k, n);
      for (std::size_t i = 0; i < got.size(); ++i) {
        ASSERT_NEAR(got[i], residual[i] + product[i], 2 * bound(type) * (1 + std::abs(product[i])))
            << weight_type_name(type) << " n " << n << " at " << i;
      }
    }
  }
}

TEST(KernelOpsHarness, ACorruptedResultFailsTheBound) {
  Vec want = random_vec(1000, 16), got = want;
  got[500] += 0.5f;
  EXPECT_GT(normalised_error(got, want), 1e-6);
}

}  // namespace
}  // namespace mqlm::gpu
