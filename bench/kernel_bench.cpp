// `mqlm bench kernels`: time, GB/s, TFLOP/s and the fraction of the device's copy bandwidth
// (measured first, in the same run, by a compute-shader copy) of every kernel, on the shapes
// of one Llama-3-8B layer at 1, 8, 32 and 512 tokens (with --experts-only, a qwen3moe-30b-a3b
// layer's expert products, and past 8 tokens moe_sort and the router's product). GPU time comes from timestamp queries around many
// back-to-back repetitions in one submission.
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <numeric>
#include <random>
#include <sstream>

#include <fmt/format.h>

#include "gpu/buffer_pool.hpp"
#include "gpu/device.hpp"
#include "gpu/fragment_layout.hpp"
#include "gpu/ops.hpp"
#include "gpu/transfer.hpp"
#include "gpu/vulkan_error.hpp"
#include "tools/commands.hpp"
#include "tools/kernel_flags.hpp"

namespace mqlm::tools {

using namespace gpu;

namespace {

struct Model {
  std::uint32_t hidden, ffn, heads, kv_heads, head_dim, vocab, context;
};
constexpr Model llama3_8b{4096, 14336, 32, 8, 128, 128256, 1024};
constexpr Model tiny{256, 512, 4, 2, 64, 1000, 64};
// Its attention (the experts' shapes are bench_experts'): 32 query heads of 4 KV heads, d 128, at the
// context of a 512-token prompt and some decoding.
constexpr Model qwen3moe_30b_a3b{2048, 768, 32, 4, 128, 151936, 600};

class Bench {
 public:
  Bench(const DeviceOptions& options, double target_ms) : device_(options), queue_(device_), pool_(queue_), kernels_(device_), target_ms_(target_ms) {
    VkQueryPoolCreateInfo info{};
    info.sType = VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO;
    info.queryType = VK_QUERY_TYPE_TIMESTAMP;
    info.queryCount = 2;
    VkQueryPool pool = VK_NULL_HANDLE;
    check(vkCreateQueryPool(device_.get(), &info, nullptr, &pool), "vkCreateQueryPool");
    queries_ = {device_.get(), pool};
    probe_fragment_layout(kernels_, queue_, pool_);
  }

  // Microseconds per repetition of `record`.
  double time_us(const std::function<void(Recording&)>& record) {
    auto once = [&](std::uint32_t reps) {
      auto rec = queue_.begin();
      vkCmdResetQueryPool(rec.command_buffer(), queries_.get(), 0, 2);
      rec.write_timestamp(queries_.get(), 0);
      for (std::uint32_t i = 0; i < reps; ++i) record(rec);
      rec.write_timestamp(queries_.get(), 1);
      auto start = std::chrono::steady_clock::now();
      queue_.submit_and_wait(rec);
      double wall_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
      if (device_.features().timestamp_period_ns == 0) return wall_us / reps;
      std::uint64_t stamps[2];
      check(vkGetQueryPoolResults(device_.get(), queries_.get(), 0, 2, sizeof stamps, stamps, 8,
                                  VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT),
            "vkGetQueryPoolResults");
      return double(stamps[1] - stamps[0]) * device_.features().timestamp_period_ns / 1e3 / reps;
    };
    double first = once(1);  // also warms pipelines and caches
    auto reps = static_cast<std::uint32_t>(std::clamp(target_ms_ * 1e3 / std::max(first, 1.0), 3.0, 500.0));
    // One untimed round of the same length first: the clocks drop while the host prepares the
    // next inputs, and a single warm-up repetition is too short for them to come back.
    (void)once(reps);
    return once(reps);
  }

  PoolBuffer random_f32(std::size_t n, std::uint64_t seed, float scale = 1.0f) {
    std::vector<float> v(n);
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> dist(-scale, scale);
    for (auto& x : v) x = dist(rng);
    return upload_new(queue_, pool_, std::span<const float>(v), "bench");
  }

  Device device_;
  ComputeQueue queue_;
  BufferPool pool_;
  KernelLibrary kernels_;
  UniqueQueryPool queries_;
  double target_ms_;
};

struct Row {
  std::string kernel, shape;
  std::uint32_t tokens;
  std::string path;
  double us, bytes, flops;
  std::string check;
};

class Table {
 public:
  explicit Table(double copy_gbs) : copy_gbs_(copy_gbs) {}
  void add(const Row& r) {
    double gbs = r.bytes / r.us / 1e3, tflops = r.flops / r.us / 1e6;
    std::string line = fmt::format("| {} | {} | {} | {} | {:.1f} | {:.1f} | {:.3f} | {:.0f}% | {} |\n", r.kernel, r.shape,
                                   r.tokens, r.path, r.us, gbs, tflops, 100 * gbs / copy_gbs_, r.check);
    text_ << line;
    std::cerr << line << std::flush;
  }
  std::string str() const { return text_.str(); }

 private:
  double copy_gbs_;
  std::ostringstream text_;
};

double copy_bandwidth(Bench& b, std::string& shape) {
  const auto& f = b.device_.features();
  std::uint64_t bytes = std::min<std::uint64_t>({std::uint64_t{1} << 30, f.max_storage_buffer_range / 2 / 16 * 16,
                                                 f.device_local_bytes / 8 / 16 * 16});
  auto src = b.pool_.allocate(bytes, "bench"), dst = b.pool_.allocate(bytes, "bench");
  double us = b.time_us([&](Recording& rec) { ops::copy(rec, b.kernels_, src.range(), dst.range(), bytes); });
  shape = fmt::format("{} MiB", bytes >> 20);
  return 2.0 * double(bytes) / us / 1e3;  // bytes read plus bytes written
}

// TFLOP/s of a module of shaders/coopmat_peak.comp whose subgroups keep `accumulators` 16x16
// F32 accumulators (the tensor cores with nothing else in the way, or with fragment loads).
double tensor_core_tflops(Bench& b, const std::string& module, std::uint32_t accumulators) {
  constexpr std::uint32_t groups = 1056, subgroups = 4, iterations = 4096;
  auto out = b.pool_.allocate(std::uint64_t{groups} * subgroups * accumulators * 16 * 16 * 4, "bench");
  const Kernel& k = b.kernels_.get({module, 1, 4, {}, 32});
  double us = b.time_us([&](Recording& rec) { rec.dispatch(k, {out.range()}, iterations, groups); });
  return 2.0 * 16 * 16 * 16 * accumulators * iterations * subgroups * groups / us / 1e6;
}

// Normalised squared error of `got` against `want`.
std::string compare(Bench& b, const PoolBuffer& got, const PoolBuffer& want, std::size_t n,
                    std::string_view against = "tiled") {
  auto g = download<float>(b.queue_, b.pool_, got, n), w = download<float>(b.queue_, b.pool_, want, n);
  double err = 0, norm = 0;
  for (std::size_t i = 0; i < n; ++i) {
    err += (double(g[i]) - w[i]) * (double(g[i]) - w[i]);
    norm += double(w[i]) * w[i];
  }
  return fmt::format("nmse {:.1e} vs {}", err / std::max(norm, 1e-30), against);
}

// One product shape of one weight type at `tokens` columns, timed every way it can run: its
// weights in copies that repetitions rotate over (at least 256 MiB in all, at most 32 copies), so
// they stream from memory as a model's layers do, not from the 50 MB L2 cache; every row checked
// against the tiled path's output, computed once untimed.
class MatmulRows {
 public:
  MatmulRows(Bench& b, Table& table, WeightType type, const char* name, std::uint32_t rows, std::uint32_t k,
             std::uint32_t tokens, const ops::KernelChoice& choice)
      : b_(b), table_(table), type_(type), rows_(rows), k_(k), tokens_(tokens), choice_(choice),
        shape_(fmt::format("{} {}x{}", name, rows, k)), bytes_(random_weights(type, rows, k, rows + k)),
        acts_(b.random_f32(std::size_t{tokens} * k, 7)), out_(b.pool_.allocate(std::uint64_t{tokens} * rows * 4, "bench")),
        tiled_out_(b.pool_.allocate(out_.size(), "bench")) {
    const std::size_t copies =
        std::clamp<std::size_t>(((std::size_t{256} << 20) + bytes_.size() - 1) / bytes_.size(), 1, 32);
    for (std::size_t i = 0; i < copies; ++i) {
      weights_.push_back(upload_new(b.queue_, b.pool_, std::span<const std::byte>(bytes_), "weights:bench"));
    }
    auto rec = b.queue_.begin();
    ops::matmul(rec, b.kernels_, type, weights_.front().range(), acts_.range(), false, tiled_out_.range(), rows, k, tokens,
                ops::MatmulPath::tiled);
    b.queue_.submit_and_wait(rec);
  }

  // ops::matmul's paths for this width: vector (few tokens), tiled, coopmat.
  void paths() {
    std::vector<ops::MatmulPath> paths;
    if (tokens_ <= 8) paths.push_back(ops::MatmulPath::vector);
    if (tokens_ > 1) paths.push_back(ops::MatmulPath::tiled);
    if (tokens_ > 8 && b_.device_.features().cooperative_matrix) paths.push_back(ops::MatmulPath::cooperative);
    for (auto path : paths) {
      double us = 0;
      try {
        us = b_.time_us([&](Recording& rec) {
          ops::matmul(rec, b_.kernels_, type_, next_weights().range(), acts_.range(), false, out_.range(), rows_, k_,
                      tokens_, path, choice_);
        });
      } catch (const GpuError& e) {  // e.g. a tensor-core pipeline the driver rejects: report, go on
        table_.add({kernel_name(), shape_, tokens_, std::string(ops::matmul_path_name(path)), NAN, 0, 0,
                    std::string("failed: ") + e.what()});
        continue;
      }
      std::string check;
      if (path != ops::MatmulPath::tiled) check = compare(b_, out_, tiled_out_, std::size_t{tokens_} * rows_);
      const double traffic = double(bytes_.size()) + 4.0 * tokens_ * (k_ + rows_);
      table_.add({kernel_name(), shape_, tokens_, std::string(ops::matmul_path_name(path)), us, traffic,
                  2.0 * rows_ * k_ * tokens_, check});
    }
  }

  // Decode's int8 mat-vec from activations quantized once (quantize_q8): as it runs after the
  // quantizing dispatch, with that dispatch and without.
  void int8_rows() {
    if (!ops::matvec_q8_applies(features(), type_, k_, tokens_, choice_)) return;
    auto q8 = b_.pool_.allocate(ops::q8_acts_bytes(k_, tokens_), "bench");
    const double traffic = double(bytes_.size()) + double(ops::q8_acts_bytes(k_, tokens_)) + 4.0 * tokens_ * rows_;
    row("vector, q8 acts", traffic, [&](Recording& rec, const PoolBuffer& w) {
      ops::quantize_q8(rec, b_.kernels_, acts_.range(), q8.range(), k_, tokens_);
      ops::matvec_q8(rec, b_.kernels_, type_, w.range(), q8.range(), out_.range(), rows_, k_, tokens_, false, choice_);
    });
    auto rec = b_.queue_.begin();
    ops::quantize_q8(rec, b_.kernels_, acts_.range(), q8.range(), k_, tokens_);
    b_.queue_.submit_and_wait(rec);
    row("vector, q8 acts made before", traffic, [&](Recording& rec, const PoolBuffer& w) {
      ops::matvec_q8(rec, b_.kernels_, type_, w.range(), q8.range(), out_.range(), rows_, k_, tokens_, false, choice_);
    });
  }

  // The narrow path (tensor cores past the vector path) from F16 activations made untimed, as the
  // forward pass makes them once for several matmuls: via F16 weights where wide products take
  // that, the staged kernel alone and with K split where its grid is small (as the model does for
  // the residual products), and the direct kernel in each of direct_shapes (empty: the tuned one),
  // with the split scratch as the model gives it.
  void narrow_rows(const std::vector<ops::DirectShape>& direct_shapes) {
    if (tokens_ <= 1 || !ops::narrow_matmul_applies(features(), type_, rows_, k_)) return;
    const std::uint32_t padded = ops::narrow_padded_columns(features(), tokens_, choice_);
    auto acts16 = b_.pool_.allocate(std::uint64_t{padded} * k_ * 2, "bench");
    {
      auto rec = b_.queue_.begin();
      ops::to_f16(rec, b_.kernels_, acts_.range(), acts16.range(), tokens_, k_, padded);
      b_.queue_.submit_and_wait(rec);
    }
    const double traffic = double(bytes_.size()) + 2.0 * padded * k_ + 4.0 * tokens_ * rows_;
    auto product = [&](Recording& rec, WeightType type, const PoolBuffer& w, BufferRange parts,
                       const ops::KernelChoice& choice) {
      ops::matmul_narrow(rec, b_.kernels_, type, w.range(), acts16.range(), out_.range(), rows_, k_, tokens_, false,
                         parts, false, choice);
    };
    // Through F16 where the model takes it, and beside the blocks read in place for the types that
    // take that only in decode batches.
    const bool in_place_blocks = !ops::narrow_reads(type_) && ops::narrow_reads_at(features(), type_, tokens_);
    if (ops::narrow_dequantizes(features(), type_, rows_, k_, tokens_) || in_place_blocks) {
      PoolBuffer w16 = b_.pool_.allocate(std::uint64_t{rows_} * k_ * 2, "bench");
      row("staged, via F16", traffic, [&](Recording& rec, const PoolBuffer& w) {
        ops::dequantize_f16(rec, b_.kernels_, type_, w.range(), w16.range(), rows_, k_);
        product(rec, WeightType::f16, w16, {}, choice_);
      });
    }
    if (!ops::narrow_reads_at(features(), type_, tokens_)) return;
    const std::uint64_t split_bytes = ops::narrow_split_bytes(features(), rows_, k_, tokens_, choice_);
    PoolBuffer parts = b_.pool_.allocate(std::max<std::uint64_t>(split_bytes, 4), "bench");
    ops::KernelChoice staged = choice_;
    staged.direct_use = ops::DirectUse::never;
    row("staged", traffic, [&](Recording& rec, const PoolBuffer& w) { product(rec, type_, w, {}, staged); });
    if (split_bytes > 0) {
      row(fmt::format("staged, K in {}", ops::narrow_splits(features(), rows_, k_, tokens_, staged)), traffic,
          [&](Recording& rec, const PoolBuffer& w) { product(rec, type_, w, parts.range(), staged); });
    }
    const std::vector<ops::DirectShape> tuned{ops::DirectShape{}};
    for (const ops::DirectShape& shape : direct_shapes.empty() ? tuned : direct_shapes) {
      ops::KernelChoice direct = choice_;
      direct.direct_use = ops::DirectUse::always;
      direct.direct_shape = shape;
      const ops::DirectShape used = ops::direct_shape(direct);
      if (!ops::direct_matmul_applies(b_.kernels_, type_, rows_, k_, tokens_) ||
          !ops::direct_shape_problem(used, padded).empty()) {
        continue;
      }
      row(fmt::format("direct {}x{}x{}", used.tm, used.sg_k, used.depth), traffic, [&](Recording& rec, const PoolBuffer& w) {
        product(rec, type_, w, split_bytes > 0 ? parts.range() : BufferRange{}, direct);
      });
    }
  }

 private:
  const DeviceFeatures& features() const { return b_.device_.features(); }
  std::string kernel_name() const { return fmt::format("matmul {}", weight_type_name(type_)); }
  const PoolBuffer& next_weights() { return weights_[next_copy_++ % weights_.size()]; }

  // One row of the table for another way of running the product: timed, checked against the tiled path.
  void row(const std::string& name, double traffic, const std::function<void(Recording&, const PoolBuffer&)>& record) {
    double us = NAN;
    std::string check;
    try {
      us = b_.time_us([&](Recording& rec) { record(rec, next_weights()); });
      check = compare(b_, out_, tiled_out_, std::size_t{tokens_} * rows_);
    } catch (const GpuError& e) {
      check = std::string("failed: ") + e.what();
    }
    table_.add({kernel_name(), shape_, tokens_, name, us, traffic, 2.0 * rows_ * k_ * tokens_, check});
  }

  Bench& b_;
  Table& table_;
  WeightType type_;
  std::uint32_t rows_, k_, tokens_;
  const ops::KernelChoice& choice_;
  std::string shape_;
  std::vector<std::byte> bytes_;
  std::vector<PoolBuffer> weights_;
  std::size_t next_copy_ = 0;
  PoolBuffer acts_, out_, tiled_out_;
};

// staged_only: time the narrow (tensor-core) path alone, checked against the tiled path run once untimed.
// direct_shapes: the direct kernel's shapes to time, one row each (empty: its tuned choice).
// choice: the shapes asked for on the command line (the rows of the staged and direct kernels take
// each kernel whatever its direct_use says).
void bench_matmuls(Bench& b, Table& table, const Model& m, std::uint32_t tokens, const std::vector<WeightType>& types,
                   bool staged_only, const std::vector<ops::DirectShape>& direct_shapes, const ops::KernelChoice& choice) {
  struct Shape {
    const char* name;
    std::uint32_t rows, k;
  };
  const Shape shapes[] = {{"attn_qkv", (m.heads + 2 * m.kv_heads) * m.head_dim, m.hidden},
                          {"attn_out", m.hidden, m.heads * m.head_dim},
                          {"ffn_gate_up", 2 * m.ffn, m.hidden},
                          {"ffn_down", m.hidden, m.ffn},
                          {"lm_head", m.vocab, m.hidden}};
  for (auto type : types) {
    for (const auto& s : shapes) {
      MatmulRows rows(b, table, type, s.name, s.rows, s.k, tokens, choice);
      if (!staged_only) {
        rows.paths();
        rows.int8_rows();
      }
      rows.narrow_rows(direct_shapes);
    }
    b.pool_.trim();
  }
}

// A mixture of experts' decode products at qwen3moe-30b-a3b's shapes (hidden 2048, 128 experts of
// 768, 8 a token) for `tokens` tokens, as the model records them: the routing of 128 logits, gate
// and up from the normed x's int8 blocks (two dispatches alongside), silu(gate) * up quantized, and
// down with the weighted sum into x (or, for comparison, down alone); then the same with the
// products routing each token themselves and gate and up making silu(gate) * up (what a decode step
// records by default, KernelChoice::experts_fused), and the block whole both ways. Every expert's
// matrix is one quantized matrix copied (up to 128 copies, as the device's buffer range allows; the
// addresses apart, so a repetition finds no other's weights in L2), and repetitions take 16
// routings in turn: given ids, each token's 8 experts consecutive, every expert read once in 16
// repetitions; ranked, 16 random rows of logits a token.
constexpr std::uint32_t experts_hidden = 2048, experts_ffn = 768, experts_used = 8, experts_routings = 16;

// What the rows of one token count share: activations, outputs and routings.
struct ExpertBuffers {
  PoolBuffer x, gate, up, slot_weights, out, x_q8, glu_q8;
  std::vector<PoolBuffer> logits;  // experts_routings of (tokens, 128) random logits
  PoolBuffer chosen, chosen_w;     // moe_route's ids and weights
};

// The experts' weights of one type: each matrix one expert's quantized rows, copied.
struct ExpertWeights {
  PoolBuffer gate, up, down;
  double gate_bytes = 0, up_bytes = 0, down_bytes = 0;  // one expert's
  std::uint32_t n_expert = 128;                         // copies
};

ExpertWeights expert_weights(Bench& b, WeightType type) {
  ExpertWeights w;
  auto experts_of = [&](std::uint32_t m, std::uint32_t k, double& bytes) {
    const std::vector<std::byte> one = random_weights(type, m, k, m + k);
    const auto copies = std::clamp<std::uint64_t>(b.device_.features().max_storage_buffer_range / one.size(), 1, 128);
    w.n_expert = std::min(w.n_expert, static_cast<std::uint32_t>(copies));
    std::vector<std::byte> all;
    for (std::uint64_t i = 0; i < copies; ++i) all.insert(all.end(), one.begin(), one.end());
    bytes = double(one.size());
    return upload_new(b.queue_, b.pool_, std::span<const std::byte>(all), "weights:bench");
  };
  w.gate = experts_of(experts_ffn, experts_hidden, w.gate_bytes);
  w.up = experts_of(experts_ffn, experts_hidden, w.up_bytes);
  w.down = experts_of(experts_hidden, experts_ffn, w.down_bytes);
  return w;
}

// The products one at a time, on given experts.
void bench_expert_products(Bench& b, Table& table, WeightType type, std::uint32_t tokens, const ExpertWeights& w,
                           const ExpertBuffers& a) {
  const std::uint32_t pairs = tokens * experts_used, hidden = experts_hidden, ffn = experts_ffn;
  std::vector<PoolBuffer> ids;
  for (std::uint32_t r = 0; r < experts_routings; ++r) {
    std::vector<std::uint32_t> v(pairs);
    for (std::uint32_t i = 0; i < pairs; ++i) v[i] = (r * experts_used + i % experts_used + 37 * (i / experts_used)) % w.n_expert;
    ids.push_back(upload_new(b.queue_, b.pool_, std::span<const std::uint32_t>(v), "bench"));
  }
  std::size_t turn = 0;
  auto next_ids = [&] { return ids[turn++ % experts_routings].range(); };
  const ops::ExpertProduct gate_up{ffn, hidden, tokens, experts_used, false, true};
  const ops::ExpertProduct down{hidden, ffn, tokens, experts_used, true, true};
  const std::string name = fmt::format("experts {}", weight_type_name(type));
  const std::string gate_shape = fmt::format("{}x{} x{} pairs", ffn, hidden, pairs),
                    down_shape = fmt::format("{}x{} x{} pairs", hidden, ffn, pairs);
  double us = b.time_us([&](Recording& rec) {
    const BufferRange chosen = next_ids();
    ops::matvec_experts(rec, b.kernels_, type, w.gate.range(), a.x_q8.range(), chosen, a.gate.range(), gate_up);
    rec.next_runs_alongside();
    ops::matvec_experts(rec, b.kernels_, type, w.up.range(), a.x_q8.range(), chosen, a.up.range(), gate_up);
  });
  table.add({name + " gate+up", gate_shape, tokens, "vector int8", us, double(pairs) * (w.gate_bytes + w.up_bytes),
             4.0 * pairs * ffn * hidden, ""});
  us = b.time_us([&](Recording& rec) {
    ops::matvec_experts_glu(rec, b.kernels_, type, w.gate.range(), w.up.range(), a.x_q8.range(),
                            {.experts = next_ids()}, a.glu_q8.range(), gate_up);
  });
  table.add({name + " gate+up+silu", gate_shape, tokens, "vector int8, one dispatch", us,
             double(pairs) * (w.gate_bytes + w.up_bytes), 4.0 * pairs * ffn * hidden, ""});
  us = b.time_us([&](Recording& rec) {
    ops::matvec_experts(rec, b.kernels_, type, w.down.range(), a.glu_q8.range(), next_ids(), a.out.range(), down);
  });
  table.add({name + " down", down_shape, tokens, "vector int8", us, double(pairs) * w.down_bytes,
             2.0 * pairs * hidden * ffn, ""});
  us = b.time_us([&](Recording& rec) {
    ops::matvec_experts_sum(rec, b.kernels_, type, w.down.range(), a.glu_q8.range(), next_ids(),
                            a.slot_weights.range(), a.x.range(), down);
  });
  table.add({name + " down+sum", down_shape, tokens, "vector int8", us, double(pairs) * w.down_bytes,
             2.0 * pairs * hidden * ffn, ""});
}

// Gate and up ranking each token's logits themselves, and the block whole both ways.
void bench_fused_experts(Bench& b, Table& table, WeightType type, std::uint32_t tokens, const ExpertWeights& w,
                         const ExpertBuffers& a) {
  const std::uint32_t pairs = tokens * experts_used, hidden = experts_hidden, ffn = experts_ffn;
  std::size_t turn = 0;
  auto next_logits = [&] { return a.logits[turn++ % experts_routings].range(); };
  const ops::ExpertProduct gate_up{ffn, hidden, tokens, experts_used, false, true};
  const ops::ExpertProduct down{hidden, ffn, tokens, experts_used, true, true};
  auto glu = [&](Recording& rec) {
    ops::matvec_experts_glu(rec, b.kernels_, type, w.gate.range(), w.up.range(), a.x_q8.range(),
                            {a.chosen.range(), a.chosen_w.range(), next_logits(), w.n_expert}, a.glu_q8.range(),
                            gate_up);
  };
  const std::string name = fmt::format("experts {}", weight_type_name(type));
  double us = b.time_us(glu);
  table.add({name + " gate+up+silu", fmt::format("{}x{} x{} pairs", ffn, hidden, pairs), tokens,
             "vector int8, one dispatch, ranked", us, double(pairs) * (w.gate_bytes + w.up_bytes),
             4.0 * pairs * ffn * hidden, ""});
  const std::string block = fmt::format("{} experts, top {}, {}x{}", w.n_expert, experts_used, ffn, hidden);
  const double bytes = double(pairs) * (w.gate_bytes + w.up_bytes + w.down_bytes), flops = 6.0 * pairs * ffn * hidden;
  auto down_sum = [&](Recording& rec) {
    ops::matvec_experts_sum(rec, b.kernels_, type, w.down.range(), a.glu_q8.range(), a.chosen.range(),
                            a.chosen_w.range(), a.x.range(), down);
  };
  us = b.time_us([&](Recording& rec) {
    ops::moe_route(rec, b.kernels_, next_logits(), a.chosen.range(), a.chosen_w.range(), tokens, w.n_expert, experts_used);
    ops::matvec_experts(rec, b.kernels_, type, w.gate.range(), a.x_q8.range(), a.chosen.range(), a.gate.range(), gate_up);
    rec.next_runs_alongside();
    ops::matvec_experts(rec, b.kernels_, type, w.up.range(), a.x_q8.range(), a.chosen.range(), a.up.range(), gate_up);
    ops::quantize_q8_silu(rec, b.kernels_, a.gate.range(), a.up.range(), a.glu_q8.range(), ffn, pairs);
    down_sum(rec);
  });
  table.add({name + " block", block, tokens, "route, gate+up, silu, down+sum", us, bytes, flops, ""});
  us = b.time_us([&](Recording& rec) {
    glu(rec);
    down_sum(rec);
  });
  table.add({name + " block", block, tokens, "gate+up+silu ranked, down+sum", us, bytes, flops, ""});
}

void bench_experts(Bench& b, Table& table, std::uint32_t tokens, const std::vector<WeightType>& types) {
  if (tokens > ops::matvec_max_columns) return;
  constexpr std::uint32_t n_expert = 128;
  const std::uint32_t pairs = tokens * experts_used, hidden = experts_hidden, ffn = experts_ffn;
  ExpertBuffers a;
  a.x = b.random_f32(std::size_t{tokens} * hidden, 21);
  a.gate = b.random_f32(std::size_t{pairs} * ffn, 22);
  a.up = b.random_f32(std::size_t{pairs} * ffn, 23);
  a.slot_weights = b.random_f32(pairs, 24);
  a.out = b.pool_.allocate(std::uint64_t{pairs} * hidden * 4, "bench");
  a.x_q8 = b.pool_.allocate(ops::q8_acts_bytes(hidden, tokens), "bench");
  a.glu_q8 = b.pool_.allocate(ops::q8_acts_bytes(ffn, pairs), "bench");
  for (std::uint32_t r = 0; r < experts_routings; ++r) a.logits.push_back(b.random_f32(std::size_t{tokens} * n_expert, 40 + r, 3.0f));
  a.chosen = b.pool_.allocate(std::uint64_t{pairs} * 4, "bench");
  a.chosen_w = b.pool_.allocate(a.chosen.size(), "bench");
  {
    auto rec = b.queue_.begin();
    ops::quantize_q8(rec, b.kernels_, a.x.range(), a.x_q8.range(), hidden, tokens);
    ops::quantize_q8_silu(rec, b.kernels_, a.gate.range(), a.up.range(), a.glu_q8.range(), ffn, pairs);
    b.queue_.submit_and_wait(rec);
  }
  double us = b.time_us([&](Recording& rec) {
    ops::quantize_q8_silu(rec, b.kernels_, a.gate.range(), a.up.range(), a.glu_q8.range(), ffn, pairs);
  });
  table.add({"quantize_q8_silu", fmt::format("{} x{} pairs", ffn, pairs), tokens, "", us, 9.0 * pairs * ffn, 0, ""});
  us = b.time_us([&](Recording& rec) {
    ops::moe_route(rec, b.kernels_, a.logits[0].range(), a.chosen.range(), a.chosen_w.range(), tokens, n_expert,
                   experts_used);
  });
  table.add({"moe_route", fmt::format("{} experts, top {}", n_expert, experts_used), tokens, "", us,
             4.0 * tokens * n_expert, 0, ""});
  for (WeightType type : types) {
    if (!ops::experts_int8(b.device_.features(), type)) continue;
    const ExpertWeights w = expert_weights(b, type);
    bench_expert_products(b, table, type, tokens, w, a);
    bench_fused_experts(b, table, type, tokens, w, a);
    b.pool_.trim();
  }
}

// A mixture of experts' router in a wide step (qwen3moe-30b-a3b: F32 weights, 128 experts x 2048)
// at t tokens: ops::matmul as the automatic path takes it, and router.comp checked against it. The
// 1 MB of weights stays in L2 from one repetition to the next, as it does across a step's tokens.
void bench_router(Bench& b, Table& table, std::uint32_t t) {
  constexpr std::uint32_t n_expert = 128, n_embd = 2048;
  auto w = b.random_f32(std::size_t{n_expert} * n_embd, 26), x = b.random_f32(std::size_t{t} * n_embd, 27);
  auto want = b.pool_.allocate(std::uint64_t{t} * n_expert * 4, "bench"), got = b.pool_.allocate(want.size(), "bench");
  const std::string shape = fmt::format("{}x{}", n_expert, n_embd);
  const double bytes = 4.0 * (n_expert + t) * n_embd + 4.0 * t * n_expert, flops = 2.0 * t * n_expert * n_embd;
  double us = b.time_us([&](Recording& rec) {
    ops::matmul(rec, b.kernels_, WeightType::f32, w.range(), x.range(), false, want.range(), n_expert, n_embd, t);
  });
  table.add({"router f32", shape, t, "matmul", us, bytes, flops, ""});
  us = b.time_us([&](Recording& rec) {
    ops::router_logits(rec, b.kernels_, WeightType::f32, w.range(), x.range(), got.range(), n_expert, n_embd, t);
  });
  table.add({"router f32", shape, t, "router.comp", us, bytes, flops,
             compare(b, got, want, std::size_t{t} * n_expert, "matmul")});
}

// A mixture of experts' wide step (qwen3moe-30b-a3b: 128 experts of 768, 8 a token, n_embd 2048):
// its expert products of `type` at t tokens, every way a wide step can make them: the tiled float
// kernel (mul_mm_id.comp, from int8 or F32 inputs made untimed) and the tensor cores in tiles of 64
// and 32 pairs (from F16 inputs made untimed), each after its moe_sort (untimed; timed in its own
// row), each checked against the first. Tokens pick 8 distinct experts uniformly at random.
void bench_wide_experts(Bench& b, Table& table, WeightType type, std::uint32_t t) {
  constexpr std::uint32_t n_expert = 128, used = 8, n_embd = 2048, n_ff = 768;
  const std::uint32_t pairs = t * used;
  std::vector<std::uint32_t> ids(pairs);
  std::mt19937 rng(5);
  for (std::uint32_t row = 0; row < t; ++row) {
    std::vector<std::uint32_t> all(n_expert);
    std::iota(all.begin(), all.end(), 0u);
    std::shuffle(all.begin(), all.end(), rng);
    std::copy_n(all.begin(), used, ids.begin() + std::size_t{row} * used);
  }
  auto experts = upload_new(b.queue_, b.pool_, std::span<const std::uint32_t>(ids), "bench");
  auto order = b.pool_.allocate(4ull * pairs, "bench"), tiles = b.pool_.allocate(ops::moe_tiles_bytes(pairs, n_expert), "bench");
  auto sort = [&](std::uint32_t tile) {
    auto rec = b.queue_.begin();
    ops::moe_sort(rec, b.kernels_, experts.range(), order.range(), tiles.range(), pairs, n_expert, tile);
    b.queue_.submit_and_wait(rec);
  };
  for (std::uint32_t tile : {ops::experts_tile_pairs, ops::experts_coopmat_pairs}) {
    const double us = b.time_us([&](Recording& rec) {
      ops::moe_sort(rec, b.kernels_, experts.range(), order.range(), tiles.range(), pairs, n_expert, tile);
    });
    table.add({"moe_sort", fmt::format("{} experts, tiles of {}", n_expert, tile), t, "", us, 12.0 * pairs, 0, ""});
  }
  const std::string kernel = fmt::format("experts {}", weight_type_name(type));
  for (auto [name, m, k, per_pair] : {std::tuple{"gate/up", n_ff, n_embd, false}, {"down", n_embd, n_ff, true}}) {
    const auto bytes = random_weights(type, std::size_t{n_expert} * m, k, m + k);
    std::vector<PoolBuffer> weights;
    const std::size_t copies = std::clamp<std::size_t>((std::size_t{256} << 20) / bytes.size() + 1, 1, 32);
    for (std::size_t i = 0; i < copies; ++i) {
      weights.push_back(upload_new(b.queue_, b.pool_, std::span<const std::byte>(bytes), "weights:bench"));
    }
    std::size_t next = 0;
    const std::uint32_t cols = per_pair ? pairs : t;
    const ops::ExpertProduct shape{m, k, t, used, per_pair, ops::experts_read_q8(type)};
    auto acts = b.random_f32(std::size_t{cols} * k, 7), acts16 = b.pool_.allocate(2ull * cols * k, "bench");
    auto q8 = b.pool_.allocate(ops::q8_acts_bytes(k, cols), "bench");
    auto out = b.pool_.allocate(4ull * pairs * m, "bench"), tiled_out = b.pool_.allocate(out.size(), "bench");
    auto rec = b.queue_.begin();
    ops::to_f16(rec, b.kernels_, acts.range(), acts16.range(), cols, k, cols);
    if (shape.acts_q8) ops::quantize_q8(rec, b.kernels_, acts.range(), q8.range(), k, cols);
    b.queue_.submit_and_wait(rec);
    const std::string shape_name = fmt::format("{} {}x{}, {}x{}", name, n_expert, m, k, pairs);
    const double traffic = double(bytes.size()) + 2.0 * cols * k + 4.0 * pairs * m, flops = 2.0 * m * k * pairs;
    auto row = [&](const std::string& path, const std::function<void(Recording&, const PoolBuffer&)>& record) {
      std::string check;
      double us = NAN;
      try {
        us = b.time_us([&](Recording& r) { record(r, weights[next++ % weights.size()]); });
        check = compare(b, out, tiled_out, std::size_t{pairs} * m);
      } catch (const GpuError& e) {
        check = std::string("failed: ") + e.what();
      }
      table.add({kernel, shape_name, t, path, us, traffic, flops, check});
    };
    sort(ops::experts_tile_pairs);
    auto tiled = [&](Recording& r, const PoolBuffer& w, const PoolBuffer& into) {
      ops::matmul_experts(r, b.kernels_, type, w.range(), shape.acts_q8 ? q8.range() : acts.range(), order.range(),
                          tiles.range(), into.range(), shape, n_expert);
    };
    {
      auto once = b.queue_.begin();
      tiled(once, weights.front(), tiled_out);
      b.queue_.submit_and_wait(once);
    }
    row("tiled", [&](Recording& r, const PoolBuffer& w) { tiled(r, w, out); });
    if (!ops::experts_coopmat_applies(b.device_.features(), type, m, k)) continue;
    ops::ExpertProduct f16 = shape;
    f16.acts_q8 = false;
    for (std::uint32_t tile : {ops::experts_coopmat_pairs, 32u}) {
      sort(tile);
      row(fmt::format("coopmat, tiles of {}", tile), [&](Recording& r, const PoolBuffer& w) {
        ops::matmul_experts_coopmat(r, b.kernels_, type, w.range(), acts16.range(), order.range(), tiles.range(),
                                    out.range(), f16, n_expert, tile);
      });
    }
    if (!quantized(type)) continue;
    // Every expert's weights to F16 first (a step hits all of them at 512 tokens), both timed.
    auto w16 = b.pool_.allocate(2ull * n_expert * m * k, "bench");
    sort(ops::experts_coopmat_pairs);
    row(fmt::format("coopmat via F16, tiles of {}", ops::experts_coopmat_pairs), [&](Recording& r, const PoolBuffer& w) {
      ops::dequantize_f16(r, b.kernels_, type, w.range(), w16.range(), n_expert * m, k);
      ops::matmul_experts_coopmat(r, b.kernels_, WeightType::f16, w16.range(), acts16.range(), order.range(),
                                  tiles.range(), out.range(), f16, n_expert, ops::experts_coopmat_pairs);
    });
    if (per_pair || !ops::experts_glu_applies(b.device_.features(), m, k)) continue;
    // What a wide step does with them (ops::experts_dequantize): gate and up (here one matrix twice)
    // decoded to F16, then silu(gate) * up in one dispatch; against twice the row above and silu.
    auto up16 = b.pool_.allocate(w16.size(), "bench"), glu16 = b.pool_.allocate(2ull * pairs * m, "bench");
    const double us = b.time_us([&](Recording& r) {
      const PoolBuffer& w = weights[next++ % weights.size()];
      ops::dequantize_f16(r, b.kernels_, type, w.range(), w16.range(), n_expert * m, k);
      r.next_runs_alongside();
      ops::dequantize_f16(r, b.kernels_, type, w.range(), up16.range(), n_expert * m, k);
      ops::matmul_experts_glu(r, b.kernels_, w16.range(), up16.range(), acts16.range(), order.range(), tiles.range(),
                              glu16.range(), f16, n_expert);
    });
    table.add({kernel, fmt::format("gate+up 2x{}x{}, {}x{}", n_expert, m, k, pairs), t,
               fmt::format("coopmat SwiGLU via F16, tiles of {}", ops::experts_coopmat_pairs), us, 2 * traffic,
               2 * flops, ""});
  }
  b.pool_.trim();
}

void bench_elementwise(Bench& b, Table& table, const Model& m, std::uint32_t t) {
  std::uint32_t h = m.hidden, qdim = m.heads * m.head_dim;
  {
    auto x = b.random_f32(std::size_t{t} * h, 1), w = b.random_f32(h, 2), out = b.pool_.allocate(4ull * t * h, "bench");
    double us = b.time_us([&](Recording& rec) { ops::rms_norm(rec, b.kernels_, x.range(), w.range(), out.range(), t, h, 1e-5f); });
    table.add({"rms_norm", fmt::format("{}", h), t, "", us, 8.0 * t * h + 4.0 * h, 4.0 * t * h, ""});
    double add_us = b.time_us([&](Recording& rec) { ops::add(rec, b.kernels_, x.range(), x.range(), out.range(), t * h); });
    table.add({"add", fmt::format("{}", h), t, "", add_us, 12.0 * t * h, 1.0 * t * h, ""});
  }
  {
    auto x = b.random_f32(std::size_t{t} * qdim, 3), out = b.pool_.allocate(4ull * t * qdim, "bench");
    std::vector<std::int32_t> pos(t);
    std::iota(pos.begin(), pos.end(), 100);
    auto bp = upload_new(b.queue_, b.pool_, std::span<const std::int32_t>(pos), "bench");
    ops::RopeShape s{t, m.heads, m.head_dim, 0, 500000.0f, 1.0f, true};
    const std::vector<float> frequencies = ops::rope_frequencies(s);
    auto freqs = upload_new(b.queue_, b.pool_, std::span<const float>(frequencies), "bench");
    double us = b.time_us([&](Recording& rec) { ops::rope(rec, b.kernels_, x.range(), bp.range(), freqs.range(), out.range(), s); });
    table.add({"rope neox", fmt::format("{}x{}", m.heads, m.head_dim), t, "", us, 8.0 * t * qdim, 6.0 * t * qdim, ""});
  }
  {
    std::size_t n = std::size_t{t} * m.ffn;
    auto g = b.random_f32(n, 4), u = b.random_f32(n, 5), out = b.pool_.allocate(4 * n, "bench");
    double us = b.time_us([&](Recording& rec) { ops::silu_mul(rec, b.kernels_, g.range(), u.range(), out.range(), n); });
    table.add({"silu_mul", fmt::format("{}", m.ffn), t, "", us, 12.0 * n, 5.0 * n, ""});
  }
  {
    std::size_t n = std::size_t{t} * m.vocab;
    auto logits = b.random_f32(n, 6), out = b.pool_.allocate(4 * n, "bench"), idx = b.pool_.allocate(4ull * t, "bench");
    double us = b.time_us([&](Recording& rec) { ops::softmax(rec, b.kernels_, logits.range(), out.range(), t, m.vocab, 1.0f); });
    table.add({"softmax", fmt::format("{}", m.vocab), t, "", us, 8.0 * n, 4.0 * n, ""});
    auto argmax_scratch = b.pool_.allocate(ops::argmax_scratch_bytes(t, m.vocab), "bench");
    us = b.time_us([&](Recording& rec) {
      ops::argmax(rec, b.kernels_, logits.range(), argmax_scratch.range(), idx.range(), t, m.vocab);
    });
    table.add({"argmax", fmt::format("{}", m.vocab), t, "", us, 4.0 * n, 1.0 * n, ""});
    std::uint32_t k = 64;
    auto scratch = b.pool_.allocate(ops::topk_scratch_bytes(t, m.vocab, k), "bench");
    auto vals = b.pool_.allocate(4ull * t * k, "bench"), ids = b.pool_.allocate(4ull * t * k, "bench");
    us = b.time_us([&](Recording& rec) {
      ops::topk(rec, b.kernels_, logits.range(), scratch.range(), vals.range(), ids.range(), t, m.vocab, k);
    });
    table.add({"top-k 64", fmt::format("{}", m.vocab), t, "", us, 4.0 * n, 1.0 * n, ""});
  }
}

// qwen35-9b's Gated DeltaNet recurrence (16 q/k heads and 32 v heads of 128, 4 taps): up to 32
// tokens a decode step of that many sequences, one token each; past it a prefill of one sequence,
// its tokens in order inside the dispatch. GB/s counts the states read and written once.
void bench_delta_net(Bench& b, Table& table, std::uint32_t t) {
  const bool decode = t <= 32;
  const ops::DeltaNetShape s{decode ? t : 1, decode ? 1 : t, 16, 32, 128, 4, 1e-6f};
  const std::size_t rows = t, conv = s.conv_dim(), delta = std::size_t{s.v_heads} * s.head_dim * s.head_dim;
  auto x = b.random_f32(rows * conv, 1), taps = b.random_f32(conv * s.conv_kernel, 2);
  auto alpha = b.random_f32(rows * s.v_heads, 3), beta = b.random_f32(rows * s.v_heads, 4);
  auto bias = b.random_f32(s.v_heads, 5), rate = b.random_f32(s.v_heads, 6, 0.01f);
  auto conv_state = b.random_f32(s.sequences * (s.conv_kernel - 1) * conv, 7), state = b.random_f32(s.sequences * delta, 8);
  std::vector<std::uint32_t> order(s.sequences);
  std::iota(order.begin(), order.end(), 0u);
  auto slots = upload_new(b.queue_, b.pool_, std::span<const std::uint32_t>(order), "bench");
  auto mixed = b.pool_.allocate(4 * rows * conv, "bench"), out = b.pool_.allocate(4 * rows * s.value_dim(), "bench");
  const std::string shape = fmt::format("{}x{} of {}", s.sequences, s.tokens, s.v_heads * s.head_dim);
  double us = b.time_us([&](Recording& rec) {
    ops::short_conv(rec, b.kernels_, x.range(), taps.range(), conv_state.range(), slots.range(), mixed.range(), s);
  });
  table.add({"short_conv", shape, t, decode ? "decode" : "prefill", us, 8.0 * rows * conv + 8.0 * s.sequences * 3 * conv,
             2.0 * rows * conv * s.conv_kernel, ""});
  us = b.time_us([&](Recording& rec) {
    ops::delta_rule(rec, b.kernels_, mixed.range(), alpha.range(), beta.range(), bias.range(), rate.range(), state.range(),
                    slots.range(), out.range(), s);
  });
  table.add({"delta_rule", shape, t, decode ? "decode" : "prefill", us, 8.0 * s.sequences * delta + 4.0 * rows * conv,
             6.0 * rows * delta, ""});
}

// The sampler (ops::sample), one row a token: its whole cost for greedy and sampled rows, and for
// top-p the passes one by one (STATS alone, then with BINS and GATHER, then with DRAW). Flat logits
// are a random-weight model's (top-p keeps most of the vocabulary, the draw walks the whole row);
// peaked ones a trained model's (the nucleus is among the top candidates).
void bench_sampling(Bench& b, Table& table, const Model& m, std::uint32_t t) {
  struct Case {
    const char* name;
    float temperature, top_p;
    std::uint32_t top_k;
  };
  const Case cases[] = {{"greedy", 0.0f, 1.0f, 0}, {"T1", 1.0f, 1.0f, 0}, {"T0.7 top-k 40", 0.7f, 1.0f, 40},
                        {"T0.7 top-p 0.95", 0.7f, 0.95f, 0}};
  const std::vector<std::uint32_t> zeros(std::size_t{t} * ops::sample_arrival_words + 4, 0);
  auto small = [&](std::size_t words) {
    return upload_new(b.queue_, b.pool_, std::span<const std::uint32_t>(zeros.data(), words), "bench");
  };
  auto arrivals = small(std::size_t{t} * ops::sample_arrival_words), entries = small(4), mask = small(4), prev = small(t);
  auto scratch = b.pool_.allocate(ops::sample_scratch_bytes(t, m.vocab), "bench");
  auto out = b.pool_.allocate(4ull * t * ops::sample_out_words, "bench"), ids = b.pool_.allocate(4ull * t, "bench");
  for (const auto& [logits_kind, scale] : {std::pair{"flat", 1.0f}, std::pair{"peaked", 12.0f}}) {
    auto logits = b.random_f32(std::size_t{t} * m.vocab, 8, scale);
    for (const Case& c : cases) {
      std::vector<ops::SampleRow> rows(t);
      for (std::uint32_t r = 0; r < t; ++r) {
        rows[r].temperature = c.temperature;
        rows[r].inv_temperature = c.temperature > 0.0f ? 1.0f / c.temperature : 1.0f;
        rows[r].top_p = c.top_p;
        rows[r].top_k = c.top_k;
        rows[r].seed_lo = r;
        rows[r].n = m.vocab;
      }
      auto rows_buffer = upload_new(b.queue_, b.pool_, std::span<const ops::SampleRow>(rows), "bench");
      const ops::SampleBuffers buffers{logits.range(), rows_buffer.range(), entries.range(), mask.range(), prev.range(),
                                       scratch.range(),  out.range(),         ids.range(),     arrivals.range()};
      std::vector<std::pair<std::string, ops::SampleNeeds>> variants{{c.name, ops::sample_needs(rows)}};
      if (c.top_p < 1.0f) {
        variants.push_back({"  stats", {false, false, false}});
        variants.push_back({"  stats, bins, gather", {false, true, false}});
      }
      for (const auto& [name, needs] : variants) {
        const double us = b.time_us([&](Recording& rec) { ops::sample(rec, b.kernels_, buffers, t, m.vocab, needs); });
        table.add({"sample " + name, fmt::format("{} {}", m.vocab, logits_kind), t, "", us, 4.0 * t * m.vocab, 0, ""});
      }
    }
  }
}

void bench_attention(Bench& b, Table& table, const Model& m, std::uint32_t t) {
  // Up to 32 tokens: decode of t sequences with m.context tokens each; more: prefill of one
  // sequence's first t tokens.
  bool decode = t <= 32;
  const std::uint32_t page = 16;
  std::uint32_t seqs = decode ? t : 1, length = decode ? m.context : t;
  std::uint32_t max_pages = (length + page - 1) / page, row = m.kv_heads * m.head_dim;
  std::vector<std::uint32_t> tables(seqs * max_pages), seq_pos, slots;
  std::iota(tables.begin(), tables.end(), 0u);
  std::shuffle(tables.begin(), tables.end(), std::mt19937(1));
  for (std::uint32_t i = 0; i < t; ++i) {
    std::uint32_t s = decode ? i : 0, p = decode ? length - 1 : i;
    seq_pos.insert(seq_pos.end(), {s, p});
    slots.push_back(tables[s * max_pages + p / page] * page + p % page);
  }
  std::uint64_t cache_bytes = std::uint64_t{seqs} * max_pages * page * row * 2;
  auto kc = b.pool_.allocate(cache_bytes, "kv"), vc = b.pool_.allocate(cache_bytes, "kv");
  auto bt = upload_new(b.queue_, b.pool_, std::span<const std::uint32_t>(tables), "bench");
  auto sp = upload_new(b.queue_, b.pool_, std::span<const std::uint32_t>(seq_pos), "bench");
  auto bs = upload_new(b.queue_, b.pool_, std::span<const std::uint32_t>(slots), "bench");
  auto q = b.random_f32(std::size_t{t} * m.heads * m.head_dim, 8), out = b.pool_.allocate(q.size(), "bench");
  auto kn = b.random_f32(std::size_t{t} * row, 9), vn = b.random_f32(std::size_t{t} * row, 10);
  double us = b.time_us([&](Recording& rec) {
    ops::kv_write(rec, b.kernels_, kn.range(), vn.range(), kc.range(), vc.range(), bs.range(), t, row);
  });
  table.add({"kv_write", fmt::format("{}x{}", m.kv_heads, m.head_dim), t, "", us, 12.0 * t * row, 0, ""});
  ops::AttentionShape s{t, m.heads, m.kv_heads, m.head_dim, page, max_pages, 1.0f / std::sqrt(float(m.head_dim))};
  double keys = decode ? double(t) * length : double(t) * (t + 1) / 2;  // key positions seen, summed over tokens
  double kv_read = decode ? 4.0 * seqs * length * row : 4.0 * length * row;
  // Both paths, the one `automatic` takes first, so that the crossover can be read off the table.
  auto chosen = ops::plan_attention(s).path;
  auto other = chosen == ops::AttentionPath::split ? ops::AttentionPath::one_pass : ops::AttentionPath::split;
  // Decode: also the split path with other numbers of key ranges than it picks, and with half and a
  // quarter of the query heads a workgroup (where a KV head's group has 4 or more).
  struct Run {
    ops::AttentionPath path;
    std::uint32_t splits = 0, head_group = 0;
  };
  std::vector<Run> runs{{chosen}, {other}};
  if (decode) {
    for (std::uint32_t splits : {4u, 8u, 16u, 64u}) runs.push_back({ops::AttentionPath::split, splits});
    const std::uint32_t group = std::min(m.heads / m.kv_heads, 8u);
    for (std::uint32_t hg : {group / 2, group / 4}) {
      if (hg >= 2 && group % hg == 0) runs.push_back({ops::AttentionPath::split, 0, hg});
    }
  }
  for (auto [path, splits, head_group] : runs) {
    s.path = path;
    s.splits = splits;
    s.head_group = head_group;
    auto plan = ops::plan_attention(s);
    auto scratch = b.pool_.allocate(ops::attention_scratch_bytes(s), "bench");
    us = b.time_us([&](Recording& rec) {
      ops::attention(rec, b.kernels_, q.range(), kc.range(), vc.range(), bt.range(), sp.range(), scratch.range(),
                     out.range(), s);
    });
    std::string name = path == ops::AttentionPath::split ? fmt::format("split x{}", plan.splits) : "one-pass";
    if (head_group != 0) name += fmt::format(", {} heads a workgroup", head_group);
    table.add({decode ? "attention decode" : "attention prefill",
               fmt::format("{}/{} heads d{} ctx {}", m.heads, m.kv_heads, m.head_dim, length), t,
               path == chosen && splits == 0 && head_group == 0 ? name : name + " (not auto)", us, kv_read + 8.0 * t * m.heads * m.head_dim,
               4.0 * keys * m.heads * m.head_dim, ""});
  }
}

std::string utc_now() {
  std::time_t now = std::time(nullptr);
  char date[32];
  std::strftime(date, sizeof(date), "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  return date;
}

// The shapes asked for on the command line (--matvec-shape, --staged-shape, --staged-splits),
// checked; CommandFailed says what is wrong with one.
ops::KernelChoice kernel_choice(const std::string& matvec_shape, const std::string& staged_shape,
                                std::uint32_t staged_splits) {
  ops::KernelChoice choice;
  if (!matvec_shape.empty()) choice.matvec_shape = parse_matvec_shape(matvec_shape);
  if (!staged_shape.empty()) {
    ops::StagedShape staged;
    char x1 = 0, x2 = 0, x3 = 0;
    std::istringstream in(staged_shape);
    if (!(in >> staged.sg_m >> x1 >> staged.sg_n >> x2 >> staged.tm >> x3 >> staged.tn) || x1 != 'x' || x2 != 'x' ||
        x3 != 'x') {
      throw CommandFailed("--staged-shape wants SGMxSGNxTMxTN[xKB], e.g. 4x1x1x4x2, not '" + staged_shape + "'");
    }
    char x4 = 0;
    if (in >> x4 && (x4 != 'x' || !(in >> staged.kb))) {
      throw CommandFailed("--staged-shape wants SGMxSGNxTMxTN[xKB], e.g. 4x1x1x4x2, not '" + staged_shape + "'");
    }
    if (auto problem = ops::staged_shape_problem(staged); !problem.empty()) {
      throw CommandFailed("--staged-shape " + staged_shape + ": " + problem);
    }
    choice.staged_shape = staged;
  }
  choice.staged_splits = staged_splits;
  return choice;
}

// --direct-shapes, checked.
std::vector<ops::DirectShape> parse_direct_shapes(const std::vector<std::string>& texts) {
  std::vector<ops::DirectShape> shapes;
  for (const std::string& text : texts) {
    ops::DirectShape shape;
    char x1 = 0, x2 = 0;
    std::istringstream in(text);
    if (!(in >> shape.tm >> x1 >> shape.sg_k >> x2 >> shape.depth) || x1 != 'x' || x2 != 'x') {
      throw CommandFailed("--direct-shapes wants TMxSGKxDEPTH, e.g. 2x4x4, not '" + text + "'");
    }
    if (auto problem = ops::direct_shape_problem(shape); !problem.empty()) {
      throw CommandFailed("--direct-shapes " + text + ": " + problem);
    }
    shapes.push_back(shape);
  }
  return shapes;
}

// The report's header: the device, its copy bandwidth (measured here, into copy_gbs) and, with
// 16x16x16 tensor cores, their peak with the operands in registers and loaded from shared memory.
std::string device_header(Bench& b, double& copy_gbs) {
  std::string header = fmt::format("- device: {}\n- fragment layout the direct matmul builds (it runs): {}\n",
                                   b.device_.features().summary(), b.kernels_.direct_fragments().value_or(false) ? "yes" : "no");
  std::cerr << header;
  std::string copy_shape;
  copy_gbs = copy_bandwidth(b, copy_shape);
  header += fmt::format("- copy bandwidth (compute-shader copy of {}, bytes read + written): {:.0f} GB/s\n", copy_shape,
                        copy_gbs);
  const auto& cm = b.device_.features().cooperative_matrix;
  if (cm && cm->n == 16) {
    // Variants (shaders/CMakeLists.txt): TMxTN fragments a subgroup, rows of S 16-byte words
    // (the staged matmul's wide shape: 2x4, S = 9).
    const std::pair<const char*, std::uint32_t> variants[] = {{"2x4_s9", 8}, {"2x4_s8", 8}, {"2x4_s10", 8}, {"2x4_s12", 8},
                                                              {"4x4_s9", 16}, {"4x2_s9", 8}, {"1x4_s9", 4}};
    std::string shared;
    for (const auto& [name, acc] : variants) {
      shared += fmt::format(" {} {:.0f},", name, tensor_core_tflops(b, fmt::format("coopmat_peak_shared_{}", name), acc));
    }
    shared.pop_back();
    header += fmt::format("- tensor cores (NV cooperative matrix 16x16x16, F16 x F16 + F32; shaders/coopmat_peak.comp): "
                          "{:.0f} TFLOP/s with the operands in registers; with fragments loaded from shared memory "
                          "(TMxTN fragments a subgroup, rows of S 16-byte words; the staged matmul loads 2x4 (wide) or 1xTN at S = 4 KB + 1):{}\n",
                          tensor_core_tflops(b, "coopmat_peak", 8), shared);
  }
  return header;
}

struct KernelBenchOptions {
  std::vector<std::uint32_t> tokens = {1, 8, 32, 512};
  std::vector<std::string> types = {"q4_0", "q8_0", "f16", "q4_k", "bf16", "f32"};
  std::string preset = "llama3-8b";
  std::string out;
  double target_ms = 20;
  bool matmul_only = false;
  bool attention_only = false;
  std::uint32_t context = 0;
  std::string matvec_shape;
  std::string staged_shape;
  std::uint32_t staged_splits = 0;
  std::vector<std::string> direct_shapes;
  std::string pipeline_stats;
  bool staged_only = false;
  bool sampling_only = false;
  bool experts_only = false;
  bool delta_net_only = false;
  DeviceOptions device;
};

// The table with its header and the command that made it, into o.out.
void write_report(const KernelBenchOptions& o, const std::string& header, const std::string& columns,
                  const Table& table) {
  std::ofstream file(o.out);
  file << "# Kernel benchmark\n\n- date: " << utc_now() << "\n" << header
       << fmt::format("- command: mqlm bench kernels --preset {} --tokens {} --types {}{}{}{}{}", o.preset,
                      fmt::join(o.tokens, ","), fmt::join(o.types, ","), o.matmul_only ? " --matmul-only" : "",
                      o.attention_only ? " --attention-only" : "",
                      o.context != 0 ? fmt::format(" --context {}", o.context) : "",
                      o.matvec_shape.empty() ? "" : " --matvec-shape " + o.matvec_shape)
       << (o.staged_only ? " --staged-only" : "") << (o.experts_only ? " --experts-only" : "")
       << (o.delta_net_only ? " --delta-net-only" : "")
       << (o.staged_shape.empty() ? "" : " --staged-shape " + o.staged_shape)
       << (o.staged_splits == 0 ? "" : fmt::format(" --staged-splits {}", o.staged_splits)) << "\n"
       << "- GB/s counts weights + activations read and outputs written once; attention counts the K/V it reads;"
          " matmul paths: vector (few tokens), tiled, coopmat (tensor cores, 64x64 tiles), staged (the narrow path: tensor cores,"
          " tiles staged through shared memory; \"K in S\": K split in S slices, as the model does for the residual products;"
          " \"via F16\": the weights dequantized to F16 first, both timed, as the model does for wide products);"
          " experts (--experts-only): tiled (mul_mm_id.comp, tiles of 16 pairs), coopmat (mul_mm_staged.comp's EXPERTS,"
          " tiles of 64 or 32; \"via F16\": every expert dequantized to F16 first, both timed; \"SwiGLU via F16\":"
          " gate and up so, then silu(gate) * up in one dispatch, as a wide step does), GB/s counting every"
          " expert's weights once; decode experts (up to 8 tokens): \"one dispatch\": gate, up and silu(gate) * up's"
          " int8 blocks (matvec_experts_glu), \"ranked\": routing each token from its logits itself, \"block\": the"
          " layer's experts as the model records them, separately (moe_route, gate+up, quantize_q8_silu, down+sum)"
          " or fused (the default);"
          " router: ops::matmul (automatic path) and router.comp, the weights from L2;"
          " check: output vs tiled;"
          " matmul repetitions rotate over copies of the weights (>= 256 MiB in all, up to 32) so they come from memory, not L2\n\n"
       << columns << table.str();
  if (!file) throw CommandFailed("cannot write " + o.out);
}

void run_kernel_bench(KernelBenchOptions& o) {
  std::vector<WeightType> types;
  for (const auto& name : o.types) {
    auto type = parse_weight_type(name);
    if (!type) {
      std::vector<std::string_view> names;
      for (WeightType t : all_weight_types) names.push_back(weight_type_name(t));
      throw CommandFailed(fmt::format("unknown weight type '{}' ({})", name, fmt::join(names, ", ")));
    }
    types.push_back(*type);
  }
  Model model = o.preset == "tiny" ? tiny : llama3_8b;
  if (o.context != 0) model.context = o.context;
  const ops::KernelChoice choice = kernel_choice(o.matvec_shape, o.staged_shape, o.staged_splits);
  const std::vector<ops::DirectShape> direct_shapes = parse_direct_shapes(o.direct_shapes);
  o.device.pipeline_statistics = !o.pipeline_stats.empty();
  if (o.staged_only) o.matmul_only = true;
  Bench b(o.device, o.target_ms);
  double copy_gbs = 0;
  const std::string header = device_header(b, copy_gbs);
  std::cerr << header;
  Table table(copy_gbs);
  for (auto t : o.tokens) {
    if (o.sampling_only) {
      bench_sampling(b, table, model, t);
      continue;
    }
    if (o.delta_net_only) {
      bench_delta_net(b, table, t);
      continue;
    }
    if (o.experts_only) {  // the decode products up to 8 tokens (and attention), the wide ones past
      bench_experts(b, table, t, types);
      if (t <= ops::matvec_max_columns) {
        Model moe = qwen3moe_30b_a3b;
        if (o.context != 0) moe.context = o.context;
        bench_attention(b, table, moe, t);
      }
      if (t > ops::matvec_max_columns) {
        bench_router(b, table, t);
        for (WeightType type : types) bench_wide_experts(b, table, type, t);
      }
      continue;
    }
    if (!o.attention_only) bench_matmuls(b, table, model, t, types, o.staged_only, direct_shapes, choice);
    if (!o.attention_only && !o.staged_only) bench_experts(b, table, t, types);
    if (o.matmul_only) continue;
    if (!o.attention_only) {
      bench_elementwise(b, table, model, t);
      bench_sampling(b, table, model, t);
    }
    bench_attention(b, table, model, t);
    b.pool_.trim();
  }
  std::string columns =
      "| kernel | shape | tokens | path | time us | GB/s | TFLOP/s | % of copy BW | check |\n"
      "|---|---|---|---|---|---|---|---|---|\n";
  std::cout << header << "\n" << columns << table.str();
  if (!o.pipeline_stats.empty()) {
    std::filesystem::create_directories(o.pipeline_stats);
    std::ofstream stats(o.pipeline_stats + "/statistics.txt");
    stats << b.kernels_.pipeline_statistics();
    if (!stats) throw CommandFailed("cannot write " + o.pipeline_stats + "/statistics.txt");
    std::cerr << fmt::format("pipeline statistics: {}/statistics.txt\n", o.pipeline_stats);
  }
  if (!o.out.empty()) write_report(o, header, columns, table);
}

}  // namespace

void add_kernel_bench(CLI::App& bench) {
  auto o = std::make_shared<KernelBenchOptions>();
  auto* cmd = bench.add_subcommand("kernels", "every GPU kernel on one Llama-3-8B layer: time, GB/s, TFLOP/s, % of copy bandwidth");
  cmd->add_option("--tokens", o->tokens, "token counts (decode up to 32, prefill above)")->delimiter(',');
  cmd->add_option("--types", o->types, "weight types of the matmuls")->delimiter(',');
  cmd->add_option("--preset", o->preset, "llama3-8b, or tiny for a smoke run on lavapipe")
      ->check(CLI::IsMember({"llama3-8b", "tiny"}));
  cmd->add_option("--device", o->device.selector, "Vulkan device: index or name substring (default: MQLM_VULKAN_DEVICE, else the first discrete GPU)");
  cmd->add_flag("--validation", o->device.validation, "switch on the Khronos validation layers");
  cmd->add_option("--target-ms", o->target_ms, "GPU time to spend on each measurement");
  cmd->add_flag("--matmul-only", o->matmul_only, "only the matmuls (no elementwise, attention)");
  cmd->add_flag("--staged-only", o->staged_only, "of the matmuls, only the narrow (tensor-core) path (implies --matmul-only)");
  cmd->add_flag("--attention-only", o->attention_only, "only kv_write and attention (both paths)");
  cmd->add_flag("--sampling-only", o->sampling_only, "only the sampler: greedy, sampled, and top-p's passes one by one");
  cmd->add_flag("--experts-only", o->experts_only,
                "only a mixture of experts' products (qwen3moe-30b-a3b's shapes): decode's up to 8 tokens with its "
                "attention (32/4 heads, --context or 600 keys), the wide ones, moe_sort and the router's product above");
  cmd->add_flag("--delta-net-only", o->delta_net_only,
                "only qwen35-9b's Gated DeltaNet recurrence (short_conv, delta_rule): a decode step of N sequences up "
                "to 32 tokens, a prefill of one sequence past");
  cmd->add_option("--context", o->context, "context length of the attention decode rows (default: the preset's)");
  cmd->add_option("--matvec-shape", o->matvec_shape,
                  "THREADSxROWS: workgroup shape of the whole-block vector matmul for every type (default: tuned per type)");
  cmd->add_option("--staged-shape", o->staged_shape,
                  "SGMxSGNxTMxTN[xKB]: the narrow (tensor-core) matmul's subgroups along M and N, 16x16 fragments "
                  "per subgroup along M and N, and blocks of 32 along K per stage (1 if not given), for every column "
                  "count (default: tuned per column count)");
  cmd->add_option("--staged-splits", o->staged_splits,
                  "slices of K for the narrow matmul's split rows, where it splits (default: tuned)");
  cmd->add_option("--direct-shapes", o->direct_shapes,
                  "TMxSGKxDEPTH,...: the direct (fragments in registers) matmul's shapes to time, one row each: 16-row "
                  "fragments a subgroup, subgroups sharing K, blocks of weights in flight (default: the tuned one)")
      ->delimiter(',');
  cmd->add_option("--pipeline-stats", o->pipeline_stats,
                  "write what the driver reports of every pipeline used (statistics such as registers) to "
                  "DIR/statistics.txt (VK_KHR_pipeline_executable_properties)");
  cmd->add_option("--out", o->out, "also write the table, with date, device, driver and command, to this file");
  cmd->callback([o] { run_kernel_bench(*o); });
}

}  // namespace mqlm::tools
