#include "actors/gateway/gateway.hpp"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>

#include "actors/gateway/client_protocol.hpp"
#include "actors/gateway/model_admin.hpp"

namespace mqlm::actors {
namespace {

using namespace messages;
namespace cp = client_protocol;

constexpr std::uint32_t kClientSocketWatch = 1;
constexpr std::uint32_t kTickTimer = 1;
// Client messages (and their bytes) read per wake, so a flood from clients cannot starve the
// inbox: the scheduler's events and heartbeat answers wait there.
constexpr int kMaxReadsPerWake = 256;
constexpr std::size_t kMaxReadBytesPerWake = 8 * 1024 * 1024;
// Frames kept of one client message: routing id, delimiter, body; beyond, only counted.
constexpr std::size_t kMaxFramesKept = 3;
// ZeroMQ drops the connection of a peer that sends a frame over this; frames between the
// protocol's limit and this get an error event instead.
constexpr std::int64_t kMaxMessageBytes = 4 * 1024 * 1024;
// ZMTP heartbeats close connections to clients whose host vanished without closing them.
constexpr int kZmtpHeartbeatIntervalMs = 1000;
constexpr int kZmtpHeartbeatTimeoutMs = 3000;
// Events queued for one client before it is deemed too slow to keep (and treated as gone).
constexpr int kClientSendQueue = 10000;
constexpr std::size_t kMaxPendingStatus = 64;
// Admin requests waiting for the enforcer, and how long one may wait: a load is as long as an
// upload (minutes for a large model on a slow disk); an unload's end waits for its requests.
constexpr std::size_t kMaxPendingAdmin = 256;
constexpr std::int64_t kAdminTimeoutNs = 600'000'000'000;
// On stop, how long the final events of cut-off requests may take to leave.
constexpr int kStopLingerMs = 200;

struct GatewayConfig {
  std::string listen = "tcp://127.0.0.1:5555";
  std::string scheduler = "scheduler";
  std::string enforcer;  // "": the server has no model pool (admin requests are refused)
  std::string cache_writer;  // "": the server keeps no KV pages beyond the GPU (clear_cache is refused)
  std::size_t max_requests = 4096;
  std::chrono::milliseconds keepalive{250};
  std::chrono::milliseconds heartbeat{200};
  std::chrono::milliseconds unavailable{800};
};

std::int64_t to_ns(std::chrono::milliseconds ms) { return std::chrono::nanoseconds(ms).count(); }

// A client connection as the ROUTER names it, and whether it frames messages like REQ does.
struct Peer {
  std::string routing_id;
  bool delimited = false;
};

class Gateway final : public Actor {
 public:
  explicit Gateway(GatewayConfig config) : config_(std::move(config)) {}

  void on_start(Context& ctx) override {
    zmq::context_t* context = ctx.zmq_context();
    if (context == nullptr) throw std::runtime_error("the gateway needs a live ZeroMQ context (it cannot be replayed)");
    socket_ = zmq::socket_t(*context, zmq::socket_type::router);
    socket_.set(zmq::sockopt::router_mandatory, 1);
    socket_.set(zmq::sockopt::linger, 0);
    socket_.set(zmq::sockopt::heartbeat_ivl, kZmtpHeartbeatIntervalMs);
    socket_.set(zmq::sockopt::heartbeat_timeout, kZmtpHeartbeatTimeoutMs);
    socket_.set(zmq::sockopt::maxmsgsize, kMaxMessageBytes);
    socket_.set(zmq::sockopt::sndhwm, kClientSendQueue);
    try {
      socket_.bind(config_.listen);
    } catch (const zmq::error_t& e) {
      socket_.close();
      throw std::runtime_error("the gateway cannot listen at " + config_.listen + ": " + e.what());
    }
    ctx.watch(socket_, kClientSocketWatch);
    // "Never heard" counts as alive until unavailable_ms after start: the scheduler may start
    // after us, and the first heartbeat needs its round trip.
    last_heard_ns_ = ctx.now_ns();
    last_heartbeat_ns_ = ctx.now_ns() - to_ns(config_.heartbeat);
    auto tick = std::max(std::min({config_.keepalive, config_.heartbeat, config_.unavailable}) / 4,
                         std::chrono::milliseconds(10));
    tick_ns_ = to_ns(tick);
    last_tick_ns_ = ctx.now_ns();
    ctx.set_timer(kTickTimer, tick, true);
    spdlog::info("gateway listening on {} for scheduler '{}'", config_.listen, config_.scheduler);
  }

  void on_stop(Context& ctx) override {
    // Whoever stops us without a Drain cuts requests off; their clients hear it rather than wait.
    for (auto& [request_id, request] : requests_) {
      if (!request.abort_sent) {
        ctx.send(config_.scheduler, Abort{static_cast<std::uint8_t>(AbortReason::shutdown)},
                 SendOptions{0, request_id, {}});
      }
      if (request.gone) continue;
      auto event = cp::error_final(RequestError::shutting_down, "the server stopped before this request finished");
      send_to_client(ctx, request.peer, cp::encode_final_event(request.id, event, request.gathered, request.logprobs));
    }
    requests_.clear();
    clients_.clear();
    for (const auto& [correlation_id, pending] : pending_admin_) {
      send_to_client(ctx, pending.peer, cp::encode_error_event(RequestError::shutting_down, "the server is stopping",
                                                               pending.request.id));
    }
    pending_admin_.clear();
    ctx.cancel_timer(kTickTimer);
    ctx.unwatch(kClientSocketWatch);
    if (socket_) {
      socket_.set(zmq::sockopt::linger, kStopLingerMs);
      socket_.close();
    }
    spdlog::info("gateway stopped: {} requests served, {} malformed frames, {} events for unknown requests",
                 served_, malformed_frames_, dropped_events_);
  }

  void on_readable(Context& ctx, std::uint32_t watch_id) override {
    if (watch_id != kClientSocketWatch || !socket_) return;
    std::size_t bytes = 0;
    for (int i = 0; i < kMaxReadsPerWake && bytes < kMaxReadBytesPerWake; ++i) {
      Frames frames;
      std::size_t count = 0;
      if (!receive_client_message(frames, count)) break;
      for (const auto& frame : frames) bytes += frame.size();
      handle_client_message(ctx, std::move(frames), count);
    }
    settle_gone_clients(ctx);
  }

  void on_message(Context& ctx, Message& message) override {
    if (message.envelope.from == config_.scheduler) last_heard_ns_ = ctx.now_ns();
    if (!config_.cache_writer.empty() && message.envelope.from == config_.cache_writer) {
      cache_writer_heard_ns_ = ctx.now_ns();
    }
    const std::uint64_t request_id = message.envelope.request_id;
    if (auto* token = std::get_if<TokenEvent>(&message.payload)) {
      on_token(ctx, request_id, std::move(*token));
    } else if (const auto* final_event = message.as<FinalEvent>()) {
      on_final(ctx, request_id, *final_event);
    } else if (const auto* report = message.as<StatusReport>()) {
      on_status_report(ctx, message.envelope.correlation_id, *report);
    } else if (const auto* memory = message.as<ModelsReport>()) {
      on_models_report(ctx, message.envelope.correlation_id, *memory);
    } else if (const auto* load = message.as<LoadAnswer>()) {
      on_load_answer(ctx, message.envelope.correlation_id, *load);
    } else if (const auto* unload = message.as<UnloadAnswer>()) {
      on_unload_answer(ctx, message.envelope.correlation_id, *unload);
    } else if (const auto* cleared = message.as<CacheCleared>()) {
      on_cache_cleared(ctx, message.envelope.correlation_id, *cleared);
    } else if (const auto* error = message.as<Error>()) {
      on_runtime_error(ctx, message.envelope, *error);
    } else if (const auto* drain = message.as<Drain>()) {
      on_drain(ctx, drain->abort_running, std::move(message));
    } else if (message.as<Timer>() != nullptr) {
      on_tick(ctx);
    } else if (message.as<HeartbeatAck>() == nullptr) {
      spdlog::debug("gateway: ignored a {} from {}", kind_name(message.kind()), message.envelope.from);
    }
    settle_gone_clients(ctx);
  }

 private:
  struct Request {
    Peer peer;
    cp::ClientId id;
    bool stream = true;
    bool logprobs = false;
    bool gone = false;         // the client disconnected: Abort sent, events dropped until the final
    bool abort_sent = false;
    cp::GatheredOutput gathered;  // for clients that do not stream
  };

  struct Client {
    std::map<cp::ClientId, std::uint64_t> open;  // the client's id -> our request id
    bool delimited = false;
    std::int64_t last_sent_ns = 0;
  };

  // A status waits for the scheduler's report and, when the server has an enforcer, its memory
  // report too; an enforcer that does not answer in unavailable_ms leaves "memory" out.
  struct PendingStatus {
    Peer peer;
    std::optional<cp::ClientId> id;
    std::int64_t asked_ns = 0;
    std::optional<StatusReport> report;
    std::optional<ModelsReport> memory;
    bool wants_memory = false;
  };

  struct PendingAdmin {
    Peer peer;
    cp::AdminRequest request;
    std::int64_t asked_ns = 0;
  };

  // ---- client input ---------------------------------------------------------------------------

  // One multipart message from the ROUTER, keeping at most kMaxFramesKept frames; count says how
  // many it had. False when nothing is waiting.
  bool receive_client_message(Frames& frames, std::size_t& count) {
    zmq::message_t part;
    if (!socket_.recv(part, zmq::recv_flags::dontwait)) return false;
    count = 1;
    bool more = part.more();
    frames.push_back(std::move(part));
    while (more) {
      zmq::message_t next;
      // The rest of a multipart message is there once its first part is.
      if (!socket_.recv(next, zmq::recv_flags::dontwait)) break;
      ++count;
      more = next.more();
      if (frames.size() < kMaxFramesKept) frames.push_back(std::move(next));
    }
    return true;
  }

  void handle_client_message(Context& ctx, Frames frames, std::size_t count) {
    Peer peer{std::string(static_cast<const char*>(frames[0].data()), frames[0].size()),
              frames.size() >= 3 && frames[1].size() == 0};
    const std::size_t body_index = peer.delimited ? 2 : 1;
    if (count != body_index + 1) {
      reject_frame(ctx, peer, cp::RequestProblem{RequestError::malformed,
                                                 "a message is one frame holding one msgpack map (after an empty "
                                                 "delimiter, from REQ); this one had " +
                                                     std::to_string(count - 1) + " frames",
                                                 std::nullopt, false});
      return;
    }
    const zmq::message_t& body = frames[body_index];
    // An empty frame is a keepalive, ours or a client's; nothing to answer.
    if (body.size() == 0) return;
    auto request = cp::parse_request(std::span<const std::byte>(static_cast<const std::byte*>(body.data()), body.size()));
    if (auto* generate = std::get_if<cp::GenerateRequest>(&request)) {
      start_generate(ctx, peer, std::move(*generate));
    } else if (const auto* abort = std::get_if<cp::AbortRequest>(&request)) {
      abort_request(ctx, peer, abort->id);
    } else if (auto* status = std::get_if<cp::StatusRequest>(&request)) {
      ask_status(ctx, peer, std::move(*status));
    } else if (auto* admin = std::get_if<cp::AdminRequest>(&request)) {
      if (admin->op == cp::AdminOp::clear_cache) {
        ask_cache_writer(ctx, peer, std::move(*admin));
      } else {
        ask_enforcer(ctx, peer, std::move(*admin));
      }
    } else {
      reject_frame(ctx, peer, std::get<cp::RequestProblem>(std::move(request)));
    }
  }

  // Bad input is the client's problem, not the server's: counted and logged at debug level.
  void reject_frame(Context& ctx, const Peer& peer, cp::RequestProblem problem) {
    ++malformed_frames_;
    spdlog::debug("gateway: rejected client frame #{} ({}): {}", malformed_frames_, cp::error_code_name(problem.code),
                  problem.message);
    if (problem.generate && problem.id) {
      refuse(ctx, peer, *problem.id, problem.code, std::move(problem.message), false);
    } else {
      send_to_client(ctx, peer, cp::encode_error_event(problem.code, problem.message, problem.id));
    }
  }

  // The final event of a generate that never opened.
  void refuse(Context& ctx, const Peer& peer, const cp::ClientId& id, RequestError code, std::string message,
              bool logprobs) {
    send_to_client(ctx, peer, cp::encode_final_event(id, cp::error_final(code, std::move(message)), {}, logprobs));
  }

  void start_generate(Context& ctx, const Peer& peer, cp::GenerateRequest request) {
    const bool logprobs = request.submit.sampling.logprobs;
    auto client = clients_.find(peer.routing_id);
    if (client != clients_.end() && client->second.open.contains(request.id)) {
      refuse(ctx, peer, request.id, RequestError::invalid_request,
             "id " + cp::describe(request.id) + " is already open: ids must be unique among your open requests",
             logprobs);
      return;
    }
    if (draining_) {
      refuse(ctx, peer, request.id, RequestError::shutting_down, "the server is draining and takes no new requests",
             logprobs);
      return;
    }
    if (scheduler_silent(ctx.now_ns())) {
      refuse(ctx, peer, request.id, RequestError::unavailable, silence_message(ctx.now_ns()), logprobs);
      return;
    }
    if (requests_.size() >= config_.max_requests) {
      refuse(ctx, peer, request.id, RequestError::busy,
             "the server has " + std::to_string(requests_.size()) + " requests open, its limit: try again later",
             logprobs);
      return;
    }
    const std::uint64_t request_id = ++next_request_id_;
    SendStatus status = ctx.send(config_.scheduler, std::move(request.submit), SendOptions{0, request_id, {}});
    if (status == SendStatus::unknown_actor) {
      refuse(ctx, peer, request.id, RequestError::internal,
             "the gateway has no address for its scheduler '" + config_.scheduler + "'", logprobs);
      return;
    }
    if (status != SendStatus::sent && status != SendStatus::deferred) {
      refuse(ctx, peer, request.id, RequestError::busy, "the scheduler's queue is full: try again later", logprobs);
      return;
    }
    Client& owner = clients_[peer.routing_id];
    if (owner.open.empty()) owner.last_sent_ns = ctx.now_ns();
    owner.delimited = peer.delimited;
    owner.open.emplace(request.id, request_id);
    requests_.emplace(request_id, Request{peer, std::move(request.id), request.stream, logprobs, false, false, {}});
  }

  // An unknown id is ignored: the request may have just finished.
  void abort_request(Context& ctx, const Peer& peer, const cp::ClientId& id) {
    auto client = clients_.find(peer.routing_id);
    if (client == clients_.end()) return;
    auto open = client->second.open.find(id);
    if (open == client->second.open.end()) return;
    send_abort(ctx, open->second, AbortReason::client);
  }

  void ask_status(Context& ctx, const Peer& peer, cp::StatusRequest request) {
    if (scheduler_silent(ctx.now_ns())) {
      send_to_client(ctx, peer, cp::encode_error_event(RequestError::unavailable, silence_message(ctx.now_ns()), request.id));
      return;
    }
    if (pending_status_.size() >= kMaxPendingStatus) {
      send_to_client(ctx, peer, cp::encode_error_event(RequestError::busy,
                                                       "too many status requests are waiting: try again later", request.id));
      return;
    }
    const std::uint64_t correlation_id = ++next_correlation_id_;
    SendStatus status = ctx.send(config_.scheduler, StatusQuery{request.trim}, SendOptions{correlation_id, 0, {}});
    if (status != SendStatus::sent && status != SendStatus::deferred) {
      send_to_client(ctx, peer, cp::encode_error_event(status == SendStatus::unknown_actor ? RequestError::internal
                                                                                           : RequestError::busy,
                                                       status == SendStatus::unknown_actor
                                                           ? "the gateway has no address for its scheduler"
                                                           : "the scheduler's queue is full: try again later",
                                                       request.id));
      return;
    }
    PendingStatus pending{peer, std::move(request.id), ctx.now_ns(), {}, {}, false};
    if (!config_.enforcer.empty()) {
      SendStatus asked = ctx.send(config_.enforcer, ModelsQuery{}, SendOptions{correlation_id, 0, {}});
      pending.wants_memory = asked == SendStatus::sent || asked == SendStatus::deferred;
    }
    pending_status_.emplace(correlation_id, std::move(pending));
  }

  // Load, unload and models go to the enforcer; its answers come back by correlation id.
  void ask_enforcer(Context& ctx, const Peer& peer, cp::AdminRequest request) {
    auto refuse_admin = [&](RequestError code, const std::string& message) {
      send_to_client(ctx, peer, cp::encode_error_event(code, message, request.id));
    };
    if (config_.enforcer.empty()) {
      refuse_admin(RequestError::invalid_request, "this server has no model pool (no enforcer): it cannot load or "
                                                  "unload models");
      return;
    }
    if (draining_ && request.op == cp::AdminOp::load) {
      refuse_admin(RequestError::shutting_down, "the server is draining and loads no models");
      return;
    }
    if (pending_admin_.size() >= kMaxPendingAdmin) {
      refuse_admin(RequestError::busy, "too many admin requests are waiting: try again later");
      return;
    }
    const std::uint64_t correlation_id = ++next_correlation_id_;
    SendStatus status = SendStatus::sent;
    switch (request.op) {
      case cp::AdminOp::load:
        status = ctx.send(config_.enforcer, LoadRequest{request.model}, SendOptions{correlation_id, 0, {}});
        break;
      case cp::AdminOp::unload:
        status = ctx.send(config_.enforcer, UnloadRequest{request.model, request.if_idle},
                          SendOptions{correlation_id, 0, {}});
        break;
      case cp::AdminOp::models:
        status = ctx.send(config_.enforcer, ModelsQuery{request.model}, SendOptions{correlation_id, 0, {}});
        break;
      case cp::AdminOp::clear_cache:  // the cache-writer's: handle_client_message sends it to ask_cache_writer
        refuse_admin(RequestError::internal, "clear_cache reached the enforcer's path");
        return;
    }
    if (status != SendStatus::sent && status != SendStatus::deferred) {
      refuse_admin(status == SendStatus::unknown_actor ? RequestError::internal : RequestError::busy,
                   status == SendStatus::unknown_actor ? "the gateway has no address for its enforcer '" +
                                                             config_.enforcer + "'"
                                                       : "the enforcer's queue is full: try again later");
      return;
    }
    pending_admin_.emplace(correlation_id, PendingAdmin{peer, std::move(request), ctx.now_ns()});
  }

  // clear_cache goes to the cache-writer; its CacheCleared comes back by correlation id. It is
  // not refused while draining: emptying a cache takes nothing from a request.
  void ask_cache_writer(Context& ctx, const Peer& peer, cp::AdminRequest request) {
    auto refuse_clear = [&](RequestError code, const std::string& message) {
      send_to_client(ctx, peer, cp::encode_error_event(code, message, request.id));
    };
    if (config_.cache_writer.empty()) {
      refuse_clear(RequestError::invalid_request, "this server runs no cache-writer (no hot cache: --hot-cache 0), "
                                                  "so it has no KV cache to clear");
      return;
    }
    if (pending_admin_.size() >= kMaxPendingAdmin) {
      refuse_clear(RequestError::busy, "too many admin requests are waiting: try again later");
      return;
    }
    const std::uint64_t correlation_id = ++next_correlation_id_;
    SendStatus status = ctx.send(config_.cache_writer, ClearCache{static_cast<std::uint8_t>(request.tier)},
                                 SendOptions{correlation_id, 0, {}});
    if (status != SendStatus::sent && status != SendStatus::deferred) {
      refuse_clear(status == SendStatus::unknown_actor ? RequestError::internal : RequestError::busy,
                   status == SendStatus::unknown_actor ? "the gateway has no address for its cache-writer '" +
                                                             config_.cache_writer + "'"
                                                       : "the cache-writer's queue is full: try again later");
      return;
    }
    pending_admin_.emplace(correlation_id, PendingAdmin{peer, std::move(request), ctx.now_ns()});
  }

  // ---- scheduler output -----------------------------------------------------------------------

  void on_token(Context& ctx, std::uint64_t request_id, TokenEvent event) {
    auto it = requests_.find(request_id);
    if (it == requests_.end()) {
      ++dropped_events_;
      return;
    }
    Request& request = it->second;
    if (request.gone) return;
    if (request.stream) {
      send_to_client(ctx, request.peer, cp::encode_token_event(request.id, event, request.logprobs));
    } else {
      request.gathered.append(std::move(event));
    }
  }

  void on_final(Context& ctx, std::uint64_t request_id, const FinalEvent& event) {
    auto it = requests_.find(request_id);
    if (it == requests_.end()) {
      ++dropped_events_;
      return;
    }
    finish(ctx, it, event);
  }

  // Sends the request's final event (unless its client is gone) and forgets it.
  void finish(Context& ctx, std::map<std::uint64_t, Request>::iterator it, const FinalEvent& event) {
    Request request = std::move(it->second);
    requests_.erase(it);
    ++served_;
    if (!request.gone) {
      send_to_client(ctx, request.peer, cp::encode_final_event(request.id, event, request.gathered, request.logprobs));
      auto client = clients_.find(request.peer.routing_id);
      if (client != clients_.end()) {
        client->second.open.erase(request.id);
        if (client->second.open.empty()) clients_.erase(client);
      }
    }
    answer_drains_if_done(ctx);
  }

  void on_status_report(Context& ctx, std::uint64_t correlation_id, const StatusReport& report) {
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
    auto it = pending_admin_.find(correlation_id);
    if (it == pending_admin_.end()) {
      ++dropped_events_;
      return;
    }
    nlohmann::json models = model_admin::memory_json(report);
    send_to_client(ctx, it->second.peer, cp::encode_json_event("models", it->second.request.id, std::move(models)));
    pending_admin_.erase(it);
  }

  // gave_up: the enforcer did not answer in time, so the status goes without "memory".
  void answer_status_if_complete(Context& ctx, std::map<std::uint64_t, PendingStatus>::iterator it, bool gave_up) {
    PendingStatus& pending = it->second;
    if (!pending.report || (pending.wants_memory && !pending.memory && !gave_up)) return;
    send_to_client(ctx, pending.peer,
                   cp::encode_status_event(pending.id, *pending.report, requests_.size(),
                                           pending.memory ? &*pending.memory : nullptr));
    pending_status_.erase(it);
  }

  void on_load_answer(Context& ctx, std::uint64_t correlation_id, const LoadAnswer& answer) {
    auto it = pending_admin_.find(correlation_id);
    if (it == pending_admin_.end()) {
      ++dropped_events_;
      return;
    }
    const PendingAdmin& pending = it->second;
    if (auto refusal = model_admin::load_refusal(answer)) {
      nlohmann::json fields = std::move(refusal->figures);
      fields["code"] = cp::error_code_name(refusal->code);
      fields["message"] = refusal->message;
      fields["model"] = answer.model;
      send_to_client(ctx, pending.peer, cp::encode_json_event("error", pending.request.id, std::move(fields)));
    } else {
      send_to_client(ctx, pending.peer, cp::encode_json_event("model", pending.request.id, model_admin::loaded_json(answer)));
    }
    pending_admin_.erase(it);
  }

  // An accepted unload is answered twice: draining at once, unloaded (with the bytes freed) at
  // its end; the client hears both.
  void on_unload_answer(Context& ctx, std::uint64_t correlation_id, const UnloadAnswer& answer) {
    auto it = pending_admin_.find(correlation_id);
    if (it == pending_admin_.end()) {
      ++dropped_events_;
      return;
    }
    const PendingAdmin& pending = it->second;
    if (auto refusal = model_admin::unload_refusal(answer)) {
      nlohmann::json fields = {{"code", cp::error_code_name(refusal->code)}, {"message", refusal->message},
                               {"model", answer.model}};
      send_to_client(ctx, pending.peer, cp::encode_json_event("error", pending.request.id, std::move(fields)));
    } else {
      send_to_client(ctx, pending.peer, cp::encode_json_event("model", pending.request.id, model_admin::unload_json(answer)));
    }
    if (static_cast<UnloadOutcome>(answer.outcome) != UnloadOutcome::draining) pending_admin_.erase(it);
  }

  void on_cache_cleared(Context& ctx, std::uint64_t correlation_id, const CacheCleared& cleared) {
    auto it = pending_admin_.find(correlation_id);
    if (it == pending_admin_.end()) {
      ++dropped_events_;
      return;
    }
    send_to_client(ctx, it->second.peer,
                   cp::encode_json_event("cache_cleared", it->second.request.id, model_admin::cleared_json(cleared)));
    pending_admin_.erase(it);
  }

  // The scheduler's runtime could not take something we sent (it answers with Error): a bug on
  // one side or the other, so the request fails with internal rather than waiting forever.
  void on_runtime_error(Context& ctx, const Envelope& envelope, const Error& error) {
    spdlog::warn("gateway: {} answered a {} with error {}: {}", envelope.from,
                 kind_name(static_cast<Kind>(error.about_kind)), error.code, error.message);
    if (auto it = requests_.find(envelope.request_id); envelope.request_id != 0 && it != requests_.end()) {
      finish(ctx, it, cp::error_final(RequestError::internal, envelope.from + " could not take the request: " + error.message));
    }
    if (auto it = pending_status_.find(envelope.correlation_id); envelope.correlation_id != 0 && it != pending_status_.end()) {
      if (envelope.from == config_.enforcer && it->second.report) {
        answer_status_if_complete(ctx, it, true);
      } else if (envelope.from == config_.enforcer) {
        it->second.wants_memory = false;
      } else {
        send_to_client(ctx, it->second.peer,
                       cp::encode_error_event(RequestError::internal, envelope.from + " could not answer: " + error.message,
                                              it->second.id));
        pending_status_.erase(it);
      }
    }
    if (auto it = pending_admin_.find(envelope.correlation_id); envelope.correlation_id != 0 && it != pending_admin_.end()) {
      send_to_client(ctx, it->second.peer,
                     cp::encode_error_event(RequestError::internal, envelope.from + " could not answer: " + error.message,
                                            it->second.request.id));
      pending_admin_.erase(it);
    }
  }

  void on_drain(Context& ctx, bool abort_running, Message message) {
    if (!draining_) spdlog::info("gateway draining: {} requests open", requests_.size());
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
    if (!late && (!requests_.empty() || !pending_status_.empty()) && scheduler_silent(now)) {
      fail_all_unavailable(ctx);
    }
    if (!late) give_up_on_enforcer(ctx, now);
    if (!late) give_up_on_cache_writer(ctx, now);
    // A client sent nothing for a while is sent an empty frame: if it is gone, the send says so.
    // Not to REQ-framed clients: a REQ socket would take the empty frame for its one answer.
    for (auto& [routing_id, client] : clients_) {
      if (client.delimited || now - client.last_sent_ns < to_ns(config_.keepalive)) continue;
      send_to_client(ctx, Peer{routing_id, false}, {});
    }
  }

  // The enforcer is not heartbeaten (it has nothing to do with requests): a status leaves its
  // part out after unavailable_ms, and an admin request fails after kAdminTimeoutNs.
  void give_up_on_enforcer(Context& ctx, std::int64_t now) {
    std::vector<std::uint64_t> late_status;
    for (const auto& [correlation_id, pending] : pending_status_) {
      if (pending.report && pending.wants_memory && now - pending.asked_ns > to_ns(config_.unavailable)) {
        late_status.push_back(correlation_id);
      }
    }
    for (std::uint64_t correlation_id : late_status) {
      answer_status_if_complete(ctx, pending_status_.find(correlation_id), true);
    }
    for (auto it = pending_admin_.begin(); it != pending_admin_.end();) {
      if (it->second.request.op == cp::AdminOp::clear_cache || now - it->second.asked_ns <= kAdminTimeoutNs) {
        ++it;
        continue;
      }
      send_to_client(ctx, it->second.peer,
                     cp::encode_error_event(RequestError::unavailable,
                                            "the enforcer '" + config_.enforcer + "' did not answer in " +
                                                std::to_string(kAdminTimeoutNs / 1'000'000'000) + " s",
                                            it->second.request.id));
      it = pending_admin_.erase(it);
    }
  }

  bool clears_pending() const {
    return std::any_of(pending_admin_.begin(), pending_admin_.end(),
                       [](const auto& entry) { return entry.second.request.op == cp::AdminOp::clear_cache; });
  }

  // A clear the cache-writer has been silent about for unavailable_ms (heartbeats answered count:
  // an SSD clear may take longer) fails with unavailable (model_admin::clear_overdue).
  void give_up_on_cache_writer(Context& ctx, std::int64_t now) {
    for (auto it = pending_admin_.begin(); it != pending_admin_.end();) {
      const PendingAdmin& pending = it->second;
      auto overdue = pending.request.op == cp::AdminOp::clear_cache
                         ? model_admin::clear_overdue(config_.cache_writer, now, pending.asked_ns,
                                                      cache_writer_heard_ns_, to_ns(config_.unavailable))
                         : std::nullopt;
      if (!overdue) {
        ++it;
        continue;
      }
      send_to_client(ctx, pending.peer, cp::encode_error_event(RequestError::unavailable, *overdue, pending.request.id));
      it = pending_admin_.erase(it);
    }
  }

  // ---- the scheduler's silence ----------------------------------------------------------------

  bool scheduler_silent(std::int64_t now) const { return now - last_heard_ns_ > to_ns(config_.unavailable); }

  std::string silence_message(std::int64_t now) const {
    return "the scheduler '" + config_.scheduler + "' has not answered for " +
           std::to_string((now - last_heard_ns_) / 1'000'000) + " ms (its process may have died): try again later";
  }

  // Every open request ends with unavailable. The scheduler is still told to abort them: if it
  // is only slow, or comes back on the same address, it then drops them instead of computing for
  // nobody (the Abort queues behind the Submit, so it arrives after it).
  void fail_all_unavailable(Context& ctx) {
    const std::string message = silence_message(ctx.now_ns());
    spdlog::warn("gateway: {}; failing {} open requests", message, requests_.size());
    auto requests = std::move(requests_);
    requests_.clear();
    clients_.clear();
    for (auto& [request_id, request] : requests) {
      if (!request.abort_sent) {
        // AbortReason has no "front end gave up"; client_gone says what is true for the
        // scheduler: nobody reads this request's output any more.
        ctx.send(config_.scheduler, Abort{static_cast<std::uint8_t>(AbortReason::client_gone)},
                 SendOptions{0, request_id, {}});
      }
      ++served_;
      if (request.gone) continue;
      auto event = cp::error_final(RequestError::unavailable, message);
      send_to_client(ctx, request.peer, cp::encode_final_event(request.id, event, request.gathered, request.logprobs));
    }
    for (auto& [correlation_id, pending] : pending_status_) {
      send_to_client(ctx, pending.peer, cp::encode_error_event(RequestError::unavailable, message, pending.id));
    }
    pending_status_.clear();
    answer_drains_if_done(ctx);
  }

  // ---- sending to clients ---------------------------------------------------------------------

  void send_abort(Context& ctx, std::uint64_t request_id, AbortReason reason) {
    ctx.send(config_.scheduler, Abort{static_cast<std::uint8_t>(reason)}, SendOptions{0, request_id, {}});
    requests_.at(request_id).abort_sent = true;
  }

  // With ZMQ_ROUTER_MANDATORY a send to a connection that is gone fails with EHOSTUNREACH, and
  // one to a client whose queue is full with EAGAIN (it has stopped reading): either way the
  // client is settled as gone once the current handler is done (not here, so that no caller
  // sees its maps change under it).
  bool send_to_client(Context& ctx, const Peer& peer, std::string_view body) {
    if (!socket_) return false;
    try {
      zmq::message_t id_frame(peer.routing_id.data(), peer.routing_id.size());
      if (!socket_.send(id_frame, zmq::send_flags::sndmore | zmq::send_flags::dontwait)) {
        spdlog::debug("gateway: a client left {} events unread; treating it as gone", kClientSendQueue);
        gone_clients_.insert(peer.routing_id);
        return false;
      }
      // Once the first frame is taken, the rest of the message is too.
      if (peer.delimited) socket_.send(zmq::message_t(), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
      socket_.send(zmq::message_t(body.data(), body.size()), zmq::send_flags::dontwait);
    } catch (const zmq::error_t& e) {
      if (e.num() != EHOSTUNREACH) throw;
      gone_clients_.insert(peer.routing_id);
      return false;
    }
    if (auto it = clients_.find(peer.routing_id); it != clients_.end()) it->second.last_sent_ns = ctx.now_ns();
    return true;
  }

  // Clients found gone: their open requests are aborted and marked so that their events are
  // dropped; each is forgotten when its FinalEvent arrives.
  void settle_gone_clients(Context& ctx) {
    for (const std::string& routing_id : gone_clients_) {
      auto client = clients_.find(routing_id);
      if (client == clients_.end()) continue;
      spdlog::debug("gateway: a client went away with {} requests open; aborting them", client->second.open.size());
      for (const auto& [id, request_id] : client->second.open) {
        Request& request = requests_.at(request_id);
        request.gone = true;
        if (!request.abort_sent) send_abort(ctx, request_id, AbortReason::client_gone);
      }
      clients_.erase(client);
    }
    gone_clients_.clear();
  }

  GatewayConfig config_;
  zmq::socket_t socket_;
  std::map<std::uint64_t, Request> requests_;   // open requests by the request id the scheduler knows
  std::map<std::string, Client> clients_;       // clients with open requests, by routing id
  std::map<std::uint64_t, PendingStatus> pending_status_;  // by correlation id
  std::map<std::uint64_t, PendingAdmin> pending_admin_;    // by correlation id
  std::set<std::string> gone_clients_;
  std::vector<Message> drains_;                 // Drains to answer once no request is open
  bool draining_ = false;
  std::uint64_t next_request_id_ = 0;
  std::uint64_t next_correlation_id_ = 0;
  std::uint64_t heartbeat_seq_ = 0;
  std::int64_t last_heard_ns_ = 0;
  std::int64_t cache_writer_heard_ns_ = 0;
  std::int64_t last_heartbeat_ns_ = 0;
  std::int64_t tick_ns_ = 0;
  std::int64_t last_tick_ns_ = 0;
  std::uint64_t served_ = 0;
  std::uint64_t malformed_frames_ = 0;
  std::uint64_t dropped_events_ = 0;
};


}  // namespace

std::unique_ptr<Actor> make_gateway(const ActorOptions& options) {
  check_option_names("gateway", options,
                     {"listen", "scheduler", "enforcer", "cache_writer", "max_requests", "keepalive_ms",
                      "heartbeat_ms", "unavailable_ms"});
  GatewayConfig config;
  if (auto it = options.find("listen"); it != options.end()) config.listen = it->second;
  if (auto it = options.find("scheduler"); it != options.end()) config.scheduler = it->second;
  config.enforcer = text_option(options, "enforcer", "");
  config.cache_writer = text_option(options, "cache_writer", "");
  if (config.listen.find("://") == std::string::npos) {
    throw std::invalid_argument("gateway option listen=" + config.listen + " is not an address such as tcp://127.0.0.1:5555");
  }
  if (config.scheduler.empty()) throw std::invalid_argument("gateway option scheduler= names no actor");
  // Every count and interval is at least 1.
  config.max_requests = number_option("gateway", options, "max_requests", config.max_requests, 1);
  auto ms = [&](const std::string& key, std::chrono::milliseconds fallback) {
    return std::chrono::milliseconds(
        number_option("gateway", options, key, static_cast<std::uint64_t>(fallback.count()), 1));
  };
  config.keepalive = ms("keepalive_ms", config.keepalive);
  config.heartbeat = ms("heartbeat_ms", config.heartbeat);
  config.unavailable = ms("unavailable_ms", config.unavailable);
  if (config.unavailable <= config.heartbeat) {
    throw std::invalid_argument("gateway option unavailable_ms must exceed heartbeat_ms, or a scheduler that answers "
                                "every heartbeat would still be deemed silent");
  }
  return std::make_unique<Gateway>(std::move(config));
}

}  // namespace mqlm::actors
