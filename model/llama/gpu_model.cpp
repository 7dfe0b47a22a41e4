#include "model/llama/gpu_model.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <optional>
#include <tuple>
#include <utility>
#include <stdexcept>

#include "gpu/fragment_layout.hpp"
#include "gpu/ops.hpp"
#include "gpu/transfer.hpp"

namespace mqlm::model {

namespace ops = gpu::ops;
using gpu::BufferRange;
using gpu::PoolBuffer;

namespace {

BufferRange rows_of(const PoolBuffer& buffer, std::uint64_t first_row, std::uint64_t rows, std::uint64_t row_bytes) {
  return buffer.range(first_row * row_bytes, rows * row_bytes);
}

}  // namespace

GpuKvCache::GpuKvCache(GpuContext gpu, const LlamaConfig& config, std::uint32_t pages, std::uint32_t page_size,
                       std::string_view owner)
    : queue_(gpu.queue),
      pool_(gpu.pool),
      kernels_(gpu.kernels),
      pages_(pages),
      page_size_(page_size),
      page_layer_bytes_(std::uint64_t{page_size} * config.kv_dim() * 2) {  // F16
  if (pages == 0 || page_size == 0) throw std::invalid_argument("a KV cache needs pages of at least one token");
  const VkDeviceSize bytes = VkDeviceSize{pages} * page_layer_bytes_;
  for (std::uint32_t l = 0; l < config.n_layers; ++l) {
    keys_.push_back(gpu.pool.allocate(bytes, owner));
    values_.push_back(gpu.pool.allocate(bytes, owner));
  }
}

std::uint64_t GpuKvCache::page_bytes() const { return 2 * keys_.size() * page_layer_bytes_; }

template <class Region, class Bytes>
std::vector<Region> GpuKvCache::page_regions(std::span<const std::uint32_t> pages, std::span<const Bytes> host) const {
  if (pages.size() != host.size()) {
    throw std::invalid_argument(std::to_string(pages.size()) + " pages but " + std::to_string(host.size()) +
                                " host buffers");
  }
  std::vector<Region> regions;
  regions.reserve(pages.size() * keys_.size() * 2);
  for (std::size_t i = 0; i < pages.size(); ++i) {
    if (pages[i] >= pages_) {
      throw std::invalid_argument("page " + std::to_string(pages[i]) + " is outside a KV cache of " +
                                  std::to_string(pages_) + " pages");
    }
    if (host[i].size() != page_bytes()) {
      throw std::invalid_argument("page " + std::to_string(pages[i]) + " has " + std::to_string(host[i].size()) +
                                  " host bytes, not the " + std::to_string(page_bytes()) + " a page takes");
    }
    const VkDeviceSize at = VkDeviceSize{pages[i]} * page_layer_bytes_;
    for (std::size_t l = 0; l < keys_.size(); ++l) {
      regions.push_back({keys_[l], at, host[i].subspan(2 * l * page_layer_bytes_, page_layer_bytes_)});
      regions.push_back({values_[l], at, host[i].subspan((2 * l + 1) * page_layer_bytes_, page_layer_bytes_)});
    }
  }
  return regions;
}

void GpuKvCache::read_pages(std::span<const std::uint32_t> pages, std::span<const std::span<std::byte>> out) {
  auto regions = page_regions<gpu::DownloadRegion>(pages, out);
  gpu::download_regions(queue_, pool_, regions, staging_chunk_, always_stage_);
}

gpu::PendingDownload GpuKvCache::read_pages_later(std::span<const std::uint32_t> pages,
                                                  std::span<const std::span<std::byte>> out, gpu::PoolBuffer staging) {
  auto regions = page_regions<gpu::DownloadRegion>(pages, out);  // checks the pages and sizes
  const std::uint64_t bytes = pages.size() * page_bytes();
  const std::uint64_t limit = queue_.device().features().max_storage_buffer_range;
  if (pages.empty() || page_layer_bytes_ % 16 != 0 || (limit != 0 && bytes > limit)) {
    return gpu::download_later(queue_, pool_, regions);
  }
  gpu::PendingDownload pending;
  pending.staging = staging.size() >= bytes && staging.mapped() != nullptr
                        ? std::move(staging)
                        : pool_.allocate(bytes, "staging", gpu::MemoryKind::host);
  // Freed when this returns: the pool keeps it from reuse until the submission is done.
  PoolBuffer index = pool_.allocate(pages.size_bytes(), "staging", gpu::MemoryKind::host);
  std::memcpy(index.mapped(), pages.data(), pages.size_bytes());
  auto rec = queue_.begin();
  rec.after_previous_submissions();  // behind the steps that wrote the pages
  const auto count = static_cast<std::uint32_t>(pages.size());
  for (std::size_t l = 0; l < keys_.size(); ++l) {
    for (std::size_t kv = 0; kv < 2; ++kv) {
      if (l + kv > 0) rec.next_runs_alongside();  // each writes its own part of every page
      gpu::ops::copy_gather(rec, kernels_, (kv == 0 ? keys_ : values_)[l].range(), pending.staging.range(),
                            index.range(), page_layer_bytes_, count, (2 * l + kv) * page_layer_bytes_, page_bytes());
    }
  }
  rec.make_visible_to_host();
  pending.done = queue_.submit(rec);
  for (std::size_t i = 0; i < pages.size(); ++i) {
    pending.copies.push_back({out[i].data(), pending.staging.mapped() + i * page_bytes(), page_bytes()});
  }
  return pending;
}

void GpuKvCache::write_pages(std::span<const std::uint32_t> pages, std::span<const std::span<const std::byte>> data) {
  auto regions = page_regions<gpu::UploadRegion>(pages, data);
  // Two writes of one page in one batch of copies would race on the GPU.
  std::vector<std::uint32_t> sorted(pages.begin(), pages.end());
  std::ranges::sort(sorted);
  if (auto twice = std::ranges::adjacent_find(sorted); twice != sorted.end()) {
    throw std::invalid_argument("page " + std::to_string(*twice) + " is written twice in one write_pages");
  }
  gpu::upload_regions(queue_, pool_, regions, staging_chunk_, always_stage_);
}

void GpuKvCache::set_page_staging(std::size_t chunk_bytes, bool always_stage) {
  if (chunk_bytes == 0) throw std::invalid_argument("page copies in staging chunks of 0 bytes");
  staging_chunk_ = chunk_bytes;
  always_stage_ = always_stage;
}

GpuTensor GpuModel::upload(gpu::Uploader& uploader, const TensorSource& source, const TensorSpec& spec) {
  auto tensor = find_tensor(source, spec);
  if (!tensor) return {};
  // A kernel binds a whole weight matrix as one storage buffer range.
  const std::uint64_t limit = gpu_.queue.device().features().max_storage_buffer_range;
  if (limit != 0 && tensor->bytes.size() > limit) {
    throw std::runtime_error(spec.name + " takes " + std::to_string(tensor->bytes.size() >> 20) + " MiB, more than the " +
                             std::to_string(limit >> 20) + " MiB one buffer binding can reach on " +
                             gpu_.queue.device().features().name);
  }
  GpuTensor t{tensor->type, tensor->rows, tensor->cols, {}};
  t.buffer = uploader.upload_new(tensor->bytes, owner_);
  return t;
}

GpuModel::GpuModel(GpuContext gpu, LlamaConfig config, const TensorSource& source, std::string owner)
    : gpu_(gpu), config_(config), owner_(std::move(owner)) {
  if (std::string why = config_.check(); !why.empty()) throw std::runtime_error("bad model configuration: " + why);
  if (config_.head_dim != 64 && config_.head_dim != 128) {
    throw std::runtime_error("the GPU attention kernel takes head dimensions 64 and 128, this model has " +
                             std::to_string(config_.head_dim));
  }
  // Whether the direct matmul may take decode batches here (once per library).
  gpu::probe_fragment_layout(gpu_.kernels, gpu_.queue, gpu_.pool);
  auto specs = tensor_specs(config_);
  std::size_t i = 0;
  // One uploader for every tensor: its staging buffers are made once, and each tensor is copied
  // out of the file while the GPU takes the one before.
  gpu::Uploader uploader(gpu_.queue, gpu_.pool);
  auto next = [&] { return upload(uploader, source, specs.at(i++)); };
  token_embd_ = next();
  layers_.resize(config_.n_layers);
  for (auto& layer : layers_) {
    assign_layer_tensors(config_, layer, next);
  }
  output_norm_ = next();
  output_ = next();
  config_.tied_output = !output_.buffer;
  uploader.finish();
}

std::vector<float> GpuModel::forward(const StepBatch& batch, GpuKvCache& cache, StepProfile* profile) {
  std::vector<float> logits;
  run(batch, cache, profile, &logits, nullptr);
  return logits;
}

std::vector<std::int32_t> GpuModel::forward_argmax(const StepBatch& batch, GpuKvCache& cache, StepProfile* profile) {
  std::vector<std::int32_t> ids;
  run(batch, cache, profile, nullptr, &ids);
  return ids;
}

GpuModel::PendingArgmax GpuModel::submit_argmax(const StepBatch& batch, GpuKvCache& cache,
                                                const PendingArgmax* tokens_from) {
  PendingArgmax pending;
  std::vector<std::int32_t> ids;
  run(batch, cache, nullptr, nullptr, &ids, &pending, tokens_from);
  return pending;
}

std::vector<std::int32_t> GpuModel::collect(PendingArgmax& pending) {
  if (pending.collected) throw std::logic_error("collect: no step pending, or collected already");
  gpu_.queue.wait(pending.done_at);
  std::vector<std::int32_t> ids(pending.count);
  if (pending.count != 0) std::memcpy(ids.data(), pending.readback.mapped(), std::size_t{pending.count} * 4);
  pending.collected = true;
  return ids;
}

void GpuModel::run(const StepBatch& batch, GpuKvCache& cache, StepProfile* profile, std::vector<float>* logits_out,
                   std::vector<std::int32_t>* argmax_out, PendingArgmax* pending, const PendingArgmax* tokens_from) {
  const auto step_start = std::chrono::steady_clock::now();
  const LlamaConfig& c = config_;
  const auto n = static_cast<std::uint32_t>(batch.tokens.size());
  if (n == 0) return;
  if (tokens_from != nullptr && tokens_from->count != n) {
    throw std::invalid_argument("a step's tokens from the step before: " + std::to_string(tokens_from->count) +
                                " there, " + std::to_string(n) + " here");
  }
  const std::uint32_t page_size = cache.page_size();
  std::uint32_t max_pages = 1;
  for (const auto& table : batch.block_tables) max_pages = std::max<std::uint32_t>(max_pages, table.size());

  // The step's small inputs.
  std::vector<std::uint32_t> ids(n), slots(n), seq_pos(2 * n), output_rows;
  std::vector<std::int32_t> positions(n);
  for (std::uint32_t t = 0; t < n; ++t) {
    const StepToken& s = batch.tokens[t];
    if (s.token < 0 || static_cast<std::uint32_t>(s.token) >= c.n_vocab) {
      throw std::out_of_range("token id " + std::to_string(s.token) + " is outside the vocabulary");
    }
    if (s.sequence >= batch.block_tables.size() || s.position / page_size >= batch.block_tables[s.sequence].size()) {
      throw std::out_of_range("token " + std::to_string(t) + " has no cache page for its position");
    }
    std::uint32_t page = batch.block_tables[s.sequence][s.position / page_size];
    if (page >= cache.pages()) throw std::out_of_range("block table names page " + std::to_string(page));
    ids[t] = static_cast<std::uint32_t>(s.token);
    positions[t] = static_cast<std::int32_t>(s.position);
    slots[t] = page * page_size + s.position % page_size;
    seq_pos[2 * t] = s.sequence;
    seq_pos[2 * t + 1] = s.position;
    if (s.output) output_rows.push_back(t);
  }
  std::vector<std::uint32_t> tables(batch.block_tables.size() * max_pages, 0);
  for (std::size_t s = 0; s < batch.block_tables.size(); ++s) {
    std::copy(batch.block_tables[s].begin(), batch.block_tables[s].end(), tables.begin() + s * max_pages);
  }
  const auto n_out = static_cast<std::uint32_t>(output_rows.size());
  if (n_out == 0) output_rows.push_back(0);  // keep buffers non-empty; nothing is read back

  auto& q = gpu_.queue;
  auto& pool = gpu_.pool;
  auto& lib = gpu_.kernels;
  std::optional<gpu::Recording> current(q.begin());
  auto rec_of = [&]() -> gpu::Recording& { return *current; };
  // The first part too: a copy of KV pages to the host may be in flight (read_pages_later), and
  // this step may write those pages.
  rec_of().after_previous_submissions();
  // Step inputs (token ids, positions, cache slots, block tables) travel in the command buffer
  // itself into device memory (Recording::update: up to 64 KiB each), so that the kernels that read
  // them every layer (rope, the cache writes, attention) read L2, not host memory across PCIe
  // (H100, Q4_0 decode: attention 0.494 -> 0.449 ms a token). Larger ones stay in host-visible
  // memory the kernels read directly.
  auto upload = [&](const auto& v) {
    auto bytes = std::as_bytes(std::span(v));
    if (bytes.size() <= 65536 && bytes.size() % 4 == 0 && !bytes.empty()) {
      PoolBuffer buffer = pool.allocate(bytes.size(), "scratch");
      rec_of().update(buffer.range(), bytes);
      return buffer;
    }
    PoolBuffer buffer = pool.allocate(std::max<std::size_t>(bytes.size(), 4), "scratch", gpu::MemoryKind::host);
    std::memcpy(buffer.mapped(), bytes.data(), bytes.size());
    return buffer;
  };
  // Token ids from the step before (tokens_from) are on the GPU already.
  PoolBuffer ids_buf = tokens_from != nullptr ? PoolBuffer{} : upload(ids), pos_buf = upload(positions), slots_buf = upload(slots),
             seq_pos_buf = upload(seq_pos), tables_buf = upload(tables), out_rows_buf = upload(output_rows);
  auto scratch = [&](std::uint64_t floats) { return pool.allocate(std::max<std::uint64_t>(floats, 1) * 4, "scratch"); };
  PoolBuffer x = scratch(std::uint64_t{n} * c.n_embd), h = scratch(std::uint64_t{n} * c.n_embd),
             qb = scratch(std::uint64_t{n} * c.q_dim()), kb = scratch(std::uint64_t{n} * c.kv_dim()),
             vb = scratch(std::uint64_t{n} * c.kv_dim()), attn = scratch(std::uint64_t{n} * c.q_dim()),
             proj = scratch(std::uint64_t{n} * c.n_embd), picked = scratch(std::uint64_t{n_out + 1} * c.n_embd),
             logits = scratch(std::uint64_t{std::max(n_out, 1u)} * c.n_vocab);
  // gate and up as F32 (n x n_ff each: 235 MB at 2,048 tokens of llama3-8b), made where a step's
  // feed-forward blocks need them: not where the SwiGLU is one dispatch (narrow_glu below).
  PoolBuffer gate, up;

  // A step goes to the GPU in parts of a few layers: the host records the next part while the
  // GPU runs the one before (each part begins with a barrier on what came before it).
  // Profiling: a timestamp after each op, labelled with the kind of op it ends.
  constexpr std::uint32_t kMaxStamps = 4096;
  const bool profiling = profile != nullptr && q.device().features().timestamp_period_ns > 0;
  std::vector<const char*> labels;
  if (profiling && !timestamps_) {
    VkQueryPoolCreateInfo info{};
    info.sType = VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO;
    info.queryType = VK_QUERY_TYPE_TIMESTAMP;
    info.queryCount = kMaxStamps;
    VkQueryPool pool_handle = VK_NULL_HANDLE;
    if (vkCreateQueryPool(q.device().get(), &info, nullptr, &pool_handle) != VK_SUCCESS) {
      throw std::runtime_error("cannot create a timestamp query pool for profiling");
    }
    timestamps_ = {q.device().get(), pool_handle};
  }
  auto mark = [&](const char* label) {
    if (!profiling || labels.size() >= kMaxStamps) return;
    rec_of().write_timestamp(timestamps_.get(), static_cast<std::uint32_t>(labels.size()));
    labels.push_back(label);
  };
  if (profiling) vkCmdResetQueryPool(rec_of().command_buffer(), timestamps_.get(), 0, kMaxStamps);
  mark("start");
  // Batches too wide for the vector path take the tensor cores' narrow path where the device and
  // the weights allow it: its F16 input is made once (into acts16) for every matmul that reads it.
  const auto& features = q.device().features();
  auto narrow = [&](const GpuTensor& w, std::uint32_t columns) {
    return ops::narrow_matmul_preferred(features, w.type, static_cast<std::uint32_t>(w.rows),
                                        static_cast<std::uint32_t>(w.cols), columns);
  };
  PoolBuffer acts16;
  auto acts16_range = [&]() {
    if (!acts16) {
      const std::uint64_t widest = std::max({c.n_embd, c.q_dim(), c.n_ff});
      acts16 = pool.allocate(std::uint64_t{ops::narrow_padded_columns(features, n)} * widest * 2, "scratch");
    }
    return acts16.range();
  };
  auto to_f16 = [&](const PoolBuffer& in, std::uint32_t rows, std::uint32_t width) {
    ops::to_f16(rec_of(), lib, in.range(), acts16_range(), rows, width, ops::narrow_padded_columns(features, rows));
  };
  // The bytes the widest group of products recorded alongside each other (q/k/v, gate/up, and the
  // residual products alone) needs of a step scratch, each product bytes_of(w); the first layer's
  // shapes are every layer's.
  auto widest_group = [&](auto bytes_of) {
    std::uint64_t widest = 0;
    if (layers_.empty()) return widest;
    const Layer& l = layers_.front();
    for (auto group : {std::vector<const GpuTensor*>{&l.wq, &l.wk, &l.wv}, {&l.w_gate, &l.w_up}, {&l.wo}, {&l.w_down}}) {
      std::uint64_t sum = 0;
      for (const GpuTensor* w : group) sum += bytes_of(*w);
      widest = std::max(widest, sum);
    }
    return widest;
  };
  // Products with few rows for a large GPU (a decode batch's q/k/v and residual products) split K on
  // the narrow path; the partial products go to this scratch, a part of it for each product of a
  // group recorded alongside each other.
  auto split_bytes = [&](const GpuTensor& w) {
    return narrow(w, n) ? ops::narrow_split_bytes(features, static_cast<std::uint32_t>(w.rows),
                                                  static_cast<std::uint32_t>(w.cols), n)
                        : 0;
  };
  PoolBuffer split_parts;
  if (const std::uint64_t bytes = widest_group(split_bytes); bytes > 0) split_parts = pool.allocate(bytes, "scratch");
  // Wide steps (prefill chunks) multiply Q4_0 and Q8_0 weights as F16 matrices dequantized once per
  // step into this scratch, a part for each product of a group.
  auto dequantizes = [&](const GpuTensor& w) {
    return ops::narrow_dequantizes(features, w.type, static_cast<std::uint32_t>(w.rows), static_cast<std::uint32_t>(w.cols), n);
  };
  auto f16_bytes = [](const GpuTensor& w) { return std::uint64_t{w.rows} * w.cols * 2; };
  PoolBuffer weights16;
  const std::uint64_t weights16_bytes = widest_group([&](const GpuTensor& w) { return dequantizes(w) ? f16_bytes(w) : 0; });
  if (weights16_bytes > 0) weights16 = pool.allocate(weights16_bytes, "scratch");
  // Dequantizes each of `ws` that takes it into its own part of weights16 (the dispatches run
  // alongside each other); returns each one's F16 range, empty for the others.
  auto dequantize_all = [&](const std::vector<const GpuTensor*>& ws) {
    std::vector<gpu::BufferRange> ranges;
    std::uint64_t offset = 0;
    bool first = true;
    for (const GpuTensor* w : ws) {
      if (!weights16 || !dequantizes(*w)) {
        ranges.emplace_back();
        continue;
      }
      ranges.push_back(weights16.range(offset, f16_bytes(*w)));
      offset += f16_bytes(*w);
      if (!std::exchange(first, false)) rec_of().next_runs_alongside();
      ops::dequantize_f16(rec_of(), lib, w->type, w->buffer.range(), ranges.back(), static_cast<std::uint32_t>(w->rows),
                          static_cast<std::uint32_t>(w->cols));
    }
    return ranges;
  };
  // split_scratch: where the product may split K; sum_later: the caller records its sum (ops::matmul_narrow).
  // input: the F16 activations, acts16 unless given.
  auto matmul_narrow = [&](const GpuTensor& w, PoolBuffer& out, std::uint32_t rows, bool accumulate,
                           gpu::BufferRange dequantized = {}, gpu::BufferRange split_scratch = {}, bool sum_later = false,
                           gpu::BufferRange input = {}) {
    const bool f16 = dequantized.buffer != VK_NULL_HANDLE;
    return ops::matmul_narrow(rec_of(), lib, f16 ? gpu::WeightType::f16 : w.type, f16 ? dequantized : w.buffer.range(),
                              input.buffer != VK_NULL_HANDLE ? input : acts16.range(), out.range(),
                              static_cast<std::uint32_t>(w.rows), static_cast<std::uint32_t>(w.cols), rows, accumulate,
                              split_scratch, sum_later);
  };
  // Int8 activations (ops::matvec_int8) of up to n columns, quantized by the dispatch before the
  // product that reads them.
  PoolBuffer acts_q8;
  auto q8 = [&]() {
    if (!acts_q8) acts_q8 = pool.allocate(ops::q8_acts_bytes(std::max({c.n_embd, c.q_dim(), c.n_ff}), n), "scratch");
    return acts_q8.range();
  };
  auto matmul = [&](const GpuTensor& w, const PoolBuffer& in, PoolBuffer& out, std::uint32_t rows) {
    if (narrow(w, rows)) {
      to_f16(in, rows, static_cast<std::uint32_t>(w.cols));
      matmul_narrow(w, out, rows, false);
      return;
    }
    const auto m = static_cast<std::uint32_t>(w.rows), k = static_cast<std::uint32_t>(w.cols);
    // From 2 columns the int8 input is quantized once rather than in each workgroup (H100, the
    // output matrix at 4 columns: 269 against 398 us); for one, the extra dispatch costs more.
    if (rows >= 2 && ops::choose_matmul_path(features, rows) == ops::MatmulPath::vector &&
        ops::matvec_int8(features, w.type) && ops::matvec_can_accumulate(w.type, k, rows)) {
      ops::quantize_q8(rec_of(), lib, in.range(), q8(), k, rows);
      ops::matvec_q8(rec_of(), lib, w.type, w.buffer.range(), q8(), out.range(), m, k, rows, false);
      return;
    }
    ops::matmul(rec_of(), lib, w.type, w.buffer.range(), in.range(), false, out.range(), static_cast<std::uint32_t>(w.rows),
                static_cast<std::uint32_t>(w.cols), rows);
  };
  // x += w * in: fused into the mat-vec where it can be (decode), else a product and an add.
  // Decode steps take the mat-vec path, which can fold the residual add (and silu) into it.
  auto fused_decode = [&](const GpuTensor& w) {
    return !narrow(w, n) && ops::choose_matmul_path(q.device().features(), n) == ops::MatmulPath::vector &&
           ops::matvec_can_accumulate(w.type, static_cast<std::uint32_t>(w.cols), n);
  };
  // Decode products that take the int8 mat-vec (ops::matvec_int8: Q8_0 and Q4_0) read
  // activations quantized once by the dispatch before them (which also makes the norm or
  // silu(gate) * up): into normed_q8 for the projections of a norm, acts_q8 for the others.
  auto int8_decode = [&](const GpuTensor& w) { return fused_decode(w) && ops::matvec_int8(features, w.type); };
  // The quantized rmsnorm(x) the int8 projections read.
  PoolBuffer normed_q8;
  auto normed = [&]() {
    if (!normed_q8) normed_q8 = pool.allocate(ops::q8_acts_bytes(c.n_embd, n), "scratch");
    return normed_q8.range();
  };
  // The norm whose F16 output the residual product before it made along with its sum (see
  // narrow_residual): its own dispatch is then skipped.
  const GpuTensor* normed_by_residual = nullptr;
  // rmsnorm(x) as the tensor cores' F16 input, in one dispatch.
  auto norm_f16 = [&](const GpuTensor& norm) {
    if (std::exchange(normed_by_residual, nullptr) == &norm) return;
    ops::rms_norm_f16(rec_of(), lib, x.range(), norm.buffer.range(), acts16_range(), n,
                      ops::narrow_padded_columns(features, n), c.n_embd, c.rms_eps);
    mark("norm");
  };
  // out_i = w_i * rmsnorm(x): in decode the int8 mat-vecs read it quantized, the others normalise x
  // as they load it; otherwise the norm is its own dispatch into h. The projections run without
  // barriers between them.
  // Whether normed_projections of these products reads its norm as the F16 form alone (norm_f16).
  auto reads_norm_f16 = [&](const auto& ws) {
    return !std::ranges::all_of(ws, [&](const GpuTensor* w) { return fused_decode(*w); }) &&
           std::ranges::all_of(ws, [&](const GpuTensor* w) { return narrow(*w, n); });
  };
  // A product of a decode batch that split K: its slices, summed after the products of its group.
  struct PendingSum {
    gpu::BufferRange parts;
    PoolBuffer* out;
    std::uint32_t count, splits;
  };
  // sums_out: where the sums of split products go for the caller to make (rope_kv_write reads
  // them), instead of sum_splits dispatches after the products.
  auto normed_projections = [&](const GpuTensor& norm, std::initializer_list<std::pair<const GpuTensor*, PoolBuffer*>> outs,
                                std::vector<PendingSum>* sums_out = nullptr) {
    std::vector<const GpuTensor*> ws;
    bool fused = true, int8 = true, narrowed = false;
    for (const auto& [w, out] : outs) {
      ws.push_back(w);
      fused = fused && fused_decode(*w);
      int8 = int8 && int8_decode(*w);
      narrowed = narrowed || narrow(*w, n);
    }
    if (int8) {
      ops::quantize_q8_rms_norm(rec_of(), lib, x.range(), norm.buffer.range(), c.rms_eps, normed(), c.n_embd, n);
      mark("norm");
    }
    if (reads_norm_f16(ws)) {  // every product reads the F16 form only
      norm_f16(norm);
    } else if (!fused) {
      ops::rms_norm(rec_of(), lib, x.range(), norm.buffer.range(), h.range(), n, c.n_embd, c.rms_eps);
      mark("norm");
      if (narrowed) to_f16(h, n, c.n_embd);
    }
    narrowed = narrowed && !fused;
    std::vector<gpu::BufferRange> dequantized(outs.size());
    if (narrowed) dequantized = dequantize_all(ws);
    // Products of a decode batch whose grids are too small for the GPU (q, k and v) split K, each
    // into its own part of split_parts; their sums follow them, recorded alongside each other.
    std::vector<PendingSum> sums;
    std::uint64_t parts_offset = 0;
    bool first = true;
    std::size_t i = 0;
    for (const auto& [w, out] : outs) {
      if (!std::exchange(first, false)) rec_of().next_runs_alongside();
      const gpu::BufferRange w16 = dequantized[i++];
      if (int8) {
        ops::matvec_q8(rec_of(), lib, w->type, w->buffer.range(), normed(), out->range(),
                       static_cast<std::uint32_t>(w->rows), static_cast<std::uint32_t>(w->cols), n, false);
      } else if (fused) {
        ops::matvec_rms_norm(rec_of(), lib, w->type, w->buffer.range(), x.range(), norm.buffer.range(), c.rms_eps,
                             out->range(), static_cast<std::uint32_t>(w->rows), static_cast<std::uint32_t>(w->cols), n);
      } else if (narrowed && narrow(*w, n)) {
        const std::uint64_t own_bytes = split_bytes(*w);
        const bool own = own_bytes > 0 && !w16.buffer && parts_offset + own_bytes <= split_parts.size();
        const gpu::BufferRange parts = own ? split_parts.range(parts_offset, own_bytes) : gpu::BufferRange{};
        if (own) parts_offset += own_bytes;
        const std::uint32_t splits = matmul_narrow(*w, *out, n, false, w16, parts, true);
        if (splits > 1) sums.push_back({parts, out, static_cast<std::uint32_t>(w->rows) * n, splits});
      } else {
        ops::matmul(rec_of(), lib, w->type, w->buffer.range(), h.range(), false, out->range(),
                    static_cast<std::uint32_t>(w->rows), static_cast<std::uint32_t>(w->cols), n);
      }
    }
    if (sums_out != nullptr) {
      *sums_out = std::move(sums);
      return;
    }
    first = true;
    for (const PendingSum& s : sums) {
      if (!std::exchange(first, false)) rec_of().next_runs_alongside();
      ops::sum_splits(rec_of(), lib, s.parts, s.out->range(), s.count, s.splits, false);
    }
  };
  // x += w * input (acts16 unless given), the add fused into the tensor cores' product. next_norm:
  // the norm whose F16 form (norm_f16) reads x next; where the product splits K, the dispatch that
  // adds its slices into x also makes that norm (one dispatch fewer: at 32 sequences each
  // is ~5 us of a layer's 0.35 ms).
  auto narrow_residual = [&](const GpuTensor& w, gpu::BufferRange input = {}, const GpuTensor* next_norm = nullptr) {
    const gpu::BufferRange w16 = dequantize_all({&w}).front();
    const bool sum_here = next_norm != nullptr && split_parts;
    const std::uint32_t splits = matmul_narrow(w, x, n, true, w16, split_parts ? split_parts.range() : gpu::BufferRange{},
                                               sum_here, input);
    if (!sum_here || splits == 1) return;  // unsplit, x is written: the norm runs as its own dispatch
    ops::sum_splits_rms_norm_f16(rec_of(), lib, split_parts.range(), splits, x.range(), next_norm->buffer.range(),
                                 acts16_range(), n, ops::narrow_padded_columns(features, n), c.n_embd, c.rms_eps);
    normed_by_residual = next_norm;
  };
  // The feed-forward block's SwiGLU in one dispatch (ops::matmul_narrow_glu) where the narrow path
  // takes gate, up and down: silu(gate) * up goes straight into glu16, the down product's input.
  auto narrow_glu = [&](const Layer& L) {
    if (!narrow(L.w_gate, n) || !narrow(L.w_up, n) || !narrow(L.w_down, n) || fused_decode(L.w_gate)) return false;
    if (L.w_gate.type != L.w_up.type || L.w_gate.rows != L.w_up.rows || L.w_gate.cols != L.w_up.cols) return false;
    const gpu::WeightType type = dequantizes(L.w_gate) ? gpu::WeightType::f16 : L.w_gate.type;
    return ops::narrow_glu_applies(features, type, static_cast<std::uint32_t>(L.w_gate.rows),
                                   static_cast<std::uint32_t>(L.w_gate.cols), n);
  };
  PoolBuffer glu16;
  auto glu16_range = [&]() {
    if (!glu16) glu16 = pool.allocate(std::uint64_t{ops::narrow_padded_columns(features, n)} * c.n_ff * 2, "scratch");
    return glu16.range();
  };
  // in_ready: `in` is already in the form the product reads, made by the dispatch before (the int8
  // path's in q8(), the tensor cores' F16 in acts16). next_norm: as narrow_residual's.
  auto residual_matmul = [&](const GpuTensor& w, const PoolBuffer& in, bool in_ready = false,
                             const GpuTensor* next_norm = nullptr) {
    const auto rows = static_cast<std::uint32_t>(w.rows), k = static_cast<std::uint32_t>(w.cols);
    if (int8_decode(w)) {
      if (!in_ready) ops::quantize_q8(rec_of(), lib, in.range(), q8(), k, n);
      ops::matvec_q8(rec_of(), lib, w.type, w.buffer.range(), q8(), x.range(), rows, k, n, true);
      return;
    }
    if (fused_decode(w)) {
      ops::matvec_accumulate(rec_of(), lib, w.type, w.buffer.range(), in.range(), false, x.range(), rows, k, n);
      return;
    }
    if (narrow(w, n)) {
      if (!in_ready) to_f16(in, n, k);
      narrow_residual(w, {}, next_norm);
      return;
    }
    matmul(w, in, proj, n);
    ops::add(rec_of(), lib, x.range(), proj.range(), x.range(), n * c.n_embd);
  };
  auto add_bias = [&](const GpuTensor& bias, PoolBuffer& io, std::uint32_t width) {
    if (!bias.buffer) return;
    for (std::uint32_t t = 0; t < n; ++t) {  // one row at a time: ops::add does not broadcast
      BufferRange row = rows_of(io, t, 1, std::uint64_t{width} * 4);
      ops::add(rec_of(), lib, row, bias.buffer.range(), row, width);
    }
  };

  ops::RopeShape rope{n, c.n_head, c.head_dim, 0, c.rope_base, 1.0f / c.rope_scale, c.rope_neox()};
  auto finish = [&](gpu::Recording& r) {
    const auto submit_at = std::chrono::steady_clock::now();
    q.submit_and_wait(r);
    if (profile == nullptr) return;
    auto ms = [](auto d) { return std::chrono::duration<double, std::milli>(d).count(); };
    profile->record_ms += ms(submit_at - step_start);
    profile->wait_ms += ms(std::chrono::steady_clock::now() - submit_at);
    ++profile->steps;
    if (!profiling || labels.size() < 2) return;
    std::vector<std::uint64_t> stamps(labels.size());
    if (vkGetQueryPoolResults(q.device().get(), timestamps_.get(), 0, static_cast<std::uint32_t>(labels.size()),
                              stamps.size() * 8, stamps.data(), 8, VK_QUERY_RESULT_64_BIT) != VK_SUCCESS) {
      return;
    }
    const double period_ms = q.device().features().timestamp_period_ns / 1e6;
    for (std::size_t i = 1; i < labels.size(); ++i) profile->gpu_ms[labels[i]] += (stamps[i] - stamps[i - 1]) * period_ms;
    // From the previous step's last op to this one's first: the GPU waited for the host's reading
    // of the result and its making of this step (the steps run one after the other).
    if (profile->last_stamp != 0 && stamps.front() > profile->last_stamp) {
      profile->between_steps_ms += (stamps.front() - profile->last_stamp) * period_ms;
    }
    profile->last_stamp = stamps.back();
  };
  ops::get_rows(rec_of(), lib, token_embd_.type, token_embd_.buffer.range(),
                tokens_from != nullptr ? tokens_from->ids.range() : ids_buf.range(), x.range(), c.n_embd, n);
  mark("embedding");
  ops::AttentionShape attention{n, c.n_head, c.n_head_kv, c.head_dim, page_size, max_pages,
                                1.0f / std::sqrt(static_cast<float>(c.head_dim))};
  for (const StepToken& t : batch.tokens) attention.max_context = std::max(attention.max_context, t.position + 1);
  PoolBuffer attn_scratch = pool.allocate(ops::attention_scratch_bytes(attention), "scratch");
  // Decode on the int8 path with nothing between the q/k/v products and rope (no biases, no q/k
  // norms) and the normal rotary layout: the products write q turned, and k and v into the cache.
  auto heads_fused = [&](const Layer& L) {
    if (L.bq.buffer || L.bk.buffer || L.bv.buffer || c.qk_norm()) return false;
    for (const GpuTensor* w : {&L.wq, &L.wk, &L.wv}) {
      if (!int8_decode(*w) || !ops::matvec_q8_heads_applies(features, w->type, static_cast<std::uint32_t>(w->rows),
                                                            static_cast<std::uint32_t>(w->cols), n, rope)) {
        return false;
      }
    }
    return true;
  };
  // The norms a residual product may make with its sum (narrow_residual's next_norm).
  auto ffn_norm_f16 = [&](const Layer& L) {
    return narrow_glu(L) || reads_norm_f16(std::array{&L.w_gate, &L.w_up}) ? &L.ffn_norm : nullptr;
  };
  auto next_attn_norm_f16 = [&](std::uint32_t l) -> const GpuTensor* {
    if (l + 1 >= c.n_layers) return nullptr;
    const Layer& next = layers_[l + 1];
    return !heads_fused(next) && reads_norm_f16(std::array{&next.wq, &next.wk, &next.wv}) ? &next.attn_norm : nullptr;
  };
  // A step sent while the GPU still runs the one it takes its tokens from goes as one submission:
  // the GPU has nothing to start meanwhile, and each part boundary below is a gap on it (H100,
  // llama3-8b decode: Q4_0 316.5-318.2 -> 323.3-325.6 tok/s, Q8_0 216.0-222.6 -> 225.0-226.9).
  const bool gpu_busy = tokens_from != nullptr && q.completed() < tokens_from->done_at;
  std::uint32_t part_size = gpu_busy ? c.n_layers : 1, part_layers = 0;
  for (std::uint32_t l = 0; l < c.n_layers; ++l) {
    const Layer& L = layers_[l];
    {
      if (heads_fused(L)) {
        ops::quantize_q8_rms_norm(rec_of(), lib, x.range(), L.attn_norm.buffer.range(), c.rms_eps, normed(), c.n_embd, n);
        mark("norm");
        const std::tuple<const GpuTensor*, gpu::BufferRange, ops::HeadsOutput> heads[] = {
            {&L.wq, qb.range(), ops::HeadsOutput::q},
            {&L.wk, cache.keys(l), ops::HeadsOutput::k_cache},
            {&L.wv, cache.values(l), ops::HeadsOutput::v_cache}};
        for (const auto& [w, out, what] : heads) {
          if (what != ops::HeadsOutput::q) rec_of().next_runs_alongside();  // they write apart
          ops::matvec_q8_heads(rec_of(), lib, w->type, w->buffer.range(), normed(), out, pos_buf.range(), slots_buf.range(),
                               rope, what, static_cast<std::uint32_t>(w->rows), static_cast<std::uint32_t>(w->cols), n);
        }
        mark("matmul qkv, rope, kv write");
      } else {
        // q, k and v read the same input and write apart: no barriers between them. With nothing
        // between them and rope, rope_kv_write adds the slices of those that split K.
        const bool rope_next = !L.bq.buffer && !L.bk.buffer && !L.bv.buffer && !c.qk_norm();
        std::vector<PendingSum> sums;
        normed_projections(L.attn_norm, {{&L.wq, &qb}, {&L.wk, &kb}, {&L.wv, &vb}}, rope_next ? &sums : nullptr);
        mark("matmul qkv");
        add_bias(L.bq, qb, c.q_dim());
        add_bias(L.bk, kb, c.kv_dim());
        add_bias(L.bv, vb, c.kv_dim());
        mark("bias");
        if (c.qk_norm()) {
          ops::rms_norm(rec_of(), lib, qb.range(), L.q_norm.buffer.range(), qb.range(), n * c.n_head, c.head_dim, c.rms_eps);
          rec_of().next_runs_alongside();  // q and k are normalised apart
          ops::rms_norm(rec_of(), lib, kb.range(), L.k_norm.buffer.range(), kb.range(), n * c.n_head_kv, c.head_dim,
                        c.rms_eps);
          mark("qk norm");
        }
        ops::QkvSlices slices;
        for (const PendingSum& s : sums) {
          if (s.out == &qb) {
            slices.q = s.parts;
            slices.q_splits = s.splits;
          } else if (s.out == &kb) {
            slices.k = s.parts;
            slices.k_splits = s.splits;
          } else {
            slices.v = s.parts;
            slices.v_splits = s.splits;
          }
        }
        ops::rope_kv_write(rec_of(), lib, qb.range(), kb.range(), vb.range(), pos_buf.range(), cache.keys(l),
                           cache.values(l), slots_buf.range(), rope, c.n_head_kv, slices);
        mark("rope, kv write");
      }
      // The output product reads the attention's output as its last dispatch makes it where it can:
      // quantized for the int8 mat-vec, F16 for the tensor cores.
      ops::AttentionMerged merged;
      if (int8_decode(L.wo)) {
        merged.q8 = q8();
      } else if (!fused_decode(L.wo) && narrow(L.wo, n)) {
        merged.f16 = acts16_range();
        merged.padded_rows = ops::narrow_padded_columns(features, n);
      }
      const bool attn_ready = ops::attention(rec_of(), lib, qb.range(), cache.keys(l), cache.values(l), tables_buf.range(),
                                             seq_pos_buf.range(), attn_scratch.range(), attn.range(), attention, merged);
      mark("attention");
      residual_matmul(L.wo, attn, attn_ready, ffn_norm_f16(L));
      mark("matmul out");
    }

    if (narrow_glu(L)) {  // x += down * (silu(gate) * up), the SwiGLU one product
      norm_f16(L.ffn_norm);
      const auto w16 = dequantize_all({&L.w_gate, &L.w_up});
      const bool f16 = w16[0].buffer != VK_NULL_HANDLE;
      ops::matmul_narrow_glu(rec_of(), lib, f16 ? gpu::WeightType::f16 : L.w_gate.type,
                             f16 ? w16[0] : L.w_gate.buffer.range(), f16 ? w16[1] : L.w_up.buffer.range(),
                             acts16.range(), glu16_range(), static_cast<std::uint32_t>(L.w_gate.rows),
                             static_cast<std::uint32_t>(L.w_gate.cols), n);
      mark("matmul gate, up");
      narrow_residual(L.w_down, glu16.range(), next_attn_norm_f16(l));
    } else {
      if (!gate) {
        gate = scratch(std::uint64_t{n} * c.n_ff);
        up = scratch(std::uint64_t{n} * c.n_ff);
      }
      normed_projections(L.ffn_norm, {{&L.w_gate, &gate}, {&L.w_up, &up}});
      mark("matmul gate, up");
      if (int8_decode(L.w_down)) {  // x += down * (silu(gate) * up), made and quantized before
        ops::quantize_q8_silu(rec_of(), lib, gate.range(), up.range(), q8(), c.n_ff, n);
        mark("silu");
        ops::matvec_q8(rec_of(), lib, L.w_down.type, L.w_down.buffer.range(), q8(), x.range(),
                       static_cast<std::uint32_t>(L.w_down.rows), static_cast<std::uint32_t>(L.w_down.cols), n, true);
      } else if (fused_decode(L.w_down)) {  // x += down * (silu(gate) * up), one kernel
        ops::matvec_accumulate_silu(rec_of(), lib, L.w_down.type, L.w_down.buffer.range(), gate.range(), up.range(),
                                    x.range(), static_cast<std::uint32_t>(L.w_down.rows),
                                    static_cast<std::uint32_t>(L.w_down.cols), n);
      } else if (narrow(L.w_down, n)) {  // silu(gate) * up made as the tensor cores' F16 input, one dispatch
        ops::silu_mul_f16(rec_of(), lib, gate.range(), up.range(), acts16_range(), n, ops::narrow_padded_columns(features, n),
                          c.n_ff);
        mark("silu");
        narrow_residual(L.w_down, {}, next_attn_norm_f16(l));
      } else {
        ops::silu_mul(rec_of(), lib, gate.range(), up.range(), gate.range(), n * c.n_ff);
        mark("silu");
        residual_matmul(L.w_down, gate);
      }
    }
    mark("matmul down");
    // Parts of 1, 2, 4, ... layers up to layers_per_submission_: the GPU starts after one layer
    // is recorded, and each part takes the host less time to record than the GPU takes to run the
    // one before, so the GPU never waits for the host inside a step.
    if (++part_layers == part_size && l + 1 < c.n_layers) {
      if (profile != nullptr && l == 0) {
        const auto first_part = std::chrono::steady_clock::now() - step_start;
        profile->first_part_ms += std::chrono::duration<double, std::milli>(first_part).count();
      }
      q.submit(rec_of());
      current.emplace(q.begin());
      rec_of().after_previous_submissions();
      mark("waiting for the host");
      part_layers = 0;
      part_size = std::min(2 * part_size, layers_per_submission_);
    }
  }
  if (n_out == 0) {
    finish(rec_of());
    if (pending != nullptr) {  // no tokens: collect() finds none
      pending->done_at = q.last_submitted();
      pending->count = 0;
      pending->collected = false;
    }
    return;
  }
  ops::rms_norm(rec_of(), lib, x.range(), output_norm_.buffer.range(), h.range(), n, c.n_embd, c.rms_eps);
  // Only the rows whose logits are wanted go through the output matrix.
  ops::get_rows(rec_of(), lib, gpu::WeightType::f32, h.range(), out_rows_buf.range(), picked.range(), c.n_embd, n_out);
  const GpuTensor& out = output_.buffer ? output_ : token_embd_;
  matmul(out, picked, logits, n_out);
  mark("output");
  // What is asked for comes back through host-visible memory, copied at the end of the submission:
  // all the logits, or only each row's argmax (4 bytes instead of a vocabulary's worth).
  const std::size_t count = argmax_out != nullptr ? n_out : std::size_t{n_out} * c.n_vocab;
  PoolBuffer readback = pool.allocate(count * 4, "scratch", gpu::MemoryKind::host);
  if (argmax_out != nullptr) {
    PoolBuffer ids = pool.allocate(count * 4, "scratch"),
               argmax_parts = pool.allocate(ops::argmax_scratch_bytes(n_out, c.n_vocab), "scratch");
    ops::argmax(rec_of(), lib, logits.range(), argmax_parts.range(), ids.range(), n_out, c.n_vocab);
    mark("argmax");
    rec_of().copy(ids.range(), readback.range());
    if (pending != nullptr) {
      if (profile == nullptr) {
        pending->done_at = q.submit(rec_of());  // the caller waits (collect)
      } else {
        finish(rec_of());  // a profile is read here
        pending->done_at = q.last_submitted();
      }
      pending->ids = std::move(ids);
      pending->readback = std::move(readback);
      pending->count = static_cast<std::uint32_t>(count);
      pending->collected = false;
      return;
    }
    finish(rec_of());
    argmax_out->resize(count);
    std::memcpy(argmax_out->data(), readback.mapped(), count * 4);
    return;
  }
  rec_of().copy(logits.range(0, count * 4), readback.range());
  finish(rec_of());
  logits_out->resize(count);
  std::memcpy(logits_out->data(), readback.mapped(), count * 4);
}

}  // namespace mqlm::model
