#include "actors/gateway/gateway.hpp"

#include <algorithm>
#include <chrono>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>

#include "actors/front_end/api_keys.hpp"
#include "actors/front_end/front_end.hpp"
#include "actors/front_end/model_admin.hpp"
#include "actors/gateway/client_protocol.hpp"
#include "actors/runtime/curve_keys.hpp"
#include "actors/runtime/zap_handler.hpp"

namespace mqlm::actors {
namespace {

using namespace messages;
using front_end::Caller;
using front_end::OpenRequest;
namespace cp = client_protocol;

constexpr std::uint32_t kClientSocketWatch = 1;
constexpr std::uint32_t kZapWatch = 2;
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
// An empty frame to a client with requests open that was sent nothing for this long.
constexpr std::chrono::milliseconds kKeepalive{250};
// On stop, how long the final events of cut-off requests may take to leave.
constexpr int kStopLingerMs = 200;

// CURVE on the client socket: the server's key pair and the clients it lets in (none: any client
// that knows the server's public key).
struct CurveServer {
  curve::KeyPair keys;
  std::optional<std::set<std::string>> allowed_clients;
};

// The client protocol's adapter to the front end's core: client frames become its calls, its
// answers become the protocol's events.
class Gateway final : public front_end::FrontEndActor {
 public:
  Gateway(std::string listen, front_end::FrontEndConfig core, front_end::ApiKeys keys,
          std::optional<CurveServer> curve)
      : FrontEndActor(std::move(core)), listen_(std::move(listen)), keys_(std::move(keys)), curve_(std::move(curve)) {}

  void on_start(Context& ctx) override {
    if (curve_) start_authenticator(ctx);
    socket_ = zmq::socket_t(client_context(ctx), zmq::socket_type::router);
    if (curve_) curve::set_server_options(socket_, curve_->keys);
    socket_.set(zmq::sockopt::router_mandatory, 1);
    socket_.set(zmq::sockopt::linger, 0);
    socket_.set(zmq::sockopt::heartbeat_ivl, kZmtpHeartbeatIntervalMs);
    socket_.set(zmq::sockopt::heartbeat_timeout, kZmtpHeartbeatTimeoutMs);
    socket_.set(zmq::sockopt::maxmsgsize, kMaxMessageBytes);
    socket_.set(zmq::sockopt::sndhwm, kClientSendQueue);
    try {
      socket_.bind(listen_);
    } catch (const zmq::error_t& e) {
      socket_.close();
      throw std::runtime_error("the gateway cannot listen at " + listen_ + ": " + e.what());
    }
    ctx.watch(socket_, kClientSocketWatch);
    core_.start(ctx);
    std::string security;
    if (curve_) {
      security = curve_->allowed_clients ? fmt::format(" (CURVE, allowed client keys: {})", curve_->allowed_clients->size())
                                         : " (CURVE, any client that knows the server's key)";
    }
    spdlog::info("gateway listening on {}{} for scheduler '{}'", listen_, security, core_.config().scheduler);
  }

  void on_stop(Context& ctx) override {
    core_.stop(ctx);
    ctx.unwatch(kClientSocketWatch);
    if (socket_) {
      socket_.set(zmq::sockopt::linger, kStopLingerMs);
      socket_.close();
    }
    spdlog::info("gateway stopped: {} requests served, {} malformed frames, {} events for unknown requests, {} "
                 "CURVE handshakes refused",
                 core_.served(), malformed_frames_, core_.dropped_events(), curve_refused());
    if (zap_) {
      ctx.unwatch(kZapWatch);
      zap_.reset();
    }
    own_context_.reset();
  }

  void on_readable(Context& ctx, std::uint32_t watch_id) override {
    if (watch_id == kZapWatch && zap_) {
      zap_->answer_waiting(ctx.now_ns());
      return;
    }
    if (watch_id != kClientSocketWatch || !socket_) return;
    std::size_t bytes = 0;
    for (int i = 0; i < kMaxReadsPerWake && bytes < kMaxReadBytesPerWake; ++i) {
      Frames frames;
      std::size_t count = 0;
      if (!receive_client_message(frames, count)) break;
      for (const auto& frame : frames) bytes += frame.size();
      handle_client_message(ctx, std::move(frames), count);
    }
    core_.settle(ctx);
  }

 private:
  // The ZAP handler answers every CURVE handshake; it is bound before the client socket, so that
  // no client ever finds the socket without it (which set_server_options makes a refusal anyway).
  // Both live in a ZeroMQ context of their own: a context has one ZAP handler, and the node's may
  // be the links' (runtime/links.hpp), which lets in the deployment's processes, not its clients.
  void start_authenticator(Context& ctx) {
    live_context(ctx);  // a replay has none: say so before making one
    own_context_.emplace(1);
    zap_.emplace(*own_context_, curve_->allowed_clients);
    ctx.watch(zap_->socket(), kZapWatch);
  }

  zmq::context_t& client_context(Context& ctx) { return own_context_ ? *own_context_ : live_context(ctx); }

  std::uint64_t curve_refused() const { return zap_ ? zap_->refused() : 0; }

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
    Caller caller{std::string(static_cast<const char*>(frames[0].data()), frames[0].size()), std::nullopt,
                  frames.size() >= 3 && frames[1].size() == 0};
    const std::size_t body_index = caller.delimited ? 2 : 1;
    if (count != body_index + 1) {
      reject_frame(ctx, caller, cp::RequestProblem{RequestError::malformed,
                                                   "a message is one frame holding one msgpack map (after an empty "
                                                   "delimiter, from REQ); this one had " +
                                                       std::to_string(count - 1) + " frames",
                                                   std::nullopt, false});
      return;
    }
    const zmq::message_t& body = frames[body_index];
    // An empty frame is a keepalive, ours or a client's; nothing to answer.
    if (body.size() == 0) return;
    std::string key;
    auto request =
        cp::parse_request(std::span<const std::byte>(static_cast<const std::byte*>(body.data()), body.size()), &key);
    if (auto refusal = refused(request, key)) request = std::move(*refusal);
    if (auto* generate = std::get_if<cp::GenerateRequest>(&request)) {
      start_generate(ctx, std::move(caller), std::move(*generate));
    } else if (const auto* abort = std::get_if<cp::AbortRequest>(&request)) {
      caller.id = abort->id;
      core_.abort(ctx, caller);
    } else if (auto* status = std::get_if<cp::StatusRequest>(&request)) {
      caller.id = std::move(status->id);
      core_.ask_status(ctx, std::move(caller), status->trim);
    } else if (auto* admin = std::get_if<cp::AdminRequest>(&request)) {
      caller.id = admin->id;
      core_.ask_admin(ctx, std::move(caller), admin_question(*admin));
    } else {
      reject_frame(ctx, caller, std::get<cp::RequestProblem>(std::move(request)));
    }
  }

  // The request as a problem when its key does not allow it (keys_.check), as on HTTP.
  std::optional<cp::RequestProblem> refused(const cp::ClientRequest& request, const std::string& key) const {
    if (std::holds_alternative<cp::RequestProblem>(request)) return std::nullopt;
    const auto* admin = std::get_if<cp::AdminRequest>(&request);
    const bool changes_server = admin != nullptr && admin->op != cp::AdminOp::models;
    using Verdict = front_end::ApiKeys::Verdict;
    const Verdict verdict = keys_.check(key, changes_server);
    if (verdict == Verdict::allowed) return std::nullopt;
    cp::RequestProblem problem;
    problem.generate = std::holds_alternative<cp::GenerateRequest>(request);
    std::visit(
        [&](const auto& r) {
          if constexpr (requires { r.id; }) problem.id = r.id;
        },
        request);
    if (verdict == Verdict::forbidden) {
      problem.code = RequestError::forbidden;
      problem.message = "load, unload and clear_cache take an admin key (--admin-api-key) as api_key";
    } else {
      problem.code = RequestError::unauthorized;
      problem.message = key.empty() ? "this server wants an API key: send it as api_key" : "incorrect API key";
    }
    return problem;
  }

  static front_end::AdminQuestion admin_question(const cp::AdminRequest& request) {
    switch (request.op) {
      case cp::AdminOp::load: return LoadRequest{request.model};
      case cp::AdminOp::unload: return UnloadRequest{request.model, request.if_idle};
      case cp::AdminOp::models: return ModelsQuery{request.model};
      case cp::AdminOp::clear_cache: break;
    }
    return ClearCache{static_cast<std::uint8_t>(request.tier)};
  }

  // Bad input is the client's problem, not the server's: counted and logged at debug level.
  void reject_frame(Context& ctx, Caller caller, cp::RequestProblem problem) {
    ++malformed_frames_;
    spdlog::debug("gateway: rejected client frame #{} ({}): {}", malformed_frames_,
                  front_end::error_code_name(problem.code), problem.message);
    caller.id = problem.id;
    if (problem.generate && problem.id) {
      core_.refuse(ctx, caller, problem.code, std::move(problem.message), false);
    } else {
      send_error(ctx, caller, problem.code, problem.message);
    }
  }

  void start_generate(Context& ctx, Caller caller, cp::GenerateRequest request) {
    caller.id = request.id;
    if (core_.is_open(caller)) {
      core_.refuse(ctx, caller, RequestError::invalid_request,
                   "id " + cp::describe(request.id) + " is already open: ids must be unique among your open requests",
                   request.submit.sampling.logprobs);
      return;
    }
    core_.open(ctx, std::move(caller), std::move(request.submit), request.stream);
  }

  // ---- the core's answers, as the protocol's events ----------------------------------------------

  void send_token(Context& ctx, const OpenRequest& request, const TokenEvent& event) override {
    send_to_client(ctx, request.caller, cp::encode_token_event(*request.caller.id, event, request.logprobs));
  }

  void send_final(Context& ctx, const OpenRequest& request, const FinalEvent& event) override {
    send_to_client(ctx, request.caller,
                   cp::encode_final_event(*request.caller.id, event, request.gathered, request.logprobs));
  }

  void send_status(Context& ctx, const Caller& caller, const StatusReport& report, const ModelsReport* memory) override {
    send_to_client(ctx, caller,
                   cp::encode_status_event(caller.id, report, {core_.open_requests(), curve_refused()}, memory));
  }

  void send_error(Context& ctx, const Caller& caller, RequestError code, const std::string& message) override {
    send_to_client(ctx, caller, cp::encode_error_event(code, message, caller.id));
  }

  // Not to REQ-framed clients: a REQ socket would take the empty frame for its one answer.
  void send_keepalive(Context& ctx, const Caller& caller) override {
    if (!caller.delimited) send_to_client(ctx, caller, {});
  }

  void send_admin_answer(Context& ctx, const Caller& caller, const front_end::AdminAnswer& answer) override {
    if (const auto* load = std::get_if<LoadAnswer>(&answer)) {
      if (auto refusal = model_admin::load_refusal(*load)) {
        send_refusal(ctx, caller, std::move(*refusal), load->model);
      } else {
        send_to_client(ctx, caller, cp::encode_json_event("model", caller.id, model_admin::loaded_json(*load)));
      }
    } else if (const auto* unload = std::get_if<UnloadAnswer>(&answer)) {
      if (auto refusal = model_admin::unload_refusal(*unload)) {
        refusal->figures = nlohmann::json::object();
        send_refusal(ctx, caller, std::move(*refusal), unload->model);
      } else {
        send_to_client(ctx, caller, cp::encode_json_event("model", caller.id, model_admin::unload_json(*unload)));
      }
    } else if (const auto* models = std::get_if<ModelsReport>(&answer)) {
      send_to_client(ctx, caller, cp::encode_json_event("models", caller.id, model_admin::memory_json(*models)));
    } else if (const auto* cleared = std::get_if<CacheCleared>(&answer)) {
      send_to_client(ctx, caller,
                     cp::encode_json_event("cache_cleared", caller.id, model_admin::cleared_json(*cleared)));
    }
  }

  // A load or unload that did not happen: an error event with its figures beside code and message.
  void send_refusal(Context& ctx, const Caller& caller, model_admin::Refusal refusal, const std::string& model) {
    nlohmann::json fields = std::move(refusal.figures);
    fields["code"] = front_end::error_code_name(refusal.code);
    fields["message"] = refusal.message;
    fields["model"] = model;
    send_to_client(ctx, caller, cp::encode_json_event("error", caller.id, std::move(fields)));
  }

  // A REQ client's messages come after an empty delimiter, as its requests did.
  void send_to_client(Context& ctx, const Caller& caller, std::string_view body) {
    if (!socket_) return;
    Frames frames;
    if (caller.delimited) frames.emplace_back();
    frames.emplace_back(body.data(), body.size());
    if (send_routed(socket_, caller.connection, std::move(frames))) core_.sent_to(caller.connection, ctx.now_ns());
  }

  std::string listen_;
  std::optional<zmq::context_t> own_context_;  // with CURVE; declared first, so closed after its sockets
  zmq::socket_t socket_;
  front_end::ApiKeys keys_;
  std::optional<CurveServer> curve_;
  std::optional<ZapHandler> zap_;
  std::uint64_t malformed_frames_ = 0;
};

// curve_key=FILE (a key pair from `mqlm keygen`) and curve_clients=PATH (allowed client keys: a
// file of them or a directory of *.pub files), read now: a file that will not do fails the start.
std::optional<CurveServer> read_curve_options(const ActorOptions& options) {
  const std::string key_file = text_option(options, "curve_key", "");
  const std::string clients = text_option(options, "curve_clients", "");
  if (key_file.empty()) {
    if (!clients.empty()) {
      throw std::invalid_argument("gateway option curve_clients needs curve_key (the server's key pair)");
    }
    return std::nullopt;
  }
  if (!curve::available()) {
    throw std::invalid_argument("this libzmq was built without CURVE (libsodium), so curve_key cannot be used");
  }
  auto keys = curve::read_key_pair(key_file);
  if (auto* error = std::get_if<curve::KeyError>(&keys)) throw std::invalid_argument(error->message);
  CurveServer curve{std::get<curve::KeyPair>(std::move(keys)), std::nullopt};
  if (!clients.empty()) {
    auto allowed = curve::read_allowed_clients(clients);
    if (auto* error = std::get_if<curve::KeyError>(&allowed)) throw std::invalid_argument(error->message);
    curve.allowed_clients = std::get<std::set<std::string>>(std::move(allowed));
  }
  return curve;
}

}  // namespace

std::unique_ptr<Actor> make_gateway(const ActorOptions& options) {
  check_option_names("gateway", options,
                     {"listen", "scheduler", "enforcer", "cache_writer", "max_requests", "keepalive_ms",
                      "heartbeat_ms", "unavailable_ms", "api_key", "api_keys", "admin_api_keys", "curve_key",
                      "curve_clients"});
  std::string listen = text_option(options, "listen", "tcp://127.0.0.1:5555");
  if (listen.find("://") == std::string::npos) {
    throw std::invalid_argument("gateway option listen=" + listen + " is not an address such as tcp://127.0.0.1:5555");
  }
  // Every count and interval is at least 1.
  constexpr std::uint64_t kNoLongest = std::numeric_limits<std::uint64_t>::max();
  front_end::FrontEndConfig core = front_end::named_config("gateway", "the gateway", "admin requests");
  front_end::read_core_options(options, kNoLongest, core);
  core.max_pending_status = kMaxPendingStatus;
  core.keepalive = front_end::milliseconds_option("gateway", options, "keepalive_ms", kKeepalive, kNoLongest);
  std::optional<CurveServer> curve = read_curve_options(options);
  return std::make_unique<Gateway>(std::move(listen), std::move(core), front_end::read_api_keys(options),
                                   std::move(curve));
}

}  // namespace mqlm::actors
