// The forward pass on the GPU: weights uploaded once through the buffer pool (owner
// "weights:<model>") and read in their GGUF layout; a paged KV cache; a step that runs a batch
// of tokens from any number of sequences (prefill chunks and single decode tokens mixed),
// recorded into one command buffer and submitted once. Only the rows asked for come back, as
// logits or as the tokens chosen on the GPU (the argmax, or each row's draw: StepSampling).
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "gpu/buffer_pool.hpp"
#include "gpu/compute_queue.hpp"
#include "gpu/device_handle.hpp"
#include "gpu/transfer.hpp"
#include "gpu/kernel_library.hpp"
#include "gpu/ops.hpp"
#include "model/llama/reference_model.hpp"
#include "model/sampling/sampler.hpp"

namespace mqlm::model {

struct GpuContext {
  gpu::ComputeQueue& queue;
  gpu::BufferPool& pool;
  gpu::KernelLibrary& kernels;
};

struct GpuTensor {
  gpu::WeightType type = gpu::WeightType::f32;
  std::uint64_t rows = 1, cols = 0;
  gpu::PoolBuffer buffer;
};

// A paged KV cache: per layer, K and V as (pages * page_size, kv_dim) F16, held in the pool
// under `owner` (an executor serving several models names each cache "kv:<model>").
class GpuKvCache {
 public:
  GpuKvCache(GpuContext gpu, const LlamaConfig& config, std::uint32_t pages, std::uint32_t page_size,
             std::string_view owner = "kv");
  std::uint32_t pages() const { return pages_; }
  std::uint32_t page_size() const { return page_size_; }
  gpu::BufferRange keys(std::uint32_t layer) const { return keys_[layer].range(); }
  gpu::BufferRange values(std::uint32_t layer) const { return values_[layer].range(); }

  // Bytes one page takes on the host: for each layer, its K rows then its V rows (F16).
  std::uint64_t page_bytes() const;
  // Copies the pages' contents out, page i into out[i] (each exactly page_bytes()), after all work
  // already submitted to the queue; returns when the bytes are on the host. Throws
  // std::invalid_argument on a page id out of range or a wrong size.
  void read_pages(std::span<const std::uint32_t> pages, std::span<const std::span<std::byte>> out);
  // The same copy submitted without waiting: steps submitted afterwards may write the pages, the
  // copy reads them first; the bytes reach `out` through the returned download's copy_out() once
  // the queue has passed its `done`. `out` must outlive that. A kernel gathers the pages into one
  // host buffer, as fast however scattered they are (gpu::download_later where it cannot):
  // `staging` where it is host memory that holds them (it then travels in the download), else one
  // from the pool.
  gpu::PendingDownload read_pages_later(std::span<const std::uint32_t> pages, std::span<const std::span<std::byte>> out,
                                        gpu::PoolBuffer staging = {});
  // Writes pages from host bytes (each exactly page_bytes()), for steps submitted afterwards.
  // Returns when the GPU has them. Throws std::invalid_argument on a page id out of range, named
  // twice, or a wrong size.
  void write_pages(std::span<const std::uint32_t> pages, std::span<const std::span<const std::byte>> data);
  // Page copies go through staging chunks of `chunk_bytes`, and through them even where the
  // cache's memory is mapped when `always_stage` (tests: the path of a device whose memory the
  // host cannot map, such as an H200's).
  void set_page_staging(std::size_t chunk_bytes, bool always_stage);

 private:
  // The K or V rows of each page of each layer, in page_bytes() order, and where each page's
  // rows begin on the host.
  template <class Region, class Bytes>
  std::vector<Region> page_regions(std::span<const std::uint32_t> pages, std::span<const Bytes> host) const;

  gpu::ComputeQueue& queue_;
  gpu::BufferPool& pool_;
  gpu::KernelLibrary& kernels_;
  std::uint32_t pages_, page_size_;
  std::uint64_t page_layer_bytes_;  // one page of one layer's K (or V): page_size * kv_dim * 2
  std::vector<gpu::PoolBuffer> keys_, values_;  // (layers) of (pages * page_size, kv_dim) F16
  std::size_t staging_chunk_ = std::size_t{64} << 20;
  bool always_stage_ = false;
};

// One layer's weights on the GPU (a missing bias or norm is an empty tensor).
struct GpuLayer {
  GpuTensor attn_norm, wq, wk, wv, wo, bq, bk, bv, q_norm, k_norm, ffn_norm, w_gate, w_up, w_down;
  GpuTensor post_attn_norm, post_ffn_norm;  // Gemma's norms of the two blocks' outputs
  // A mixture of experts' router (n_expert, n_embd); w_gate, w_up and w_down then hold every
  // expert's matrix, one after another.
  GpuTensor router;
};

// One token of a step: which sequence (an index into block_tables), its position there, and
// whether its logits are wanted.
struct StepToken {
  std::uint32_t sequence = 0;
  std::uint32_t position = 0;
  std::int32_t token = 0;
  bool output = false;
};

// How each output row's token is chosen on the GPU, with the CPU sampler's semantics
// (gpu::ops::sample). A step without it takes each row's argmax.
struct StepSampling {
  std::vector<gpu::ops::SampleRow> rows;  // one per output row, in order
  std::vector<std::uint32_t> entries;     // 4 words per listed token: token, bias bits, in window, count
  std::vector<std::uint32_t> mask;        // the allowed-token bits of the rows that have a mask
  // The mask's words are not known yet (they follow from the step before's tokens, which the host
  // has not read): a step sent with submit_tokens then holds its output part back until
  // send_held gives them. The words in `mask` only size it.
  bool masks_later = false;
};

// Adds an output row's draw (Sampler::gpu_row) to a step's sampling: n columns may be sampled;
// pending_row: the output row of the step before whose token the draw follows, not yet accepted
// by the host's sampler (gpu_row(true)); allowed: the row's allowed-token bits, empty for all.
void add_sampling_row(StepSampling& sampling, const SamplingRow& row, std::uint32_t n,
                      std::optional<std::uint32_t> pending_row, std::span<const std::uint32_t> allowed = {});

// How many top logprobs each row of a step's sampling reports: -1 where it asks for no logprobs.
std::vector<std::int8_t> top_logprob_counts(const StepSampling& sampling);
// The rows' choices from gpu::ops::sample's output words (rows, sample_out_words). Throws
// std::runtime_error for a row with no finite logit.
std::vector<SampledToken> sampled_tokens(std::span<const std::uint32_t> words, std::span<const std::int8_t> top_logprobs);

struct StepBatch {
  std::vector<StepToken> tokens;
  // Per sequence, the cache pages that hold positions 0, page_size, 2 * page_size, ...
  std::vector<std::vector<std::uint32_t>> block_tables;
  std::optional<StepSampling> sampling;
};

// Where a step's time goes: GPU time per kind of op (from timestamps written between ops) and
// the host's time recording and waiting. Accumulates over the steps it is handed to.
struct StepProfile {
  std::map<std::string, double> gpu_ms;  // "matmul", "attention", ...
  double record_ms = 0;  // building the step's inputs and command buffer on the host
  double wait_ms = 0;    // from submit to the step's completion
  double first_part_ms = 0;  // from the step's start to the submission of its first part
  // GPU idle from one profiled step's last op to the next one's first (host turnaround), summed
  // over the steps after the first.
  double between_steps_ms = 0;
  std::uint64_t last_stamp = 0;  // GPU ticks of the last step's last op
  std::uint64_t steps = 0;
};

class GpuModel {
 public:
  // Uploads every tensor; throws std::runtime_error naming a missing or misshapen one.
  GpuModel(GpuContext gpu, LlamaConfig config, const TensorSource& source, std::string owner);
  const LlamaConfig& config() const { return config_; }
  // A step is submitted in parts (1, 2, 4, ... layers, then this many each), so the host records a
  // part while the GPU runs the one before; any value gives the same results.
  void set_layers_per_submission(std::uint32_t layers) { layers_per_submission_ = std::max(1u, layers); }
  // The kernels and shapes every step takes where several could (the tuned ones by default); tests
  // compare others.
  void set_kernel_choice(const gpu::ops::KernelChoice& choice) { kernel_choice_ = choice; }

  // Runs the step; returns (outputs, n_vocab) logits, one row per token marked output, in order.
  std::vector<float> forward(const StepBatch& batch, GpuKvCache& cache, StepProfile* profile = nullptr);
  // The same step, returning only each output row's most likely token (lowest id on ties),
  // chosen on the GPU: greedy decoding without copying the logits back.
  std::vector<std::int32_t> forward_argmax(const StepBatch& batch, GpuKvCache& cache, StepProfile* profile = nullptr);

  // The same step, each output row's token chosen on the GPU as batch.sampling says (the argmax
  // without it), with the logprobs asked for: only those come back. hidden: when not null, every
  // token's final hidden state after output_norm, (tokens, n_embd), comes back there too (what
  // embeddings are pooled from); a step with no output rows then computes only that.
  std::vector<SampledToken> forward_sampled(const StepBatch& batch, GpuKvCache& cache, StepProfile* profile = nullptr,
                                            std::vector<float>* hidden = nullptr);

  // forward_sampled sent to the GPU without waiting for it; collect() waits and returns its tokens.
  // The next step may be sent before that, its tokens taken on the GPU from this one's argmax
  // (`tokens_from`: its batch has one token for each output row of this one, in order, whose ids
  // are not read), so that the GPU goes from step to step without waiting for the host between them.
  class Step;  // one step's recording (gpu_step.cpp)
  class PendingTokens {
   public:
    PendingTokens() = default;
    PendingTokens(PendingTokens&&) = default;
    PendingTokens& operator=(PendingTokens&&) = default;
    bool holds_output() const { return held != nullptr; }  // send_held has yet to send its output part

   private:
    friend class GpuModel;
    gpu::PoolBuffer ids;       // on the device: what a next step reads
    gpu::PoolBuffer readback;  // host-visible: what collect() reads
    std::uint64_t done_at = 0;  // the timeline value of the step's last submission
    std::uint32_t count = 0;
    bool sampled = false;  // readback holds (count, gpu::ops::sample_out_words) words, else (count) ids
    std::vector<std::int8_t> top_logprobs;  // (count) when sampled: -1 no logprobs, else how many alternatives
    bool collected = true;
    std::shared_ptr<Step> held;  // masks_later: the step, its output part recorded and not yet sent
  };
  // With batch.sampling->masks_later, every layer goes to the GPU now and the output part (the
  // logits, the draws) waits for send_held: the GPU runs the layers while the host reads the step
  // before and works out the masks, which a grammar can only do from that step's tokens.
  PendingTokens submit_tokens(const StepBatch& batch, GpuKvCache& cache, const PendingTokens* tokens_from = nullptr);
  // Writes the held step's mask words (as many as its sampling's mask had) and sends its output
  // part. Dropping the PendingTokens instead drops that part (the step is then lost).
  void send_held(PendingTokens& pending, std::span<const std::uint32_t> mask);
  // Whether collect() would return without waiting (its output part sent and done on the GPU).
  bool finished(const PendingTokens& pending) const;
  std::vector<std::int32_t> collect(PendingTokens& pending);
  std::vector<SampledToken> collect_sampled(PendingTokens& pending);

 private:
  // What a step hands back: each output row's logits, or its token (waited for, or still on the GPU).
  enum class StepOutput : std::uint8_t { logits, tokens, in_flight };
  using StepResult = std::variant<std::vector<float>, PendingTokens>;

  GpuTensor upload(gpu::Uploader& uploader, const TensorSource& source, const TensorSpec& spec);
  StepResult run(const StepBatch& batch, GpuKvCache& cache, StepOutput want, StepProfile* profile,
                 const PendingTokens* tokens_from, std::vector<float>* hidden = nullptr);

  gpu::UniqueQueryPool timestamps_;  // made on the first profiled step
  GpuContext gpu_;
  LlamaConfig config_;
  std::string owner_;
  GpuTensor token_embd_, output_norm_, output_;
  std::vector<GpuLayer> layers_;
  gpu::PoolBuffer rope_frequencies_;  // (rotary dims / 2) what the rope kernels read: ops::rope_frequencies
  gpu::PoolBuffer rope_frequencies_local_;  // the same for the local layers, where a model has them
  gpu::ops::KernelChoice kernel_choice_;
  // Each part boundary idles the GPU ~15-60 us; the host records a layer ~3x faster than the GPU
  // runs it, so parts may double (H100, llama3-8b Q4_0 decode: parts up to 32 / 8 / 4 layers
  // 295 / 293 / 286 tok/s).
  std::uint32_t layers_per_submission_ = 32;
};

}  // namespace mqlm::model
