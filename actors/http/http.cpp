#include "actors/http/http.hpp"

#include <algorithm>
#include <chrono>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "actors/front_end/front_end.hpp"
#include "actors/http/bridge.hpp"
#include "actors/http/http_server.hpp"
#include "actors/http/http_status.hpp"

namespace mqlm::actors {
namespace {

using namespace messages;
using front_end::Caller;
using front_end::OpenRequest;

constexpr std::uint32_t kBridgeWatch = 1;
constexpr std::uint32_t kHistoryTimer = front_end::kCoreTickTimer + 1;
// The status sampler's connection name: handlers' DEALERs have ZeroMQ's routing ids, which start
// with a zero byte, so no handler can be taken for it.
constexpr const char* kSampler = "status-history";
// Handler messages read per wake, so that a burst of HTTP requests cannot starve the inbox.
constexpr int kMaxReadsPerWake = 256;
// Replies queued for one handler before it is deemed stuck (its client stopped reading) and gone.
constexpr int kHandlerSendQueue = 10000;
constexpr std::size_t kMaxPendingStatus = 256;

// The bridge's adapter to the front end's core: the handlers' messages become its calls, its
// answers go back to the handler that asked.
class Http final : public front_end::FrontEndActor {
 public:
  Http(HttpServerConfig server, front_end::FrontEndConfig core, std::chrono::milliseconds history_interval)
      : FrontEndActor(std::move(core)), server_config_(std::move(server)), history_interval_(history_interval) {}

  void on_start(Context& ctx) override {
    zmq::context_t& context = live_context(ctx);
    // Unique per instance: a restarted actor binds while its predecessor's socket may linger.
    bridge_endpoint_ = fmt::format("inproc://mqlm-http-bridge/{}/{}", ctx.self(), static_cast<const void*>(this));
    bridge_ = zmq::socket_t(context, zmq::socket_type::router);
    bridge_.set(zmq::sockopt::router_mandatory, 1);
    bridge_.set(zmq::sockopt::linger, 0);
    bridge_.set(zmq::sockopt::sndhwm, kHandlerSendQueue);
    bridge_.bind(bridge_endpoint_);
    ctx.watch(bridge_, kBridgeWatch);
    try {
      server_ = std::make_unique<HttpServer>(context, bridge_endpoint_, server_config_);
      server_->start();
    } catch (...) {
      server_.reset();
      ctx.unwatch(kBridgeWatch);
      bridge_.close();
      throw;
    }
    started_ns_ = ctx.now_ns();
    core_.start(ctx);
    ctx.set_timer(kHistoryTimer, history_interval_, true);
    spdlog::info("http listening on {}:{} for scheduler '{}'{}", server_config_.host, server_->port(),
                 core_.config().scheduler, server_config_.keys.any() ? " (API key required)" : "");
  }

  void on_stop(Context& ctx) override {
    ctx.cancel_timer(kHistoryTimer);
    core_.stop(ctx);
    // The handlers still waiting see the server stop and give up; stop() joins them.
    if (server_) server_->stop();
    server_.reset();
    ctx.unwatch(kBridgeWatch);
    if (bridge_) bridge_.close();
    spdlog::info("http stopped: {} requests served, {} events for unknown requests", core_.served(),
                 core_.dropped_events());
  }

  void on_readable(Context& ctx, std::uint32_t watch_id) override {
    if (watch_id != kBridgeWatch || !bridge_) return;
    for (int i = 0; i < kMaxReadsPerWake; ++i) {
      std::string handler;
      Frames frames;
      if (!receive_handler_message(handler, frames)) break;
      handle_handler_message(ctx, std::move(handler), std::move(frames));
    }
    core_.settle(ctx);
  }

 private:
  // ---- handler input --------------------------------------------------------------------------

  // [routing id, message frames...]; false when nothing is waiting.
  bool receive_handler_message(std::string& handler, Frames& frames) {
    zmq::message_t routing_id;
    if (!bridge_.recv(routing_id, zmq::recv_flags::dontwait)) return false;
    handler.assign(static_cast<const char*>(routing_id.data()), routing_id.size());
    bool more = routing_id.more();
    while (more) {
      zmq::message_t frame;
      // The rest of a multipart message is there once its first part is.
      if (!bridge_.recv(frame, zmq::recv_flags::dontwait)) break;
      more = frame.more();
      frames.push_back(std::move(frame));
    }
    return true;
  }

  void handle_handler_message(Context& ctx, std::string handler, Frames frames) {
    Caller caller{std::move(handler), std::nullopt, false};
    std::optional<Message> message = http_bridge::decode(std::move(frames));
    if (!message) {
      core_.refuse(ctx, caller, RequestError::internal, "the http actor could not read the request from its handler",
                   false);
      return;
    }
    if (auto* submit = std::get_if<Submit>(&message->payload)) {
      if (core_.is_open(caller)) {
        core_.refuse(ctx, caller, RequestError::internal, "a handler opened a second request on one socket", false);
      } else {
        core_.open(ctx, std::move(caller), std::move(*submit), true);
      }
    } else if (message->as<Abort>() != nullptr) {
      core_.connection_gone(caller.connection);
    } else if (const auto* query = message->as<StatusQuery>()) {
      core_.ask_status(ctx, std::move(caller), query->trim);
    } else if (auto question = admin_question(message->payload)) {
      core_.ask_admin(ctx, std::move(caller), std::move(*question));
    } else {
      spdlog::warn("http: a handler sent a {}", kind_name(message->kind()));
    }
  }

  static std::optional<front_end::AdminQuestion> admin_question(const Payload& payload) {
    if (const auto* load = std::get_if<LoadRequest>(&payload)) return *load;
    if (const auto* unload = std::get_if<UnloadRequest>(&payload)) return *unload;
    if (const auto* models = std::get_if<ModelsQuery>(&payload)) return *models;
    if (const auto* clear = std::get_if<ClearCache>(&payload)) return *clear;
    if (const auto* tokenize = std::get_if<Tokenize>(&payload)) return *tokenize;
    return std::nullopt;
  }

  // ---- the core's answers, to the handler that asked --------------------------------------------

  void send_token(Context&, const OpenRequest& request, const TokenEvent& event) override {
    send_to_handler(request.caller.connection, event);
  }

  void send_final(Context&, const OpenRequest& request, const FinalEvent& event) override {
    send_to_handler(request.caller.connection, event);
  }

  void request_ended(const FinalEvent& event) override { figures_.record(event); }

  void send_accepted(Context&, const OpenRequest& request, const StatusReport& report) override {
    send_to_handler(request.caller.connection, report);
  }

  // The status page's sample: asked like a handler's status, answered into the history.
  void on_timer(Context& ctx, std::uint32_t timer_id) override {
    if (timer_id == kHistoryTimer) core_.ask_status(ctx, Caller{kSampler, std::nullopt, false}, false);
  }

  void send_status(Context& ctx, const Caller& caller, const StatusReport& report, const ModelsReport* memory) override {
    if (caller.connection == kSampler) {
      history_.add(report, memory, ctx.now_ns() - started_ns_);
      return;
    }
    if (memory != nullptr) send_to_handler(caller.connection, *memory);
    http_status::HttpFigures figures = figures_;
    figures.uptime_ns = ctx.now_ns() - started_ns_;
    figures.open_requests = static_cast<std::uint32_t>(core_.open_requests());
    figures.draining = core_.draining();
    figures.history = history_.samples();
    figures.history_interval_s = std::chrono::duration<double>(history_interval_).count();
    figures.history_capacity = static_cast<std::uint32_t>(history_.capacity());
    Frames blobs;
    blobs.push_back(http_bridge::figures_frame(figures));
    send_to_handler(caller.connection, report, std::move(blobs));
  }

  void send_admin_answer(Context&, const Caller& caller, const front_end::AdminAnswer& answer) override {
    std::visit([&](const auto& message) { send_to_handler(caller.connection, message); }, answer);
  }

  // A sample the scheduler did not answer is a gap in the plots.
  void send_error(Context&, const Caller& caller, RequestError code, const std::string& message) override {
    if (caller.connection == kSampler) return;
    send_to_handler(caller.connection, front_end::error_final(code, message));
  }

  // A handler socket that closed, or stopped reading, has its request settled as gone.
  void send_to_handler(const std::string& handler, const Payload& payload, Frames blobs = {}) {
    if (!bridge_) return;
    send_routed(bridge_, handler, http_bridge::encode(payload, std::move(blobs)));
  }

  HttpServerConfig server_config_;
  std::string bridge_endpoint_;
  zmq::socket_t bridge_;
  std::unique_ptr<HttpServer> server_;  // after bridge_: destroyed first, so no handler outlives the socket
  http_status::HttpFigures figures_;
  std::chrono::milliseconds history_interval_;
  http_status::StatusHistory history_;
  std::int64_t started_ns_ = 0;
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
                     {"listen", "scheduler", "enforcer", "cache_writer", "api_key", "api_keys", "admin_api_keys",
                      "cors_origins", "pooling", "max_body_bytes", "max_requests", "threads", "max_connections",
                      "keepalive_ms", "heartbeat_ms", "unavailable_ms", "history_ms"});
  HttpServerConfig server;
  parse_listen(text_option(options, "listen", "127.0.0.1:8080"), server);
  constexpr std::uint64_t kLongestMs = 3'600'000;
  front_end::FrontEndConfig core = front_end::named_config("http", "the http actor", "admin calls");
  front_end::read_core_options(options, kLongestMs, core);
  core.max_pending_status = kMaxPendingStatus;
  // The callers' liveness is the handlers' (SSE keepalives), so the core sends none; a handler
  // commits to a 200 once the scheduler took its request.
  core.confirm_acceptance = true;
  server.keys = front_end::read_api_keys(options);
  const std::string origins = text_option(options, "cors_origins", "");
  for (std::string_view origin : split_option(origins, ',')) {
    if (!origin.empty()) server.cors_origins.emplace_back(origin);
  }
  const std::string pooling = text_option(options, "pooling", "mean");
  if (pooling != "mean" && pooling != "last") {
    throw std::invalid_argument("http: option pooling is '" + pooling + "': it must be mean or last");
  }
  server.pooling = pooling == "mean" ? 1 : 2;
  server.max_body_bytes =
      number_option("http", options, "max_body_bytes", server.max_body_bytes, 1024, front_end::kMaxRequestBytes);
  server.threads = number_option("http", options, "threads", server.threads, 1, 4096);
  server.max_connections = number_option("http", options, "max_connections", server.max_connections, 128, 1'000'000);
  server.sse_keepalive = front_end::milliseconds_option("http", options, "keepalive_ms", server.sse_keepalive, kLongestMs);
  const auto history_interval = front_end::milliseconds_option("http", options, "history_ms",
                                                                std::chrono::milliseconds(10'000), kLongestMs);
  return std::make_unique<Http>(std::move(server), std::move(core), history_interval);
}

}  // namespace mqlm::actors
