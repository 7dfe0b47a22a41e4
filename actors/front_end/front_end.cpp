#include "actors/front_end/front_end.hpp"

#include <algorithm>
#include <cerrno>
#include <stdexcept>

#include <spdlog/spdlog.h>

#include "actors/front_end/model_admin.hpp"

namespace mqlm::actors::front_end {

using namespace messages;

namespace {

// Admin questions waiting for the enforcer or the cache-writer, and how long one may wait for
// the enforcer: a load is as long as an upload (minutes for a large model on a slow disk); an
// unload's end waits for its requests.
constexpr std::size_t kMaxPendingAdmin = 256;
constexpr std::int64_t kAdminTimeoutNs = 600'000'000'000;

std::int64_t to_ns(std::chrono::milliseconds ms) { return std::chrono::nanoseconds(ms).count(); }

bool taken(SendStatus status) { return status == SendStatus::sent || status == SendStatus::deferred; }

// The line an operator reads for every request that ran (at the info level, key=value): who
// served it, its model, its tokens and times as the scheduler counted them, and how it ended.
void log_finished(const std::string& front_end, std::uint64_t request_id, const OpenRequest& request,
                  const FinalEvent& event) {
  const auto ms = [](std::int64_t ns) { return static_cast<double>(ns) / 1e6; };
  const auto reason = static_cast<FinishReason>(event.finish);
  spdlog::info("request done: id={}-{} model={} prompt_tokens={} cached_tokens={} completion_tokens={} "
               "ttft_ms={:.1f} total_ms={:.1f} finish={}{}{}",
               front_end, request_id, request.model.empty() ? "default" : request.model, event.prompt_tokens,
               event.cached_tokens, event.completion_tokens, ms(event.ttft_ns), ms(event.total_ns),
               finish_reason_name(reason), reason == FinishReason::error ? " error=" : "",
               reason == FinishReason::error ? error_code_name(static_cast<RequestError>(event.error)) : "");
}

}  // namespace

std::chrono::milliseconds milliseconds_option(std::string_view kind, const ActorOptions& options,
                                              const std::string& key, std::chrono::milliseconds fallback,
                                              std::uint64_t high) {
  return std::chrono::milliseconds(
      number_option(kind, options, key, static_cast<std::uint64_t>(fallback.count()), 1, high));
}

FrontEndConfig named_config(std::string name, std::string self, std::string admin_noun) {
  FrontEndConfig config;
  config.name = std::move(name);
  config.self = std::move(self);
  config.admin_noun = std::move(admin_noun);
  return config;
}

void read_core_options(const ActorOptions& options, std::uint64_t ms_high, FrontEndConfig& config) {
  const std::string& name = config.name;
  const std::string_view kind = name;
  config.scheduler = text_option(options, "scheduler", config.scheduler);
  if (config.scheduler.empty()) throw std::invalid_argument(name + " option scheduler= names no actor");
  config.enforcer = text_option(options, "enforcer", "");
  config.cache_writer = text_option(options, "cache_writer", "");
  config.max_requests = number_option(kind, options, "max_requests", config.max_requests, 1);
  config.heartbeat = milliseconds_option(kind, options, "heartbeat_ms", config.heartbeat, ms_high);
  config.unavailable = milliseconds_option(kind, options, "unavailable_ms", config.unavailable, ms_high);
  if (config.unavailable <= config.heartbeat) {
    throw std::invalid_argument(name + " option unavailable_ms must exceed heartbeat_ms, or a scheduler that answers "
                                       "every heartbeat would still be deemed silent");
  }
}

void FrontEnd::start(Context& ctx) {
  // "Never heard" counts as alive until unavailable_ms after start: the scheduler may start
  // after us, and the first heartbeat needs its round trip.
  last_heard_ns_ = ctx.now_ns();
  last_heartbeat_ns_ = ctx.now_ns() - to_ns(config_.heartbeat);
  auto shortest = std::min(config_.heartbeat, config_.unavailable);
  if (config_.keepalive) shortest = std::min(shortest, *config_.keepalive);
  const auto tick = std::max(shortest / 4, std::chrono::milliseconds(10));
  tick_ns_ = to_ns(tick);
  last_tick_ns_ = ctx.now_ns();
  ctx.set_timer(kCoreTickTimer, tick, true);
}

void FrontEnd::stop(Context& ctx) {
  // Whoever stops us without a Drain cuts requests off; their callers hear it rather than wait.
  const FinalEvent event = error_final(RequestError::shutting_down, "the server stopped before this request finished");
  for (auto& [request_id, request] : requests_) {
    if (!request.abort_sent) {
      ctx.send(config_.scheduler, Abort{static_cast<std::uint8_t>(AbortReason::shutdown)},
               SendOptions{0, request_id, {}});
    }
    port_.request_ended(event);
    if (!request.gone) port_.send_final(ctx, request, event);
  }
  requests_.clear();
  connections_.clear();
  for (const auto& [correlation_id, pending] : pending_status_) {
    port_.send_error(ctx, pending.caller, RequestError::shutting_down, "the server is stopping");
  }
  pending_status_.clear();
  for (const auto& [correlation_id, pending] : pending_admin_) {
    port_.send_error(ctx, pending.caller, RequestError::shutting_down, "the server is stopping");
  }
  pending_admin_.clear();
  ctx.cancel_timer(kCoreTickTimer);
}

// ---- what callers ask -------------------------------------------------------------------------

bool FrontEnd::is_open(const Caller& caller) const {
  auto connection = connections_.find(caller.connection);
  return connection != connections_.end() && connection->second.open.contains(caller.id);
}

void FrontEnd::refuse(Context& ctx, const Caller& caller, RequestError code, std::string message, bool logprobs) {
  const FinalEvent event = error_final(code, std::move(message));
  OpenRequest never_opened;
  never_opened.caller = caller;
  never_opened.logprobs = logprobs;
  port_.request_ended(event);
  port_.send_final(ctx, never_opened, event);
}

void FrontEnd::open(Context& ctx, Caller caller, Submit submit, bool stream) {
  const bool logprobs = submit.sampling.logprobs;
  if (draining_) {
    refuse(ctx, caller, RequestError::shutting_down, "the server is draining and takes no new requests", logprobs);
    return;
  }
  if (scheduler_silent(ctx.now_ns())) {
    refuse(ctx, caller, RequestError::unavailable, silence_message(ctx.now_ns()), logprobs);
    return;
  }
  if (requests_.size() >= config_.max_requests) {
    refuse(ctx, caller, RequestError::busy,
           "the server has " + std::to_string(requests_.size()) + " requests open, its limit: try again later",
           logprobs);
    return;
  }
  const std::uint64_t request_id = ++next_request_id_;
  std::string model = submit.model;
  SendStatus status = ctx.send(config_.scheduler, std::move(submit), SendOptions{0, request_id, {}});
  if (status == SendStatus::unknown_actor) {
    refuse(ctx, caller, RequestError::internal,
           config_.self + " has no address for its scheduler '" + config_.scheduler + "'", logprobs);
    return;
  }
  if (!taken(status)) {
    refuse(ctx, caller, RequestError::busy, "the scheduler's queue is full: try again later", logprobs);
    return;
  }
  Connection& connection = connections_[caller.connection];
  if (connection.open.empty()) connection.last_sent_ns = ctx.now_ns();
  connection.delimited = caller.delimited;
  connection.open.emplace(caller.id, request_id);
  OpenRequest request;
  request.caller = std::move(caller);
  request.model = std::move(model);
  request.stream = stream;
  request.logprobs = logprobs;
  requests_.emplace(request_id, std::move(request));
  if (config_.confirm_acceptance) unbarriered_.push_back(request_id);
}

void FrontEnd::abort(Context& ctx, const Caller& caller) {
  auto connection = connections_.find(caller.connection);
  if (connection == connections_.end()) return;
  auto open = connection->second.open.find(caller.id);
  if (open == connection->second.open.end()) return;
  send_abort(ctx, open->second, AbortReason::client);
}

void FrontEnd::ask_status(Context& ctx, Caller caller, bool trim) {
  if (scheduler_silent(ctx.now_ns())) {
    port_.send_error(ctx, caller, RequestError::unavailable, silence_message(ctx.now_ns()));
    return;
  }
  if (pending_status_.size() >= config_.max_pending_status) {
    port_.send_error(ctx, caller, RequestError::busy, "too many status requests are waiting: try again later");
    return;
  }
  const std::uint64_t correlation_id = ++next_correlation_id_;
  SendStatus status = ctx.send(config_.scheduler, StatusQuery{trim}, SendOptions{correlation_id, 0, {}});
  if (!went(ctx, caller, status, "scheduler", "")) return;
  PendingStatus pending{std::move(caller), ctx.now_ns(), {}, {}, false};
  if (!config_.enforcer.empty()) {
    pending.wants_memory = taken(ctx.send(config_.enforcer, ModelsQuery{}, SendOptions{correlation_id, 0, {}}));
  }
  pending_status_.emplace(correlation_id, std::move(pending));
}

// Load, unload and models go to the enforcer, a clear to the cache-writer; their answers come
// back by correlation id. A clear is not refused while draining: emptying a cache takes nothing
// from a request.
void FrontEnd::ask_admin(Context& ctx, Caller caller, AdminQuestion question) {
  if (auto refusal = admin_refusal(question)) {
    port_.send_error(ctx, caller, refusal->first, refusal->second);
    return;
  }
  if (pending_admin_.size() >= kMaxPendingAdmin) {
    port_.send_error(ctx, caller, RequestError::busy, "too many " + config_.admin_noun + " are waiting: try again later");
    return;
  }
  const bool clear_cache = std::holds_alternative<ClearCache>(question);
  const bool to_scheduler = std::holds_alternative<Tokenize>(question);
  const std::string& peer = clear_cache ? config_.cache_writer : to_scheduler ? config_.scheduler : config_.enforcer;
  const std::uint64_t correlation_id = ++next_correlation_id_;
  const Payload payload = std::visit([](const auto& asked) { return Payload{asked}; }, question);
  SendStatus status = ctx.send(peer, payload, SendOptions{correlation_id, 0, {}});
  if (!went(ctx, caller, status, clear_cache ? "cache-writer" : to_scheduler ? "scheduler" : "enforcer", peer)) return;
  pending_admin_.emplace(correlation_id, PendingAdmin{std::move(caller), clear_cache, ctx.now_ns(), to_scheduler});
}

// Why this server cannot take `question` at all, or nullopt.
std::optional<std::pair<RequestError, std::string>> FrontEnd::admin_refusal(const AdminQuestion& question) const {
  if (std::holds_alternative<Tokenize>(question)) return std::nullopt;
  if (const auto* clear = std::get_if<ClearCache>(&question)) {
    if (config_.cache_writer.empty()) {
      return std::pair{RequestError::invalid_request, std::string("this server runs no cache-writer (no hot cache: "
                                                                  "--hot-cache 0), so it has no KV cache to clear")};
    }
    const auto tier = static_cast<CacheTier>(clear->tier);
    if (tier != CacheTier::hot && tier != CacheTier::ssd) {
      return std::pair{RequestError::internal, std::string("a handler asked to clear an unknown cache tier")};
    }
    return std::nullopt;
  }
  if (config_.enforcer.empty()) {
    return std::pair{RequestError::invalid_request,
                     std::string("this server has no model pool (no enforcer): it cannot load or unload models")};
  }
  if (draining_ && std::holds_alternative<LoadRequest>(question)) {
    return std::pair{RequestError::shutting_down, std::string("the server is draining and loads no models")};
  }
  return std::nullopt;
}

// Whether a question to `role` (named `peer`, "" to leave the name out) went; if not, its caller
// hears why.
bool FrontEnd::went(Context& ctx, const Caller& caller, SendStatus status, const std::string& role,
                    const std::string& peer) {
  if (taken(status)) return true;
  if (status == SendStatus::unknown_actor) {
    port_.send_error(ctx, caller, RequestError::internal,
                     config_.self + " has no address for its " + role + (peer.empty() ? "" : " '" + peer + "'"));
  } else {
    port_.send_error(ctx, caller, RequestError::busy, "the " + role + "'s queue is full: try again later");
  }
  return false;
}

void FrontEnd::sent_to(const std::string& connection, std::int64_t now_ns) {
  if (auto it = connections_.find(connection); it != connections_.end()) it->second.last_sent_ns = now_ns;
}

// Connections found gone: their open requests are aborted and marked so that their events are
// dropped; each is forgotten when its FinalEvent arrives.
void FrontEnd::settle(Context& ctx) {
  send_barrier(ctx);
  for (const std::string& gone : gone_connections_) {
    auto connection = connections_.find(gone);
    if (connection == connections_.end()) continue;
    spdlog::debug("{}: a caller went away with {} requests open; aborting them", config_.name,
                  connection->second.open.size());
    for (const auto& [id, request_id] : connection->second.open) {
      OpenRequest& request = requests_.at(request_id);
      request.gone = true;
      if (!request.abort_sent) send_abort(ctx, request_id, AbortReason::client_gone);
    }
    connections_.erase(connection);
  }
  gone_connections_.clear();
}

// The scheduler answers a Submit it refuses at once, before anything it receives later. So a
// StatusQuery sent after a batch of Submits is answered after their refusals: a request with
// no event by then was accepted.
void FrontEnd::send_barrier(Context& ctx) {
  if (unbarriered_.empty()) return;
  const std::uint64_t correlation_id = ++next_correlation_id_;
  // When it cannot be sent, the next batch or tick tries again.
  if (!taken(ctx.send(config_.scheduler, StatusQuery{false}, SendOptions{correlation_id, 0, {}}))) return;
  barriers_.emplace(correlation_id, std::move(unbarriered_));
  unbarriered_.clear();
}

// ---- what the other actors say ----------------------------------------------------------------

void FrontEnd::on_message(Context& ctx, Message& message) {
  const Envelope& envelope = message.envelope;
  if (envelope.from == config_.scheduler) last_heard_ns_ = ctx.now_ns();
  if (!config_.cache_writer.empty() && envelope.from == config_.cache_writer) cache_writer_heard_ns_ = ctx.now_ns();
  if (auto* token = std::get_if<TokenEvent>(&message.payload)) {
    on_token(ctx, envelope.request_id, std::move(*token));
  } else if (const auto* final_event = message.as<FinalEvent>()) {
    on_final(ctx, envelope.request_id, *final_event);
  } else if (const auto* report = message.as<StatusReport>()) {
    on_status_report(ctx, envelope.correlation_id, *report);
  } else if (const auto* memory = message.as<ModelsReport>()) {
    on_models_report(ctx, envelope.correlation_id, *memory);
  } else if (const auto* load = message.as<LoadAnswer>()) {
    on_admin_answer(ctx, envelope.correlation_id, *load);
  } else if (const auto* unload = message.as<UnloadAnswer>()) {
    on_admin_answer(ctx, envelope.correlation_id, *unload);
  } else if (const auto* cleared = message.as<CacheCleared>()) {
    on_admin_answer(ctx, envelope.correlation_id, *cleared);
  } else if (const auto* tokenized = message.as<Tokenized>()) {
    on_admin_answer(ctx, envelope.correlation_id, *tokenized);
  } else if (const auto* error = message.as<Error>()) {
    on_runtime_error(ctx, envelope, *error);
  } else if (const auto* drain = message.as<Drain>()) {
    on_drain(ctx, drain->abort_running, std::move(message));
  } else if (const auto* timer = message.as<Timer>()) {
    if (timer->timer_id == kCoreTickTimer) {
      on_tick(ctx);
    } else {
      port_.on_timer(ctx, timer->timer_id);
    }
  } else if (message.as<HeartbeatAck>() == nullptr) {
    spdlog::debug("{}: ignored a {} from {}", config_.name, kind_name(message.kind()), envelope.from);
  }
}

void FrontEnd::on_token(Context& ctx, std::uint64_t request_id, TokenEvent event) {
  auto it = requests_.find(request_id);
  if (it == requests_.end()) {
    ++dropped_events_;
    return;
  }
  OpenRequest& request = it->second;
  if (request.gone) return;
  request.accepted = true;
  if (request.stream) {
    port_.send_token(ctx, request, event);
  } else {
    request.gathered.append(std::move(event));
  }
}

void FrontEnd::on_final(Context& ctx, std::uint64_t request_id, const FinalEvent& event) {
  auto it = requests_.find(request_id);
  if (it == requests_.end()) {
    ++dropped_events_;
    return;
  }
  finish(ctx, it, event);
}

// Sends the request's final (unless its caller is gone) and forgets it.
void FrontEnd::finish(Context& ctx, RequestIt it, const FinalEvent& event) {
  log_finished(config_.name, it->first, it->second, event);
  OpenRequest request = std::move(it->second);
  requests_.erase(it);
  ++served_;
  port_.request_ended(event);
  if (!request.gone) {
    port_.send_final(ctx, request, event);
    auto connection = connections_.find(request.caller.connection);
    if (connection != connections_.end()) {
      connection->second.open.erase(request.caller.id);
      if (connection->second.open.empty()) connections_.erase(connection);
    }
  }
  answer_drains_if_done(ctx);
}

void FrontEnd::on_status_report(Context& ctx, std::uint64_t correlation_id, const StatusReport& report) {
  if (auto barrier = barriers_.find(correlation_id); barrier != barriers_.end()) {
    for (std::uint64_t request_id : barrier->second) {
      auto it = requests_.find(request_id);
      if (it == requests_.end() || it->second.accepted || it->second.gone) continue;
      it->second.accepted = true;
      port_.send_accepted(ctx, it->second, report);
    }
    barriers_.erase(barrier);
    return;
  }
  auto it = pending_status_.find(correlation_id);
  if (it == pending_status_.end()) {
    ++dropped_events_;
    return;
  }
  it->second.report = report;
  answer_status_if_complete(ctx, it, false);
}

void FrontEnd::on_models_report(Context& ctx, std::uint64_t correlation_id, const ModelsReport& report) {
  if (auto it = pending_status_.find(correlation_id); it != pending_status_.end()) {
    it->second.memory = report;
    answer_status_if_complete(ctx, it, false);
    return;
  }
  on_admin_answer(ctx, correlation_id, report);
}

// gave_up: the enforcer did not answer in time, so the status goes without its memory report.
void FrontEnd::answer_status_if_complete(Context& ctx, StatusIt it, bool gave_up) {
  PendingStatus& pending = it->second;
  if (!pending.report || (pending.wants_memory && !pending.memory && !gave_up)) return;
  port_.send_status(ctx, pending.caller, *pending.report, pending.memory ? &*pending.memory : nullptr);
  pending_status_.erase(it);
}

// An accepted unload is answered twice: draining at once, unloaded (with the bytes freed) at its
// end; the caller hears both.
void FrontEnd::on_admin_answer(Context& ctx, std::uint64_t correlation_id, const AdminAnswer& answer) {
  auto it = pending_admin_.find(correlation_id);
  if (it == pending_admin_.end()) {
    ++dropped_events_;
    return;
  }
  port_.send_admin_answer(ctx, it->second.caller, answer);
  const auto* unload = std::get_if<UnloadAnswer>(&answer);
  if (unload == nullptr || static_cast<UnloadOutcome>(unload->outcome) != UnloadOutcome::draining) {
    pending_admin_.erase(it);
  }
}

// A peer's runtime could not take something we sent (it answers with Error): a bug on one side or
// the other, so what waited on it fails with internal rather than waiting forever.
void FrontEnd::on_runtime_error(Context& ctx, const Envelope& envelope, const Error& error) {
  spdlog::warn("{}: {} answered a {} with error {}: {}", config_.name, envelope.from,
               kind_name(static_cast<Kind>(error.about_kind)), error.code, error.message);
  if (auto it = requests_.find(envelope.request_id); envelope.request_id != 0 && it != requests_.end()) {
    finish(ctx, it, error_final(RequestError::internal, envelope.from + " could not take the request: " + error.message));
  }
  if (envelope.correlation_id == 0) return;
  const std::string could_not = envelope.from + " could not answer: " + error.message;
  if (auto it = pending_status_.find(envelope.correlation_id); it != pending_status_.end()) {
    if (envelope.from == config_.enforcer) {
      it->second.wants_memory = false;
      answer_status_if_complete(ctx, it, true);
    } else {
      port_.send_error(ctx, it->second.caller, RequestError::internal, could_not);
      pending_status_.erase(it);
    }
  }
  if (auto it = pending_admin_.find(envelope.correlation_id); it != pending_admin_.end()) {
    port_.send_error(ctx, it->second.caller, RequestError::internal, could_not);
    pending_admin_.erase(it);
  }
}

void FrontEnd::on_drain(Context& ctx, bool abort_running, Message message) {
  if (!draining_) spdlog::info("{} draining: {} requests open", config_.name, requests_.size());
  draining_ = true;
  if (abort_running) {
    for (auto& [request_id, request] : requests_) {
      if (!request.abort_sent) send_abort(ctx, request_id, AbortReason::shutdown);
    }
  }
  drains_.push_back(std::move(message));
  answer_drains_if_done(ctx);
}

void FrontEnd::answer_drains_if_done(Context& ctx) {
  if (drains_.empty() || !requests_.empty()) return;
  for (const auto& drain : drains_) ctx.reply(drain, Drained{served_});
  drains_.clear();
}

// ---- liveness ----------------------------------------------------------------------------------

void FrontEnd::on_tick(Context& ctx) {
  const std::int64_t now = ctx.now_ns();
  // A late tick means this loop was busy (a burst of large frames, a starved machine), and the
  // loop fires timers before it reads its inbox: the scheduler's answers may be waiting there
  // unread. Its silence is judged at the next tick, after the inbox had its turn.
  const bool late = now - last_tick_ns_ > 2 * tick_ns_;
  last_tick_ns_ = now;
  if (now - last_heartbeat_ns_ >= to_ns(config_.heartbeat)) {
    ctx.send(config_.scheduler, Heartbeat{++heartbeat_seq_});
    if (clears_pending()) ctx.send(config_.cache_writer, Heartbeat{heartbeat_seq_});
    last_heartbeat_ns_ = now;
  }
  send_barrier(ctx);
  if (!late && (!requests_.empty() || !pending_status_.empty()) && scheduler_silent(now)) {
    fail_all_unavailable(ctx);
  }
  if (!late) {
    answer_late_statuses(ctx, now);
    give_up_on_enforcer(ctx, now);
    give_up_on_cache_writer(ctx, now);
  }
  keep_connections_alive(ctx, now);
}

// The enforcer is not heartbeaten (it has nothing to do with requests): a status whose memory
// report is late goes without it.
void FrontEnd::answer_late_statuses(Context& ctx, std::int64_t now) {
  std::vector<std::uint64_t> late;
  for (const auto& [correlation_id, pending] : pending_status_) {
    if (pending.report && pending.wants_memory && now - pending.asked_ns > to_ns(config_.unavailable)) {
      late.push_back(correlation_id);
    }
  }
  for (std::uint64_t correlation_id : late) answer_status_if_complete(ctx, pending_status_.find(correlation_id), true);
}

// An admin question fails after kAdminTimeoutNs without the enforcer's answer; a Tokenize, which
// the scheduler answers at once, after unavailable_ms.
void FrontEnd::give_up_on_enforcer(Context& ctx, std::int64_t now) {
  for (auto it = pending_admin_.begin(); it != pending_admin_.end();) {
    const PendingAdmin& pending = it->second;
    const std::int64_t limit = pending.to_scheduler ? to_ns(config_.unavailable) : kAdminTimeoutNs;
    if (pending.clear_cache || now - pending.asked_ns <= limit) {
      ++it;
      continue;
    }
    const std::string& peer = pending.to_scheduler ? config_.scheduler : config_.enforcer;
    port_.send_error(ctx, pending.caller, RequestError::unavailable,
                     std::string(pending.to_scheduler ? "the scheduler '" : "the enforcer '") + peer +
                         "' did not answer in " + std::to_string(limit / 1'000'000) + " ms");
    it = pending_admin_.erase(it);
  }
}

// A clear the cache-writer has been silent about for unavailable_ms (heartbeats answered count:
// an SSD clear may take longer) fails with unavailable (model_admin::clear_overdue).
void FrontEnd::give_up_on_cache_writer(Context& ctx, std::int64_t now) {
  for (auto it = pending_admin_.begin(); it != pending_admin_.end();) {
    const PendingAdmin& pending = it->second;
    auto overdue = pending.clear_cache ? model_admin::clear_overdue(config_.cache_writer, now, pending.asked_ns,
                                                                    cache_writer_heard_ns_, to_ns(config_.unavailable))
                                       : std::nullopt;
    if (!overdue) {
      ++it;
      continue;
    }
    port_.send_error(ctx, pending.caller, RequestError::unavailable, *overdue);
    it = pending_admin_.erase(it);
  }
}

bool FrontEnd::clears_pending() const {
  return std::any_of(pending_admin_.begin(), pending_admin_.end(),
                     [](const auto& entry) { return entry.second.clear_cache; });
}

// A connection sent nothing for a while hears from the adapter: if it is gone, the send says so.
void FrontEnd::keep_connections_alive(Context& ctx, std::int64_t now) {
  if (!config_.keepalive) return;
  for (const auto& [routing_id, connection] : connections_) {
    if (now - connection.last_sent_ns < to_ns(*config_.keepalive)) continue;
    port_.send_keepalive(ctx, Caller{routing_id, std::nullopt, connection.delimited});
  }
}

bool FrontEnd::scheduler_silent(std::int64_t now) const { return now - last_heard_ns_ > to_ns(config_.unavailable); }

std::string FrontEnd::silence_message(std::int64_t now) const {
  return "the scheduler '" + config_.scheduler + "' has not answered for " +
         std::to_string((now - last_heard_ns_) / 1'000'000) + " ms (its process may have died): try again later";
}

// Every open request ends with unavailable. The scheduler is still told to abort them: if it is
// only slow, or comes back on the same address, it then drops them instead of computing for
// nobody (the Abort queues behind the Submit, so it arrives after it).
void FrontEnd::fail_all_unavailable(Context& ctx) {
  const std::string message = silence_message(ctx.now_ns());
  spdlog::warn("{}: {}; failing {} open requests", config_.name, message, requests_.size());
  while (!requests_.empty()) {
    auto it = requests_.begin();
    // AbortReason has no "front end gave up"; client_gone says what is true for the scheduler:
    // nobody reads this request's output any more.
    if (!it->second.abort_sent) send_abort(ctx, it->first, AbortReason::client_gone);
    finish(ctx, it, error_final(RequestError::unavailable, message));
  }
  for (const auto& [correlation_id, pending] : pending_status_) {
    port_.send_error(ctx, pending.caller, RequestError::unavailable, message);
  }
  pending_status_.clear();
  barriers_.clear();
  unbarriered_.clear();
  answer_drains_if_done(ctx);
}

void FrontEnd::send_abort(Context& ctx, std::uint64_t request_id, AbortReason reason) {
  ctx.send(config_.scheduler, Abort{static_cast<std::uint8_t>(reason)}, SendOptions{0, request_id, {}});
  requests_.at(request_id).abort_sent = true;
}

// ---- the actor ---------------------------------------------------------------------------------

void FrontEndActor::on_message(Context& ctx, Message& message) {
  core_.on_message(ctx, message);
  core_.settle(ctx);
}

bool FrontEndActor::send_routed(zmq::socket_t& router, const std::string& connection, messages::Frames frames) {
  try {
    if (!router.send(zmq::message_t(connection.data(), connection.size()),
                     zmq::send_flags::sndmore | zmq::send_flags::dontwait)) {
      spdlog::debug("{}: a caller left its queue full (it stopped reading); treating it as gone", core_.config().name);
      core_.connection_gone(connection);
      return false;
    }
    // Once the first frame is taken, the rest of the message is too.
    for (std::size_t i = 0; i < frames.size(); ++i) {
      const bool last = i + 1 == frames.size();
      router.send(frames[i], last ? zmq::send_flags::dontwait : zmq::send_flags::sndmore | zmq::send_flags::dontwait);
    }
  } catch (const zmq::error_t& e) {
    if (e.num() != EHOSTUNREACH) throw;
    core_.connection_gone(connection);
    return false;
  }
  return true;
}

zmq::context_t& FrontEndActor::live_context(Context& ctx) const {
  zmq::context_t* context = ctx.zmq_context();
  if (context == nullptr) {
    throw std::runtime_error(core_.config().self + " needs a live ZeroMQ context (it cannot be replayed)");
  }
  return *context;
}

}  // namespace mqlm::actors::front_end
