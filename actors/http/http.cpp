#include "actors/http/http.hpp"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "actors/gateway/client_protocol.hpp"
#include "actors/gateway/model_admin.hpp"
#include "actors/http/bridge.hpp"
#include "actors/http/http_server.hpp"
#include "actors/http/http_status.hpp"

namespace mqlm::actors {
namespace {

using namespace messages;
using http_bridge::AdminAnswer;
using http_bridge::AdminCall;
using http_bridge::AdminOp;
using http_bridge::StatusAnswer;
using http_bridge::Tag;
namespace cp = client_protocol;

constexpr std::uint32_t kBridgeWatch = 1;
constexpr std::uint32_t kTickTimer = 1;
// Handler messages read per wake, so that a burst of HTTP requests cannot starve the inbox.
constexpr int kMaxReadsPerWake = 256;
// Replies queued for one handler before it is deemed stuck (its client stopped reading) and gone.
constexpr int kHandlerSendQueue = 10000;
constexpr std::size_t kMaxPendingStatus = 256;
constexpr std::size_t kMaxPendingAdmin = 256;

struct HttpConfig {
  HttpServerConfig server;
  std::string scheduler = "scheduler";
  std::string enforcer;  // "": no model pool (admin calls are refused, status has no memory)
  std::string cache_writer;  // "": no KV pages beyond the GPU (cache clears are refused)
  std::size_t max_requests = 4096;
  std::chrono::milliseconds heartbeat{200};
  std::chrono::milliseconds unavailable{800};
};

std::int64_t to_ns(std::chrono::milliseconds ms) { return std::chrono::nanoseconds(ms).count(); }

class Http final : public Actor {
 public:
  explicit Http(HttpConfig config) : config_(std::move(config)) {}

  void on_start(Context& ctx) override {
    zmq::context_t* context = ctx.zmq_context();
    if (context == nullptr) {
      throw std::runtime_error("the http actor needs a live ZeroMQ context (it cannot be replayed)");
    }
    // Unique per instance: a restarted actor binds while its predecessor's socket may linger.
    bridge_endpoint_ = fmt::format("inproc://mqlm-http-bridge/{}/{}", ctx.self(), static_cast<const void*>(this));
    bridge_ = zmq::socket_t(*context, zmq::socket_type::router);
    bridge_.set(zmq::sockopt::router_mandatory, 1);
    bridge_.set(zmq::sockopt::linger, 0);
    bridge_.set(zmq::sockopt::sndhwm, kHandlerSendQueue);
    bridge_.bind(bridge_endpoint_);
    ctx.watch(bridge_, kBridgeWatch);
    try {
      server_ = std::make_unique<HttpServer>(*context, bridge_endpoint_, config_.server);
      server_->start();
    } catch (...) {
      server_.reset();
      ctx.unwatch(kBridgeWatch);
      bridge_.close();
      throw;
    }
    started_ns_ = ctx.now_ns();
    last_heard_ns_ = ctx.now_ns();
    last_heartbeat_ns_ = ctx.now_ns() - to_ns(config_.heartbeat);
    auto tick = std::max(std::min(config_.heartbeat, config_.unavailable) / 4, std::chrono::milliseconds(10));
    tick_ns_ = to_ns(tick);
    last_tick_ns_ = ctx.now_ns();
    ctx.set_timer(kTickTimer, tick, true);
    spdlog::info("http listening on {}:{} for scheduler '{}'{}", config_.server.host, server_->port(),
                 config_.scheduler, config_.server.api_key.empty() ? "" : " (API key required)");
  }

  void on_stop(Context& ctx) override {
    // Whoever stops us without a Drain cuts requests off; their clients hear it rather than wait.
    for (auto& [request_id, request] : requests_) {
      if (!request.abort_sent) {
        ctx.send(config_.scheduler, Abort{static_cast<std::uint8_t>(AbortReason::shutdown)},
                 SendOptions{0, request_id, {}});
      }
      auto event = cp::error_final(RequestError::shutting_down, "the server stopped before this request finished");
      figures_.record(event);
      if (!request.gone) send_to_handler(request.handler, Tag::final, http_bridge::pack(event));
    }
    requests_.clear();
    by_handler_.clear();
    for (const auto& [correlation_id, pending] : pending_status_) {
      refuse_status(pending.handler, RequestError::shutting_down, "the server is stopping");
    }
    pending_status_.clear();
    for (const auto& [correlation_id, pending] : pending_admin_) {
      refuse_admin(pending.handler, RequestError::shutting_down, "the server is stopping");
    }
    pending_admin_.clear();
    ctx.cancel_timer(kTickTimer);
    // The handlers still waiting see the server stop and give up; stop() joins them.
    if (server_) server_->stop();
    server_.reset();
    ctx.unwatch(kBridgeWatch);
    if (bridge_) bridge_.close();
    spdlog::info("http stopped: {} requests served, {} events for unknown requests", served_, dropped_events_);
  }

  void on_readable(Context& ctx, std::uint32_t watch_id) override {
    if (watch_id != kBridgeWatch || !bridge_) return;
    for (int i = 0; i < kMaxReadsPerWake; ++i) {
      std::vector<zmq::message_t> frames;
      if (!receive_handler_message(frames)) break;
      handle_handler_message(ctx, frames);
    }
    send_barrier(ctx);
    settle_gone_handlers(ctx);
  }

  void on_message(Context& ctx, Message& message) override {
    if (message.envelope.from == config_.scheduler) last_heard_ns_ = ctx.now_ns();
    if (!config_.cache_writer.empty() && message.envelope.from == config_.cache_writer) {
      cache_writer_heard_ns_ = ctx.now_ns();
    }
    const std::uint64_t request_id = message.envelope.request_id;
    if (const auto* token = message.as<TokenEvent>()) {
      on_token(request_id, *token);
    } else if (const auto* final_event = message.as<FinalEvent>()) {
      on_final(ctx, request_id, *final_event);
    } else if (const auto* report = message.as<StatusReport>()) {
      on_status_report(ctx, message.envelope.correlation_id, *report);
    } else if (const auto* memory = message.as<ModelsReport>()) {
      on_models_report(ctx, message.envelope.correlation_id, *memory);
    } else if (const auto* load = message.as<LoadAnswer>()) {
      on_load_answer(message.envelope.correlation_id, *load);
    } else if (const auto* unload = message.as<UnloadAnswer>()) {
      on_unload_answer(message.envelope.correlation_id, *unload);
    } else if (const auto* cleared = message.as<CacheCleared>()) {
      on_cache_cleared(message.envelope.correlation_id, *cleared);
    } else if (const auto* error = message.as<Error>()) {
      on_runtime_error(ctx, message.envelope, *error);
    } else if (const auto* drain = message.as<Drain>()) {
      on_drain(ctx, drain->abort_running, std::move(message));
    } else if (message.as<Timer>() != nullptr) {
      on_tick(ctx);
    } else if (message.as<HeartbeatAck>() == nullptr) {
      spdlog::debug("http: ignored a {} from {}", kind_name(message.kind()), message.envelope.from);
    }
    settle_gone_handlers(ctx);
  }

 private:
  struct Request {
    std::string handler;      // the handler socket's routing id
    bool accepted = false;    // the handler was told (or a token showed it)
    bool gone = false;        // the client went away: Abort sent, events dropped until the final
    bool abort_sent = false;
  };

  // A status waits for the scheduler's report and, with an enforcer, for its memory report;
  // an enforcer silent for unavailable_ms is left out.
  struct PendingStatus {
    std::string handler;
    std::int64_t asked_ns = 0;
    std::optional<StatusReport> report;
    std::optional<ModelsReport> memory;
    bool wants_memory = false;
  };

  struct PendingAdmin {
    std::string handler;
    AdminCall call;
    std::int64_t asked_ns = 0;
  };

  // ---- handler input --------------------------------------------------------------------------

  // [routing id, tag, body?]; false when nothing is waiting.
  bool receive_handler_message(std::vector<zmq::message_t>& frames) {
    while (true) {
      zmq::message_t frame;
      if (!bridge_.recv(frame, zmq::recv_flags::dontwait)) return !frames.empty();
      const bool more = frame.more();
      if (frames.size() < 3) frames.push_back(std::move(frame));
      if (!more) return true;
    }
  }

  void handle_handler_message(Context& ctx, const std::vector<zmq::message_t>& frames) {
    if (frames.size() < 2 || frames[1].size() != 1) {
      spdlog::warn("http: a handler sent a message without a tag");
      return;
    }
    const std::string handler(static_cast<const char*>(frames[0].data()), frames[0].size());
    const auto tag = static_cast<Tag>(*static_cast<const std::uint8_t*>(frames[1].data()));
    if (tag == Tag::open) {
      std::optional<Submit> submit;
      if (frames.size() == 3) submit = http_bridge::unpack<Submit>(frames[2]);
      if (!submit) {
        refuse(handler, RequestError::internal, "the http actor could not read the request from its handler");
        return;
      }
      open_request(ctx, handler, std::move(*submit));
    } else if (tag == Tag::gone) {
      auto it = by_handler_.find(handler);
      if (it != by_handler_.end()) handler_gone(ctx, it->second);
    } else if (tag == Tag::status) {
      std::optional<StatusQuery> query;
      if (frames.size() == 3) query = http_bridge::unpack<StatusQuery>(frames[2]);
      ask_status(ctx, handler, query ? query->trim : false);
    } else if (tag == Tag::admin) {
      std::optional<AdminCall> call;
      if (frames.size() == 3) call = http_bridge::unpack<AdminCall>(frames[2]);
      if (!call) {
        refuse_admin(handler, RequestError::internal, "the http actor could not read the call from its handler");
        return;
      }
      if (call->op == static_cast<std::uint8_t>(AdminOp::clear_cache)) {
        ask_cache_writer(ctx, handler, *call);
      } else {
        ask_enforcer(ctx, handler, std::move(*call));
      }
    } else {
      spdlog::warn("http: a handler sent unknown tag {}", static_cast<int>(tag));
    }
  }

  // The final of a request that never opened.
  void refuse(const std::string& handler, RequestError code, std::string message) {
    auto event = cp::error_final(code, std::move(message));
    figures_.record(event);
    send_to_handler(handler, Tag::final, http_bridge::pack(event));
  }

  void open_request(Context& ctx, const std::string& handler, Submit submit) {
    if (by_handler_.contains(handler)) {
      refuse(handler, RequestError::internal, "a handler opened a second request on one socket");
      return;
    }
    if (draining_) {
      refuse(handler, RequestError::shutting_down, "the server is draining and takes no new requests");
      return;
    }
    if (scheduler_silent(ctx.now_ns())) {
      refuse(handler, RequestError::unavailable, silence_message(ctx.now_ns()));
      return;
    }
    if (requests_.size() >= config_.max_requests) {
      refuse(handler, RequestError::busy,
             "the server has " + std::to_string(requests_.size()) + " requests open, its limit: try again later");
      return;
    }
    const std::uint64_t request_id = ++next_request_id_;
    SendStatus status = ctx.send(config_.scheduler, std::move(submit), SendOptions{0, request_id, {}});
    if (status == SendStatus::unknown_actor) {
      refuse(handler, RequestError::internal,
             "the http actor has no address for its scheduler '" + config_.scheduler + "'");
      return;
    }
    if (status != SendStatus::sent && status != SendStatus::deferred) {
      refuse(handler, RequestError::busy, "the scheduler's queue is full: try again later");
      return;
    }
    requests_.emplace(request_id, Request{handler});
    by_handler_.emplace(handler, request_id);
    unbarriered_.push_back(request_id);
  }

  // The scheduler answers a Submit it refuses at once, before anything it receives later. So a
  // StatusQuery sent after a batch of Submits is answered after their refusals: a request with
  // no event by then was accepted, and its handler may commit to a 200 and stream.
  void send_barrier(Context& ctx) {
    if (unbarriered_.empty()) return;
    const std::uint64_t correlation_id = ++next_correlation_id_;
    SendStatus status = ctx.send(config_.scheduler, StatusQuery{false}, SendOptions{correlation_id, 0, {}});
    // When it cannot be sent, the next batch or tick tries again.
    if (status != SendStatus::sent && status != SendStatus::deferred) return;
    barriers_.emplace(correlation_id, std::move(unbarriered_));
    unbarriered_.clear();
  }

  void ask_status(Context& ctx, const std::string& handler, bool trim) {
    if (scheduler_silent(ctx.now_ns())) {
      refuse_status(handler, RequestError::unavailable, silence_message(ctx.now_ns()));
      return;
    }
    if (pending_status_.size() >= kMaxPendingStatus) {
      refuse_status(handler, RequestError::busy, "too many status requests are waiting: try again later");
      return;
    }
    const std::uint64_t correlation_id = ++next_correlation_id_;
    SendStatus status = ctx.send(config_.scheduler, StatusQuery{trim}, SendOptions{correlation_id, 0, {}});
    if (status != SendStatus::sent && status != SendStatus::deferred) {
      refuse_status(handler, status == SendStatus::unknown_actor ? RequestError::internal : RequestError::busy,
                    status == SendStatus::unknown_actor ? "the http actor has no address for its scheduler"
                                                        : "the scheduler's queue is full: try again later");
      return;
    }
    PendingStatus pending{handler, ctx.now_ns(), {}, {}, false};
    if (!config_.enforcer.empty()) {
      SendStatus asked = ctx.send(config_.enforcer, ModelsQuery{}, SendOptions{correlation_id, 0, {}});
      pending.wants_memory = asked == SendStatus::sent || asked == SendStatus::deferred;
    }
    pending_status_.emplace(correlation_id, std::move(pending));
  }

  void refuse_status(const std::string& handler, RequestError code, std::string message) {
    StatusAnswer answer;
    answer.failure = cp::error_final(code, std::move(message));
    send_to_handler(handler, Tag::status_answer, http_bridge::pack(answer));
  }

  // ---- scheduler output -----------------------------------------------------------------------

  void on_token(std::uint64_t request_id, const TokenEvent& event) {
    auto it = requests_.find(request_id);
    if (it == requests_.end()) {
      ++dropped_events_;
      return;
    }
    Request& request = it->second;
    if (request.gone) return;
    request.accepted = true;
    send_to_handler(request.handler, Tag::token, http_bridge::pack(event));
  }

  void on_final(Context& ctx, std::uint64_t request_id, const FinalEvent& event) {
    auto it = requests_.find(request_id);
    if (it == requests_.end()) {
      ++dropped_events_;
      return;
    }
    finish(ctx, it, event);
  }

  // Sends the request's final (unless its client is gone), counts it and forgets the request.
  void finish(Context& ctx, std::map<std::uint64_t, Request>::iterator it, const FinalEvent& event) {
    Request request = std::move(it->second);
    requests_.erase(it);
    by_handler_.erase(request.handler);
    ++served_;
    figures_.record(event);
    if (!request.gone) send_to_handler(request.handler, Tag::final, http_bridge::pack(event));
    answer_drains_if_done(ctx);
  }

  void on_status_report(Context& ctx, std::uint64_t correlation_id, const StatusReport& report) {
    if (auto barrier = barriers_.find(correlation_id); barrier != barriers_.end()) {
      for (std::uint64_t request_id : barrier->second) {
        auto it = requests_.find(request_id);
        if (it == requests_.end() || it->second.accepted || it->second.gone) continue;
        it->second.accepted = true;
        send_to_handler(it->second.handler, Tag::accepted, {});
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

  void on_models_report(Context& ctx, std::uint64_t correlation_id, const ModelsReport& report) {
    if (auto it = pending_status_.find(correlation_id); it != pending_status_.end()) {
      it->second.memory = report;
      answer_status_if_complete(ctx, it, false);
      return;
    }
    answer_admin(correlation_id, [&](AdminAnswer& answer) { answer.models = report; });
  }

  // Gives the handler of admin call `correlation_id` its answer, `fill` setting the part that
  // came; an answer to no call waiting is counted and dropped.
  template <typename Fill>
  void answer_admin(std::uint64_t correlation_id, Fill fill) {
    auto it = pending_admin_.find(correlation_id);
    if (it == pending_admin_.end()) {
      ++dropped_events_;
      return;
    }
    AdminAnswer answer;
    answer.ok = true;
    fill(answer);
    send_to_handler(it->second.handler, Tag::admin_answer, http_bridge::pack(answer));
    pending_admin_.erase(it);
  }

  // gave_up: the enforcer did not answer in time; the status goes without the memory picture.
  void answer_status_if_complete(Context& ctx, std::map<std::uint64_t, PendingStatus>::iterator it, bool gave_up) {
    PendingStatus& pending = it->second;
    if (!pending.report || (pending.wants_memory && !pending.memory && !gave_up)) return;
    StatusAnswer answer;
    answer.ok = true;
    answer.report = *pending.report;
    answer.figures = figures_;
    answer.figures.uptime_ns = ctx.now_ns() - started_ns_;
    answer.figures.open_requests = static_cast<std::uint32_t>(requests_.size());
    answer.figures.draining = draining_;
    if (pending.memory) {
      answer.has_memory = true;
      answer.memory = *pending.memory;
    }
    send_to_handler(pending.handler, Tag::status_answer, http_bridge::pack(answer));
    pending_status_.erase(it);
  }

  // ---- admin --------------------------------------------------------------------------------------

  void refuse_admin(const std::string& handler, RequestError code, std::string message) {
    AdminAnswer answer;
    answer.failure = cp::error_final(code, std::move(message));
    send_to_handler(handler, Tag::admin_answer, http_bridge::pack(answer));
  }

  void ask_enforcer(Context& ctx, const std::string& handler, AdminCall call) {
    if (config_.enforcer.empty()) {
      refuse_admin(handler, RequestError::invalid_request,
                   "this server has no model pool (no enforcer): it cannot load or unload models");
      return;
    }
    if (draining_ && call.op == static_cast<std::uint8_t>(AdminOp::load)) {
      refuse_admin(handler, RequestError::shutting_down, "the server is draining and loads no models");
      return;
    }
    if (pending_admin_.size() >= kMaxPendingAdmin) {
      refuse_admin(handler, RequestError::busy, "too many admin calls are waiting: try again later");
      return;
    }
    const std::uint64_t correlation_id = ++next_correlation_id_;
    SendStatus status = SendStatus::sent;
    switch (static_cast<AdminOp>(call.op)) {
      case AdminOp::load: status = ctx.send(config_.enforcer, LoadRequest{call.model}, SendOptions{correlation_id, 0, {}}); break;
      case AdminOp::unload:
        status = ctx.send(config_.enforcer, UnloadRequest{call.model, call.if_idle}, SendOptions{correlation_id, 0, {}});
        break;
      case AdminOp::models: status = ctx.send(config_.enforcer, ModelsQuery{call.model}, SendOptions{correlation_id, 0, {}}); break;
      case AdminOp::clear_cache:  // the cache-writer's (ask_cache_writer)
      default:
        refuse_admin(handler, RequestError::internal, "a handler sent an unknown admin op");
        return;
    }
    if (status != SendStatus::sent && status != SendStatus::deferred) {
      refuse_admin(handler, status == SendStatus::unknown_actor ? RequestError::internal : RequestError::busy,
                   status == SendStatus::unknown_actor
                       ? "the http actor has no address for its enforcer '" + config_.enforcer + "'"
                       : "the enforcer's queue is full: try again later");
      return;
    }
    pending_admin_.emplace(correlation_id, PendingAdmin{handler, std::move(call), ctx.now_ns()});
  }

  // A cache clear goes to the cache-writer; not refused while draining (it takes nothing from a
  // request).
  void ask_cache_writer(Context& ctx, const std::string& handler, const AdminCall& call) {
    if (config_.cache_writer.empty()) {
      refuse_admin(handler, RequestError::invalid_request,
                   "this server runs no cache-writer (no hot cache: --hot-cache 0), so it has no KV cache to clear");
      return;
    }
    const auto tier = static_cast<CacheTier>(call.tier);
    if (tier != CacheTier::hot && tier != CacheTier::ssd) {
      refuse_admin(handler, RequestError::internal, "a handler asked to clear an unknown cache tier");
      return;
    }
    if (pending_admin_.size() >= kMaxPendingAdmin) {
      refuse_admin(handler, RequestError::busy, "too many admin calls are waiting: try again later");
      return;
    }
    const std::uint64_t correlation_id = ++next_correlation_id_;
    SendStatus status = ctx.send(config_.cache_writer, ClearCache{call.tier}, SendOptions{correlation_id, 0, {}});
    if (status != SendStatus::sent && status != SendStatus::deferred) {
      refuse_admin(handler, status == SendStatus::unknown_actor ? RequestError::internal : RequestError::busy,
                   status == SendStatus::unknown_actor
                       ? "the http actor has no address for its cache-writer '" + config_.cache_writer + "'"
                       : "the cache-writer's queue is full: try again later");
      return;
    }
    pending_admin_.emplace(correlation_id, PendingAdmin{handler, call, ctx.now_ns()});
  }

  void on_cache_cleared(std::uint64_t correlation_id, const CacheCleared& cleared) {
    answer_admin(correlation_id, [&](AdminAnswer& answer) { answer.cleared = cleared; });
  }

  void on_load_answer(std::uint64_t correlation_id, const LoadAnswer& load) {
    answer_admin(correlation_id, [&](AdminAnswer& answer) { answer.load = load; });
  }

  // An accepted unload is answered twice (draining, then unloaded): a call that waits is
  // answered with the second, one that does not with the first (the second is then dropped).
  void on_unload_answer(std::uint64_t correlation_id, const UnloadAnswer& unload) {
    auto it = pending_admin_.find(correlation_id);
    if (it == pending_admin_.end()) return;  // the end of an unload whose caller did not wait
    const bool draining = static_cast<UnloadOutcome>(unload.outcome) == UnloadOutcome::draining;
    if (draining && it->second.call.wait) return;
    answer_admin(correlation_id, [&](AdminAnswer& answer) { answer.unload = unload; });
  }

  // The scheduler's runtime could not take something we sent (it answers with Error): a bug on
  // one side or the other, so the request fails with internal rather than waiting forever.
  void on_runtime_error(Context& ctx, const Envelope& envelope, const Error& error) {
    spdlog::warn("http: {} answered a {} with error {}: {}", envelope.from,
                 kind_name(static_cast<Kind>(error.about_kind)), error.code, error.message);
    if (auto it = requests_.find(envelope.request_id); envelope.request_id != 0 && it != requests_.end()) {
      finish(ctx, it,
             cp::error_final(RequestError::internal, envelope.from + " could not take the request: " + error.message));
    }
    if (auto it = pending_admin_.find(envelope.correlation_id);
        envelope.correlation_id != 0 && it != pending_admin_.end()) {
      refuse_admin(it->second.handler, RequestError::internal, envelope.from + " could not answer: " + error.message);
      pending_admin_.erase(it);
    }
    if (auto it = pending_status_.find(envelope.correlation_id);
        envelope.correlation_id != 0 && it != pending_status_.end() && envelope.from == config_.enforcer) {
      it->second.wants_memory = false;
      answer_status_if_complete(ctx, it, true);
    } else if (auto it = pending_status_.find(envelope.correlation_id);
        envelope.correlation_id != 0 && it != pending_status_.end()) {
      refuse_status(it->second.handler, RequestError::internal, envelope.from + " could not answer: " + error.message);
      pending_status_.erase(it);
    }
  }

  void on_drain(Context& ctx, bool abort_running, Message message) {
    if (!draining_) spdlog::info("http draining: {} requests open", requests_.size());
    draining_ = true;
    if (abort_running) {
      for (auto& [request_id, request] : requests_) {
        if (!request.abort_sent) send_abort(ctx, request_id, AbortReason::shutdown);
      }
    }
    drains_.push_back(std::move(message));
    answer_drains_if_done(ctx);
  }

  void answer_drains_if_done(Context& ctx) {
    if (drains_.empty() || !requests_.empty()) return;
    for (const auto& drain : drains_) ctx.reply(drain, Drained{served_});
    drains_.clear();
  }

  void on_tick(Context& ctx) {
    const std::int64_t now = ctx.now_ns();
    // A late tick means the loop was busy and the scheduler's answers may wait unread in the
    // inbox (timers fire before it is read): silence is judged at the next tick.
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
    if (!late) answer_late_statuses(ctx, now);
    if (!late) give_up_on_cache_writer(now);
    settle_gone_handlers(ctx);
  }

  // The enforcer is not heartbeaten: a status whose memory report is late goes without it. Admin
  // calls wait as long as their handlers do (they give up on their own deadline).
  void answer_late_statuses(Context& ctx, std::int64_t now) {
    std::vector<std::uint64_t> late;
    for (const auto& [correlation_id, pending] : pending_status_) {
      if (pending.report && pending.wants_memory && now - pending.asked_ns > to_ns(config_.unavailable)) {
        late.push_back(correlation_id);
      }
    }
    for (std::uint64_t correlation_id : late) answer_status_if_complete(ctx, pending_status_.find(correlation_id), true);
  }

  bool clears_pending() const {
    return std::any_of(pending_admin_.begin(), pending_admin_.end(), [](const auto& entry) {
      return entry.second.call.op == static_cast<std::uint8_t>(AdminOp::clear_cache);
    });
  }

  // A clear the cache-writer has been silent about for unavailable_ms (heartbeats answered count:
  // an SSD clear may take longer) fails with unavailable, a 503 (model_admin::clear_overdue).
  void give_up_on_cache_writer(std::int64_t now) {
    for (auto it = pending_admin_.begin(); it != pending_admin_.end();) {
      const PendingAdmin& pending = it->second;
      auto overdue = pending.call.op == static_cast<std::uint8_t>(AdminOp::clear_cache)
                         ? model_admin::clear_overdue(config_.cache_writer, now, pending.asked_ns,
                                                      cache_writer_heard_ns_, to_ns(config_.unavailable))
                         : std::nullopt;
      if (!overdue) {
        ++it;
        continue;
      }
      refuse_admin(pending.handler, RequestError::unavailable, *overdue);
      it = pending_admin_.erase(it);
    }
  }

  // ---- the scheduler's silence ----------------------------------------------------------------

  bool scheduler_silent(std::int64_t now) const { return now - last_heard_ns_ > to_ns(config_.unavailable); }

  std::string silence_message(std::int64_t now) const {
    return "the scheduler '" + config_.scheduler + "' has not answered for " +
           std::to_string((now - last_heard_ns_) / 1'000'000) + " ms (its process may have died): try again later";
  }

  // Every open request ends with unavailable; the scheduler is still told to abort them, in case
  // it is only slow (as the gateway does).
  void fail_all_unavailable(Context& ctx) {
    const std::string message = silence_message(ctx.now_ns());
    spdlog::warn("http: {}; failing {} open requests", message, requests_.size());
    std::vector<std::uint64_t> open;
    for (const auto& [request_id, request] : requests_) open.push_back(request_id);
    for (std::uint64_t request_id : open) {
      Request& request = requests_.at(request_id);
      if (!request.abort_sent) send_abort(ctx, request_id, AbortReason::client_gone);
      finish(ctx, requests_.find(request_id), cp::error_final(RequestError::unavailable, message));
    }
    for (const auto& [correlation_id, pending] : pending_status_) {
      refuse_status(pending.handler, RequestError::unavailable, message);
    }
    pending_status_.clear();
    barriers_.clear();
    unbarriered_.clear();
  }

  // ---- sending to handlers ----------------------------------------------------------------------

  void send_abort(Context& ctx, std::uint64_t request_id, AbortReason reason) {
    ctx.send(config_.scheduler, Abort{static_cast<std::uint8_t>(reason)}, SendOptions{0, request_id, {}});
    requests_.at(request_id).abort_sent = true;
  }

  // The client of a request left (its handler said so, or its socket is gone): the scheduler is
  // told to abort it; the request is forgotten when its final arrives.
  void handler_gone(Context& ctx, std::uint64_t request_id) {
    auto it = requests_.find(request_id);
    if (it == requests_.end()) return;
    it->second.gone = true;
    if (!it->second.abort_sent) send_abort(ctx, request_id, AbortReason::client_gone);
  }

  // With ZMQ_ROUTER_MANDATORY a send to a handler socket that closed fails with EHOSTUNREACH,
  // and one to a handler that stopped reading fails with EAGAIN: its request is settled as gone
  // after the current handler (so that no caller sees the tables change under it).
  void send_to_handler(const std::string& handler, Tag tag, const std::string& body) {
    if (!bridge_) return;
    try {
      const auto byte = static_cast<std::uint8_t>(tag);
      if (!bridge_.send(zmq::message_t(handler.data(), handler.size()),
                        zmq::send_flags::sndmore | zmq::send_flags::dontwait)) {
        gone_handlers_.insert(handler);
        return;
      }
      const bool has_body = tag != Tag::accepted;
      bridge_.send(zmq::message_t(&byte, 1), has_body ? zmq::send_flags::sndmore | zmq::send_flags::dontwait
                                                      : zmq::send_flags::dontwait);
      if (has_body) bridge_.send(zmq::message_t(body.data(), body.size()), zmq::send_flags::dontwait);
    } catch (const zmq::error_t& e) {
      if (e.num() != EHOSTUNREACH) throw;
      gone_handlers_.insert(handler);
    }
  }

  void settle_gone_handlers(Context& ctx) {
    for (const std::string& handler : gone_handlers_) {
      auto it = by_handler_.find(handler);
      if (it != by_handler_.end()) handler_gone(ctx, it->second);
    }
    gone_handlers_.clear();
  }

  HttpConfig config_;
  std::string bridge_endpoint_;
  zmq::socket_t bridge_;
  std::unique_ptr<HttpServer> server_;  // after bridge_: destroyed first, so no handler outlives the socket
  std::map<std::uint64_t, Request> requests_;           // open requests by the request id the scheduler knows
  std::map<std::string, std::uint64_t> by_handler_;     // handler routing id -> its request id
  std::map<std::uint64_t, PendingStatus> pending_status_;  // by correlation id
  std::map<std::uint64_t, PendingAdmin> pending_admin_;    // by correlation id
  std::map<std::uint64_t, std::vector<std::uint64_t>> barriers_;  // correlation id -> requests it settles
  std::vector<std::uint64_t> unbarriered_;              // opened since the last barrier was sent
  std::set<std::string> gone_handlers_;
  std::vector<Message> drains_;
  http_status::HttpFigures figures_;
  bool draining_ = false;
  std::uint64_t next_request_id_ = 0;
  std::uint64_t next_correlation_id_ = 0;
  std::uint64_t heartbeat_seq_ = 0;
  std::int64_t started_ns_ = 0;
  std::int64_t last_heard_ns_ = 0;
  std::int64_t cache_writer_heard_ns_ = 0;
  std::int64_t last_heartbeat_ns_ = 0;
  std::int64_t tick_ns_ = 0;
  std::int64_t last_tick_ns_ = 0;
  std::uint64_t served_ = 0;
  std::uint64_t dropped_events_ = 0;
};

// "HOST:PORT", "[V6]:PORT" or ":PORT" (127.0.0.1).
void parse_listen(const std::string& text, HttpServerConfig& server) {
  const auto colon = text.rfind(':');
  if (colon == std::string::npos) {
    throw std::invalid_argument("http option listen=" + text + " is not HOST:PORT, such as 127.0.0.1:8080");
  }
  std::string host = text.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  server.host = host.empty() ? "127.0.0.1" : host;
  server.port = static_cast<int>(parse_number_option("http", "listen port", text.substr(colon + 1), 0, 65535));
}

}  // namespace

std::unique_ptr<Actor> make_http(const ActorOptions& options) {
  check_option_names("http", options,
                     {"listen", "scheduler", "enforcer", "cache_writer", "api_key", "max_body_bytes", "max_requests",
                      "threads", "keepalive_ms", "heartbeat_ms", "unavailable_ms"});
  HttpConfig config;
  parse_listen(text_option(options, "listen", "127.0.0.1:8080"), config.server);
  config.scheduler = text_option(options, "scheduler", config.scheduler);
  if (config.scheduler.empty()) throw std::invalid_argument("http option scheduler= names no actor");
  config.enforcer = text_option(options, "enforcer", "");
  config.cache_writer = text_option(options, "cache_writer", "");
  config.server.api_key = text_option(options, "api_key", "");
  config.server.max_body_bytes = number_option("http", options, "max_body_bytes", config.server.max_body_bytes, 1024,
                                               cp::kMaxFrameBytes);
  config.max_requests = number_option("http", options, "max_requests", config.max_requests, 1);
  config.server.threads = number_option("http", options, "threads", config.server.threads, 1, 4096);
  auto ms = [&](const std::string& key, std::chrono::milliseconds fallback) {
    return std::chrono::milliseconds(
        number_option("http", options, key, static_cast<std::uint64_t>(fallback.count()), 1, 3'600'000));
  };
  config.server.sse_keepalive = ms("keepalive_ms", config.server.sse_keepalive);
  config.heartbeat = ms("heartbeat_ms", config.heartbeat);
  config.unavailable = ms("unavailable_ms", config.unavailable);
  if (config.unavailable <= config.heartbeat) {
    throw std::invalid_argument("http option unavailable_ms must exceed heartbeat_ms, or a scheduler that answers "
                                "every heartbeat would still be deemed silent");
  }
  return std::make_unique<Http>(std::move(config));
}

}  // namespace mqlm::actors
