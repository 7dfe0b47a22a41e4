#include "actors/executor/executor.hpp"

#include <algorithm>
#include <cmath>
#include <chrono>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <map>
#include <numeric>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "actors/executor/executor_options.hpp"
#include "actors/executor/page_moves.hpp"
#include "actors/executor/pipeline_cache.hpp"
#include "actors/executor/process_memory.hpp"
#include "gpu/buffer_pool.hpp"
#include "gpu/compute_queue.hpp"
#include "gpu/device.hpp"
#include "gpu/kernel_library.hpp"
#include "gpu/vulkan_error.hpp"
#include "model/gguf/gguf_file.hpp"
#include "model/gguf/vocabulary_metadata.hpp"
#include "model/grammar/mask_workers.hpp"
#include "model/grammar/response_grammar.hpp"
#include "model/llama/embedding_pool.hpp"
#include "model/llama/gguf_model.hpp"
#include "model/llama/gpu_model.hpp"
#include "model/sampling/prompt_lookup.hpp"
#include "model/sampling/sampler.hpp"

namespace mqlm::actors {

using namespace messages;

namespace {

using Clock = std::chrono::steady_clock;

constexpr std::uint32_t kTrimTimer = 1;
// A trim while sequences are running keeps free what the steps of this long needed at their peak.
constexpr auto kWorkingSetWindow = std::chrono::seconds(5);
// Pool statistics ride on every 32nd StepResult (and on any after a trim): often enough for the
// scheduler's status to stay current, rarely enough that steps do not carry a map each.
constexpr std::uint64_t kPoolStatsEvery = 32;
constexpr std::uint32_t kCacheCloseTimer = 2;
// While KV pages spilled to the host are on their way to the cache-writer (KvPageMoves), this
// timer sends those whose copies are done when no step comes to do it.
constexpr std::uint32_t kSpillTimer = 3;
// A greedy step sent ahead is answered once the next plan has gone to the GPU after it, or when
// this timer fires first (no next plan came): 1 ms, the shortest a timer waits.
constexpr std::uint32_t kCollectTimer = 4;
// An unload waits this long for the cache-writer's ModelCacheClosed before answering without it.
constexpr auto kCacheCloseTimeout = std::chrono::seconds(10);

// ---- helpers ---------------------------------------------------------------------------------

PoolStatsWire to_wire(const gpu::PoolStats& stats) {
  PoolStatsWire wire{stats.active_bytes, stats.cached_bytes, stats.peak_active_bytes, stats.held_bytes,
                     static_cast<std::uint32_t>(stats.blocks), {}};
  for (const auto& [owner, bytes] : stats.active_by_owner) wire.active_by_owner.emplace(owner, bytes);
  return wire;
}

// The process's resident set is not the device's: answer_query adds it.
DeviceMemoryWire to_wire(const gpu::DeviceMemory& figures) {
  return {figures.total_bytes, figures.budget_bytes, figures.usage_bytes, figures.has_budget, 0};
}

bool is_device_lost(const std::exception& e) {
  return dynamic_cast<const gpu::GpuError*>(&e) != nullptr &&
         std::string_view(e.what()).find(gpu::result_name(VK_ERROR_DEVICE_LOST)) != std::string_view::npos;
}

std::uint64_t pages_for(std::uint64_t tokens, std::uint32_t page_size) { return (tokens + page_size - 1) / page_size; }

// One block table per plan sequence; its tokens at position, position + 1, ...; a row of output
// after the last token of each sequence that asks for one, and after each token before its drafts
// (the rows that verify them). The plan has passed plan_problem.
model::StepBatch make_batch(const StepPlan& plan, std::uint32_t page_size) {
  model::StepBatch batch;
  for (std::uint32_t s = 0; s < plan.sequences.size(); ++s) {
    const PlanSequence& seq = plan.sequences[s];
    // Only the pages up to the last position: the attention's work grows with the longest table.
    const std::uint64_t end = std::uint64_t{seq.position} + seq.tokens.size();
    const auto pages = static_cast<std::ptrdiff_t>(pages_for(end, page_size));
    batch.block_tables.emplace_back(seq.block_table.begin(), seq.block_table.begin() + pages);
    const std::size_t first_output = seq.tokens.size() - 1 - seq.drafted;
    for (std::uint32_t i = 0; i < seq.tokens.size(); ++i) {
      batch.tokens.push_back({s, seq.position + i, seq.tokens[i], seq.output && i >= first_output});
    }
  }
  return batch;
}

// The pool's block size: block_mib= if given; else the device's default (gpu::default_block_size),
// but no more than a 16th of the memory ceiling, so that what blocks round up to stays small
// against it (a 256 MiB block under a 100 MiB ceiling would put the pool over the hard mark with
// one small model loaded).
VkDeviceSize pool_block_bytes(const ExecutorOptions& options, const gpu::Device& device) {
  constexpr std::uint64_t kMiB = 1 << 20;
  if (options.block_mib > 0) return options.block_mib * kMiB;
  std::uint64_t ceiling = options.ceiling_bytes;
  if (options.ceiling_fraction > 0.0) {
    ceiling = static_cast<std::uint64_t>(static_cast<double>(device.memory_figures().total_bytes) *
                                         options.ceiling_fraction);
  }
  std::uint64_t block = gpu::default_block_size(device.features().device_local_bytes);
  if (ceiling > 0) block = std::clamp(ceiling / 16 / kMiB * kMiB, kMiB, block);
  spdlog::info("executor: the buffer pool takes blocks of {} MiB from the driver", block / kMiB);
  return block;
}

// The device and what every model shares on it, made once and destroyed in reverse order: the
// pool before the queue, the queue before the device. Every model's buffers must have gone back
// to the pool before it goes.
struct DeviceStack {
  explicit DeviceStack(const ExecutorOptions& options)
      : device(gpu::DeviceOptions{options.device}),
        queue(device),
        pool(queue, gpu::PoolOptions{pool_block_bytes(options, device)}),
        kernels(device, read_pipeline_cache(options.pipeline_cache)) {
    queue.enable_timeline();
  }
  model::GpuContext context() { return {queue, pool, kernels}; }

  gpu::Device device;
  gpu::ComputeQueue queue;
  gpu::BufferPool pool;
  gpu::KernelLibrary kernels;
};

std::string weights_owner(std::string_view id) { return fmt::format("weights:{}", id); }
std::string kv_owner(std::string_view id) { return fmt::format("kv:{}", id); }

std::uint64_t owned_bytes(const gpu::PoolStats& stats, const std::string& owner) {
  auto it = stats.active_by_owner.find(owner);
  return it == stats.active_by_owner.end() ? 0 : it->second;
}

double mib(std::uint64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

std::int64_t nanoseconds_since(Clock::time_point started) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - started).count();
}

// One loaded model: its weights and paged KV cache in the shared pool, each under an owner label
// of the model's own, so that its bytes can be told from the other models'.
struct LoadedModel {
  std::string id;
  model::LlamaConfig config;
  std::uint32_t n_vocab = 0;  // rows that may be sampled: the tokenizer's size (<= config.n_vocab)
  std::uint32_t kv_pages = 0;
  std::uint32_t page_size = 0;
  std::unique_ptr<model::GpuModel> weights;     // owner "weights:<id>"
  std::unique_ptr<model::GpuKvCache> kv_cache;  // owner "kv:<id>"; destroyed before the weights
  // The vocabulary's pieces, made when the first constrained sequence (response_format) starts.
  std::shared_ptr<const model::grammar::TokenTrie> token_trie;

  std::uint64_t bytes(const gpu::PoolStats& stats) const {
    return owned_bytes(stats, weights_owner(id)) + owned_bytes(stats, kv_owner(id));
  }
  ModelInfo info() const {
    return ModelInfo{id, kv_pages, page_size, config.n_ctx_train, n_vocab, kv_cache ? kv_cache->page_bytes() : 0};
  }
};

// A sequence's sampler, and the model it runs on: unloading a model drops its sequences.
struct SequenceState {
  std::string model_id;
  model::Sampler sampler;
  std::int32_t last_token = -1;  // its last step's sample: what a follower (PlanSequence::follows) takes
  std::optional<model::EmbeddingPool> pool{};  // an embedding's: pooled from its prompt's chunks, never sampled
  // A constrained response_format's: the tokens its grammar allows, told each token drawn.
  std::optional<model::grammar::TokenConstraint> constraint{};
};

// Why a step failed, found on its way (checking, submitting, collecting) and applied in its turn:
// a later step's failure must not take the samplers of a step before it that is still to answer.
struct StepFailure {
  RequestError error = RequestError::gpu;
  std::string message;
};

// One plan from its arrival to its answer, in the executor's queue of steps (Executor::steps_):
// opened, submitted to the GPU (run there in turn, or sent without waiting when it only decodes
// and prefills), then finished in order: collected and answered. Every token is chosen on the GPU
// (its argmax, or each sequence's draw: gpu::ops::sample). A step may stay in flight after its plan
// is handled: a next plan whose sequences all follow it, in its order, goes to the GPU before this
// one's tokens are read, taking them on the GPU from its choices (GpuModel::submit_tokens), so that
// the GPU goes from step to step without waiting for the executor's answer and the scheduler's
// next plan between them.
struct Step {
  messages::Envelope to;  // the plan's: whom the answer goes to
  StepPlan plan;          // as it runs (followers' tokens put in, or taken on the GPU)
  std::size_t slots_before = 0;
  Clock::time_point started;
  std::string model_id;  // the model it ran on; empty when nothing ran on one
  std::optional<model::GpuModel::PendingTokens> pending;  // sent without waiting, not yet collected
  bool sent_ahead = false;                                // the collect timer may be waiting for it
  std::vector<model::SampledToken> chosen;  // (outputs): the GPU's picks, with the logprobs asked for
  std::optional<StepFailure> failure;
  StepResult result;
  Frames pooled;  // the vectors of result.pooled, as the answer's blobs
};

// ---- the actor -------------------------------------------------------------------------------

class Executor final : public Actor {
 public:
  explicit Executor(ExecutorOptions options) : options_(std::move(options)) {}

  void on_start(Context& ctx) override;
  void on_message(Context& ctx, Message& message) override;
  void on_stop(Context& ctx) override {
    finish_steps(ctx);
    advance_spills(ctx, true);
    log_gpu_timeline();
  }

 private:
  const LoadedModel& load_model(const std::string& id);
  std::vector<std::string> release_model(Context& ctx, LoadedModel& loaded);
  void answer_load(Context& ctx, const Message& message, const LoadModel& load);
  void answer_unload(Context& ctx, const Message& message, const UnloadModel& unload);
  void answer_query(Context& ctx, const Message& message, const ExecutorQuery& query);
  void answer_step(Context& ctx, const Message& message, const StepPlan& plan);
  void log_gpu_timeline();
  messages::GpuTimeWire gpu_time();
  Step& open_step(const messages::Envelope& to, const StepPlan& plan);
  LoadedModel* chain_model(const StepPlan& plan);
  LoadedModel* ahead_model(const StepPlan& plan);
  void submit(Step& step, const Frames& blobs);
  void submit_ahead(Step& step, LoadedModel& loaded, const model::GpuModel::PendingTokens* tokens_from);
  void run_in_turn(Step& step, const Frames& blobs);
  void run_forward(Step& step, LoadedModel& loaded);
  void gpu_failed(Step& step, std::string message, const std::exception& e);
  void lose_device(const std::string& why);
  bool still_running(Context& ctx);
  void finish_steps(Context& ctx, bool leave_one_in_flight = false);
  void finish_oldest(Context& ctx);
  void collect(Step& step);
  void send_result(Context& ctx, Step& step);
  std::optional<StepPlan> runnable(const StepPlan& plan, const std::unordered_set<std::uint64_t>& failed) const;
  void advance_spills(Context& ctx, bool wait);
  void on_cache_closed(Context& ctx, const ModelCacheClosed& closed);
  void answer_pending_unloads(Context& ctx, bool timed_out);
  LoadedModel* model_for(const StepPlan& plan, std::string& problem);
  std::optional<std::string> plan_problem(const StepPlan& plan, const LoadedModel& loaded) const;
  std::optional<std::string> draft_problem(const StepPlan& plan, const PlanSequence& seq) const;
  void start_sequences(const std::string& model_id, const std::vector<SequenceStart>& starts);
  void fail_if_injected(std::uint64_t gpu_step) const;
  bool all_plain_greedy(const StepPlan& plan, const LoadedModel& loaded) const;
  bool pooled(const PlanSequence& seq) const;
  bool samples(const PlanSequence& seq) const { return seq.output && !pooled(seq); }
  void pool_embeddings(Step& step, std::span<const float> hidden, std::uint32_t width);
  void log_if_slow(const StepPlan& plan, const model::StepProfile& profile, Clock::duration took,
                   std::uint64_t new_blocks) const;
  void warm_up(const LoadedModel& loaded);
  model::StepBatch step_batch(const StepPlan& plan, const LoadedModel& loaded, bool follows_pending,
                              bool masks_later = false);
  void send_held_masks(const Step& before, Step& step);
  void send_masks(Step& step);
  bool prepare(Step& step, const Frames& blobs, LoadedModel& loaded);
  std::vector<std::uint32_t> constrained_masks(const StepPlan& plan, std::uint32_t words);
  const std::shared_ptr<const model::grammar::TokenTrie>& token_trie(LoadedModel& loaded) const;
  void take_outputs(const StepPlan& plan, std::span<const model::SampledToken> chosen, StepResult& result);
  OutputToken verify_drafts(const PlanSequence& seq, std::span<const model::SampledToken> rows);
  void fail_step(const StepPlan& plan, StepResult& result, RequestError error, std::string message);
  bool trim_after_release(Context& ctx, std::size_t slots_before);
  bool trim_pool(Context& ctx, bool keep_working_set = false);
  void trim_now(Context& ctx, bool keep_working_set = false);
  std::string load_failure(const std::string& id, const std::exception& e) const;
  std::string loaded_ids() const;
  std::string no_gpu_problem() const;

  ExecutorOptions options_;
  std::unique_ptr<DeviceStack> gpu_;  // null only after a device loss whose rebuild failed
  std::string gpu_unavailable_;       // why gpu_ is null
  // Declared after gpu_, so destroyed before it. Empty whenever gpu_ is null.
  std::map<std::string, LoadedModel> models_;
  KvPageMoves page_moves_{options_.cache_writer, options_.spill_piece_pages, kSpillTimer};  // staging from gpu_'s pool
  std::unordered_map<std::uint64_t, SequenceState> sequences_;  // sequence -> its sampler and model
  std::unordered_set<std::uint64_t> failed_;  // sequences the last step failed: the next plan's are left out
  std::uint64_t plans_ = 0;        // StepPlans answered
  std::uint64_t gpu_steps_ = 0;    // plans that reached the GPU with sequences (what fail_steps counts)
  std::int64_t last_trim_ns_ = 0;  // ctx.now_ns() of the last trim
  bool trim_pending_ = false;      // a release found the interval not yet over: the timer trims
  std::uint64_t steps_at_timer_ = 0;  // gpu_steps_ when that timer was set
  // (ctx.now_ns(), the pool epoch it began) for each trim of the last kWorkingSetWindow: a trim
  // while sequences run keeps the blocks allocated from since the oldest of them.
  std::deque<std::pair<std::int64_t, std::uint64_t>> trim_epochs_;
  // Unloads whose answer waits for the cache-writer's ModelCacheClosed.
  struct PendingUnload {
    std::string to;
    std::uint64_t correlation_id = 0;
    ModelUnloaded answer;
    Clock::time_point started;
  };
  std::map<std::string, PendingUnload> pending_unloads_;
  std::uint64_t steps_chained_ = 0;  // plans sent to the GPU behind a step in flight
  // Walks constrained rows' masks beside this thread; made when the first constrained sequence starts.
  std::unique_ptr<model::grammar::MaskWorkers> mask_workers_;
  // Plans not yet answered, oldest first: between messages at most one, a greedy step in flight,
  // answered before the executor handles anything else (a plan may go to the GPU after it first).
  std::deque<Step> steps_;
};

void Executor::on_start(Context& ctx) {
  gpu_ = std::make_unique<DeviceStack>(options_);
  for (const std::string& id : options_.preload) {
    try {
      load_model(id);
    } catch (const std::exception& e) {
      throw std::runtime_error("executor: " + load_failure(id, e));
    }
  }
  last_trim_ns_ = ctx.now_ns();
  if (models_.empty()) {
    spdlog::info("executor: on {} with no model loaded (configured: {})", gpu_->device.features().name,
                 configured_ids(options_));
  }
}

// Uploads the configured model `id`, makes its KV cache and trims the upload's staging memory
// away, so that what stays held is the baseline later trims come back to. Throws what went
// wrong (load_failure says it with the model's id and file); whatever of the model was made has
// gone back to the pool by then (the caller trims).
const LoadedModel& Executor::load_model(const std::string& id) {
  const auto started = Clock::now();
  const std::filesystem::path& path = options_.models.at(id);
  auto opened = model::gguf::GgufFile::open(path);
  if (auto* e = std::get_if<model::gguf::GgufError>(&opened)) {
    throw std::runtime_error("the file cannot be opened: " + e->message());
  }
  const auto& file = std::get<model::gguf::GgufFile>(opened);
  auto config = model::read_llama_config(file);
  if (auto* e = std::get_if<std::string>(&config)) throw std::runtime_error(*e);
  auto vocabulary = model::gguf::read_vocabulary(file);
  if (auto* e = std::get_if<model::gguf::GgufError>(&vocabulary)) {
    throw std::runtime_error("its tokenizer metadata " + e->message());
  }
  LoadedModel loaded;
  loaded.id = id;
  loaded.config = std::get<model::LlamaConfig>(config);
  // Some models (Qwen2) have more output rows than tokens: those rows can never be sampled.
  loaded.n_vocab = static_cast<std::uint32_t>(
      std::min<std::size_t>(std::get<model::Vocabulary>(vocabulary).tokens.size(), loaded.config.n_vocab));
  loaded.kv_pages = options_.kv_pages;
  loaded.page_size = options_.page_size;
  const std::int64_t read_ns = nanoseconds_since(started);
  loaded.weights = std::make_unique<model::GpuModel>(gpu_->context(), loaded.config, model::gguf_tensor_source(file),
                                                     weights_owner(id));
  const std::int64_t weights_ns = nanoseconds_since(started);
  loaded.kv_cache = std::make_unique<model::GpuKvCache>(gpu_->context(), loaded.config, loaded.kv_pages,
                                                        loaded.page_size, kv_owner(id));
  const std::int64_t kv_ns = nanoseconds_since(started);
  if (options_.warm_up == 1 || (options_.warm_up == -1 && gpu_->device.features().discrete)) warm_up(loaded);
  const std::int64_t warm_ns = nanoseconds_since(started);
  gpu_->pool.trim();
  const LoadedModel& entry = models_.insert_or_assign(id, std::move(loaded)).first->second;

  const gpu::PoolStats stats = gpu_->pool.stats();
  spdlog::info("executor: model {} ({}) loaded on {} in {} ms (file and vocabulary {} ms, weights {} ms, KV cache {} "
               "ms, warm-up {} ms, trim {} ms): {:.1f} MiB of weights, KV cache of {} pages of {} tokens ({:.1f} MiB), "
               "context {}, vocabulary {}",
               id, path.string(), gpu_->device.features().name, nanoseconds_since(started) / 1'000'000,
               read_ns / 1'000'000, (weights_ns - read_ns) / 1'000'000, (kv_ns - weights_ns) / 1'000'000,
               (warm_ns - kv_ns) / 1'000'000, (nanoseconds_since(started) - warm_ns) / 1'000'000,
               mib(owned_bytes(stats, weights_owner(id))), entry.kv_pages, entry.page_size,
               mib(owned_bytes(stats, kv_owner(id))), entry.config.n_ctx_train, entry.n_vocab);
  if (!options_.pipeline_cache.empty()) write_pipeline_cache(options_.pipeline_cache, gpu_->kernels.cache_data());
  return entry;
}

// Runs the model once, results discarded, at each batch shape steps may have: decode batches of
// 1-8 sequences (the int8 mat-vec's shapes), 16, 32, 64 and 128 (the tensor cores' tiles, K split
// or not), each sequence three pages deep, and a 512-token prefill chunk (F16 weights), greedy
// and, once, with logits. Each kernel's pipeline is then made at load instead of in the first
// step that needs it: on the H100 that step took 335-361 ms instead of ~10 (the first decode of
// 7 or 8 sequences in a serving run). It writes KV pages that no sequence holds yet.
void Executor::warm_up(const LoadedModel& loaded) {
  const std::uint32_t page = loaded.page_size, depth = 3, position = depth * page - 1;
  auto run = [&](const model::StepBatch& batch, bool logits) {
    if (logits) {
      (void)loaded.weights->forward(batch, *loaded.kv_cache);
    } else {
      (void)loaded.weights->forward_argmax(batch, *loaded.kv_cache);
    }
  };
  if (position < loaded.config.n_ctx_train) {
    for (std::uint32_t width : {1u, 2u, 3u, 4u, 5u, 6u, 7u, 8u, 16u, 32u, 64u, 128u}) {
      if (std::uint64_t{width} * depth > loaded.kv_pages) break;
      model::StepBatch batch;
      for (std::uint32_t s = 0; s < width; ++s) {
        batch.block_tables.push_back({depth * s, depth * s + 1, depth * s + 2});
        batch.tokens.push_back({s, position, 0, true});
      }
      run(batch, false);
      if (width == 1) run(batch, true);
    }
  }
  constexpr std::uint32_t chunk = 512;
  const std::uint32_t pages = (chunk + page - 1) / page;
  if (chunk <= loaded.config.n_ctx_train && pages <= loaded.kv_pages) {
    model::StepBatch batch;
    batch.block_tables.emplace_back(pages);
    std::iota(batch.block_tables[0].begin(), batch.block_tables[0].end(), 0u);
    for (std::uint32_t i = 0; i < chunk; ++i) batch.tokens.push_back({0, i, 0, i + 1 == chunk});
    run(batch, false);
  }
}

// Frees the model part by part, each part in its own try: a part whose release throws is logged
// and noted, and the rest still goes. A part is moved out of the model before anything can
// throw, so it is destroyed however its step ends, and the trim at the end finds it gone.
std::vector<std::string> Executor::release_model(Context& ctx, LoadedModel& loaded) {
  std::vector<std::string> problems;
  auto release = [&](std::string_view part, auto&& step) {
    try {
      step();
    } catch (const std::exception& e) {
      spdlog::error("executor: releasing the {} of model {} failed: {}", part, loaded.id, e.what());
      problems.push_back(fmt::format("{}: {}", part, e.what()));
    }
  };
  release("sequences", [&] {
    std::erase_if(sequences_, [&](const auto& entry) { return entry.second.model_id == loaded.id; });
  });
  release("KV cache", [&] {
    advance_spills(ctx, true);  // what it spilled reaches the cache-writer before the cache goes
    std::unique_ptr<model::GpuKvCache> kv_cache = std::move(loaded.kv_cache);
    kv_cache.reset();
  });
  release("weights", [&] {
    std::unique_ptr<model::GpuModel> weights = std::move(loaded.weights);
    if (options_.fail_release == loaded.id) {
      throw std::runtime_error(fmt::format("injected failure releasing model '{}' (executor option fail_release)",
                                           loaded.id));
    }
    weights.reset();
  });
  release("pool trim", [&] { trim_now(ctx); });  // waits for in-flight work that may read the model
  return problems;
}

void Executor::on_message(Context& ctx, Message& message) {
  const auto* plan = message.as<StepPlan>();
  const auto* timer = message.as<Timer>();
  if (timer != nullptr && timer->timer_id == kCollectTimer && still_running(ctx)) return;
  // A step in flight is answered before anything else is handled (a plan may go to the GPU
  // after it first).
  if (plan == nullptr) finish_steps(ctx);
  if (plan != nullptr) {
    answer_step(ctx, message, *plan);
  } else if (timer != nullptr && timer->timer_id == kCollectTimer) {
    // answered above
  } else if (const auto* load = message.as<LoadModel>()) {
    answer_load(ctx, message, *load);
  } else if (const auto* unload = message.as<UnloadModel>()) {
    answer_unload(ctx, message, *unload);
  } else if (const auto* query = message.as<ExecutorQuery>()) {
    answer_query(ctx, message, *query);
  } else if (const auto* closed = message.as<ModelCacheClosed>()) {
    on_cache_closed(ctx, *closed);
  } else if (timer != nullptr && timer->timer_id == kTrimTimer) {
    // Steps since the release that set it: sequences are still running, their scratch stays.
    if (trim_pending_) trim_pool(ctx, gpu_steps_ != steps_at_timer_ && !sequences_.empty());
  } else if (timer != nullptr && timer->timer_id == kCacheCloseTimer) {
    answer_pending_unloads(ctx, true);
  } else if (timer != nullptr && timer->timer_id == kSpillTimer) {
    page_moves_.timer_fired();
    advance_spills(ctx, false);
  } else {
    spdlog::debug("executor: ignored a {} from {}", kind_name(message.kind()), message.envelope.from);
  }
}

// Synchronous: the executor handles nothing else while the weights upload.
void Executor::answer_load(Context& ctx, const Message& message, const LoadModel& load) {
  const auto started = Clock::now();
  ModelLoaded answer;
  answer.model = load.model;
  if (!options_.models.contains(load.model)) {
    answer.error = fmt::format("no model '{}' is configured (this executor knows: {})", load.model,
                               configured_ids(options_));
  } else if (models_.contains(load.model)) {
    answer.ok = true;  // already loaded: nothing uploaded, so load_ns stays 0
  } else if (!gpu_) {
    answer.error = no_gpu_problem();
  } else {
    try {
      load_model(load.model);
      answer.ok = true;
      answer.load_ns = nanoseconds_since(started);
    } catch (const std::exception& e) {
      answer.error = load_failure(load.model, e);
      spdlog::error("executor: {}", answer.error);
      if (is_device_lost(e)) {
        lose_device(e.what());
      } else {
        trim_pool(ctx);  // what the failed load had allocated went back to the pool as it unwound
      }
    }
  }
  if (gpu_) {
    const gpu::PoolStats stats = gpu_->pool.stats();
    if (answer.ok) {
      const LoadedModel& loaded = models_.at(load.model);
      answer.info = loaded.info();
      answer.bytes = loaded.bytes(stats);
    }
    answer.pool = to_wire(stats);
  }
  ctx.reply(message, std::move(answer));
}

void Executor::answer_unload(Context& ctx, const Message& message, const UnloadModel& unload) {
  const auto started = Clock::now();
  ModelUnloaded answer;
  answer.model = unload.model;
  if (auto it = models_.find(unload.model); it != models_.end()) {
    // gpu_ is there: models_ is empty without it.
    const gpu::PoolStats before = gpu_->pool.stats();
    answer.was_loaded = true;
    answer.held_before = before.held_bytes;
    answer.model_bytes = it->second.bytes(before);
    answer.problems = release_model(ctx, it->second);
    models_.erase(it);
    answer.held_after = gpu_->pool.stats().held_bytes;
    answer.freed_bytes = answer.held_before > answer.held_after ? answer.held_before - answer.held_after : 0;
    spdlog::info("executor: model {} unloaded: it owned {:.1f} MiB, the pool gave {:.1f} MiB back to the driver{}",
                 unload.model, mib(answer.model_bytes), mib(answer.freed_bytes),
                 answer.problems.empty() ? "" : fmt::format(" ({} parts failed to release)", answer.problems.size()));
  }
  if (gpu_) answer.pool = to_wire(gpu_->pool.stats());
  answer.unload_ns = nanoseconds_since(started);
  // The cache-writer releases the model's hot pages next. This Close leaves after every page this
  // executor spilled for the model (one sender, one pipe), so none can arrive after it.
  if (!options_.cache_writer.empty() && !pending_unloads_.contains(unload.model) &&
      ctx.send(options_.cache_writer, CloseModelCache{unload.model, true}) == SendStatus::sent) {
    pending_unloads_.emplace(unload.model, PendingUnload{message.envelope.from, message.envelope.correlation_id,
                                                          std::move(answer), started});
    ctx.set_timer(kCacheCloseTimer, kCacheCloseTimeout, false);
    return;
  }
  ctx.reply(message, std::move(answer));
}

void Executor::on_cache_closed(Context& ctx, const ModelCacheClosed& closed) {
  auto it = pending_unloads_.find(closed.model);
  if (it == pending_unloads_.end()) return;
  PendingUnload pending = std::move(it->second);
  pending_unloads_.erase(it);
  ModelUnloaded& answer = pending.answer;
  answer.cache_released_bytes = closed.released_bytes;
  for (const std::string& problem : closed.problems) answer.problems.push_back("hot cache: " + problem);
  answer.unload_ns = nanoseconds_since(pending.started);
  ctx.send(pending.to, std::move(answer), {pending.correlation_id, 0, {}});
}

// The cache-writer did not answer in time: the unloads are answered without it, saying so.
void Executor::answer_pending_unloads(Context& ctx, bool timed_out) {
  for (auto& [model, pending] : std::exchange(pending_unloads_, {})) {
    if (timed_out) {
      pending.answer.problems.push_back(fmt::format("hot cache: the cache-writer did not answer the close within {} s",
                                                    kCacheCloseTimeout.count()));
    }
    ctx.send(pending.to, std::move(pending.answer), {pending.correlation_id, 0, {}});
  }
}

void Executor::answer_query(Context& ctx, const Message& message, const ExecutorQuery& query) {
  if (query.trim) trim_pool(ctx);
  ExecutorReport report;
  for (const auto& [id, loaded] : models_) report.models.push_back(loaded.info());
  report.slots = static_cast<std::uint32_t>(sequences_.size());
  report.steps_chained = steps_chained_;
  if (gpu_) {
    report.pool = to_wire(gpu_->pool.stats());
    report.device = gpu_->device.features().name;
    report.memory = to_wire(gpu_->device.memory_figures());
    report.gpu_time = gpu_time();
  }
  report.memory.process_rss_bytes = resident_set_bytes();
  ctx.reply(message, std::move(report));
}

// The GPU's time so far, as reports and results carry it.
messages::GpuTimeWire Executor::gpu_time() {
  const gpu::QueueTimeline& t = gpu_->queue.timeline();
  return {t.busy_ms / 1e3, t.queued_gap_ms / 1e3, t.starved_ms / 1e3, t.submissions};
}

// Where the GPU's time went while it served (gpu::QueueTimeline), said once at the end.
void Executor::log_gpu_timeline() {
  if (!gpu_) return;
  const gpu::QueueTimeline& t = gpu_->queue.timeline();
  if (t.submissions == 0) return;
  std::string late;
  for (const auto& [label, ms] : t.starved_by_label) late += fmt::format("; {:.1f} ms before {}", ms, label);
  spdlog::info("executor: {} steps ({} chained), {} GPU submissions: busy {:.1f} ms, idle {:.1f} ms between submissions "
               "queued in time, {:.1f} ms waiting for the host ({} times{})",
               plans_, steps_chained_, t.submissions, t.busy_ms, t.queued_gap_ms, t.starved_ms, t.starved_submissions,
               late);
}

// Every plan takes the same way through the queue of steps: the steps before it are answered
// first, unless it goes to the GPU behind the one in flight (chain_model); then it is submitted,
// and every step is answered in order but a last one left in flight for the next plan to follow.
void Executor::answer_step(Context& ctx, const Message& message, const StepPlan& plan) {
  LoadedModel* chained = chain_model(plan);
  if (chained == nullptr) finish_steps(ctx);
  const model::GpuModel::PendingTokens* tokens_from = chained != nullptr ? &*steps_.back().pending : nullptr;
  Step& step = open_step(message.envelope, plan);
  if (chained != nullptr) {
    submit_ahead(step, *chained, tokens_from);
    if (!step.failure) ++steps_chained_;
  } else {
    submit(step, message.blobs);
  }
  finish_steps(ctx, true);
}

// The plan's step, queued behind those not yet answered.
Step& Executor::open_step(const messages::Envelope& to, const StepPlan& plan) {
  ++plans_;
  Step& step = steps_.emplace_back();
  step.to = to;
  step.plan = plan;
  step.slots_before = sequences_.size();
  step.started = Clock::now();
  step.result.step = plan.step;
  return step;
}

// The model a plan goes to the GPU on behind the step in flight, its tokens taken there from that
// step's choices: a plan that may be sent ahead (ahead_model) whose sequences all follow the step
// in flight's, one each in its order, on its model. Null for any other plan. A plan with
// constrained sequences goes too, holding back its output part: a grammar's mask needs the token
// before it on the host, and is sent when that step is answered (send_held_masks).
LoadedModel* Executor::chain_model(const StepPlan& plan) {
  if (steps_.empty() || !steps_.back().pending || !plan.starts.empty() || !plan.released.empty() ||
      !plan.spill.empty() || !plan.restore.empty()) {
    return nullptr;
  }
  const Step& before = steps_.back();
  LoadedModel* loaded = ahead_model(plan);
  if (loaded == nullptr || loaded->id != before.model_id || plan.sequences.size() != before.plan.sequences.size()) {
    return nullptr;
  }
  for (std::size_t i = 0; i < plan.sequences.size(); ++i) {
    const PlanSequence& seq = plan.sequences[i];
    // Its token is the one output row of the step before's sequence i: not so after drafts.
    if (!seq.follows || seq.tokens.size() != 1 || seq.sequence != before.plan.sequences[i].sequence ||
        before.plan.sequences[i].drafted > 0) {
      return nullptr;
    }
  }
  return loaded;
}

// The model a plan may be sent ahead on, or null: a step of decodes and prefills that all
// ask for output, no trim, no sequence left out, no embedding, and no step profile asked for
// (log_steps_over_ms profiles steps run in turn). Its starts, releases and page moves are done
// before it is sent (prepare): a spill's copy goes to the GPU before the step that may write
// its pages, and a restore is on the GPU when it returns.
LoadedModel* Executor::ahead_model(const StepPlan& plan) {
  if (!gpu_ || options_.log_steps_over_ms > 0 || !failed_.empty() || plan.sequences.empty() || plan.trim) {
    return nullptr;
  }
  for (const SequenceStart& start : plan.starts) {
    if (start.pooling != 0) return nullptr;
  }
  std::string problem;
  LoadedModel* loaded = model_for(plan, problem);
  if (loaded == nullptr || plan_problem(plan, *loaded)) return nullptr;
  for (const PlanSequence& seq : plan.sequences) {
    if (!seq.output || pooled(seq)) return nullptr;  // an embedding's hidden states come back only waited for
  }
  return loaded;
}

// A step with none before it: its releases done and its plan made runnable, sent ahead where it
// may be (ahead_model, every follower given its token), else run in turn.
void Executor::submit(Step& step, const Frames& blobs) {
  LoadedModel* ahead = ahead_model(step.plan);
  const std::size_t planned = step.plan.sequences.size();
  try {
    for (std::uint64_t sequence : step.plan.released) sequences_.erase(sequence);
    if (std::optional<StepPlan> resolved = runnable(step.plan, std::exchange(failed_, {}))) {
      step.plan = std::move(*resolved);
    }
    if (ahead != nullptr && step.plan.sequences.size() == planned) {
      if (prepare(step, blobs, *ahead)) submit_ahead(step, *ahead, nullptr);
    } else {
      run_in_turn(step, blobs);
    }
  } catch (const std::exception& e) {
    // Nothing above should throw (plans are checked first, GPU failures are caught where they
    // happen): this is a bug, answered as one rather than ending the actor.
    step.failure = StepFailure{RequestError::internal, std::string("executor bug: ") + e.what()};
  }
}

// Sends the step to the GPU without waiting for it (tokens_from: the step in flight, whose choices
// give this one's tokens). Its constrained rows' masks are walked while the GPU runs its layers:
// now, when they need no step before it (send_masks), else once that step is answered
// (send_held_masks).
void Executor::submit_ahead(Step& step, LoadedModel& loaded, const model::GpuModel::PendingTokens* tokens_from) {
  step.model_id = loaded.id;
  try {
    fail_if_injected(++gpu_steps_);
    step.pending = loaded.weights->submit_tokens(step_batch(step.plan, loaded, tokens_from != nullptr, true),
                                                 *loaded.kv_cache, tokens_from);
    step.sent_ahead = true;
  } catch (const std::exception& e) {
    gpu_failed(step, e.what(), e);
  }
  if (tokens_from == nullptr) send_masks(step);
}

// Starts the plan's sequences and runs its step on the plan's model, waiting for it, once the plan
// has passed every check. A plan that only releases needs no model: it may come after its model
// was unloaded.
void Executor::run_in_turn(Step& step, const Frames& blobs) {
  const StepPlan& plan = step.plan;
  if (plan.starts.empty() && plan.sequences.empty() && plan.spill.empty() && plan.restore.empty()) return;
  if (!gpu_) {
    step.failure = StepFailure{RequestError::gpu, no_gpu_problem()};
    return;
  }
  std::string problem;
  LoadedModel* loaded = model_for(plan, problem);
  if (loaded == nullptr) {
    step.failure = StepFailure{RequestError::internal, problem};
  } else if (auto invalid = plan_problem(plan, *loaded)) {
    step.failure = StepFailure{RequestError::internal, "invalid step plan: " + *invalid};
  } else if (prepare(step, blobs, *loaded) && !plan.sequences.empty()) {
    run_forward(step, *loaded);
  }
}

// The plan's pages moved (spilled to the host, restored from blobs) and its sequences started on
// `loaded`, before its step goes to the GPU; false when the step failed.
bool Executor::prepare(Step& step, const Frames& blobs, LoadedModel& loaded) {
  const StepPlan& plan = step.plan;
  if (plan.restore.size() != blobs.size()) {
    step.failure = StepFailure{RequestError::internal, fmt::format("invalid step plan: {} pages to restore and {} blobs",
                                                                   plan.restore.size(), blobs.size())};
    return false;
  }
  step.model_id = loaded.id;
  try {
    page_moves_.move(plan, blobs, loaded.id, *loaded.kv_cache, gpu_->pool);
  } catch (const std::exception& e) {
    // The step fails; the scheduler then forgets the pages the plan was restoring.
    gpu_failed(step, std::string("moving KV pages: ") + e.what(), e);
    return false;
  }
  start_sequences(loaded.id, plan.starts);
  return true;
}

// The step's forward pass, waited for: the GPU's argmax where every output is plain greedy, the
// logits otherwise.
void Executor::run_forward(Step& step, LoadedModel& loaded) {
  const model::StepBatch batch = step_batch(step.plan, loaded, false);
  try {
    fail_if_injected(++gpu_steps_);
    const auto started = Clock::now();
    model::StepProfile profile;
    model::StepProfile* profiling = options_.log_steps_over_ms > 0 ? &profile : nullptr;
    const std::uint64_t blocks_before = profiling != nullptr ? gpu_->pool.stats().blocks : 0;
    const bool embeds = std::any_of(step.plan.sequences.begin(), step.plan.sequences.end(),
                                    [&](const PlanSequence& seq) { return pooled(seq); });
    std::vector<float> hidden;
    step.chosen = loaded.weights->forward_sampled(batch, *loaded.kv_cache, profiling, embeds ? &hidden : nullptr);
    if (embeds) pool_embeddings(step, hidden, loaded.config.n_embd);
    if (profiling != nullptr) {
      const std::uint64_t blocks_after = gpu_->pool.stats().blocks;
      log_if_slow(step.plan, profile, Clock::now() - started,
                  blocks_after > blocks_before ? blocks_after - blocks_before : 0);
    }
  } catch (const std::exception& e) {
    // The step's scratch went back to the pool as the forward pass unwound.
    gpu_failed(step, e.what(), e);  // `loaded` is gone after a device loss
  }
}

// fail_steps= names this GPU step: it fails as if the GPU had thrown.
void Executor::fail_if_injected(std::uint64_t gpu_step) const {
  if (options_.fail_steps.contains(gpu_step)) {
    throw gpu::GpuError(fmt::format("injected failure of GPU step {} (executor option fail_steps)", gpu_step));
  }
}

// The GPU failed the step (`e`, said as `message`): it fails, and where the device is lost, so
// does every step not yet answered.
void Executor::gpu_failed(Step& step, std::string message, const std::exception& e) {
  step.pending.reset();
  step.failure = StepFailure{RequestError::gpu, std::move(message)};
  if (is_device_lost(e)) lose_device(step.failure->message);
}

// The GPU device is lost (`why`): every step not yet answered fails, its GPU state let go before
// the device goes; the first of them answered says the KV caches' contents are lost; then the
// device is made again and the models loaded on it again.
//
// Best effort, and untested: lavapipe never loses its device, so no test can make it happen.
// Samplers live on the host and survive with their models; the caches' contents do not. A model
// that cannot be loaded again is dropped, with its sequences.
void Executor::lose_device(const std::string& why) {
  for (Step& step : steps_) {
    step.pending.reset();
    if (!step.failure) step.failure = StepFailure{RequestError::gpu, why};
  }
  if (!steps_.empty()) steps_.front().result.kv_lost = true;
  spdlog::error("executor: the GPU device was lost; recreating the device and pool and loading again: {}",
                loaded_ids());
  std::vector<std::string> ids;
  for (const auto& [id, loaded] : models_) ids.push_back(id);
  page_moves_.drop_all();  // spills the GPU had not copied are lost
  models_.clear();         // their buffers go back to the old pool before it goes
  gpu_.reset();            // and the old device goes before the new one is made
  try {
    gpu_ = std::make_unique<DeviceStack>(options_);
    gpu_unavailable_.clear();
    for (const std::string& id : ids) {
      try {
        load_model(id);
      } catch (const std::exception& e) {
        spdlog::error("executor: after the device loss, {}", load_failure(id, e));
      }
    }
  } catch (const std::exception& e) {
    models_.clear();
    gpu_.reset();
    gpu_unavailable_ = e.what();
    spdlog::error("executor: recreating the GPU after a device loss failed: {}", e.what());
  }
  std::erase_if(sequences_, [&](const auto& entry) { return !models_.contains(entry.second.model_id); });
}

// The collect timer finds the step in flight still running on the GPU: it looks again in a
// millisecond rather than wait for it, so that the next plan, if it comes first, still goes to the
// GPU behind it (waiting here would leave the GPU idle while that plan is recorded, and while its
// constrained rows' masks are walked). A device that fails the check is left to collect().
bool Executor::still_running(Context& ctx) {
  if (steps_.size() != 1 || !steps_.front().pending || !models_.contains(steps_.front().model_id)) return false;
  bool running = false;
  try {
    running = !models_.at(steps_.front().model_id).weights->finished(*steps_.front().pending);
  } catch (const std::exception&) {
    return false;
  }
  if (running) ctx.set_timer(kCollectTimer, std::chrono::milliseconds(1), false);
  return running;
}

// Answers the steps in order: all of them, or all but a last one still in flight, which the next
// plan may follow on the GPU (or the collect timer answers, if none comes first).
void Executor::finish_steps(Context& ctx, bool leave_one_in_flight) {
  while (!steps_.empty() && !(leave_one_in_flight && steps_.size() == 1 && steps_.front().pending)) {
    finish_oldest(ctx);
  }
  if (!steps_.empty()) ctx.set_timer(kCollectTimer, std::chrono::milliseconds(1), false);
}

// The oldest step's answer: its tokens collected and sampled, or its failure applied.
void Executor::finish_oldest(Context& ctx) {
  Step& step = steps_.front();
  if (step.sent_ahead) ctx.cancel_timer(kCollectTimer);
  if (step.pending) collect(step);
  if (step.failure) {
    fail_step(step.plan, step.result, step.failure->error, step.failure->message);
  } else if (!step.model_id.empty()) {
    try {
      take_outputs(step.plan, step.chosen, step.result);
    } catch (const std::exception& e) {
      // The sampler refuses logits with nothing finite in them: the model's bug, not the request's.
      // Also the step's failure: a step held behind it (send_held_masks) fails with it.
      step.failure = StepFailure{RequestError::internal, std::string("sampling failed: ") + e.what()};
      fail_step(step.plan, step.result, step.failure->error, step.failure->message);
    }
  }
  // The answer goes first, so that the scheduler plans the next step while the masks of the step
  // behind are walked (its layers run on the GPU meanwhile).
  send_result(ctx, step);
  if (steps_.size() > 1) send_held_masks(step, steps_[1]);
  steps_.pop_front();
}

// Waits for a step sent ahead and takes its tokens. A failure fails the steps sent behind it too
// (their tokens came from it), their GPU state let go before a device rebuild.
void Executor::collect(Step& step) {
  try {
    step.chosen = models_.at(step.model_id).weights->collect_sampled(*step.pending);
    step.pending.reset();
  } catch (const std::exception& e) {
    for (Step& behind : steps_) {
      if (&behind == &step || behind.failure) continue;
      behind.pending.reset();
      behind.failure = StepFailure{RequestError::gpu, std::string("the step before it failed: ") + e.what()};
    }
    gpu_failed(step, e.what(), e);
  }
}

void Executor::send_result(Context& ctx, Step& step) {
  const StepPlan& plan = step.plan;
  StepResult& result = step.result;
  bool trimmed = false;
  if (plan.trim || result.error == static_cast<std::uint16_t>(RequestError::gpu)) {
    // A failed step may have left large scratch ranges cached: give them back now.
    trimmed = trim_pool(ctx);
  } else if (!plan.released.empty()) {
    trimmed = trim_after_release(ctx, step.slots_before);
  }
  result.slots = static_cast<std::uint32_t>(sequences_.size());
  if (gpu_ && (trimmed || plan.trim || plans_ % kPoolStatsEvery == 0)) {
    result.has_pool = true;
    result.pool = to_wire(gpu_->pool.stats());
  }
  if (gpu_) result.gpu_time = gpu_time();
  result.gpu_ns = nanoseconds_since(step.started);
  Frames blobs = result.pooled.empty() ? Frames{} : std::move(step.pooled);
  ctx.send(step.to.from, std::move(result), SendOptions{step.to.correlation_id, step.to.request_id, std::move(blobs)});
  advance_spills(ctx, false);
}

// The plan as it can run, or nothing when it runs as it came: each follower's token put in (the
// one its sequence's previous step sampled), and the sequences the previous step failed (unless
// this plan starts them again) left out: the scheduler planned this step before it learnt that,
// and ends them on that step's answer. So is a follower whose sampler is gone or has sampled
// nothing. A later plan that asks a failed sequence for output is refused as a scheduler bug.
std::optional<StepPlan> Executor::runnable(const StepPlan& plan, const std::unordered_set<std::uint64_t>& failed) const {
  auto left_out = [&](const PlanSequence& s) {
    return failed.contains(s.sequence) && std::none_of(plan.starts.begin(), plan.starts.end(), [&](const SequenceStart& start) {
             return start.sequence == s.sequence;
           });
  };
  const bool changes = std::any_of(plan.sequences.begin(), plan.sequences.end(),
                                   [&](const PlanSequence& s) { return s.follows || left_out(s); });
  if (!changes) return std::nullopt;
  StepPlan resolved = plan;
  std::erase_if(resolved.sequences, [&](PlanSequence& s) {
    if (left_out(s)) return true;
    if (!s.follows) return false;
    const auto state = sequences_.find(s.sequence);
    if (state == sequences_.end() || state->second.last_token < 0) {
      spdlog::warn("executor: step {}: sequence {} follows a step that sampled nothing for it: left out", plan.step,
                   s.sequence);
      return true;
    }
    s.tokens.assign(1, state->second.last_token);
    s.follows = false;
    return false;
  });
  return resolved;
}

void Executor::advance_spills(Context& ctx, bool wait) {
  if (gpu_) page_moves_.advance(ctx, gpu_->queue, wait);  // there are none without it
}

// The loaded model the plan is for (the only one loaded when the plan names none), or null and
// `problem` says why there is none.
LoadedModel* Executor::model_for(const StepPlan& plan, std::string& problem) {
  if (plan.model.empty()) {
    if (models_.size() == 1) return &models_.begin()->second;
    problem = models_.empty() ? std::string("the plan names no model and no model is loaded")
                              : fmt::format("the plan names no model and {} are loaded ({}): it must name one",
                                            models_.size(), loaded_ids());
    return nullptr;
  }
  if (auto it = models_.find(plan.model); it != models_.end()) return &it->second;
  problem = options_.models.contains(plan.model)
                ? fmt::format("model '{}' is not loaded (loaded: {}); load it first", plan.model, loaded_ids())
                : fmt::format("model '{}' is not loaded: no model of that id is configured (configured: {})",
                              plan.model, configured_ids(options_));
  return nullptr;
}

// The first thing wrong with the plan, or nothing. Checked before anything changes, so a bad
// plan runs nothing on the GPU; it comes from another process and is trusted no further than
// any input.
std::optional<std::string> Executor::plan_problem(const StepPlan& plan, const LoadedModel& loaded) const {
  const std::uint32_t n_vocab = loaded.n_vocab;
  auto outside_vocabulary = [&](std::int32_t token) {
    return token < 0 || static_cast<std::uint32_t>(token) >= n_vocab;
  };
  std::unordered_set<std::uint64_t> starting;
  for (const SequenceStart& start : plan.starts) {
    starting.insert(start.sequence);
    if (start.pooling > static_cast<std::uint8_t>(model::Pooling::last)) {
      return fmt::format("sequence {}: pooling {} is not none, mean or last", start.sequence, start.pooling);
    }
    if (auto error = model::validate(start.sampling, {static_cast<std::int32_t>(n_vocab)})) {
      return fmt::format("sequence {}: sampling {}: {}", start.sequence, error->field, error->message);
    }
    if (start.sampling.response_format.constrained()) {
      const auto grammar = model::grammar::response_grammar(start.sampling.response_format);
      if (const auto* refused = std::get_if<model::grammar::SchemaError>(&grammar)) {
        return fmt::format("sequence {}: response_format: {}", start.sequence, refused->message);
      }
      if (start.end_tokens.empty() || std::any_of(start.end_tokens.begin(), start.end_tokens.end(), outside_vocabulary)) {
        return fmt::format("sequence {}: a constrained response_format needs end tokens inside the vocabulary",
                           start.sequence);
      }
    }
    for (std::int32_t token : start.prompt) {
      if (outside_vocabulary(token)) {
        return fmt::format("sequence {}: prompt token id {} is outside the vocabulary [0, {})", start.sequence,
                           token, n_vocab);
      }
    }
  }
  for (const SpillPage& spill : plan.spill) {
    if (spill.page >= loaded.kv_pages) return fmt::format("spill page {} is outside the KV cache's {} pages", spill.page, loaded.kv_pages);
  }
  std::unordered_set<std::uint32_t> restoring;
  for (std::uint32_t page : plan.restore) {
    if (page >= loaded.kv_pages) return fmt::format("restore page {} is outside the KV cache's {} pages", page, loaded.kv_pages);
    if (!restoring.insert(page).second) return fmt::format("restore page {} appears twice", page);
  }
  std::unordered_set<std::uint64_t> seen;
  for (const PlanSequence& s : plan.sequences) {
    if (!seen.insert(s.sequence).second) return fmt::format("sequence {} appears twice in the step", s.sequence);
    if (s.tokens.empty()) return fmt::format("sequence {} has no tokens", s.sequence);
    const std::uint64_t end = std::uint64_t{s.position} + s.tokens.size();
    if (end > loaded.config.n_ctx_train) {
      return fmt::format("sequence {}: positions {} to {} go past the model's context of {} tokens", s.sequence,
                         s.position, end - 1, loaded.config.n_ctx_train);
    }
    if (const std::uint64_t needed = pages_for(end, loaded.page_size); s.block_table.size() < needed) {
      return fmt::format("sequence {}: its block table has {} pages, position {} needs {}", s.sequence,
                         s.block_table.size(), end - 1, needed);
    }
    for (std::uint32_t page : s.block_table) {
      if (page >= loaded.kv_pages) {
        return fmt::format("sequence {}: block table names page {}, the KV cache has pages 0 to {}", s.sequence,
                           page, loaded.kv_pages - 1);
      }
    }
    for (std::int32_t token : s.tokens) {
      if (outside_vocabulary(token)) {
        return fmt::format("sequence {}: token id {} is outside the vocabulary [0, {})", s.sequence, token, n_vocab);
      }
    }
    if (auto problem = draft_problem(plan, s)) return problem;
    if (starting.contains(s.sequence)) continue;
    const auto state = sequences_.find(s.sequence);
    if (state == sequences_.end()) {
      if (s.output) {
        return fmt::format("sequence {} asks for output but has no sampler (never started, or released)",
                           s.sequence);
      }
    } else if (state->second.model_id != loaded.id) {
      return fmt::format("sequence {} was started on model '{}', the plan is for '{}'", s.sequence,
                         state->second.model_id, loaded.id);
    }
  }
  return std::nullopt;
}

// What is wrong with a sequence's drafts, if it has any: they follow a token of its own, in a
// step that samples it by a draw that has no grammar and reports no logprobs (its sampler started
// in this plan or before): verify_drafts' rule needs nothing else.
std::optional<std::string> Executor::draft_problem(const StepPlan& plan, const PlanSequence& s) const {
  if (s.drafted == 0) return std::nullopt;
  if (s.drafted >= s.tokens.size() || !s.output || s.follows) {
    return fmt::format("sequence {}: {} drafts need output, no follows and a token before them ({} tokens)",
                       s.sequence, s.drafted, s.tokens.size());
  }
  const model::SamplingParams* sampling = nullptr;
  for (const SequenceStart& start : plan.starts) {
    if (start.sequence == s.sequence && start.pooling == 0) sampling = &start.sampling;
  }
  const auto state = sequences_.find(s.sequence);
  if (sampling == nullptr && state != sequences_.end() && !state->second.pool) sampling = &state->second.sampler.params();
  if (sampling == nullptr || sampling->logprobs || sampling->response_format.constrained()) {
    return fmt::format("sequence {}: drafts are verified for a draw without logprobs or a response_format", s.sequence);
  }
  return std::nullopt;
}

void Executor::start_sequences(const std::string& model_id, const std::vector<SequenceStart>& starts) {
  for (const SequenceStart& start : starts) {
    SequenceState state{model_id, model::Sampler(start.sampling, start.prompt)};
    LoadedModel& loaded = models_.at(model_id);
    if (start.pooling != 0) state.pool.emplace(static_cast<model::Pooling>(start.pooling), loaded.config.n_embd);
    if (start.sampling.response_format.constrained()) {
      // plan_problem compiled it already: a failure here is a bug, answered as one by submit.
      auto grammar = model::grammar::response_grammar(start.sampling.response_format);
      if (auto* refused = std::get_if<model::grammar::SchemaError>(&grammar)) throw std::logic_error(refused->message);
      state.constraint.emplace(std::get<std::shared_ptr<const model::grammar::Grammar>>(std::move(grammar)),
                               token_trie(loaded), start.end_tokens);
    }
    sequences_.insert_or_assign(start.sequence, std::move(state));
  }
}

bool Executor::pooled(const PlanSequence& seq) const {
  const auto state = sequences_.find(seq.sequence);
  return state != sequences_.end() && state->second.pool;
}

// Each embedding sequence of the step takes its rows of the step's hidden states (tokens, width),
// in plan order; one whose prompt ends here answers with its vector.
void Executor::pool_embeddings(Step& step, std::span<const float> hidden, std::uint32_t width) {
  std::size_t row = 0;
  for (const PlanSequence& seq : step.plan.sequences) {
    const std::span<const float> rows = hidden.subspan(row * width, seq.tokens.size() * width);
    row += seq.tokens.size();
    auto state = sequences_.find(seq.sequence);
    if (state == sequences_.end() || !state->second.pool) continue;
    model::EmbeddingPool& pool = *state->second.pool;
    if (!pool.add(rows, seq.position)) {
      step.failure = StepFailure{RequestError::internal,
                                 fmt::format("invalid step plan: embedding sequence {} has {} positions pooled and a "
                                             "chunk at position {}",
                                             seq.sequence, pool.positions(), seq.position)};
      return;
    }
    if (!seq.output) continue;
    const std::vector<float> vector = pool.vector();
    step.result.pooled.push_back(seq.sequence);
    step.pooled.emplace_back(vector.data(), vector.size() * sizeof(float));
  }
}

// With log_steps_over_ms: a step's forward pass that took longer, what it held and where its
// time went (GPU time per kind of op, the host's recording and waiting, blocks the pool had to
// take from the driver).
void Executor::log_if_slow(const StepPlan& plan, const model::StepProfile& profile, Clock::duration took,
                           std::uint64_t new_blocks) const {
  const double ms = std::chrono::duration<double, std::milli>(took).count();
  if (ms <= static_cast<double>(options_.log_steps_over_ms)) return;
  std::size_t prefill_tokens = 0, prefills = 0, decodes = 0;
  for (const PlanSequence& seq : plan.sequences) {
    if (seq.tokens.size() > 1) {
      prefill_tokens += seq.tokens.size();
      ++prefills;
    } else {
      ++decodes;
    }
  }
  std::vector<std::pair<double, std::string>> ops;
  double gpu = 0;
  for (const auto& [op, op_ms] : profile.gpu_ms) {
    ops.emplace_back(op_ms, op);
    gpu += op_ms;
  }
  std::sort(ops.rbegin(), ops.rend());
  std::string parts;
  for (const auto& [op_ms, op] : ops) parts += fmt::format("{}{} {:.1f}", parts.empty() ? "" : ", ", op, op_ms);
  spdlog::info("executor: step {} ({} prefill tokens in {} sequences, {} decodes, {} starting) took {:.1f} ms: "
               "GPU {:.1f} ms ({}); host recording {:.1f} ms, waiting {:.1f} ms; {} blocks more in the pool",
               plan.step, prefill_tokens, prefills, decodes, plan.starts.size(), ms, gpu, parts, profile.record_ms,
               profile.wait_ms, new_blocks);
}

// Whether the GPU's argmax can stand in for every output's draw (no sampler needs telling).
bool Executor::all_plain_greedy(const StepPlan& plan, const LoadedModel& loaded) const {
  if (loaded.n_vocab != loaded.config.n_vocab) return false;  // the argmax would consider the padding rows
  return std::all_of(plan.sequences.begin(), plan.sequences.end(), [&](const PlanSequence& seq) {
    return !samples(seq) || model::plain_greedy(sequences_.at(seq.sequence).sampler.params());
  });
}

// The plan's batch, each output's token chosen on the GPU: by the argmax where every output is
// plain greedy, else by each sequence's draw (follows_pending: the plan's tokens come from the step
// in flight, whose choices the samplers have not accepted yet).
model::StepBatch Executor::step_batch(const StepPlan& plan, const LoadedModel& loaded, bool follows_pending,
                                      bool masks_later) {
  model::StepBatch batch = make_batch(plan, loaded.page_size);
  // An embedding's last row is pooled, not sampled: no logits for it.
  for (model::StepToken& token : batch.tokens) token.output = token.output && samples(plan.sequences[token.sequence]);
  if (all_plain_greedy(plan, loaded)) return batch;
  model::StepSampling& sampling = batch.sampling.emplace();
  // A constrained row's mask: the tokens its grammar allows after every token accepted so far.
  // masks_later: its words are sent once the GPU has the step's layers, zeros until then
  // (send_masks; send_held_masks where they need the tokens of the step in flight first).
  const std::uint32_t words = (loaded.n_vocab + 31) / 32;
  const bool constrained = std::any_of(plan.sequences.begin(), plan.sequences.end(), [&](const PlanSequence& seq) {
    return samples(seq) && sequences_.at(seq.sequence).constraint.has_value();
  });
  std::vector<std::uint32_t> masks;
  if (constrained) masks = masks_later ? std::vector<std::uint32_t>(words, 0) : constrained_masks(plan, words);
  std::size_t mask_offset = 0;
  std::uint32_t row = 0;
  for (const PlanSequence& seq : plan.sequences) {
    if (!samples(seq)) continue;
    SequenceState& state = sequences_.at(seq.sequence);
    std::span<const std::uint32_t> allowed;
    if (state.constraint) {
      allowed = std::span(masks).subspan(mask_offset, words);
      if (masks_later) {
        sampling.masks_later = true;
      } else {
        mask_offset += words;
      }
    }
    model::add_sampling_row(sampling, state.sampler.gpu_row(follows_pending), loaded.n_vocab,
                            follows_pending ? std::optional<std::uint32_t>(row) : std::nullopt, allowed);
    ++row;
    // The rows verifying drafts (never following): each the draw after the drafts before it.
    const auto drafts = std::span<const std::int32_t>(seq.tokens).subspan(seq.tokens.size() - seq.drafted);
    for (std::uint32_t d = 1; d <= seq.drafted; ++d) {
      model::add_sampling_row(sampling, state.sampler.gpu_row_after(drafts.first(d)), loaded.n_vocab, std::nullopt);
    }
  }
  return batch;
}

// chosen: (outputs), the GPU's picks; each sampler that keeps a history is told its token.
void Executor::take_outputs(const StepPlan& plan, std::span<const model::SampledToken> chosen, StepResult& result) {
  std::size_t row = 0;
  for (const PlanSequence& seq : plan.sequences) {
    if (!samples(seq)) continue;
    if (seq.drafted > 0) {
      result.tokens.push_back(verify_drafts(seq, chosen.subspan(row, seq.drafted + 1)));
      row += seq.drafted + 1;
      continue;
    }
    const model::SampledToken& sampled = chosen[row++];
    SequenceState& state = sequences_.at(seq.sequence);
    if (!model::plain_greedy(state.sampler.params())) state.sampler.accept(sampled.token);
    if (state.constraint && !state.constraint->accept(sampled.token)) {
      throw std::logic_error(fmt::format("sequence {} drew token {}, which its response_format's grammar does not allow",
                                         seq.sequence, sampled.token));
    }
    OutputToken out;
    out.sequence = seq.sequence;
    out.token = sampled.token;
    if (sampled.logprob) {
      out.has_logprobs = true;
      out.logprobs.token = sampled.token;
      out.logprobs.logprob = *sampled.logprob;
      for (const model::TokenLogprob& top : sampled.top_logprobs) {
        out.logprobs.top_tokens.push_back(top.token);
        out.logprobs.top_logprobs.push_back(top.logprob);
      }
    }
    state.last_token = out.token;
    result.tokens.push_back(std::move(out));
  }
}

// A sequence's drafts checked against the draws of its rows (one after its last token, one after
// each draft, each with the counter and penalties of its place): the drafts kept, and the draw
// after the last of them, which a follower of this sequence takes. A draft is kept where the row
// before it drew it: that is speculative sampling's rule for a draft that is a point mass q = 1
// at d (keep d with chance min(1, p(d) / q(d)) = p(d), else draw from p without d, renormalised),
// since a draw x from p is d with chance p(d) and, when it is not, is distributed as p without d.
// Each kept token is the one plain sampling with the request's seed draws at its index, so the
// output is the same token for token, greedy or sampled, whatever was drafted.
OutputToken Executor::verify_drafts(const PlanSequence& seq, std::span<const model::SampledToken> rows) {
  std::vector<std::int32_t> choices;
  for (const model::SampledToken& sampled : rows) choices.push_back(sampled.token);
  const auto drafts = std::span<const std::int32_t>(seq.tokens).subspan(seq.tokens.size() - seq.drafted);
  const std::size_t accepted = model::accepted_drafts(drafts, choices);
  OutputToken out;
  out.sequence = seq.sequence;
  out.token = choices[accepted];
  out.accepted.assign(drafts.begin(), drafts.begin() + static_cast<std::ptrdiff_t>(accepted));
  SequenceState& state = sequences_.at(seq.sequence);
  if (!model::plain_greedy(state.sampler.params())) {
    for (std::int32_t token : out.accepted) state.sampler.accept(token);
    state.sampler.accept(out.token);
  }
  state.last_token = out.token;
  return out;
}

// The step behind the one just answered (`before`), sent with its output part held back for its
// constrained rows' masks: they follow now from the tokens `before` drew, in step_batch's order of
// rows. Where `before` failed, its follower cannot run: it fails too, its output part dropped.
void Executor::send_held_masks(const Step& before, Step& step) {
  if (!step.pending || !step.pending->holds_output()) return;
  if (before.failure) {
    step.pending.reset();
    if (!step.failure) step.failure = StepFailure{before.failure->error, "the step before it failed: " + before.failure->message};
    return;
  }
  send_masks(step);
}

// The masks of a step sent with its output part held (in step_batch's order of rows), walked
// while the GPU runs the step's layers, and the held part sent with them.
void Executor::send_masks(Step& step) {
  if (!step.pending || !step.pending->holds_output()) return;
  LoadedModel& loaded = models_.at(step.model_id);
  try {
    loaded.weights->send_held(*step.pending, constrained_masks(step.plan, (loaded.n_vocab + 31) / 32));
  } catch (const std::exception& e) {
    gpu_failed(step, e.what(), e);
  }
}

// The masks of the plan's constrained rows, `words` each, in the order of its rows: walked on
// the mask workers beside this thread.
std::vector<std::uint32_t> Executor::constrained_masks(const StepPlan& plan, std::uint32_t words) {
  std::vector<model::grammar::TokenConstraint*> constraints;
  for (const PlanSequence& seq : plan.sequences) {
    if (!samples(seq)) continue;
    SequenceState& state = sequences_.at(seq.sequence);
    if (state.constraint) constraints.push_back(&*state.constraint);
  }
  if (constraints.empty()) return {};
  if (!mask_workers_) {
    const int threads = options_.mask_threads;
    mask_workers_ = std::make_unique<model::grammar::MaskWorkers>(
        threads < 0 ? model::grammar::MaskWorkers::default_threads() : static_cast<unsigned>(threads));
  }
  std::vector<std::uint32_t> masks;
  masks.reserve(constraints.size() * words);
  for (std::span<const std::uint32_t> allowed : mask_workers_->allowed(constraints)) {
    masks.insert(masks.end(), allowed.begin(), allowed.begin() + words);
  }
  return masks;
}

// The model's pieces as a trie, read from its file's vocabulary the first time a constrained
// sequence starts on it (a 128k vocabulary: about a second on one core) and kept with the model.
const std::shared_ptr<const model::grammar::TokenTrie>& Executor::token_trie(LoadedModel& loaded) const {
  if (loaded.token_trie) return loaded.token_trie;
  auto opened = model::gguf::GgufFile::open(options_.models.at(loaded.id));
  if (auto* e = std::get_if<model::gguf::GgufError>(&opened)) throw std::runtime_error(e->message());
  auto vocabulary = model::gguf::read_vocabulary(std::get<model::gguf::GgufFile>(opened));
  if (auto* e = std::get_if<model::gguf::GgufError>(&vocabulary)) throw std::runtime_error(e->message());
  auto tokenizer = model::Tokenizer::create(std::get<model::Vocabulary>(vocabulary));
  if (auto* e = std::get_if<model::TokenizerError>(&tokenizer)) throw std::runtime_error(e->message);
  loaded.token_trie = std::make_shared<const model::grammar::TokenTrie>(
      model::grammar::token_pieces(std::get<model::Tokenizer>(tokenizer)));
  return loaded.token_trie;
}

// The step fails every sequence in it: the scheduler ends them, so their state goes too.
void Executor::fail_step(const StepPlan& plan, StepResult& result, RequestError error, std::string message) {
  spdlog::warn("executor: step {} failed ({}): {}", plan.step, error == RequestError::gpu ? "gpu" : "internal",
               message);
  result.tokens.clear();
  result.pooled.clear();
  result.error = static_cast<std::uint16_t>(error);
  result.message = std::move(message);
  for (const SequenceStart& start : plan.starts) sequences_.erase(start.sequence);
  for (const PlanSequence& seq : plan.sequences) {
    sequences_.erase(seq.sequence);
    failed_.insert(seq.sequence);
  }
}

// Trimming hands cached memory back to the driver at the cost of allocating it again when the
// next large step comes. With few sequences the next request probably needs the same scratch
// soon, so the pool keeps it a while (2 s at one sequence); with many, the cache holds scratch
// sized for large batches while memory is scarcest, so the interval shrinks to 100 ms at 64
// sequences. A release that finds the interval not yet over leaves a timer to trim when it is.
// While sequences are still running, a trim keeps the blocks that steps of the last
// kWorkingSetWindow allocated from and returns the others: handing the working set back and
// allocating it again cost each step after a trim 30-300 ms on the H100 (64 sequences: decode
// steps of 16 ms took 45-85, prefill steps 420-480 ms instead of ~200), while memory the steps
// stop needing still goes back within the window. With no sequence left, a trim returns
// everything.
bool Executor::trim_after_release(Context& ctx, std::size_t slots_before) {
  const std::int64_t interval_ns = std::chrono::nanoseconds(trim_interval(slots_before)).count();
  const std::int64_t since = ctx.now_ns() - last_trim_ns_;
  if (since >= interval_ns) return trim_pool(ctx, !sequences_.empty());
  if (!trim_pending_) {
    trim_pending_ = true;
    steps_at_timer_ = gpu_steps_;
    const auto wait = std::chrono::ceil<std::chrono::milliseconds>(std::chrono::nanoseconds(interval_ns - since));
    ctx.set_timer(kTrimTimer, wait, false);
  }
  return false;
}

// Whether the pool was trimmed; a failure is logged.
bool Executor::trim_pool(Context& ctx, bool keep_working_set) {
  try {
    trim_now(ctx, keep_working_set);
    return gpu_ != nullptr;
  } catch (const gpu::GpuError& e) {
    spdlog::warn("executor: trimming the buffer pool failed: {}", e.what());
    return false;
  }
}

// Trims the pool now (the trim any pending timer waits for), throwing what the pool throws:
// everything, or all but the recent working set (see trim_after_release).
void Executor::trim_now(Context& ctx, bool keep_working_set) {
  if (!keep_working_set) {
    advance_spills(ctx, true);  // so their staging goes back too
    page_moves_.release_kept_staging();
  }
  if (trim_pending_) ctx.cancel_timer(kTrimTimer);
  trim_pending_ = false;
  const std::int64_t now = ctx.now_ns();
  last_trim_ns_ = now;
  if (!gpu_) return;
  gpu::BufferPool& pool = gpu_->pool;
  const std::int64_t window_ns = std::chrono::nanoseconds(kWorkingSetWindow).count();
  while (!trim_epochs_.empty() && now - trim_epochs_.front().first > window_ns) trim_epochs_.pop_front();
  // Both wait for in-flight work; steps here are already waited for.
  if (keep_working_set) {
    pool.trim_unused_since(trim_epochs_.empty() ? pool.epoch() : trim_epochs_.front().second);
  } else {
    pool.trim();
  }
  pool.begin_epoch();
  trim_epochs_.emplace_back(now, pool.epoch());
}

std::string Executor::load_failure(const std::string& id, const std::exception& e) const {
  return fmt::format("cannot load model '{}' from {}: {}", id, options_.models.at(id).string(), e.what());
}

std::string Executor::loaded_ids() const {
  std::vector<std::string_view> ids;
  for (const auto& [id, loaded] : models_) ids.push_back(id);
  return joined_ids(ids);
}

std::string Executor::no_gpu_problem() const {
  return "the executor has had no GPU since a device loss (recreating it failed: " + gpu_unavailable_ +
         "); restart the executor";
}

}  // namespace

std::chrono::milliseconds trim_interval(std::size_t slots) {
  // 2000 ms * slots^(-log 20 / log 64): each doubling of the sequences divides the interval by
  // 20^(1/6) (about 1.65), from 2 s at one sequence to 100 ms at 64; clamped outside that range.
  const double s = static_cast<double>(std::clamp<std::size_t>(slots, 1, 64));
  return std::chrono::milliseconds(std::lround(2000.0 * std::pow(s, -std::log(20.0) / std::log(64.0))));
}

std::unique_ptr<Actor> make_executor(const ActorOptions& options) {
  return std::make_unique<Executor>(parse_executor_options(options));
}

}  // namespace mqlm::actors
