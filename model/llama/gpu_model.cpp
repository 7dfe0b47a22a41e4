#include "model/llama/gpu_model.hpp"

#include <algorithm>
#include <bit>
#include <cstring>
#include <stdexcept>
#include <utility>

#include "gpu/fragment_layout.hpp"
#include "gpu/ops.hpp"
#include "gpu/transfer.hpp"

namespace mqlm::model {

using gpu::PoolBuffer;

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
  rec.set_label("a copy to the host");
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
  if (config_.hybrid()) {
    throw std::runtime_error(std::string(architecture_name(config_.arch)) +
                             " cannot be served yet: the GPU forward pass does not run its Gated DeltaNet layers (the "
                             "short convolution and the delta rule, with their per-sequence state); only the CPU "
                             "reference computes them");
  }
  if (config_.head_dim > gpu::ops::attention_max_head_dim) {
    throw std::runtime_error("the GPU attention kernels take head dimensions up to " +
                             std::to_string(gpu::ops::attention_max_head_dim) + ", this model has " +
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
  if (i < specs.size()) output_ = next();  // gemma2 asks for none
  config_.tied_output = !output_.buffer;
  const std::vector<float> frequencies = gpu::ops::rope_frequencies(rope_shape(config_, 0, config_.n_head));
  rope_frequencies_ = uploader.upload_new(std::as_bytes(std::span(frequencies)), owner_);
  if (config_.sliding_window != 0) {
    const std::vector<float> local = gpu::ops::rope_frequencies(rope_shape(config_, 0, config_.n_head, true));
    rope_frequencies_local_ = uploader.upload_new(std::as_bytes(std::span(local)), owner_);
  }
  uploader.finish();
}

std::vector<float> GpuModel::forward(const StepBatch& batch, GpuKvCache& cache, StepProfile* profile) {
  return std::get<std::vector<float>>(run(batch, cache, StepOutput::logits, profile, nullptr));
}

void add_sampling_row(StepSampling& sampling, const SamplingRow& row, std::uint32_t n,
                      std::optional<std::uint32_t> pending_row, std::span<const std::uint32_t> allowed) {
  gpu::ops::SampleRow r;
  r.temperature = row.temperature;
  r.inv_temperature = row.temperature > 0.0f ? 1.0f / row.temperature : 1.0f;
  r.top_p = row.top_p;
  r.min_p_offset = row.min_p_offset;
  r.repetition = row.repetition_penalty;
  r.inv_repetition = 1.0f / row.repetition_penalty;
  r.presence = row.presence_penalty;
  r.frequency = row.frequency_penalty;
  r.top_k = static_cast<std::uint32_t>(std::max(row.top_k, 0));
  r.seed_lo = static_cast<std::uint32_t>(row.seed);
  r.seed_hi = static_cast<std::uint32_t>(row.seed >> 32);
  r.counter = row.counter;
  r.n = n;
  r.entries_offset = static_cast<std::uint32_t>(sampling.entries.size() / 4);
  r.entries_count = static_cast<std::uint32_t>(row.entries.size());
  for (const SamplingEntry& e : row.entries) {
    sampling.entries.insert(sampling.entries.end(), {static_cast<std::uint32_t>(e.token), std::bit_cast<std::uint32_t>(e.bias),
                                                     e.in_window, e.count});
  }
  if (!allowed.empty()) {
    if (allowed.size() < (n + 31) / 32) throw std::invalid_argument("sampling: an allowed-token mask shorter than the row");
    r.mask_offset = static_cast<std::uint32_t>(sampling.mask.size());
    sampling.mask.insert(sampling.mask.end(), allowed.begin(), allowed.begin() + (n + 31) / 32);
  }
  if (row.logprobs) {
    r.flags = gpu::ops::sample_flag_logprobs |
              std::min<std::uint32_t>(std::max(row.top_logprobs, 0), gpu::ops::sample_max_top_logprobs);
  }
  // The pending token matters only to penalties: a row without them need not read it.
  const bool penalised = row.repetition_penalty != 1.0f || row.presence_penalty != 0.0f || row.frequency_penalty != 0.0f;
  if (pending_row && penalised) {
    r.flags |= gpu::ops::sample_flag_pending | (*pending_row << 16);
    if (row.repetition_penalty != 1.0f) r.flags |= gpu::ops::sample_flag_window;
  }
  sampling.rows.push_back(r);
}

std::vector<std::int32_t> GpuModel::forward_argmax(const StepBatch& batch, GpuKvCache& cache, StepProfile* profile) {
  if (batch.sampling) throw std::invalid_argument("forward_argmax: the batch asks for sampling (forward_sampled)");
  auto pending = std::get<PendingTokens>(run(batch, cache, StepOutput::tokens, profile, nullptr));
  return collect(pending);
}

std::vector<SampledToken> GpuModel::forward_sampled(const StepBatch& batch, GpuKvCache& cache, StepProfile* profile,
                                                    std::vector<float>* hidden) {
  auto pending = std::get<PendingTokens>(run(batch, cache, StepOutput::tokens, profile, nullptr, hidden));
  return collect_sampled(pending);
}

GpuModel::PendingTokens GpuModel::submit_tokens(const StepBatch& batch, GpuKvCache& cache,
                                                const PendingTokens* tokens_from) {
  return std::get<PendingTokens>(run(batch, cache, StepOutput::in_flight, nullptr, tokens_from));
}

bool GpuModel::finished(const PendingTokens& pending) const {
  return !pending.held && gpu_.queue.completed() >= pending.done_at;
}

std::vector<std::int32_t> GpuModel::collect(PendingTokens& pending) {
  std::vector<std::int32_t> ids;
  for (const SampledToken& t : collect_sampled(pending)) ids.push_back(t.token);
  return ids;
}

std::vector<std::int8_t> top_logprob_counts(const StepSampling& sampling) {
  std::vector<std::int8_t> counts;
  for (const gpu::ops::SampleRow& row : sampling.rows) {
    const bool logprobs = (row.flags & gpu::ops::sample_flag_logprobs) != 0;
    counts.push_back(logprobs ? static_cast<std::int8_t>(std::min(row.flags & 0xFFu, gpu::ops::sample_max_top_logprobs)) : -1);
  }
  return counts;
}

std::vector<SampledToken> sampled_tokens(std::span<const std::uint32_t> words, std::span<const std::int8_t> top_logprobs) {
  std::vector<SampledToken> tokens(top_logprobs.size());
  for (std::size_t r = 0; r < tokens.size(); ++r) {
    const std::uint32_t* w = &words[r * gpu::ops::sample_out_words];
    if (w[0] == 0xFFFFFFFFu) throw std::runtime_error("sampling: no logit of the row is finite (all NaN or -inf)");
    tokens[r].token = static_cast<std::int32_t>(w[0]);
    if (top_logprobs[r] < 0) continue;
    tokens[r].logprob = std::bit_cast<float>(w[1]);
    for (std::int8_t a = 0; a < top_logprobs[r] && w[2 + 2 * a] != 0xFFFFFFFFu; ++a) {
      tokens[r].top_logprobs.push_back({static_cast<std::int32_t>(w[2 + 2 * a]), std::bit_cast<float>(w[3 + 2 * a])});
    }
  }
  return tokens;
}

// Each row's token, and where the row asked for them its logprobs.
std::vector<SampledToken> GpuModel::collect_sampled(PendingTokens& pending) {
  if (pending.collected) throw std::logic_error("collect: no step pending, or collected already");
  if (pending.held) throw std::logic_error("collect: the step's output part was never sent (send_held)");
  gpu_.queue.wait(pending.done_at);
  pending.collected = true;
  if (pending.count == 0) return {};
  const std::uint32_t stride = pending.sampled ? gpu::ops::sample_out_words : 1;
  const auto* mapped = reinterpret_cast<const std::uint32_t*>(pending.readback.mapped());
  const std::span<const std::uint32_t> words(mapped, std::size_t{pending.count} * stride);
  if (pending.sampled) return sampled_tokens(words, pending.top_logprobs);
  std::vector<SampledToken> tokens(pending.count);
  for (std::uint32_t r = 0; r < pending.count; ++r) tokens[r].token = static_cast<std::int32_t>(words[r]);
  return tokens;
}

}  // namespace mqlm::model
