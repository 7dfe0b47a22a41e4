#include "actors/executor/executor.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <optional>
#include <set>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "gpu/buffer_pool.hpp"
#include "gpu/compute_queue.hpp"
#include "gpu/device.hpp"
#include "gpu/kernel_library.hpp"
#include "gpu/vulkan_error.hpp"
#include "model/gguf/gguf_file.hpp"
#include "model/gguf/vocabulary_metadata.hpp"
#include "model/llama/gguf_model.hpp"
#include "model/llama/gpu_model.hpp"
#include "model/sampling/sampler.hpp"

namespace mqlm::actors {

using namespace messages;

namespace {

using Clock = std::chrono::steady_clock;

constexpr std::uint32_t kTrimTimer = 1;
// Pool statistics ride on every 32nd StepResult (and on any after a trim): often enough for the
// scheduler's status to stay current, rarely enough that steps do not carry a map each.
constexpr std::uint64_t kPoolStatsEvery = 32;

// ---- options ---------------------------------------------------------------------------------

struct ExecutorOptions {
  std::filesystem::path model;
  std::string name;
  std::string device;
  std::uint32_t kv_pages = 1024;
  std::uint32_t page_size = 16;
  std::set<std::uint64_t> fail_steps;  // GPU steps (counted from 1) that fail on purpose
};

constexpr std::uint64_t kMaxUint32 = std::numeric_limits<std::uint32_t>::max();

std::uint64_t parse_number(std::string_view key, std::string_view text, std::uint64_t max) {
  return parse_number_option("executor", key, text, 1, max);
}

std::set<std::uint64_t> parse_step_list(std::string_view key, std::string_view text) {
  std::set<std::uint64_t> steps;
  while (!text.empty()) {
    const auto comma = text.find(',');
    steps.insert(parse_number(key, text.substr(0, comma), std::numeric_limits<std::uint64_t>::max()));
    text = comma == std::string_view::npos ? std::string_view{} : text.substr(comma + 1);
  }
  return steps;
}

ExecutorOptions parse_options(const ActorOptions& options) {
  ExecutorOptions parsed;
  for (const auto& [key, value] : options) {
    if (key == "model") {
      parsed.model = value;
    } else if (key == "name") {
      if (value.empty()) throw std::invalid_argument("executor option name= is empty: give the model a name");
      parsed.name = value;
    } else if (key == "device") {
      parsed.device = value;
    } else if (key == "kv_pages") {
      parsed.kv_pages = static_cast<std::uint32_t>(parse_number(key, value, kMaxUint32));
    } else if (key == "page_size") {
      parsed.page_size = static_cast<std::uint32_t>(parse_number(key, value, kMaxUint32));
    } else if (key == "fail_steps") {
      parsed.fail_steps = parse_step_list(key, value);
    } else {
      throw std::invalid_argument("actor executor has no option '" + key +
                                  "' (it takes model, name, device, kv_pages, page_size, fail_steps)");
    }
  }
  if (parsed.model.empty()) throw std::invalid_argument("actor executor needs option model=PATH (a GGUF file)");
  // The GPU addresses a cache row as page * page_size + offset in 32 bits.
  if (std::uint64_t{parsed.kv_pages} * parsed.page_size > kMaxUint32) {
    throw std::invalid_argument(fmt::format("executor options kv_pages={} and page_size={} make more than 2^32 "
                                            "cache rows; use fewer or smaller pages",
                                            parsed.kv_pages, parsed.page_size));
  }
  if (parsed.name.empty()) {
    const std::filesystem::path file = parsed.model.filename();
    parsed.name = file.extension() == ".gguf" ? file.stem().string() : file.string();
  }
  return parsed;
}

// ---- helpers ---------------------------------------------------------------------------------

PoolStatsWire to_wire(const gpu::PoolStats& stats) {
  PoolStatsWire wire{stats.active_bytes, stats.cached_bytes, stats.peak_active_bytes, stats.held_bytes,
                     static_cast<std::uint32_t>(stats.blocks), {}};
  for (const auto& [owner, bytes] : stats.active_by_owner) wire.active_by_owner.emplace(owner, bytes);
  return wire;
}

// Greedy with nothing that reads the sampler's history: the GPU's argmax (lowest id on ties, as
// the sampler breaks them) is the sampler's choice, and the sampler need not be told the token,
// because its history feeds only the penalties, which are off for the sequence's whole life.
bool plain_greedy(const model::SamplingParams& p) {
  return p.temperature == 0.0f && !p.logprobs && p.presence_penalty == 0.0f && p.frequency_penalty == 0.0f &&
         (p.repetition_penalty == 1.0f || p.repetition_last_n == 0);
}

bool is_device_lost(const std::exception& e) {
  return dynamic_cast<const gpu::GpuError*>(&e) != nullptr &&
         std::string_view(e.what()).find(gpu::result_name(VK_ERROR_DEVICE_LOST)) != std::string_view::npos;
}

std::uint64_t pages_for(std::uint64_t tokens, std::uint32_t page_size) { return (tokens + page_size - 1) / page_size; }

// One block table per plan sequence; its tokens at position, position + 1, ...; a row of output
// after the last token of each sequence that asks for one. The plan has passed plan_problem.
model::StepBatch make_batch(const StepPlan& plan, std::uint32_t page_size) {
  model::StepBatch batch;
  for (std::uint32_t s = 0; s < plan.sequences.size(); ++s) {
    const PlanSequence& seq = plan.sequences[s];
    // Only the pages up to the last position: the attention's work grows with the longest table.
    const std::uint64_t end = std::uint64_t{seq.position} + seq.tokens.size();
    const auto pages = static_cast<std::ptrdiff_t>(pages_for(end, page_size));
    batch.block_tables.emplace_back(seq.block_table.begin(), seq.block_table.begin() + pages);
    for (std::uint32_t i = 0; i < seq.tokens.size(); ++i) {
      batch.tokens.push_back({s, seq.position + i, seq.tokens[i], seq.output && i + 1 == seq.tokens.size()});
    }
  }
  return batch;
}

// Everything on the device, made together and destroyed together in reverse order: the cache
// and the model hand their buffers back to the pool before it goes, the pool before the queue,
// the queue before the device.
struct GpuStack {
  GpuStack(const ExecutorOptions& options, const model::LlamaConfig& config, const model::TensorSource& weights)
      : device(gpu::DeviceOptions{options.device}),
        queue(device),
        pool(queue),
        kernels(device),
        gpu_model(context(), config, weights, "weights:" + options.name),
        kv_cache(context(), config, options.kv_pages, options.page_size) {}
  model::GpuContext context() { return {queue, pool, kernels}; }

  gpu::Device device;
  gpu::ComputeQueue queue;
  gpu::BufferPool pool;
  gpu::KernelLibrary kernels;
  model::GpuModel gpu_model;
  model::GpuKvCache kv_cache;
};

// ---- the actor -------------------------------------------------------------------------------

class Executor final : public Actor {
 public:
  explicit Executor(ExecutorOptions options) : options_(std::move(options)) {}

  void on_start(Context& ctx) override;
  void on_message(Context& ctx, Message& message) override;

 private:
  void load();
  void rebuild_after_device_loss();
  void answer_query(Context& ctx, const Message& message, const ExecutorQuery& query);
  void answer_step(Context& ctx, const Message& message, const StepPlan& plan);
  std::optional<std::string> plan_problem(const StepPlan& plan) const;
  void start_sequences(const std::vector<SequenceStart>& starts);
  void run_step(const StepPlan& plan, StepResult& result);
  bool all_plain_greedy(const StepPlan& plan) const;
  void sample_outputs(const StepPlan& plan, std::span<const float> logits, std::span<const std::int32_t> chosen,
                      StepResult& result);
  void fail_step(const StepPlan& plan, StepResult& result, RequestError error, std::string message);
  bool trim_after_release(Context& ctx, std::size_t slots_before);
  bool trim_pool(Context& ctx);

  ExecutorOptions options_;
  model::LlamaConfig config_;
  std::uint32_t n_vocab_ = 0;      // rows that may be sampled: the tokenizer's size (<= config_.n_vocab)
  std::unique_ptr<GpuStack> gpu_;  // null only after a device loss whose rebuild failed
  std::string gpu_unavailable_;    // why gpu_ is null
  std::unordered_map<std::uint64_t, model::Sampler> samplers_;  // sequence -> its sampler
  std::uint64_t plans_ = 0;        // StepPlans answered
  std::uint64_t gpu_steps_ = 0;    // plans that reached the GPU with sequences (what fail_steps counts)
  std::int64_t last_trim_ns_ = 0;  // ctx.now_ns() of the last trim
  bool trim_pending_ = false;      // a release found the interval not yet over: the timer trims
};

void Executor::on_start(Context& ctx) {
  load();
  last_trim_ns_ = ctx.now_ns();
  const gpu::PoolStats stats = gpu_->pool.stats();
  auto owned = [&](const std::string& owner) {
    auto it = stats.active_by_owner.find(owner);
    return it == stats.active_by_owner.end() ? 0.0 : static_cast<double>(it->second) / (1 << 20);
  };
  spdlog::info("executor: model {} ({}) loaded on {}: {:.1f} MiB of weights, KV cache of {} pages of {} tokens "
               "({:.1f} MiB), context {}, vocabulary {}",
               options_.name, options_.model.string(), gpu_->device.features().name, owned("weights:" + options_.name),
               options_.kv_pages, options_.page_size, owned("kv"), config_.n_ctx_train, n_vocab_);
}

void Executor::load() {
  const std::string path = options_.model.string();
  auto opened = model::gguf::GgufFile::open(options_.model);
  if (auto* e = std::get_if<model::gguf::GgufError>(&opened)) {
    throw std::runtime_error("executor: cannot open model " + path + ": " + e->message());
  }
  const auto& file = std::get<model::gguf::GgufFile>(opened);
  auto config = model::read_llama_config(file);
  if (auto* e = std::get_if<std::string>(&config)) throw std::runtime_error("executor: model " + path + ": " + *e);
  auto vocabulary = model::gguf::read_vocabulary(file);
  if (auto* e = std::get_if<model::gguf::GgufError>(&vocabulary)) {
    throw std::runtime_error("executor: model " + path + ": its tokenizer metadata " + e->message());
  }
  config_ = std::get<model::LlamaConfig>(config);
  // Some models (Qwen2) have more output rows than tokens: those rows can never be sampled.
  n_vocab_ = static_cast<std::uint32_t>(
      std::min<std::size_t>(std::get<model::Vocabulary>(vocabulary).tokens.size(), config_.n_vocab));
  gpu_.reset();  // a rebuild lets go of the old device before making the new one
  gpu_ = std::make_unique<GpuStack>(options_, config_, model::gguf_tensor_source(file));
  // The upload's staging memory goes back to the driver: what stays held is the weights and the
  // KV cache, the baseline later trims come back to.
  gpu_->pool.trim();
}

// Best effort, and untested: lavapipe never loses its device, so no test can make it happen.
// Samplers live on the host and survive; the cache's contents do not (the step says kv_lost).
void Executor::rebuild_after_device_loss() {
  spdlog::error("executor: the GPU device was lost; recreating the device, pool, model and KV cache");
  try {
    load();
    gpu_unavailable_.clear();
  } catch (const std::exception& e) {
    gpu_.reset();
    gpu_unavailable_ = e.what();
    spdlog::error("executor: recreating the GPU after a device loss failed: {}", e.what());
  }
}

void Executor::on_message(Context& ctx, Message& message) {
  if (const auto* plan = message.as<StepPlan>()) {
    answer_step(ctx, message, *plan);
  } else if (const auto* query = message.as<ExecutorQuery>()) {
    answer_query(ctx, message, *query);
  } else if (const auto* timer = message.as<Timer>(); timer != nullptr && timer->timer_id == kTrimTimer) {
    if (trim_pending_) trim_pool(ctx);
  } else {
    spdlog::debug("executor: ignored a {} from {}", kind_name(message.kind()), message.envelope.from);
  }
}

void Executor::answer_query(Context& ctx, const Message& message, const ExecutorQuery& query) {
  if (query.trim) trim_pool(ctx);
  ExecutorReport report;
  report.models.push_back(
      ModelInfo{options_.name, options_.kv_pages, options_.page_size, config_.n_ctx_train, n_vocab_});
  report.slots = static_cast<std::uint32_t>(samplers_.size());
  if (gpu_) {
    report.pool = to_wire(gpu_->pool.stats());
    report.device = gpu_->device.features().name;
  }
  ctx.reply(message, std::move(report));
}

void Executor::answer_step(Context& ctx, const Message& message, const StepPlan& plan) {
  const auto started = Clock::now();
  const std::size_t slots_before = samplers_.size();
  ++plans_;
  StepResult result;
  result.step = plan.step;
  try {
    for (std::uint64_t sequence : plan.released) samplers_.erase(sequence);
    if (auto problem = plan_problem(plan)) {
      fail_step(plan, result, RequestError::internal, "invalid step plan: " + *problem);
    } else {
      start_sequences(plan.starts);
      if (!plan.sequences.empty()) run_step(plan, result);
    }
  } catch (const std::exception& e) {
    // Nothing above should throw (plans are checked first, GPU failures are caught where they
    // happen): this is a bug, answered as one rather than ending the actor.
    fail_step(plan, result, RequestError::internal, std::string("executor bug: ") + e.what());
  }
  bool trimmed = false;
  if (plan.trim || result.error == static_cast<std::uint16_t>(RequestError::gpu)) {
    // A failed step may have left large scratch ranges cached: give them back now.
    trimmed = trim_pool(ctx);
  } else if (!plan.released.empty()) {
    trimmed = trim_after_release(ctx, slots_before);
  }
  result.slots = static_cast<std::uint32_t>(samplers_.size());
  if (gpu_ && (trimmed || plan.trim || plans_ % kPoolStatsEvery == 0)) {
    result.has_pool = true;
    result.pool = to_wire(gpu_->pool.stats());
  }
  result.gpu_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - started).count();
  ctx.reply(message, std::move(result));
}

// The first thing wrong with the plan, or nothing. Checked before anything changes, so a bad
// plan runs nothing on the GPU; it comes from another process and is trusted no further than
// any input.
std::optional<std::string> Executor::plan_problem(const StepPlan& plan) const {
  if (!plan.model.empty() && plan.model != options_.name) {
    return fmt::format("the plan is for model '{}', this executor serves '{}'", plan.model, options_.name);
  }
  auto outside_vocabulary = [&](std::int32_t token) {
    return token < 0 || static_cast<std::uint32_t>(token) >= n_vocab_;
  };
  std::unordered_set<std::uint64_t> starting;
  for (const SequenceStart& start : plan.starts) {
    starting.insert(start.sequence);
    if (auto error = model::validate(start.sampling, {static_cast<std::int32_t>(n_vocab_)})) {
      return fmt::format("sequence {}: sampling {}: {}", start.sequence, error->field, error->message);
    }
    for (std::int32_t token : start.prompt) {
      if (outside_vocabulary(token)) {
        return fmt::format("sequence {}: prompt token id {} is outside the vocabulary [0, {})", start.sequence,
                           token, n_vocab_);
      }
    }
  }
  std::unordered_set<std::uint64_t> seen;
  for (const PlanSequence& s : plan.sequences) {
    if (!seen.insert(s.sequence).second) return fmt::format("sequence {} appears twice in the step", s.sequence);
    if (s.tokens.empty()) return fmt::format("sequence {} has no tokens", s.sequence);
    const std::uint64_t end = std::uint64_t{s.position} + s.tokens.size();
    if (end > config_.n_ctx_train) {
      return fmt::format("sequence {}: positions {} to {} go past the model's context of {} tokens", s.sequence,
                         s.position, end - 1, config_.n_ctx_train);
    }
    if (const std::uint64_t needed = pages_for(end, options_.page_size); s.block_table.size() < needed) {
      return fmt::format("sequence {}: its block table has {} pages, position {} needs {}", s.sequence,
                         s.block_table.size(), end - 1, needed);
    }
    for (std::uint32_t page : s.block_table) {
      if (page >= options_.kv_pages) {
        return fmt::format("sequence {}: block table names page {}, the KV cache has pages 0 to {}", s.sequence,
                           page, options_.kv_pages - 1);
      }
    }
    for (std::int32_t token : s.tokens) {
      if (outside_vocabulary(token)) {
        return fmt::format("sequence {}: token id {} is outside the vocabulary [0, {})", s.sequence, token, n_vocab_);
      }
    }
    if (s.output && !samplers_.contains(s.sequence) && !starting.contains(s.sequence)) {
      return fmt::format("sequence {} asks for output but has no sampler (never started, or released)", s.sequence);
    }
  }
  return std::nullopt;
}

void Executor::start_sequences(const std::vector<SequenceStart>& starts) {
  for (const SequenceStart& start : starts) {
    samplers_.insert_or_assign(start.sequence, model::Sampler(start.sampling, start.prompt));
  }
}

void Executor::run_step(const StepPlan& plan, StepResult& result) {
  if (!gpu_) {
    fail_step(plan, result, RequestError::gpu,
              "the executor has had no GPU since a device loss (recreating it failed: " + gpu_unavailable_ +
                  "); restart the executor");
    return;
  }
  const model::StepBatch batch = make_batch(plan, options_.page_size);
  const bool greedy = all_plain_greedy(plan);
  const std::uint64_t gpu_step = ++gpu_steps_;
  std::vector<float> logits;         // (outputs, config_.n_vocab)
  std::vector<std::int32_t> chosen;  // (outputs) when greedy
  try {
    if (options_.fail_steps.contains(gpu_step)) {
      throw gpu::GpuError(fmt::format("injected failure of GPU step {} (executor option fail_steps)", gpu_step));
    }
    if (greedy) {
      chosen = gpu_->gpu_model.forward_argmax(batch, gpu_->kv_cache);
    } else {
      logits = gpu_->gpu_model.forward(batch, gpu_->kv_cache);
    }
  } catch (const std::exception& e) {
    // The step's scratch went back to the pool as the forward pass unwound.
    fail_step(plan, result, RequestError::gpu, e.what());
    if (is_device_lost(e)) {
      result.kv_lost = true;
      rebuild_after_device_loss();
    }
    return;
  }
  try {
    sample_outputs(plan, logits, chosen, result);
  } catch (const std::exception& e) {
    // The sampler refuses logits with nothing finite in them: the model's bug, not the request's.
    fail_step(plan, result, RequestError::internal, std::string("sampling failed: ") + e.what());
  }
}

// Whether the GPU's argmax can stand in for every output's sampler, sparing the logits' copy.
bool Executor::all_plain_greedy(const StepPlan& plan) const {
  if (n_vocab_ != config_.n_vocab) return false;  // the argmax would consider the padding rows
  return std::all_of(plan.sequences.begin(), plan.sequences.end(), [&](const PlanSequence& seq) {
    return !seq.output || plain_greedy(samplers_.at(seq.sequence).params());
  });
}

// logits: (outputs, config_.n_vocab), or chosen: (outputs), the GPU's picks when all were greedy.
void Executor::sample_outputs(const StepPlan& plan, std::span<const float> logits,
                              std::span<const std::int32_t> chosen, StepResult& result) {
  std::size_t row = 0;
  for (const PlanSequence& seq : plan.sequences) {
    if (!seq.output) continue;
    OutputToken out;
    out.sequence = seq.sequence;
    if (!chosen.empty()) {
      out.token = chosen[row];
    } else {
      // Only the rows that are tokens: padding rows past the vocabulary can never be chosen.
      auto row_logits = logits.subspan(row * config_.n_vocab, n_vocab_);
      model::SampledToken sampled = samplers_.at(seq.sequence).sample(row_logits);
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
    }
    ++row;
    result.tokens.push_back(std::move(out));
  }
}

// The step fails every sequence in it: the scheduler ends them, so their state goes too.
void Executor::fail_step(const StepPlan& plan, StepResult& result, RequestError error, std::string message) {
  spdlog::warn("executor: step {} failed ({}): {}", plan.step, error == RequestError::gpu ? "gpu" : "internal",
               message);
  result.tokens.clear();
  result.error = static_cast<std::uint16_t>(error);
  result.message = std::move(message);
  for (const SequenceStart& start : plan.starts) samplers_.erase(start.sequence);
  for (const PlanSequence& seq : plan.sequences) samplers_.erase(seq.sequence);
}

// Trimming hands cached memory back to the driver at the cost of allocating it again when the
// next large step comes. With few sequences the next request probably needs the same scratch
// soon, so the pool keeps it a while (2 s at one sequence); with many, the cache holds scratch
// sized for large batches while memory is scarcest, and steps come so often that the pause a
// trim costs is small beside them, so the interval shrinks to 100 ms at 64 sequences. A release
// that finds the interval not yet over leaves a timer to trim when it is.
bool Executor::trim_after_release(Context& ctx, std::size_t slots_before) {
  const std::int64_t interval_ns = std::chrono::nanoseconds(trim_interval(slots_before)).count();
  const std::int64_t since = ctx.now_ns() - last_trim_ns_;
  if (since >= interval_ns) return trim_pool(ctx);
  if (!trim_pending_) {
    trim_pending_ = true;
    const auto wait = std::chrono::ceil<std::chrono::milliseconds>(std::chrono::nanoseconds(interval_ns - since));
    ctx.set_timer(kTrimTimer, wait, false);
  }
  return false;
}

bool Executor::trim_pool(Context& ctx) {
  if (trim_pending_) ctx.cancel_timer(kTrimTimer);  // this trim is the one it was waiting for
  trim_pending_ = false;
  last_trim_ns_ = ctx.now_ns();
  if (!gpu_) return false;
  try {
    gpu_->pool.trim();  // waits for in-flight work; steps here are already waited for
    return true;
  } catch (const gpu::GpuError& e) {
    spdlog::warn("executor: trimming the buffer pool failed: {}", e.what());
    return false;
  }
}

}  // namespace

std::chrono::milliseconds trim_interval(std::size_t slots) {
  // 2000 ms * slots^(-log 20 / log 64): each doubling of the sequences divides the interval by
  // 20^(1/6) (about 1.65), from 2 s at one sequence to 100 ms at 64; clamped outside that range.
  const double s = static_cast<double>(std::clamp<std::size_t>(slots, 1, 64));
  return std::chrono::milliseconds(std::lround(2000.0 * std::pow(s, -std::log(20.0) / std::log(64.0))));
}

std::unique_ptr<Actor> make_executor(const ActorOptions& options) {
  return std::make_unique<Executor>(parse_options(options));
}

}  // namespace mqlm::actors
