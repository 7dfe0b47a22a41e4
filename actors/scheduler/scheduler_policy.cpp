#include "actors/scheduler/scheduler_policy.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "actors/scheduler/chat_output.hpp"
#include "actors/scheduler/scheduler_request.hpp"

namespace mqlm::actors {

using namespace messages;

namespace {

// A Tokenized answer's bytes per token at most (a msgpack integer), and what an answer may hold:
// under the payload limit of the front end's decoder (1 MiB), with room for the rest.
constexpr std::size_t kTokenizedBytesPerToken = 5;
constexpr std::size_t kMaxTokenizedBytes = 900'000;

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

// A chat's turns as the template takes them.
std::vector<model::ChatMessage> chat_messages(const std::vector<ChatTurn>& chat) {
  std::vector<model::ChatMessage> turns;
  turns.reserve(chat.size());
  for (const auto& t : chat) {
    std::vector<model::ChatToolCall> calls;
    for (const auto& call : t.tool_calls) calls.push_back({call.id, call.name, call.arguments});
    turns.push_back({t.role, t.content, std::move(calls), t.tool_call_id, t.name, t.has_content});
  }
  return turns;
}

}  // namespace

// A model by the name a front end gave: its id, an alias of one, or "" for the default.
ServedModel* SchedulerPolicy::model_named(const std::string& name) const {
  if (name.empty()) return default_model_;
  auto alias = config_.aliases.find(name);
  auto it = models_.find(alias != config_.aliases.end() ? alias->second : name);
  return it == models_.end() ? nullptr : it->second.get();
}

std::string SchedulerPolicy::unknown_model_message(const std::string& name) const {
  std::vector<std::string> names;
  for (const auto& [id, model] : models_) names.push_back(id);
  for (const auto& [alias, id] : config_.aliases) names.push_back(alias + " (" + id + ")");
  return fmt::format("no model named '{}' here (this server has: {})", name, fmt::join(names, ", "));
}

SchedulerPolicy::SchedulerPolicy(SchedulerConfig config) : config_(std::move(config)) {
  for (const auto& [name, path] : config_.models) {
    models_.emplace(name, read_served_model(name, path, config_.chat_template));
  }
  default_model_ = models_.at(config_.default_model).get();
}

SchedulerPolicy::~SchedulerPolicy() = default;

void SchedulerPolicy::start(PolicyOutput& out) { out.send(config_.executor, ExecutorQuery{false}, {}); }

void SchedulerPolicy::handle(PolicyOutput& out, Message& message, std::int64_t now_ns, const std::string& self) {
  Turn ctx(out, now_ns, self);
  if (const auto* submit = message.as<Submit>()) {
    on_submit(ctx, message, *submit);
  } else if (const auto* abort = message.as<Abort>()) {
    on_abort(ctx, message, *abort);
  } else if (const auto* result = message.as<StepResult>()) {
    on_step_result(ctx, *result, message.blobs);
  } else if (const auto* report = message.as<ExecutorReport>()) {
    on_executor_report(ctx, *report);
  } else if (const auto* query = message.as<StatusQuery>()) {
    on_status(ctx, message, *query);
  } else if (const auto* tokenize = message.as<Tokenize>()) {
    on_tokenize(ctx, message, *tokenize);
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
    spdlog::warn("{}: {} answered an error: {}", self, message.envelope.from, error->message);
  }
}

void SchedulerPolicy::stop(PolicyOutput& out, std::int64_t now_ns, const std::string& self) {
  Turn ctx(out, now_ns, self);
  // Whatever is still open ends now, so every front end gets its final events.
  std::vector<std::uint64_t> open;
  for (const auto& [sequence, request] : requests_) open.push_back(sequence);
  for (std::uint64_t sequence : open) {
    end_request(ctx, sequence, FinishReason::abort, RequestError::none, "the scheduler stopped");
  }
  spill_on_stop(ctx);
}

// The prefix pages on the GPU would go with the process: the most recent go to the cache-writer,
// which stops after the executor and keeps them on SSD. The executor takes this plan before its
// own Stop, as it takes every message queued before it.
void SchedulerPolicy::spill_on_stop(Turn& ctx) {
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

// The answer goes back by correlation id, whatever it says.
void SchedulerPolicy::on_tokenize(Turn& ctx, const Message& message, const Tokenize& question) const {
  ctx.send(message.envelope.from, tokenized(question), {message.envelope.correlation_id, 0, {}});
}

// With the model's tokenizer, which every configured model has from its file, loaded or not.
// An answer that would not fit a message's payload limit is refused instead.
Tokenized SchedulerPolicy::tokenized(const Tokenize& question) const {
  auto refuse = [](RequestError code, std::string why) {
    return Tokenized{static_cast<std::uint16_t>(code), std::move(why), {}, {}, {}};
  };
  const ServedModel* m = model_named(question.model);
  if (m == nullptr) return refuse(RequestError::unknown_model, unknown_model_message(question.model));
  Tokenized answer;
  if (question.detokenize) {
    for (std::size_t i = 0; i < question.tokens.size(); ++i) {
      if (question.tokens[i] < 0 || static_cast<std::uint32_t>(question.tokens[i]) >= m->n_vocab) {
        return refuse(RequestError::invalid_request, fmt::format("tokens[{}] = {} is not a token id of {} (0 to {})",
                                                                 i, question.tokens[i], m->name, m->n_vocab - 1));
      }
    }
    answer.text = m->tokenizer->decode(question.tokens, model::DecodeOptions{true, true});
    return answer;
  }
  answer.tokens = m->tokenizer->encode(question.text, {question.add_special, question.parse_special});
  std::size_t bytes = answer.tokens.size() * kTokenizedBytesPerToken;
  if (question.with_pieces) {
    for (std::int32_t token : answer.tokens) answer.pieces.push_back(token_piece(*m->tokenizer, token));
    for (const auto& piece : answer.pieces) bytes += piece.size();
  }
  if (bytes > kMaxTokenizedBytes) {
    return refuse(RequestError::invalid_request,
                  fmt::format("the text makes {} tokens, more than one answer may hold: tokenize it in parts",
                              answer.tokens.size()));
  }
  return answer;
}

std::optional<std::string> SchedulerPolicy::prompt_for(const ServedModel& m, const Submit& submit, std::int64_t now_ns,
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
      if (!m.chat) return "model " + m.name + ": " + m.chat_problem;
      const std::int64_t unix_s = (now_ns + config_.unix_clock_offset_ns) / 1'000'000'000;
      auto rendered = m.chat->render(chat_messages(submit.chat), true, unix_s,
                                     {submit.tools, submit.chat_template_kwargs});
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

// Why a submit cannot be served: the queue is full, the prompt is not one, or prompt and sampling
// do not fit the model. Fills `prompt` on the way.
std::optional<std::pair<RequestError, std::string>> SchedulerPolicy::refusal(const ServedModel& m, const Submit& submit,
                                                                             std::int64_t now_ns,
                                                                             std::vector<std::int32_t>& prompt) const {
  if (waiting_.size() >= config_.max_waiting) {
    return std::pair{RequestError::busy, fmt::format("{} requests are waiting already: try again later", waiting_.size())};
  }
  if (submit.pooling > static_cast<std::uint8_t>(model::Pooling::last)) {
    return std::pair{RequestError::invalid_request, fmt::format("pooling {} is not none (0), mean (1) or last (2)",
                                                                submit.pooling)};
  }
  if (auto why = prompt_for(m, submit, now_ns, prompt)) return std::pair{RequestError::invalid_request, std::move(*why)};
  if (prompt.empty()) return std::pair{RequestError::invalid_request, std::string("the prompt is empty")};
  if (submit.draft_max < -1 || submit.draft_max > kMaxDraftTokens) {
    return std::pair{RequestError::invalid_request,
                     fmt::format("draft_max is {}: it must be -1 (the server's setting), 0 (no drafts) or up to {}",
                                 submit.draft_max, kMaxDraftTokens)};
  }
  const std::uint64_t longest = std::min<std::uint64_t>(
      m.n_ctx > 0 ? m.n_ctx : UINT32_MAX, m.kv_capacity_tokens > 0 ? m.kv_capacity_tokens : UINT32_MAX);
  if (submit.pooling != 0) {
    if (prompt.size() <= longest) return std::nullopt;  // its sampling is not used
    return std::pair{RequestError::prompt_too_long,
                     fmt::format("the input makes {} tokens, more than the {} a sequence may have here: embed a "
                                 "shorter input",
                                 prompt.size(), longest)};
  }
  if (prompt.size() + static_cast<std::uint64_t>(std::max(1, submit.sampling.max_tokens)) > longest) {
    return std::pair{RequestError::prompt_too_long,
                     fmt::format("{} prompt tokens and max_tokens {} exceed the {} tokens a sequence may have here",
                                 prompt.size(), submit.sampling.max_tokens, longest)};
  }
  model::SamplingLimits limits{static_cast<std::int32_t>(m.n_vocab),
                               static_cast<std::int32_t>(longest - prompt.size())};
  if (auto error = model::validate(submit.sampling, limits)) {
    return std::pair{RequestError::invalid_request, error->field + ": " + error->message};
  }
  if (submit.sampling.response_format.constrained() && m.stop_tokens.empty()) {
    return std::pair{RequestError::invalid_request,
                     fmt::format("response_format: model '{}' has no end-of-generation token to end the JSON with",
                                 m.name)};
  }
  return std::nullopt;
}

void SchedulerPolicy::on_submit(Turn& ctx, const Message& message, const Submit& submit) {
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

  ServedModel* chosen = model_named(submit.model);
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
    end_request(ctx, r.sequence, FinishReason::error, RequestError::unknown_model, unknown_model_message(submit.model));
    return;
  }
  ServedModel& m = *chosen;
  usage_changed(ctx, m, +1);
  auto output = chat_output_plan(m, submit);
  if (auto* why = std::get_if<std::string>(&output)) {
    end_request(ctx, r.sequence, FinishReason::error, RequestError::invalid_request, std::move(*why));
    return;
  }
  ChatOutputPlan& plan = std::get<ChatOutputPlan>(output);
  // A forced tool call constrains the sampling as a json_schema response_format does.
  std::optional<Submit> constrained;
  if (plan.format) {
    constrained = submit;
    constrained->sampling.response_format = std::move(*plan.format);
    r.sampling = constrained->sampling;
  }
  std::vector<std::int32_t> prompt;
  if (auto refused = refusal(m, constrained ? *constrained : submit, ctx.now_ns(), prompt)) {
    end_request(ctx, r.sequence, FinishReason::error, refused->first, std::move(refused->second));
    return;
  }
  if (plan.setup) {
    plan.setup->starts_in_reasoning = plan.setup->reasoning && opens_reasoning(m, prompt);
    r.output.emplace(std::move(*plan.setup));
  }
  r.history = std::move(prompt);
  r.prompt_tokens = static_cast<std::uint32_t>(r.history.size());
  r.pooling = static_cast<model::Pooling>(submit.pooling);
  if (r.embedding()) r.sampling = model::SamplingParams{};  // the executor makes a sampler all the same
  // Drafts are verified by the request's draw (greedy or sampled), but not where it reports
  // logprobs (a kept draft has none) or follows a grammar (the mask of a draft's row would need it).
  if (!r.embedding() && !r.sampling.logprobs && !r.sampling.response_format.constrained()) {
    r.draft_max = submit.draft_max < 0 ? config_.draft_max : static_cast<std::uint32_t>(submit.draft_max);
  }
  r.decoder.emplace(*m.tokenizer, model::DecodeOptions{false, false});
  r.stops.emplace(model::StopMatcher::for_request(r.sampling, m.stop_tokens));
  waiting_.push_back(r.sequence);
  // A model that is not loaded is asked for; the request waits for it (or for the answer that
  // it cannot be loaded). Before the executor's first report no model is known to be loaded:
  // the request waits for that report, which asks for the loads still wanted then.
  if (executor_ready_ && m.state == ModelState::unloaded) request_load(ctx, m);
  schedule(ctx);
}

void SchedulerPolicy::on_abort(Turn& ctx, const Message& message, const Abort& abort) {
  auto it = by_client_.find({message.envelope.from, message.envelope.request_id});
  if (it == by_client_.end()) return;  // already ended: its final event is on its way
  pending_aborts_.emplace_back(it->second, static_cast<AbortReason>(abort.reason));
  if (in_flight_.empty()) {
    apply_pending_aborts(ctx);
    schedule(ctx);
  }
}

void SchedulerPolicy::apply_pending_aborts(Turn& ctx) {
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

void SchedulerPolicy::on_executor_report(Turn& ctx, const ExecutorReport& report) {
  executor_slots_ = report.slots;
  pool_ = report.pool;
  gpu_time_ = report.gpu_time;
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

void SchedulerPolicy::serve_model(ServedModel& m, const ModelInfo& info) {
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

void SchedulerPolicy::request_load(Turn& ctx, ServedModel& m) {
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
void SchedulerPolicy::fail_waiting(Turn& ctx, ServedModel& m, RequestError error, const std::string& why) {
  std::vector<std::uint64_t> theirs;
  for (std::uint64_t seq : waiting_) {
    if (requests_.at(seq)->model == &m) theirs.push_back(seq);
  }
  for (std::uint64_t seq : theirs) end_request(ctx, seq, FinishReason::error, error, why);
}

void SchedulerPolicy::on_model_loaded(Turn& ctx, const ModelLoaded& loaded) {
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

void SchedulerPolicy::on_load_answer(Turn& ctx, const LoadAnswer& answer) {
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
void SchedulerPolicy::on_abort_model(Turn& ctx, const AbortModel& abort) {
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
void SchedulerPolicy::answer_drained(Turn& ctx) {
  for (auto& [name, model] : models_) {
    if (!model->drain_pending) continue;
    if (in_flight_for(name)) continue;
    model->drain_pending = false;
    ctx.send(config_.enforcer.empty() ? std::string("enforcer") : config_.enforcer,
             ModelDrained{name, drained_counts_[name]});
    drained_counts_.erase(name);
  }
}

void SchedulerPolicy::on_model_unloaded(Turn& ctx, const ModelUnloaded& unloaded) {
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
void SchedulerPolicy::usage_changed(Turn& ctx, ServedModel& m, int delta) {
  const std::uint32_t before = m.open_requests;
  m.open_requests = static_cast<std::uint32_t>(static_cast<int>(m.open_requests) + delta);
  if (config_.enforcer.empty() || (before > 0) == (m.open_requests > 0)) return;
  ctx.send(config_.enforcer, ModelUsage{m.name, m.open_requests, ctx.now_ns()});
}

// ---- results --------------------------------------------------------------------------------

void SchedulerPolicy::on_step_result(Turn& ctx, const StepResult& result, const Frames& blobs) {
  if (in_flight_.empty() || result.step != in_flight_.front().plan.step) {
    spdlog::warn("{}: a result for step {} that is not the oldest in flight: ignored", ctx.self(), result.step);
    return;
  }
  const InFlight step = std::move(in_flight_.front());
  in_flight_.pop_front();
  const StepPlan& plan = step.plan;
  executor_slots_ = result.slots;
  if (result.has_pool) pool_ = result.pool;
  if (result.gpu_time.submissions > 0) gpu_time_ = result.gpu_time;  // none where no GPU ran it
  if (!plan.sequences.empty()) {
    ++steps_;
    log_step_times(ctx, step, result);
  }
  for (const auto& s : plan.sequences) {
    auto it = requests_.find(s.sequence);
    if (it == requests_.end()) continue;
    if (s.output) --it->second->pending;
    if (s.drafted > 0) it->second->verifying = false;
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
    fail_step(ctx, plan, result);
  } else {
    apply_answer(ctx, step, result);
    finish_embeddings(ctx, plan, result, blobs);
  }
  answer_drained(ctx);
  schedule(ctx);
}

// A step that failed ends its requests; one that lost the KV cache takes every computed token
// with it.
void SchedulerPolicy::fail_step(Turn& ctx, const StepPlan& plan, const StepResult& result) {
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
  if (result.kv_lost) forget_kv_cache();
}

// Nothing computed survives: every running sequence starts over, and no page is shared; the plan
// in flight behind the failed one computes on the lost cache.
void SchedulerPolicy::forget_kv_cache() {
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

// The step's tokens are in the cache now (full pages join the prefix cache) and its sampled
// tokens go to their requests.
void SchedulerPolicy::apply_answer(Turn& ctx, const InFlight& step, const StepResult& result) {
  const StepPlan& plan = step.plan;
  std::map<std::uint64_t, std::size_t> verified;  // sequences with drafts: their index in the plan
  for (std::size_t i = 0; i < plan.sequences.size(); ++i) {
    const PlanSequence& s = plan.sequences[i];
    if (s.drafted > 0) {
      verified.emplace(s.sequence, i);  // what it keeps is known from its output (deliver_verified)
      continue;
    }
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
    if (auto drafted = verified.find(output.sequence); drafted != verified.end()) {
      deliver_verified(ctx, step, drafted->second, output);
    } else {
      deliver_token(ctx, *it->second, output);
    }
  }
}

// An embedding ends with its output step, carrying the vector; one the executor left without one
// would otherwise wait for ever.
void SchedulerPolicy::finish_embeddings(Turn& ctx, const StepPlan& plan, const StepResult& result,
                                        const Frames& blobs) {
  for (std::size_t i = 0; i < result.pooled.size() && result.pooled.size() == blobs.size(); ++i) {
    auto it = requests_.find(result.pooled[i]);
    if (it == requests_.end() || !it->second->embedding() || blobs[i].size() % sizeof(float) != 0) continue;
    std::vector<float> vector(blobs[i].size() / sizeof(float));
    std::memcpy(vector.data(), blobs[i].data(), blobs[i].size());
    end_request(ctx, result.pooled[i], FinishReason::stop, RequestError::none, {}, {}, std::move(vector));
  }
  for (const PlanSequence& s : plan.sequences) {
    auto it = requests_.find(s.sequence);
    if (!s.output || it == requests_.end() || !it->second->embedding()) continue;
    end_request(ctx, s.sequence, FinishReason::error, RequestError::internal,
                "the executor computed the input but returned no embedding for it");
  }
}

void SchedulerPolicy::log_step_times(Turn& ctx, const InFlight& step, const StepResult& result) {
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

void SchedulerPolicy::deliver_token(Turn& ctx, Request& r, const OutputToken& output) {
  if (r.first_token_ns == 0) r.first_token_ns = ctx.now_ns();
  r.history.push_back(output.token);
  ++generated_tokens_;
  const model::Tokenizer& tokenizer = *r.model->tokenizer;
  std::string text = tokenizer.ends_generation(output.token) ? std::string{} : r.decoder->push(output.token);
  model::StopStep step = r.stops->push(output.token, text);
  TokenEvent event;
  event.tokens = {output.token};
  if (r.output) {
    put_output(event, r.output->push(step.text), submit_unix_ns(r), r.sequence);
  } else {
    event.text = std::move(step.text);
  }
  if (output.has_logprobs) event.logprobs.push_back(with_token_texts(tokenizer, output.logprobs));
  ctx.send(r.front, event, {0, r.client_request, {}});
  if (step.finish) {
    end_request(ctx, r.sequence, *step.finish == model::FinishReason::stop ? FinishReason::stop : FinishReason::length,
                RequestError::none, {}, step.stop_string);
  } else if (r.model->n_ctx > 0 && r.history.size() >= r.model->n_ctx) {
    end_request(ctx, r.sequence, FinishReason::length, RequestError::none, "the model's context is full");
  }
}

std::int64_t SchedulerPolicy::submit_unix_ns(const Request& request) const {
  return request.submitted_ns + config_.unix_clock_offset_ns;
}

// The one way a request ends.
void SchedulerPolicy::end_request(Turn& ctx, std::uint64_t sequence, FinishReason finish, RequestError error,
                                  std::string message, std::string stop, std::vector<float> embedding) {
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
  final.error = static_cast<std::uint16_t>(error);
  final.message = std::move(message);
  final.stop = std::move(stop);
  final.embedding = std::move(embedding);
  // Text held back (a stop string's possible start, a character's first bytes) is the client's
  // unless a stop string ended the request, in which case the matcher has dropped it already.
  if (r.stops && !r.stops->finished()) {
    final.text = (r.decoder ? r.decoder->finish() : std::string{});
    final.text = r.stops->release() + final.text;
  }
  if (r.output) {
    // What the parser held back, as what it is; a turn that ended having made calls ends with them.
    model::ParsedOutput rest = r.output->push(final.text);
    rest.append(r.output->finish());
    put_output(final, std::move(rest), submit_unix_ns(r), r.sequence);
    if (finish == FinishReason::stop && r.output->calls() > 0) finish = FinishReason::tool_calls;
  }
  final.finish = static_cast<std::uint8_t>(finish);
  final.prompt_tokens = r.prompt_tokens;
  final.completion_tokens = r.history.empty() ? 0 : r.generated();
  final.cached_tokens = r.cached_tokens;
  final.queue_ns = elapsed(r.submitted_ns, r.scheduled_ns);
  final.ttft_ns = elapsed(r.submitted_ns, r.first_token_ns);
  final.total_ns = ctx.now_ns() - r.submitted_ns;
  ctx.send(r.front, final, {0, r.client_request, {}});
  if (r.model != nullptr) r.model->outcomes.record(finish, error, final.prompt_tokens, final.completion_tokens);

  by_client_.erase({r.front, r.client_request});
  requests_.erase(it);
  ++finished_;
}

// ---- status and the watchdog ----------------------------------------------------------------

void SchedulerPolicy::on_status(Turn& ctx, const Message& message, const StatusQuery& query) {
  if (query.trim && executor_ready_) {
    // Answered when the executor has trimmed (its report follows any step already sent).
    status_waiters_.push_back({message.envelope.from, message.envelope.correlation_id});
    ctx.send(config_.executor, ExecutorQuery{true});
    return;
  }
  ctx.send(message.envelope.from, status(), {message.envelope.correlation_id, message.envelope.request_id, {}});
}

// Answers the status queries that waited for the executor's report (pool_ holds its figures).
void SchedulerPolicy::answer_status(Turn& ctx) {
  for (const auto& waiter : status_waiters_) ctx.send(waiter.to, status(), {waiter.correlation_id, 0, {}});
  status_waiters_.clear();
}

StatusReport SchedulerPolicy::status() const {
  StatusReport s;
  for (const auto& [name, model] : models_) {
    s.models.push_back(name);
    if (model->outcomes.finished > 0) s.outcomes[name] = model->outcomes;
  }
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
  s.generated_tokens = generated_tokens_;
  s.drafted_tokens = drafted_tokens_;
  s.accepted_tokens = accepted_tokens_;
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
  s.gpu_time = gpu_time_;
  return s;
}

void SchedulerPolicy::on_timer(Turn& ctx) {
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
