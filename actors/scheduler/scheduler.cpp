#include "actors/scheduler/scheduler.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <xxhash.h>

#include "model/gguf/gguf_file.hpp"
#include "model/gguf/vocabulary_metadata.hpp"

namespace mqlm::actors {

using namespace messages;

namespace {

constexpr std::uint32_t kWatchdogTimer = 1;
constexpr auto kWatchdogInterval = std::chrono::milliseconds(500);

// 0 when the later moment never came (a request refused before it was scheduled).
std::int64_t elapsed(std::int64_t from_ns, std::int64_t to_ns) { return to_ns > 0 ? to_ns - from_ns : 0; }

// One token's bytes as it stands in generated text: not at a sequence's start (so SentencePiece
// keeps its leading space), special tokens as their text (an end-of-turn token is not nothing).
std::string token_piece(const model::Tokenizer& tokenizer, std::int32_t token) {
  if (token < 0 || static_cast<std::size_t>(token) >= tokenizer.size()) return {};
  return tokenizer.decode(std::span<const std::int32_t>(&token, 1), model::DecodeOptions{true, false});
}

// The executor's logprobs with the texts that front ends show (OpenAI's logprobs are by text).
TokenLogprobs with_token_texts(const model::Tokenizer& tokenizer, TokenLogprobs logprobs) {
  logprobs.text = token_piece(tokenizer, logprobs.token);
  logprobs.top_texts.clear();
  for (std::int32_t token : logprobs.top_tokens) logprobs.top_texts.push_back(token_piece(tokenizer, token));
  return logprobs;
}

}  // namespace

// What the scheduler knows of a model: enough to turn prompts into tokens and tokens into text.
struct Scheduler::ServedModel {
  std::string name;
  // Mixed into prefix-cache keys, so models never share pages: the id and the file's identity, so a
  // page on SSD is never restored into other weights served under the same id.
  std::uint64_t key = 0;
  std::uint64_t page_bytes = 0;      // a KV page on the host (the executor's figure)
  model::Vocabulary vocabulary;
  std::unique_ptr<model::Tokenizer> tokenizer;
  std::optional<model::ChatTemplate> chat;
  std::vector<std::int32_t> stop_tokens;  // EOS, EOT and the chat family's end-of-turn tokens
  std::uint32_t n_ctx = 0;
  std::uint32_t n_vocab = 0;  // ids that may appear in a prompt or be sampled

  ModelState state = ModelState::unloaded;
  std::optional<KvPageTable> pages;  // while loaded: made from the executor's figures
  std::uint32_t kv_capacity_tokens = 0;
  std::uint32_t open_requests = 0;   // in the request table
  bool load_requested = false;       // a LoadRequest to the enforcer awaits its answer
  bool drain_pending = false;        // AbortModel came: ModelDrained goes once no step of it is in flight

  bool served() const { return state == ModelState::loaded && pages.has_value(); }
};

struct Scheduler::Request {
  ServedModel* model = nullptr;
  std::string front;             // the front end that submitted it (gateway, http)
  std::uint64_t client_request = 0;  // its request id there
  std::uint64_t sequence = 0;
  std::vector<std::int32_t> history;  // prompt, then generated tokens
  std::uint32_t prompt_tokens = 0;
  std::uint32_t computed = 0;         // tokens of history whose K and V are in the cache
  std::uint32_t planned = 0;          // positions given to plans (computed, or in a plan in flight)
  std::uint32_t pending = 0;          // plans in flight that sample a token for it
  std::uint32_t epoch = 0;            // preemptions: answers to plans of an earlier epoch compute nothing of it
  std::uint32_t cached_tokens = 0;    // prompt tokens the prefix cache gave at first admission
  // Its prefix beyond the GPU: asked of the cache-writer once, before its first admission.
  enum class Lookup : std::uint8_t { none, pending, done } lookup = Lookup::none;
  std::int64_t lookup_sent_ns = 0;
  std::uint32_t restore_from = 0;     // the page index the answer's first page is for
  std::vector<KvPageId> restore_ids;  // the answer's pages, and their blobs and tiers
  Frames restore_blobs;
  std::vector<std::uint8_t> restore_tiers;
  bool admitted_once = false;
  bool running = false;
  bool executor_has_it = false;       // the executor holds its sampler
  model::SamplingParams sampling;
  std::optional<model::StreamDecoder> decoder;
  std::optional<model::StopMatcher> stops;
  std::int64_t submitted_ns = 0, scheduled_ns = 0, first_token_ns = 0;

  std::uint32_t generated() const { return static_cast<std::uint32_t>(history.size()) - prompt_tokens; }
};

SchedulerConfig scheduler_config(const ActorOptions& options) {
  check_option_names("scheduler", options,
                     {"model", "name", "models", "aliases", "default_model", "executor", "enforcer", "max_sequences",
                      "token_budget", "max_waiting", "step_timeout_ms", "cache_writer", "lookup_timeout_ms", "stop_spill_bytes",
                      "overlap"});
  SchedulerConfig c;
  auto model = options.find("model");
  auto models = options.find("models");
  if (models != options.end()) {
    if (model != options.end() || options.contains("name")) {
      throw std::invalid_argument("scheduler: model= (and name=) and models= do not go together");
    }
    c.models = parse_model_list("scheduler", models->second);
  } else {
    if (model == options.end() || model->second.empty()) {
      throw std::invalid_argument("scheduler: model=PATH (a GGUF file) or models=ID=PATH;... is required");
    }
    const std::filesystem::path path = model->second;
    std::string name = text_option(options, "name", path.stem().string());
    if (name.empty()) throw std::invalid_argument("scheduler option name= is empty: give the model an id");
    c.models.emplace(name, path);
  }
  c.aliases = aliases_option("scheduler", options, c.models);
  c.default_model = text_option(options, "default_model", c.models.begin()->first);
  if (!c.models.contains(c.default_model)) {
    throw std::invalid_argument("scheduler option default_model=" + c.default_model + " is not one of models=");
  }
  c.executor = text_option(options, "executor", c.executor);
  c.enforcer = text_option(options, "enforcer", c.enforcer);
  auto count = [&](const std::string& key, std::uint32_t fallback, std::uint32_t low, std::uint32_t high) {
    return static_cast<std::uint32_t>(number_option("scheduler", options, key, fallback, low, high));
  };
  c.max_sequences = count("max_sequences", c.max_sequences, 1, 4096);
  c.token_budget = count("token_budget", c.token_budget, 1, 1 << 20);
  c.max_waiting = count("max_waiting", c.max_waiting, 1, 1 << 24);
  c.step_timeout_ms = count("step_timeout_ms", c.step_timeout_ms, 10, 3'600'000);
  c.cache_writer = text_option(options, "cache_writer", c.cache_writer);
  c.lookup_timeout_ms = count("lookup_timeout_ms", c.lookup_timeout_ms, 1, 3'600'000);
  c.stop_spill_bytes = number_option("scheduler", options, "stop_spill_bytes", 0);
  c.overlap = count("overlap", c.overlap ? 1 : 0, 0, 1) == 1;
  return c;
}

std::unique_ptr<Actor> make_scheduler(const ActorOptions& options) {
  return std::make_unique<Scheduler>(scheduler_config(options));
}

namespace {

// The prefix cache's name for a model: its id, its file's size and a hash of samples of the file
// (the first MiB, where the metadata and tensor layout are, and 4 KiB at 64 places through the
// weights), so weights replaced under the same id never share pages with the old ones, even
// pages kept on SSD across a restart. Milliseconds for a file of gigabytes.
std::uint64_t model_identity(const std::string& name, const std::filesystem::path& path) {
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  XXH3_64bits_update(state, name.data(), name.size());
  std::ifstream file(path, std::ios::binary);
  const std::uint64_t size = std::filesystem::file_size(path);
  XXH3_64bits_update(state, &size, sizeof size);
  std::vector<char> sample(std::size_t{1} << 20);
  auto hash_at = [&](std::uint64_t offset, std::size_t bytes) {
    file.clear();
    file.seekg(static_cast<std::streamoff>(offset));
    file.read(sample.data(), static_cast<std::streamsize>(std::min<std::uint64_t>(bytes, size - std::min(size, offset))));
    XXH3_64bits_update(state, sample.data(), static_cast<std::size_t>(file.gcount()));
  };
  hash_at(0, sample.size());
  for (std::uint64_t i = 1; i <= 64; ++i) hash_at(size / 65 * i, 4096);
  const std::uint64_t identity = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return identity;
}

// What the scheduler needs of the model in `path`, read when it is built (the replay rule).
std::unique_ptr<Scheduler::ServedModel> read_served_model(const std::string& name, const std::filesystem::path& path) {
  const std::string where = path.string();
  auto opened = model::gguf::GgufFile::open(path);
  if (auto* e = std::get_if<model::gguf::GgufError>(&opened)) throw std::invalid_argument(where + ": " + e->message());
  const auto& file = std::get<model::gguf::GgufFile>(opened);
  auto vocabulary = model::gguf::read_vocabulary(file);
  if (auto* e = std::get_if<model::gguf::GgufError>(&vocabulary)) {
    throw std::invalid_argument(where + ": " + e->message());
  }
  auto served = std::make_unique<Scheduler::ServedModel>();
  Scheduler::ServedModel& m = *served;
  m.vocabulary = std::get<model::Vocabulary>(std::move(vocabulary));
  auto tokenizer = model::Tokenizer::create(m.vocabulary);
  if (auto* e = std::get_if<model::TokenizerError>(&tokenizer)) throw std::invalid_argument(where + ": " + e->message);
  m.tokenizer = std::make_unique<model::Tokenizer>(std::get<model::Tokenizer>(std::move(tokenizer)));
  m.name = name;
  m.key = model_identity(m.name, path);
  m.n_vocab = static_cast<std::uint32_t>(m.tokenizer->size());
  if (const auto* arch = file.get<std::string>("general.architecture")) {
    if (const auto* ctx = file.get<std::uint32_t>(*arch + ".context_length")) m.n_ctx = *ctx;
  }
  auto chat = model::chat_template_for(m.vocabulary);
  if (auto* t = std::get_if<model::ChatTemplate>(&chat)) {
    m.chat = *t;
    m.stop_tokens = model::end_of_turn_token_ids(t->family, m.vocabulary);
  } else {
    for (std::int32_t id : {m.tokenizer->eos(), m.tokenizer->eot()}) {
      if (id >= 0) m.stop_tokens.push_back(id);
    }
  }
  return served;
}

}  // namespace

Scheduler::Scheduler(SchedulerConfig config) : config_(std::move(config)) {
  for (const auto& [name, path] : config_.models) models_.emplace(name, read_served_model(name, path));
  default_model_ = models_.at(config_.default_model).get();
}

Scheduler::~Scheduler() = default;

void Scheduler::on_start(Context& ctx) {
  // The executor says how many KV pages it has; nothing is planned before it answers.
  ctx.send(config_.executor, ExecutorQuery{false});
  ctx.set_timer(kWatchdogTimer, kWatchdogInterval, true);
}

void Scheduler::on_message(Context& ctx, Message& message) {
  if (const auto* submit = message.as<Submit>()) {
    on_submit(ctx, message, *submit);
  } else if (const auto* abort = message.as<Abort>()) {
    on_abort(ctx, message, *abort);
  } else if (const auto* result = message.as<StepResult>()) {
    on_step_result(ctx, *result);
  } else if (const auto* report = message.as<ExecutorReport>()) {
    on_executor_report(ctx, *report);
  } else if (const auto* query = message.as<StatusQuery>()) {
    on_status(ctx, message, *query);
  } else if (const auto* loaded = message.as<ModelLoaded>()) {
    on_model_loaded(ctx, *loaded);
  } else if (const auto* unloaded = message.as<ModelUnloaded>()) {
    on_model_unloaded(ctx, *unloaded);
  } else if (const auto* answer = message.as<LoadAnswer>()) {
    on_load_answer(ctx, *answer);
  } else if (const auto* abort_model = message.as<AbortModel>()) {
    on_abort_model(ctx, *abort_model);
  } else if (const auto* cached = message.as<CachedPrefix>()) {
    on_cached_prefix(ctx, message, *cached);
  } else if (message.as<Timer>() != nullptr) {
    on_timer(ctx);
  } else if (const auto* error = message.as<Error>()) {
    spdlog::warn("{}: {} answered an error: {}", ctx.self(), message.envelope.from, error->message);
  }
}

void Scheduler::on_stop(Context& ctx) {
  // Whatever is still open ends now, so every front end gets its final events.
  std::vector<std::uint64_t> open;
  for (const auto& [sequence, request] : requests_) open.push_back(sequence);
  for (std::uint64_t sequence : open) {
    end_request(ctx, sequence, FinishReason::abort, RequestError::none, "the scheduler stopped");
  }
  // The prefix pages on the GPU would go with the process: the most recent go to the cache-writer,
  // which stops after the executor and keeps them on SSD. The executor takes this plan before its
  // own Stop, as it takes every message queued before it.
  if (config_.cache_writer.empty() || config_.stop_spill_bytes == 0) return;
  for (auto& [name, model] : models_) {
    if (!model->served() || model->page_bytes == 0) continue;
    StepPlan plan;
    plan.step = next_step_++;
    plan.model = name;
    plan.model_key = model->key;
    for (EvictedPage& page : model->pages->cached_pages(config_.stop_spill_bytes / model->page_bytes)) {
      plan.spill.push_back({page.page, std::move(page.id)});
    }
    if (plan.spill.empty()) continue;
    spdlog::info("{}: stopping: {} prefix pages of model {} go to the cache-writer", ctx.self(), plan.spill.size(), name);
    ctx.send(config_.executor, std::move(plan));
  }
}

std::optional<std::string> Scheduler::prompt_for(const ServedModel& m, const Submit& submit,
                                                 std::vector<std::int32_t>& prompt) const {
  switch (static_cast<PromptKind>(submit.prompt_kind)) {
    case PromptKind::text:
      prompt = m.tokenizer->encode(submit.text, {true, false});
      return std::nullopt;
    case PromptKind::tokens:
      for (std::size_t i = 0; i < submit.tokens.size(); ++i) {
        if (submit.tokens[i] < 0 || static_cast<std::uint32_t>(submit.tokens[i]) >= m.n_vocab) {
          return fmt::format("tokens[{}] = {} is not a token id of {} (0 to {})", i, submit.tokens[i], m.name,
                             m.n_vocab - 1);
        }
      }
      prompt = submit.tokens;
      return std::nullopt;
    case PromptKind::chat: {
      if (!m.chat) return "model " + m.name + " has no chat template it recognises: send a prompt instead";
      std::vector<model::ChatMessage> turns;
      for (const auto& t : submit.chat) turns.push_back({t.role, t.content});
      auto rendered = model::render_chat(*m.chat, turns, true);
      if (auto* e = std::get_if<model::ChatTemplateError>(&rendered)) return "messages: " + e->message;
      // The template writes the special tokens as text; BOS is added where the model wants it,
      // unless the template wrote it already.
      prompt = m.tokenizer->encode(std::get<std::string>(rendered), {false, true});
      if (m.vocabulary.add_bos && m.tokenizer->bos() >= 0 && (prompt.empty() || prompt[0] != m.tokenizer->bos())) {
        prompt.insert(prompt.begin(), m.tokenizer->bos());
      }
      return std::nullopt;
    }
  }
  return "unknown prompt kind";
}

void Scheduler::on_submit(Context& ctx, const Message& message, const Submit& submit) {
  const auto client_key = std::make_pair(message.envelope.from, message.envelope.request_id);
  auto fail_now = [&](RequestError error, std::string text) {
    FinalEvent final;
    final.finish = static_cast<std::uint8_t>(FinishReason::error);
    final.error = static_cast<std::uint16_t>(error);
    final.message = std::move(text);
    ctx.send(message.envelope.from, final, {0, message.envelope.request_id, {}});
    ++finished_;
  };
  // A request id already open from that front end cannot be told apart from it: refused
  // without touching the open one.
  if (by_client_.contains(client_key)) {
    fail_now(RequestError::invalid_request, fmt::format("request id {} is already open", client_key.second));
    return;
  }

  ServedModel* chosen = default_model_;
  if (!submit.model.empty()) {
    auto alias = config_.aliases.find(submit.model);
    auto it = models_.find(alias != config_.aliases.end() ? alias->second : submit.model);
    chosen = it == models_.end() ? nullptr : it->second.get();
  }
  auto request = std::make_unique<Request>();
  Request& r = *request;
  r.model = chosen;
  r.front = message.envelope.from;
  r.client_request = message.envelope.request_id;
  r.sequence = next_sequence_++;
  r.submitted_ns = ctx.now_ns();
  r.sampling = submit.sampling;
  requests_.emplace(r.sequence, std::move(request));
  by_client_.emplace(client_key, r.sequence);

  if (chosen == nullptr) {
    std::vector<std::string> names;
    for (const auto& [name, model] : models_) names.push_back(name);
    for (const auto& [alias, id] : config_.aliases) names.push_back(alias + " (" + id + ")");
    end_request(ctx, r.sequence, FinishReason::error, RequestError::unknown_model,
                fmt::format("no model named '{}' here (this server has: {})", submit.model, fmt::join(names, ", ")));
    return;
  }
  ServedModel& m = *chosen;
  usage_changed(ctx, m, +1);
  if (waiting_.size() >= config_.max_waiting) {
    end_request(ctx, r.sequence, FinishReason::error, RequestError::busy,
                fmt::format("{} requests are waiting already: try again later", waiting_.size()));
    return;
  }
  std::vector<std::int32_t> prompt;
  if (auto why = prompt_for(m, submit, prompt)) {
    end_request(ctx, r.sequence, FinishReason::error, RequestError::invalid_request, *why);
    return;
  }
  if (prompt.empty()) {
    end_request(ctx, r.sequence, FinishReason::error, RequestError::invalid_request, "the prompt is empty");
    return;
  }
  const std::uint64_t longest = std::min<std::uint64_t>(
      m.n_ctx > 0 ? m.n_ctx : UINT32_MAX, m.kv_capacity_tokens > 0 ? m.kv_capacity_tokens : UINT32_MAX);
  if (prompt.size() + static_cast<std::uint64_t>(std::max(1, submit.sampling.max_tokens)) > longest) {
    end_request(ctx, r.sequence, FinishReason::error, RequestError::prompt_too_long,
                fmt::format("{} prompt tokens and max_tokens {} exceed the {} tokens a sequence may have here",
                            prompt.size(), submit.sampling.max_tokens, longest));
    return;
  }
  model::SamplingLimits limits{static_cast<std::int32_t>(m.n_vocab),
                               static_cast<std::int32_t>(longest - prompt.size())};
  if (auto error = model::validate(submit.sampling, limits)) {
    end_request(ctx, r.sequence, FinishReason::error, RequestError::invalid_request,
                error->field + ": " + error->message);
    return;
  }
  r.history = std::move(prompt);
  r.prompt_tokens = static_cast<std::uint32_t>(r.history.size());
  r.decoder.emplace(*m.tokenizer, model::DecodeOptions{false, false});
  r.stops.emplace(model::StopMatcher::for_request(r.sampling, m.stop_tokens));
  waiting_.push_back(r.sequence);
  // A model that is not loaded is asked for; the request waits for it (or for the answer that
  // it cannot be loaded).
  if (m.state == ModelState::unloaded) request_load(ctx, m);
  schedule(ctx);
}

void Scheduler::on_abort(Context& ctx, const Message& message, const Abort& abort) {
  auto it = by_client_.find({message.envelope.from, message.envelope.request_id});
  if (it == by_client_.end()) return;  // already ended: its final event is on its way
  pending_aborts_.emplace_back(it->second, static_cast<AbortReason>(abort.reason));
  if (in_flight_.empty()) {
    apply_pending_aborts(ctx);
    schedule(ctx);
  }
}

void Scheduler::apply_pending_aborts(Context& ctx) {
  auto aborts = std::move(pending_aborts_);
  pending_aborts_.clear();
  for (const auto& [sequence, reason] : aborts) {
    if (!requests_.contains(sequence)) continue;
    const char* why = reason == AbortReason::client_gone ? "the client disconnected"
                      : reason == AbortReason::shutdown  ? "the server is shutting down"
                                                         : "aborted by the client";
    end_request(ctx, sequence, FinishReason::abort, RequestError::none, why);
  }
}

void Scheduler::on_executor_report(Context& ctx, const ExecutorReport& report) {
  executor_slots_ = report.slots;
  pool_ = report.pool;
  if (!executor_ready_) {
    // The models the executor loaded at its start; the rest load through the enforcer.
    for (const ModelInfo& info : report.models) {
      auto it = models_.find(info.name);
      if (it == models_.end()) {
        spdlog::warn("{}: the executor has model '{}', which this scheduler is not configured for", ctx.self(),
                     info.name);
        continue;
      }
      serve_model(*it->second, info);
    }
    executor_ready_ = true;
    spdlog::info("{}: executor ready on {} with {} of {} models loaded", ctx.self(), report.device,
                 report.models.size(), models_.size());
    for (auto& [name, model] : models_) {
      const bool wanted = std::any_of(waiting_.begin(), waiting_.end(),
                                      [&](std::uint64_t seq) { return requests_.at(seq)->model == model.get(); });
      if (wanted && model->state == ModelState::unloaded) request_load(ctx, *model);
    }
  }
  answer_status(ctx);
  schedule(ctx);
}

// ---- the model pool -------------------------------------------------------------------------

void Scheduler::serve_model(ServedModel& m, const ModelInfo& info) {
  if (info.kv_pages == 0 || info.page_size == 0) {
    spdlog::error("scheduler: the executor has no KV pages for model '{}'", m.name);
    return;
  }
  if (!m.pages) {
    m.pages.emplace(info.kv_pages, info.page_size);
    m.pages->record_evictions(!config_.cache_writer.empty() && info.page_bytes > 0);
  }
  m.page_bytes = info.page_bytes;
  m.kv_capacity_tokens = info.kv_pages * info.page_size;
  if (info.n_ctx > 0) m.n_ctx = m.n_ctx > 0 ? std::min(m.n_ctx, info.n_ctx) : info.n_ctx;
  m.state = ModelState::loaded;
  m.load_requested = false;
  spdlog::info("scheduler: serving model {}: {} KV pages of {} tokens", m.name, info.kv_pages, info.page_size);
}

void Scheduler::request_load(Context& ctx, ServedModel& m) {
  if (m.load_requested) return;
  if (config_.enforcer.empty()) {
    fail_waiting(ctx, m, RequestError::unavailable,
                 "model " + m.name + " is not loaded and this server loads no models on demand");
    return;
  }
  if (const SendStatus sent = ctx.send(config_.enforcer, LoadRequest{m.name}); sent != SendStatus::sent) {
    fail_waiting(ctx, m, RequestError::busy,
                 sent == SendStatus::unknown_actor ? "no memory enforcer is configured to load " + m.name
                                                   : "the memory enforcer is busy: try again later");
    return;
  }
  m.load_requested = true;
  m.state = ModelState::loading;
}

// Ends every waiting request of the model (none of them has pages or executor state).
void Scheduler::fail_waiting(Context& ctx, ServedModel& m, RequestError error, const std::string& why) {
  std::vector<std::uint64_t> theirs;
  for (std::uint64_t seq : waiting_) {
    if (requests_.at(seq)->model == &m) theirs.push_back(seq);
  }
  for (std::uint64_t seq : theirs) end_request(ctx, seq, FinishReason::error, error, why);
}

void Scheduler::on_model_loaded(Context& ctx, const ModelLoaded& loaded) {
  auto it = models_.find(loaded.model);
  if (it == models_.end()) return;
  ServedModel& m = *it->second;
  if (!loaded.ok) {
    m.state = ModelState::unloaded;
    m.load_requested = false;
    fail_waiting(ctx, m, RequestError::model_failed, "model " + m.name + " could not be loaded: " + loaded.error);
    return;
  }
  serve_model(m, loaded.info);
  schedule(ctx);
}

void Scheduler::on_load_answer(Context& ctx, const LoadAnswer& answer) {
  auto it = models_.find(answer.model);
  if (it == models_.end()) return;
  ServedModel& m = *it->second;
  m.load_requested = false;
  const auto outcome = static_cast<LoadOutcome>(answer.outcome);
  if (outcome == LoadOutcome::loaded) {
    schedule(ctx);  // its ModelLoaded came first and made it servable
    return;
  }
  if (m.state == ModelState::loading) m.state = ModelState::unloaded;
  RequestError error = RequestError::model_failed;
  std::string why = "model " + m.name + " cannot be loaded: " + answer.message;
  if (outcome == LoadOutcome::insufficient_memory) {
    error = RequestError::insufficient_memory;
    why = fmt::format("model {} does not fit in memory: it needs {} bytes, {} of the ceiling's {} are available "
                      "(pinned: {})",
                      m.name, answer.needed_bytes, answer.available_bytes, answer.ceiling_bytes,
                      answer.pinned.empty() ? std::string("none") : fmt::format("{}", fmt::join(answer.pinned, ", ")));
  } else if (outcome == LoadOutcome::unknown_model) {
    error = RequestError::unknown_model;
  } else if (outcome == LoadOutcome::shutting_down) {
    error = RequestError::shutting_down;
  }
  fail_waiting(ctx, m, error, why);
}

// The enforcer unloads the model: every request of it ends now, nothing more of it is planned, and
// ModelDrained answers once no step of it is in flight (the executor may then free it).
void Scheduler::on_abort_model(Context& ctx, const AbortModel& abort) {
  auto it = models_.find(abort.model);
  if (it == models_.end()) {
    // Nothing of it here: drained already.
    ctx.send(config_.enforcer.empty() ? std::string("enforcer") : config_.enforcer, ModelDrained{abort.model, 0});
    return;
  }
  ServedModel& m = *it->second;
  m.state = ModelState::draining;
  std::vector<std::uint64_t> theirs;
  for (const auto& [seq, request] : requests_) {
    if (request->model == &m) theirs.push_back(seq);
  }
  for (std::uint64_t seq : theirs) {
    end_request(ctx, seq, FinishReason::abort, RequestError::none,
                abort.reason.empty() ? "model " + m.name + " was unloaded" : abort.reason);
  }
  m.drain_pending = true;
  drained_counts_[m.name] += static_cast<std::uint32_t>(theirs.size());
  answer_drained(ctx);
}

// ModelDrained for every draining model no step in flight still computes.
void Scheduler::answer_drained(Context& ctx) {
  for (auto& [name, model] : models_) {
    if (!model->drain_pending) continue;
    if (in_flight_for(name)) continue;
    model->drain_pending = false;
    ctx.send(config_.enforcer.empty() ? std::string("enforcer") : config_.enforcer,
             ModelDrained{name, drained_counts_[name]});
    drained_counts_.erase(name);
  }
}

void Scheduler::on_model_unloaded(Context& ctx, const ModelUnloaded& unloaded) {
  auto it = models_.find(unloaded.model);
  if (it == models_.end()) return;
  ServedModel& m = *it->second;
  m.pages.reset();
  m.kv_capacity_tokens = 0;
  m.state = ModelState::unloaded;
  m.load_requested = false;
  // Requests that came for it while it drained load it again.
  const bool wanted = std::any_of(waiting_.begin(), waiting_.end(),
                                  [&](std::uint64_t seq) { return requests_.at(seq)->model == &m; });
  if (wanted) request_load(ctx, m);
}

// The enforcer learns which models are idle from these: sent when a model's open requests go from
// none to some or back.
void Scheduler::usage_changed(Context& ctx, ServedModel& m, int delta) {
  const std::uint32_t before = m.open_requests;
  m.open_requests = static_cast<std::uint32_t>(static_cast<int>(m.open_requests) + delta);
  if (config_.enforcer.empty() || (before > 0) == (m.open_requests > 0)) return;
  ctx.send(config_.enforcer, ModelUsage{m.name, m.open_requests, ctx.now_ns()});
}

// ---- the prefix cache beyond the GPU -----------------------------------------------------------

// Asks the cache-writer for the full pages of the prompt past those the GPU holds; the request
// waits for the answer (or lookup_timeout_ms) before its first admission.
void Scheduler::start_lookup(Context& ctx, Request& r) {
  r.lookup = Request::Lookup::done;
  ServedModel& m = *r.model;
  if (config_.cache_writer.empty() || m.page_bytes == 0 || r.admitted_once || !m.pages) return;
  const std::vector<std::uint64_t> keys = m.pages->prefix_keys(m.key, r.history);
  const std::size_t held = m.pages->held_prefix(keys);
  if (held == keys.size()) return;
  PrefixLookup lookup{m.name, m.key, m.pages->page_size(), m.page_bytes, {}};
  const std::size_t asked = std::min<std::size_t>(keys.size() - held, kMaxPrefixPages);
  lookup.keys.assign(keys.begin() + static_cast<std::ptrdiff_t>(held),
                     keys.begin() + static_cast<std::ptrdiff_t>(held + asked));
  if (ctx.send(config_.cache_writer, std::move(lookup), {r.sequence, 0, {}}) != SendStatus::sent) return;
  r.lookup = Request::Lookup::pending;
  r.lookup_sent_ns = ctx.now_ns();
  r.restore_from = static_cast<std::uint32_t>(held);
}

void Scheduler::on_cached_prefix(Context& ctx, Message& message, const CachedPrefix& cached) {
  auto it = requests_.find(message.envelope.correlation_id);
  if (it == requests_.end() || it->second->lookup != Request::Lookup::pending) return;  // ended, or given up on
  Request& r = *it->second;
  r.lookup = Request::Lookup::done;
  if (cached.pages.size() >= 64) {
    spdlog::info("{}: {} prefix pages came back from the cache-writer {:.1f} ms after the lookup", ctx.self(),
                 cached.pages.size(), static_cast<double>(ctx.now_ns() - r.lookup_sent_ns) / 1e6);
  }
  if (message.blobs.size() == cached.pages.size() && cached.model == r.model->name) {
    r.restore_ids = cached.pages;
    r.restore_tiers = cached.tiers;
    r.restore_blobs = std::move(message.blobs);
  } else {
    spdlog::warn("{}: a CachedPrefix for model {} with {} pages and {} blobs: ignored", ctx.self(), cached.model,
                 cached.pages.size(), message.blobs.size());
  }
  schedule(ctx);
}

// Adds to the sequence (just begun with `reused` tokens from the GPU's prefix cache) the pages the
// cache-writer sent that continue it, and to the plan their restores. Returns the tokens they hold.
std::uint32_t Scheduler::restore_prefix(Request& r, std::uint32_t reused, StepPlan& plan, Frames& blobs) {
  ServedModel& m = *r.model;
  const std::uint32_t page_size = m.pages->page_size();
  const std::uint32_t held = reused / page_size;
  std::uint32_t restored = 0;
  // The GPU may have gained pages since the lookup (another prompt computed them) or lost some
  // (then the answer no longer continues what it has, and is let go).
  for (std::size_t i = held >= r.restore_from ? held - r.restore_from : r.restore_ids.size(); i < r.restore_ids.size();
       ++i) {
    const std::size_t first = (r.restore_from + i) * page_size;
    if (first + page_size >= r.history.size() || r.restore_blobs[i].size() != m.page_bytes) break;
    std::optional<std::uint32_t> page =
        m.pages->adopt(r.sequence, r.restore_ids[i], std::span<const std::int32_t>(r.history).subspan(first, page_size));
    collect_spills(m, plan, blobs);  // what made room for it is copied out before it is written
    if (!page) break;
    plan.restore.push_back(*page);
    blobs.push_back(std::move(r.restore_blobs[i]));
    (static_cast<CacheTier>(r.restore_tiers[i]) == CacheTier::ssd ? restored_ssd_tokens_ : restored_hot_tokens_) +=
        page_size;
    restored += page_size;
  }
  r.restore_ids.clear();
  r.restore_blobs.clear();
  r.restore_tiers.clear();
  return restored;
}

// The prefix pages the plan's page needs gave to other contents go to the cache-writer, copied out
// by the executor before the step writes them. A page restored earlier in this same plan has not
// been written yet (and the cache-writer still has it): its restore is dropped instead.
void Scheduler::collect_spills(ServedModel& m, StepPlan& plan, Frames& blobs) {
  for (EvictedPage& evicted : m.pages->take_evicted()) {
    auto restore = std::find(plan.restore.begin(), plan.restore.end(), evicted.page);
    if (restore != plan.restore.end()) {
      blobs.erase(blobs.begin() + (restore - plan.restore.begin()));
      plan.restore.erase(restore);
      continue;
    }
    plan.spill.push_back({evicted.page, std::move(evicted.id)});
    ++spilled_pages_;
  }
}

// ---- planning -------------------------------------------------------------------------------

void Scheduler::preempt(Request& r) {
  r.model->pages->release(r.sequence);
  r.computed = 0;
  r.planned = 0;
  ++r.epoch;
  r.running = false;
  std::erase(running_, r.sequence);
  waiting_.push_front(r.sequence);
  ++preemptions_;
}

// Adds up to `budget` of the request's uncomputed tokens to the plan, taking the pages they need
// (when there are none and may_preempt, the newest running sequences give theirs). False when it
// could not.
bool Scheduler::plan_sequence(Request& r, std::uint32_t budget, bool may_preempt, StepPlan& plan) {
  const auto total = static_cast<std::uint32_t>(r.history.size());
  // Every known token planned: the next is the one a step in flight samples (see may_follow).
  const bool follows = r.planned == total;
  const std::uint32_t n = follows ? 1 : std::min(total - r.planned, budget);
  if (n == 0) return false;
  KvPageTable& pages = *r.model->pages;
  while (!pages.reserve(r.sequence, r.planned + n)) {
    // The newest running sequence gives way; if that is this one, it waits.
    if (!may_preempt || running_.empty()) return false;
    // Of this model: another model's pages are no use to it.
    auto newest_it = std::find_if(running_.rbegin(), running_.rend(),
                                  [&](std::uint64_t seq) { return requests_.at(seq)->model == r.model; });
    if (newest_it == running_.rend()) return false;
    Request& newest = *requests_.at(*newest_it);
    if (&newest == &r) return false;
    preempt(newest);
    // Its tokens may already be in this plan: take them out again.
    std::erase_if(plan.sequences, [&](const PlanSequence& s) { return s.sequence == newest.sequence; });
  }
  PlanSequence s;
  s.sequence = r.sequence;
  s.position = r.planned;
  if (follows) {
    s.tokens.assign(1, 0);
  } else {
    s.tokens.assign(r.history.begin() + r.planned, r.history.begin() + r.planned + n);
  }
  s.block_table = pages.block_table(r.sequence);
  s.output = follows || r.planned + n == total;
  s.follows = follows;
  r.planned += n;
  plan.sequences.push_back(std::move(s));
  return true;
}

// Whether a running request whose every known token is planned may decode the token a step in
// flight samples for it: not if that token may be its last (max_tokens, the model's context); a
// stop string or end token it brings is found only when it comes, and the follower's step is
// then wasted (its answer for an ended request is dropped).
bool Scheduler::may_follow(const Request& r) const {
  if (!config_.overlap || r.pending == 0 || r.planned != r.history.size()) return false;
  if (r.generated() + r.pending >= static_cast<std::uint32_t>(std::max(r.sampling.max_tokens, 1))) return false;
  return r.model->n_ctx == 0 || r.history.size() + r.pending < r.model->n_ctx;
}

bool Scheduler::in_flight_for(const std::string& model) const {
  return std::any_of(in_flight_.begin(), in_flight_.end(), [&](const InFlight& f) { return f.plan.model == model; });
}

// The model the next step is for: of the servable models with work, the first after the last
// one stepped (so two busy models take turns, step by step); nullptr when none has work.
Scheduler::ServedModel* Scheduler::next_model_to_step() {
  std::vector<ServedModel*> busy;
  for (auto& [name, model] : models_) {
    if (!model->served()) continue;
    const bool has_work = std::any_of(running_.begin(), running_.end(),
                                      [&](std::uint64_t seq) { return requests_.at(seq)->model == model.get(); }) ||
                          std::any_of(waiting_.begin(), waiting_.end(),
                                      [&](std::uint64_t seq) { return requests_.at(seq)->model == model.get(); });
    if (has_work) busy.push_back(model.get());
  }
  if (busy.empty()) return nullptr;
  for (ServedModel* model : busy) {
    if (model->name > last_stepped_) return model;
  }
  return busy.front();
}

void Scheduler::schedule(Context& ctx) {
  const std::size_t depth = config_.overlap ? 2 : 1;
  while (executor_ready_ && in_flight_.size() < depth && plan_step(ctx)) {
  }
}

// Plans one step and sends it; false when there was nothing to send.
bool Scheduler::plan_step(Context& ctx) {
  ServedModel* chosen = next_model_to_step();
  StepPlan plan;
  Frames restore_blobs;  // one per plan.restore page
  std::uint32_t budget = config_.token_budget;
  if (chosen != nullptr) {
    ServedModel& m = *chosen;
    plan.model = m.name;
    plan.model_key = m.key;
    // Running sequences first, oldest first: each decodes a token or continues its prompt.
    for (std::size_t i = 0; i < running_.size() && budget > 0; ++i) {
      Request& r = *requests_.at(running_[i]);
      if (r.model != &m) continue;
      if (!r.running) continue;  // preempted by an older one's page needs during this plan
      if (r.planned == r.history.size() && !may_follow(r)) continue;  // its next token is not planned yet
      const bool planned = plan_sequence(r, budget, true, plan);
      collect_spills(m, plan, restore_blobs);
      if (!planned) {
        if (!r.running) break;
        preempt(r);  // no pages even after every newer one gave way
        break;
      }
      budget -= static_cast<std::uint32_t>(plan.sequences.back().tokens.size());
    }
    // Then waiting ones, first come first served, while budget and the sequence limit allow.
    for (auto it = waiting_.begin(); it != waiting_.end() && budget > 0 && running_.size() < config_.max_sequences;) {
      Request& r = *requests_.at(*it);
      if (r.model != &m || r.pending > 0) {  // (preempted while a step samples for it: it waits for the token)
        ++it;
        continue;
      }
      const auto longest =
          static_cast<std::uint64_t>(r.prompt_tokens) + static_cast<std::uint64_t>(r.sampling.max_tokens);
      if (longest > m.kv_capacity_tokens) {
        it = waiting_.erase(it);
        end_request(ctx, r.sequence, FinishReason::error, RequestError::prompt_too_long,
                    fmt::format("{} prompt tokens and max_tokens {} do not fit in the KV cache's {} tokens",
                                r.prompt_tokens, r.sampling.max_tokens, m.kv_capacity_tokens));
        continue;
      }
      // Before its first admission, a prompt asks the cache-writer for the pages the GPU lacks;
      // the ones after it may go meanwhile.
      if (r.lookup == Request::Lookup::none) start_lookup(ctx, r);
      if (r.lookup == Request::Lookup::pending) {
        ++it;
        continue;
      }
      // Waiting sequences hold no pages (preemption and a failed admission release them), so
      // each admission starts from the prefix cache.
      const std::uint32_t reused = m.pages->begin(r.sequence, m.key, r.history);
      const std::uint32_t restored = restore_prefix(r, reused, plan, restore_blobs);
      r.computed = reused + restored;
      r.planned = r.computed;
      // A waiting sequence never preempts a running one: it waits for pages instead.
      const bool planned = plan_sequence(r, budget, false, plan);
      collect_spills(m, plan, restore_blobs);
      if (!planned) {
        // Gives back the prefix pages it took, until its turn; restored ones stay in the GPU's
        // prefix cache (the plan still restores them).
        m.pages->release(r.sequence);
        r.computed = 0;
        r.planned = 0;
        break;
      }
      prefix_hit_tokens_ += reused;
      it = waiting_.erase(it);
      r.running = true;
      running_.push_back(r.sequence);
      if (!r.admitted_once) {
        r.admitted_once = true;
        r.scheduled_ns = ctx.now_ns();
        r.cached_tokens = std::min(reused + restored, r.prompt_tokens);
      }
      if (!r.executor_has_it) {
        plan.starts.push_back({r.sequence, r.sampling, {r.history.begin(), r.history.begin() + r.prompt_tokens}});
        r.executor_has_it = true;
      }
      budget -= static_cast<std::uint32_t>(plan.sequences.back().tokens.size());
    }
  }

  const bool moves_pages = !plan.spill.empty() || !plan.restore.empty();
  if (plan.sequences.empty() && to_release_.empty() && !moves_pages) return false;
  if (plan.sequences.empty() && !moves_pages) plan.model.clear();  // only releases: for no model in particular
  if (!plan.model.empty()) last_stepped_ = plan.model;
  plan.step = next_step_++;
  plan.released = std::move(to_release_);
  to_release_.clear();
  InFlight sent;
  for (const auto& s : plan.sequences) {
    computed_tokens_ += s.tokens.size();
    Request& r = *requests_.at(s.sequence);
    sent.epochs.push_back(r.epoch);
    if (s.output) ++r.pending;
  }
  ctx.send(config_.executor, plan, {0, 0, std::move(restore_blobs)});
  sent.plan = std::move(plan);
  sent.since_ns = ctx.now_ns();
  in_flight_.push_back(std::move(sent));
  return true;
}

// ---- results --------------------------------------------------------------------------------

void Scheduler::on_step_result(Context& ctx, const StepResult& result) {
  if (in_flight_.empty() || result.step != in_flight_.front().plan.step) {
    spdlog::warn("{}: a result for step {} that is not the oldest in flight: ignored", ctx.self(), result.step);
    return;
  }
  const InFlight step = std::move(in_flight_.front());
  in_flight_.pop_front();
  const StepPlan& plan = step.plan;
  executor_slots_ = result.slots;
  if (result.has_pool) pool_ = result.pool;
  if (!plan.sequences.empty()) {
    ++steps_;
    log_step_times(ctx, step, result);
  }
  for (const auto& s : plan.sequences) {
    if (auto it = requests_.find(s.sequence); it != requests_.end() && s.output) --it->second->pending;
  }

  apply_pending_aborts(ctx);
  if (step.void_) {
    // Computed on a KV cache that is gone: nothing of it counts. A failed step took its
    // sequences' samplers with it.
    if (result.error != 0) {
      for (const auto& s : plan.sequences) {
        if (auto it = requests_.find(s.sequence); it != requests_.end()) it->second->executor_has_it = false;
      }
    }
  } else if (result.error != 0) {
    spdlog::warn("{}: step {} failed: {}", ctx.self(), result.step, result.message);
    for (const auto& s : plan.sequences) {
      if (auto it = requests_.find(s.sequence); it != requests_.end()) {
        it->second->executor_has_it = false;  // the executor dropped the state of the step's sequences
        end_request(ctx, s.sequence, FinishReason::error, static_cast<RequestError>(result.error),
                    "the step computing this request failed: " + result.message);
      }
    }
    // Pages the plan restored may not hold what their keys say.
    if (auto it = models_.find(plan.model); it != models_.end() && it->second->pages) {
      for (std::uint32_t page : plan.restore) it->second->pages->forget(page);
    }
    if (result.kv_lost) {
      // Nothing computed survives: every running sequence starts over, and no page is shared; the
      // plan in flight behind this one computes on the lost cache.
      for (InFlight& later : in_flight_) later.void_ = true;
      for (std::uint64_t sequence : std::vector<std::uint64_t>(running_)) preempt(*requests_.at(sequence));
      for (auto& [name, model] : models_) {
        if (!model->pages) continue;
        const auto stats = model->pages->stats();
        const std::uint32_t page_size = model->pages->page_size();
        model->pages.emplace(stats.total, page_size);
        model->pages->record_evictions(!config_.cache_writer.empty() && model->page_bytes > 0);
      }
    }
  } else {
    for (std::size_t i = 0; i < plan.sequences.size(); ++i) {
      const PlanSequence& s = plan.sequences[i];
      auto it = requests_.find(s.sequence);
      if (it == requests_.end()) continue;  // ended while the step ran
      Request& r = *it->second;
      // Preempted since: its pages went (its sampled token still stands: that cache was whole
      // while the step ran).
      if (r.epoch != step.epochs[i]) continue;
      r.computed = s.position + static_cast<std::uint32_t>(s.tokens.size());
      r.model->pages->computed(r.sequence, std::span<const std::int32_t>(r.history.data(), r.computed));
    }
    for (const auto& output : result.tokens) {
      auto it = requests_.find(output.sequence);
      if (it == requests_.end()) continue;
      deliver_token(ctx, *it->second, output);
    }
  }
  answer_drained(ctx);
  schedule(ctx);
  step_times_.handling_ns += monotonic_ns() - ctx.now_ns();
}

void Scheduler::log_step_times(Context& ctx, const InFlight& step, const StepResult& result) {
  constexpr std::uint64_t every = 500;
  StepTimes& t = step_times_;
  ++t.steps;
  t.sequences += step.plan.sequences.size();
  t.round_ns += ctx.now_ns() - step.since_ns;
  t.executor_ns += result.gpu_ns;
  if (t.steps < every) return;
  const double ms = 1e6 * static_cast<double>(t.steps);
  spdlog::info(
      "{}: {} steps of {:.1f} sequences: {:.2f} ms a step from plan to result, the executor {:.2f} ms of it; "
      "{:.3f} ms handling a result (its tokens and the next plan)",
      ctx.self(), t.steps, static_cast<double>(t.sequences) / static_cast<double>(t.steps),
      static_cast<double>(t.round_ns) / ms, static_cast<double>(t.executor_ns) / ms,
      static_cast<double>(t.handling_ns) / ms);
  t = {};
}

void Scheduler::deliver_token(Context& ctx, Request& r, const OutputToken& output) {
  if (r.first_token_ns == 0) r.first_token_ns = ctx.now_ns();
  r.history.push_back(output.token);
  const model::Tokenizer& tokenizer = *r.model->tokenizer;
  std::string text = tokenizer.ends_generation(output.token) ? std::string{} : r.decoder->push(output.token);
  model::StopStep step = r.stops->push(output.token, text);
  TokenEvent event;
  event.tokens = {output.token};
  event.text = std::move(step.text);
  if (output.has_logprobs) event.logprobs.push_back(with_token_texts(tokenizer, output.logprobs));
  ctx.send(r.front, event, {0, r.client_request, {}});
  if (step.finish) {
    end_request(ctx, r.sequence, *step.finish == model::FinishReason::stop ? FinishReason::stop : FinishReason::length,
                RequestError::none, {}, step.stop_string);
  } else if (r.model->n_ctx > 0 && r.history.size() >= r.model->n_ctx) {
    end_request(ctx, r.sequence, FinishReason::length, RequestError::none, "the model's context is full");
  }
}

// The one way a request ends.
void Scheduler::end_request(Context& ctx, std::uint64_t sequence, FinishReason finish, RequestError error,
                            std::string message, std::string stop) {
  auto it = requests_.find(sequence);
  if (it == requests_.end()) return;
  Request& r = *it->second;
  std::erase(waiting_, sequence);
  std::erase(running_, sequence);
  if (r.model != nullptr) {
    if (r.model->pages) r.model->pages->release(sequence);
    usage_changed(ctx, *r.model, -1);
  }
  if (r.executor_has_it) to_release_.push_back(sequence);

  FinalEvent final;
  final.finish = static_cast<std::uint8_t>(finish);
  final.error = static_cast<std::uint16_t>(error);
  final.message = std::move(message);
  final.stop = std::move(stop);
  // Text held back (a stop string's possible start, a character's first bytes) is the client's
  // unless a stop string ended the request, in which case the matcher has dropped it already.
  if (r.stops && !r.stops->finished()) {
    final.text = (r.decoder ? r.decoder->finish() : std::string{});
    final.text = r.stops->release() + final.text;
  }
  final.prompt_tokens = r.prompt_tokens;
  final.completion_tokens = r.history.empty() ? 0 : r.generated();
  final.cached_tokens = r.cached_tokens;
  final.queue_ns = elapsed(r.submitted_ns, r.scheduled_ns);
  final.ttft_ns = elapsed(r.submitted_ns, r.first_token_ns);
  final.total_ns = ctx.now_ns() - r.submitted_ns;
  ctx.send(r.front, final, {0, r.client_request, {}});

  by_client_.erase({r.front, r.client_request});
  requests_.erase(it);
  ++finished_;
}

// ---- status and the watchdog ----------------------------------------------------------------

void Scheduler::on_status(Context& ctx, const Message& message, const StatusQuery& query) {
  if (query.trim && executor_ready_) {
    // Answered when the executor has trimmed (its report follows any step already sent).
    status_waiters_.push_back({message.envelope.from, message.envelope.correlation_id});
    ctx.send(config_.executor, ExecutorQuery{true});
    return;
  }
  ctx.reply(message, status());
}

// Answers the status queries that waited for the executor's report (pool_ holds its figures).
void Scheduler::answer_status(Context& ctx) {
  for (const auto& waiter : status_waiters_) ctx.send(waiter.to, status(), {waiter.correlation_id, 0, {}});
  status_waiters_.clear();
}

StatusReport Scheduler::status() const {
  StatusReport s;
  for (const auto& [name, model] : models_) s.models.push_back(name);
  s.requests = static_cast<std::uint32_t>(requests_.size());
  s.waiting = static_cast<std::uint32_t>(waiting_.size());
  s.running = static_cast<std::uint32_t>(running_.size());
  s.steps = steps_;
  s.finished = finished_;
  s.preemptions = preemptions_;
  s.computed_tokens = computed_tokens_;
  s.prefix_hit_tokens = prefix_hit_tokens_;
  s.restored_hot_tokens = restored_hot_tokens_;
  s.restored_ssd_tokens = restored_ssd_tokens_;
  s.spilled_pages = spilled_pages_;
  for (const auto& [name, model] : models_) {
    if (!model->pages) continue;
    const PageTableStats p = model->pages->stats();
    s.kv_pages += p.total;
    s.kv_pages_in_use += p.in_use;
    s.kv_pages_cached += p.cached;
    s.kv_references += p.references;
  }
  s.executor_slots = executor_slots_;
  s.executor_ready = executor_ready_;
  s.pool = pool_;
  return s;
}

void Scheduler::on_timer(Context& ctx) {
  // A cache-writer that does not answer costs a prompt its restored prefix, never its request.
  bool lookups_given_up = false;
  for (auto& [sequence, request] : requests_) {
    if (request->lookup != Request::Lookup::pending) continue;
    if ((ctx.now_ns() - request->lookup_sent_ns) / 1'000'000 < config_.lookup_timeout_ms) continue;
    request->lookup = Request::Lookup::done;
    lookups_given_up = true;
  }
  if (lookups_given_up) {
    spdlog::warn("{}: the cache-writer did not answer prefix lookups within {} ms: computing those prompts",
                 ctx.self(), config_.lookup_timeout_ms);
    schedule(ctx);
  }
  if (in_flight_.empty()) return;
  const std::int64_t waited_ms = (ctx.now_ns() - in_flight_.front().since_ns) / 1'000'000;
  if (waited_ms < config_.step_timeout_ms) return;
  // The executor is gone or stuck: the requests of every plan in flight fail instead of hanging,
  // and nothing more is planned until it answers again.
  spdlog::error("{}: step {} unanswered for {} ms: failing its requests", ctx.self(), in_flight_.front().plan.step,
                waited_ms);
  const std::deque<InFlight> lost = std::exchange(in_flight_, {});
  executor_ready_ = false;
  for (const InFlight& f : lost) {
    for (const auto& s : f.plan.sequences) {
      end_request(ctx, s.sequence, FinishReason::error, RequestError::unavailable,
                  "the executor did not answer within " + std::to_string(config_.step_timeout_ms) + " ms");
    }
  }
  answer_drained(ctx);
  ctx.send(config_.executor, ExecutorQuery{false});
}

}  // namespace mqlm::actors
