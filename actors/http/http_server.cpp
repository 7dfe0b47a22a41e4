#include "actors/http/http_server.hpp"

#include <algorithm>
#include <cctype>
#include <deque>
#include <optional>
#include <random>
#include <stdexcept>
#include <variant>

#include <spdlog/spdlog.h>

#include "actors/front_end/events.hpp"
#include "actors/front_end/model_admin.hpp"
#include "actors/http/bridge.hpp"
#include "actors/http/http_status.hpp"
#include "actors/http/http_transport.hpp"
#include "actors/http/status_page.hpp"
#include "actors/http/openai_embeddings.hpp"
#include "actors/http/openai_json.hpp"

namespace mqlm::actors {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using messages::Message;
using openai::ApiError;
using openai::Endpoint;

// How often a handler that waits for the actor looks whether the server is stopping.
constexpr auto kPollTick = 50ms;
// How long a handler's last frames (its "gone") may wait to reach the actor when it closes.
constexpr int kBridgeLingerMs = 1000;
// A load waits for the upload (minutes for a large model from a slow disk), an unload with
// wait=true for the model's requests to end.
constexpr auto kAdminTimeout = 600s;
// How long a browser may reuse a CORS preflight's answer (a day, Chromium's cap is 2 hours).
constexpr int kCorsMaxAgeS = 86400;

// What the actor says about the server (bridge.hpp): the scheduler's report, the actor's figures
// and, when the server has an enforcer that answered, its memory report.
struct StatusAnswer {
  messages::StatusReport report;
  http_status::HttpFigures figures;
  std::optional<messages::ModelsReport> memory;
};

Message internal_failure(std::string message) {
  Message failure;
  failure.payload = front_end::error_final(messages::RequestError::internal, std::move(message));
  return failure;
}

// One request's DEALER socket to the actor. Destroying it while its request is open tells the
// actor the client is gone, whichever way the handler ended (client closed, server stopping,
// an exception).
class BridgeCall {
 public:
  BridgeCall(zmq::context_t& context, const std::string& bridge) : socket_(context, zmq::socket_type::dealer) {
    socket_.set(zmq::sockopt::linger, kBridgeLingerMs);
    socket_.connect(bridge);
  }
  ~BridgeCall() {
    if (open_) send(messages::Abort{static_cast<std::uint8_t>(messages::AbortReason::client_gone)});
  }
  BridgeCall(const BridgeCall&) = delete;
  BridgeCall& operator=(const BridgeCall&) = delete;

  bool open(const messages::Submit& submit) {
    open_ = send(submit);
    return open_;
  }
  // A StatusQuery, or an admin question (LoadRequest, UnloadRequest, ClearCache).
  bool ask(const messages::Payload& question) { return send(question); }
  // The request's final arrived: nothing to abort any more.
  void ended() { open_ = false; }

  // The next reply within `timeout`, or nullopt.
  std::optional<Message> receive(std::chrono::milliseconds timeout) {
    zmq::pollitem_t item{socket_.handle(), 0, ZMQ_POLLIN, 0};
    if (zmq::poll(&item, 1, timeout) == 0) return std::nullopt;
    messages::Frames frames;
    while (true) {
      zmq::message_t frame;
      if (!socket_.recv(frame, zmq::recv_flags::dontwait)) break;
      const bool more = frame.more();
      frames.push_back(std::move(frame));
      if (!more) break;
    }
    if (frames.empty()) return std::nullopt;
    if (auto reply = http_bridge::decode(std::move(frames))) return reply;
    return internal_failure("the http actor sent an undecodable answer");
  }

 private:
  bool send(const messages::Payload& payload) {
    try {
      messages::Frames frames = http_bridge::encode(payload);
      for (std::size_t i = 0; i < frames.size(); ++i) {
        const bool last = i + 1 == frames.size();
        const auto flags = last ? zmq::send_flags::dontwait : zmq::send_flags::sndmore | zmq::send_flags::dontwait;
        if (!socket_.send(frames[i], flags)) return false;
      }
      return true;
    } catch (const zmq::error_t& e) {
      spdlog::warn("http: a handler could not reach the actor: {}", e.what());
      return false;
    }
  }

  zmq::socket_t socket_;
  bool open_ = false;
};

// A streaming request's life after its headers went out: the actor's replies become SSE chunks,
// with a keepalive comment whenever nothing was written for a while. A write that fails means
// the client went away; returning false then ends the response, and the BridgeCall's end tells
// the actor.
class SseStream {
 public:
  SseStream(std::shared_ptr<BridgeCall> call, const http::Transport& server, openai::StreamRenderer renderer,
            std::deque<Message> early, std::chrono::milliseconds keepalive)
      : call_(std::move(call)),
        server_(server),
        renderer_(std::move(renderer)),
        early_(std::move(early)),
        keepalive_(keepalive) {}

  // The transport calls this until it returns false or the sink is done.
  bool pump(http::DataSink& sink) {
    if (!started_) {
      started_ = true;
      if (!write(sink, renderer_.start())) return false;
      while (!early_.empty() && !finished_) {
        Message reply = std::move(early_.front());
        early_.pop_front();
        if (!handle(sink, std::move(reply))) return false;
      }
      if (finished_) return true;
    }
    if (server_.stopping()) return false;
    auto reply = call_->receive(kPollTick);
    if (!reply) return Clock::now() - last_write_ < keepalive_ || write(sink, openai::kSseKeepalive);
    // Whatever else is there already goes out in the same turn.
    while (reply && !finished_) {
      if (!handle(sink, std::move(*reply))) return false;
      if (!finished_) reply = call_->receive(0ms);
    }
    return true;
  }

 private:
  // A StatusReport (the scheduler took the request) says nothing the stream shows.
  bool handle(http::DataSink& sink, Message reply) {
    if (const auto* event = reply.as<messages::TokenEvent>()) return write(sink, renderer_.tokens(*event));
    if (const auto* final_event = reply.as<messages::FinalEvent>()) {
      call_->ended();
      finished_ = true;
      if (!write(sink, renderer_.finish(*final_event))) return false;
      sink.done();
    }
    return true;
  }

  bool write(http::DataSink& sink, std::string_view text) {
    if (text.empty()) return true;
    if (!sink.write(text.data(), text.size())) return false;
    last_write_ = Clock::now();
    return true;
  }

  std::shared_ptr<BridgeCall> call_;
  const http::Transport& server_;
  openai::StreamRenderer renderer_;
  std::deque<Message> early_;
  std::chrono::milliseconds keepalive_;
  bool started_ = false;
  bool finished_ = false;
  Clock::time_point last_write_ = Clock::now();
};

std::mt19937_64& thread_random() {
  thread_local std::mt19937_64 engine{std::random_device{}()};
  return engine;
}

std::string response_id(Endpoint endpoint) {
  static constexpr char kAlphabet[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  std::uniform_int_distribution<std::size_t> pick(0, sizeof(kAlphabet) - 2);
  std::string id = endpoint == Endpoint::chat ? "chatcmpl-" : "cmpl-";
  for (int i = 0; i < 24; ++i) id += kAlphabet[pick(thread_random())];
  return id;
}

std::int64_t unix_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void reply_error(http::Response& res, const ApiError& error) {
  res.status = error.status;
  res.set_content(openai::error_body(error), "application/json");
}

ApiError server_error(int status, std::string message, std::string code) {
  return ApiError{status, "server_error", std::move(message), std::nullopt, std::move(code)};
}

bool starts_with_ignoring_case(std::string_view text, std::string_view prefix) {
  if (text.size() < prefix.size()) return false;
  for (std::size_t i = 0; i < prefix.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(text[i])) != std::tolower(static_cast<unsigned char>(prefix[i]))) {
      return false;
    }
  }
  return true;
}

}  // namespace

class HttpServer::Impl {
 public:
  Impl(zmq::context_t& context, std::string bridge, HttpServerConfig config)
      : context_(context), bridge_(std::move(bridge)), config_(std::move(config)), server(transport_config(config_)) {
    server.set_error_handler([this](const http::Request& req, http::Response& res) { fill_error(req, res); });
    server.set_exception_handler([](const http::Request& req, http::Response& res, const std::string& what) {
      spdlog::error("http: {} {} failed: {}", req.method, req.path, what);
      reply_error(res, server_error(500, "the server failed on this request: " + what, "internal_error"));
    });
    server.set_authorizer([this](const http::Request& req, http::Response& res, http::Access access) {
      return !authorized(req, res, access == http::Access::admin);
    });
    if (!config_.cors_origins.empty()) {
      server.set_pre_routing([this](const http::Request& req, http::Response& res) { return cors(req, res); });
    }
    route();
  }

 private:
  zmq::context_t& context_;
  std::string bridge_;
  HttpServerConfig config_;

 public:
  http::Transport server;

 private:
  using Handler = void (Impl::*)(const http::Request&, http::Response&) const;

  static http::TransportConfig transport_config(const HttpServerConfig& config) {
    http::TransportConfig transport;
    transport.host = config.host;
    transport.port = config.port;
    transport.max_body_bytes = config.max_body_bytes;
    transport.threads = config.threads;
    transport.max_connections = config.max_connections;
    return transport;
  }

  void route() {
    auto bound = [this](Handler handler) {
      return [this, handler](const http::Request& req, http::Response& res) { (this->*handler)(req, res); };
    };
    server.Post("/v1/chat/completions", bound(&Impl::chat));
    server.Post("/v1/completions", bound(&Impl::completions));
    server.Post("/v1/embeddings", bound(&Impl::embeddings));
    server.Get("/v1/models", bound(&Impl::models));
    server.Get(R"(/v1/models/(.+))", bound(&Impl::one_model));
    server.Get("/api/status", bound(&Impl::status));
    server.Get("/metrics", bound(&Impl::metrics));
    server.Post(R"(/api/models/([^/]+)/load)", bound(&Impl::load_model), http::Access::admin);
    server.Post(R"(/api/models/([^/]+)/unload)", bound(&Impl::unload_model), http::Access::admin);
    server.Post("/api/hot-cache/clear", bound(&Impl::clear_hot_cache), http::Access::admin);
    server.Post("/api/ssd-cache/clear", bound(&Impl::clear_ssd_cache), http::Access::admin);
    server.Post("/tokenize", bound(&Impl::tokenize));
    server.Post("/detokenize", bound(&Impl::detokenize));
    server.Get("/health", bound(&Impl::health), http::Access::open);
    server.Get("/ready", bound(&Impl::ready), http::Access::open);
    server.Get("/live", bound(&Impl::live), http::Access::open);
    server.Get("/", [](const http::Request&, http::Response& res) { page(res); }, http::Access::open);
  }

  // CORS, before routing: a browser sends its preflight without the API key, and every answer to
  // an allowed origin (errors included, so that the page can read them) needs the header.
  bool cors(const http::Request& req, http::Response& res) const {
    const std::string origin = req.get_header_value("Origin");
    const auto& origins = config_.cors_origins;
    const bool any = std::find(origins.begin(), origins.end(), "*") != origins.end();
    const bool allowed = any || std::find(origins.begin(), origins.end(), origin) != origins.end();
    if (origin.empty() || !allowed) return false;
    res.set_header("Access-Control-Allow-Origin", any ? "*" : origin);
    // The answer differs by origin, so caches must not give one origin's to another.
    if (!any) res.set_header("Vary", "Origin");
    if (req.method != "OPTIONS") return false;
    // The headers the page asks for are allowed (OpenAI's SDKs send x-stainless-* ones), and
    // always the two an API call needs.
    std::string headers = "Authorization, Content-Type";
    if (const std::string asked = req.get_header_value("Access-Control-Request-Headers"); !asked.empty()) {
      headers += ", " + asked;
    }
    res.status = 204;
    res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
    res.set_header("Access-Control-Allow-Headers", headers);
    res.set_header("Access-Control-Max-Age", std::to_string(kCorsMaxAgeS));
    return true;
  }

  // The answers the transport gives itself (no route, a body over the limit, an unreadable
  // request) carry OpenAI's JSON too.
  void fill_error(const http::Request& req, http::Response& res) const {
    if (!res.body.empty()) return;
    ApiError error = openai::invalid_request("the request could not be read as HTTP", std::nullopt, "bad_request");
    switch (res.status) {
      case 404:
      case 405:
        error = openai::invalid_request(
            "Unknown request URL: " + req.method.substr(0, 16) + " " + req.path.substr(0, 256) +
                " (this server has POST /v1/chat/completions, POST /v1/completions, POST /v1/embeddings, GET "
                "/v1/models, POST "
                "/tokenize, POST /detokenize, GET /health, GET /ready, GET /live, GET / (the status page), GET /api/status, GET /metrics, POST "
                "/api/models/{id}/load, POST /api/models/{id}/unload, POST /api/hot-cache/clear and POST "
                "/api/ssd-cache/clear)",
            std::nullopt, "unknown_url");
        break;
      case 408:
        error = openai::invalid_request("the request body did not arrive in time", std::nullopt, "request_timeout");
        break;
      case 413:
        error = openai::invalid_request("the request body is over this server's limit of " +
                                            std::to_string(config_.max_body_bytes) + " bytes",
                                        std::nullopt, "request_too_large");
        break;
      case 415:
        error = openai::invalid_request("Content-Encoding " + req.get_header_value("Content-Encoding").substr(0, 64) +
                                            " is not taken: send the body uncompressed",
                                        std::nullopt, "unsupported_encoding");
        break;
      case 431:
        error = openai::invalid_request("the request's headers are over this server's limit", std::nullopt,
                                        "headers_too_large");
        break;
      default:
        if (res.status >= 500) error = server_error(res.status, "the server could not answer", "internal_error");
    }
    error.status = res.status;
    reply_error(res, error);
  }

  bool authorized(const http::Request& req, http::Response& res, bool admin_route) const {
    if (!config_.keys.any()) return true;
    constexpr std::string_view kScheme = "Bearer ";
    const std::string header = req.get_header_value("Authorization");
    const std::string_view key =
        starts_with_ignoring_case(header, kScheme) ? std::string_view(header).substr(kScheme.size()) : "";
    using Verdict = front_end::ApiKeys::Verdict;
    const Verdict verdict = config_.keys.check(key, admin_route);
    if (verdict == Verdict::allowed) return true;
    if (verdict == Verdict::forbidden) {
      reply_error(res, ApiError{403, "invalid_request_error",
                                "this endpoint changes the server: it takes an admin key (--admin-api-key)",
                                std::nullopt, "forbidden"});
      return false;
    }
    reply_error(res, ApiError{401, "invalid_request_error",
                              header.empty() ? "You didn't provide an API key: send it as Authorization: Bearer KEY"
                                             : "Incorrect API key provided",
                              std::nullopt, "invalid_api_key"});
    res.set_header("WWW-Authenticate", "Bearer");
    return false;
  }

  // The next reply, or nullopt when the deadline passed, the server is stopping or the client
  // (when given) hung up: a request nobody will read is given up within a tick, and the
  // BridgeCall's end aborts it.
  std::optional<Message> await(BridgeCall& call, std::optional<Clock::time_point> deadline = std::nullopt,
                               const http::Request* client = nullptr) const {
    while (!server.stopping() && (client == nullptr || !client->connection_closed())) {
      auto wait = std::chrono::milliseconds(kPollTick);
      if (deadline) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*deadline - Clock::now());
        if (left <= 0ms) return std::nullopt;
        wait = std::min(wait, left);
      }
      if (auto reply = call.receive(wait)) return reply;
    }
    return std::nullopt;
  }

  // ---- completions ----------------------------------------------------------------------------

  void chat(const http::Request& req, http::Response& res) const { complete(Endpoint::chat, req, res); }
  void completions(const http::Request& req, http::Response& res) const {
    complete(Endpoint::completions, req, res);
  }

  void complete(Endpoint endpoint, const http::Request& req, http::Response& res) const {
    auto parsed = openai::parse_completion_request(endpoint, req.body, thread_random()());
    if (auto* error = std::get_if<ApiError>(&parsed)) {
      reply_error(res, *error);
      return;
    }
    auto& request = std::get<openai::CompletionRequest>(parsed);
    auto call = std::make_shared<BridgeCall>(context_, bridge_);
    if (!call->open(request.submit)) {
      reply_error(res, server_error(503, "the server cannot take requests now: try again later", "unavailable"));
      return;
    }
    openai::ResponseIdentity identity{response_id(endpoint), unix_seconds()};
    if (request.stream) {
      stream(std::move(call), std::move(request), std::move(identity), req, res);
    } else {
      gather(*call, request, identity, req, res);
    }
  }

  void gather(BridgeCall& call, const openai::CompletionRequest& request, const openai::ResponseIdentity& identity,
              const http::Request& req, http::Response& res) const {
    front_end::GatheredOutput output;
    while (auto reply = await(call, std::nullopt, &req)) {
      if (auto* event = std::get_if<messages::TokenEvent>(&reply->payload)) {
        output.append(std::move(*event));
      } else if (const auto* final_event = reply->as<messages::FinalEvent>()) {
        call.ended();
        if (!openai::finish_reason(*final_event)) {
          reply_error(res, openai::error_for(*final_event));
          return;
        }
        res.set_content(openai::dump(openai::completion_body(request, identity, output, *final_event)),
                        "application/json");
        return;
      }
    }
    reply_error(res, server_error(503, "the server stopped, or the client left, before this request finished",
                                  "shutting_down"));
  }

  // ---- embeddings (openai_embeddings.hpp) ------------------------------------------------------

  // Every input is a request of its own, kInputsAtOnce of them open at once so that the scheduler
  // batches them; leaving early (an error, the server stopping) aborts those still open.
  void embeddings(const http::Request& req, http::Response& res) const {
    constexpr std::size_t kInputsAtOnce = 32;
    auto parsed = openai::parse_embedding_request(req.body, config_.pooling);
    if (auto* error = std::get_if<ApiError>(&parsed)) return reply_error(res, *error);
    const auto& request = std::get<openai::EmbeddingRequest>(parsed);
    std::vector<messages::FinalEvent> finals;
    for (std::size_t first = 0; first < request.submits.size(); first += kInputsAtOnce) {
      std::vector<std::unique_ptr<BridgeCall>> calls;
      for (std::size_t i = first; i < std::min(first + kInputsAtOnce, request.submits.size()); ++i) {
        calls.push_back(std::make_unique<BridgeCall>(context_, bridge_));
        if (!calls.back()->open(request.submits[i])) {
          return reply_error(res,
                             server_error(503, "the server cannot take requests now: try again later", "unavailable"));
        }
      }
      for (auto& call : calls) {
        std::optional<messages::FinalEvent> final_event = await_final(*call, req);
        if (!final_event) {
          return reply_error(res, server_error(503, "the server stopped, or the client left, before this request "
                                                    "finished",
                                               "shutting_down"));
        }
        finals.push_back(std::move(*final_event));
      }
    }
    auto body = openai::embeddings_json(request, finals);
    if (auto* error = std::get_if<ApiError>(&body)) return reply_error(res, *error);
    res.set_content(openai::dump(std::get<nlohmann::json>(body)), "application/json");
  }

  // The request's FinalEvent (what comes before it, such as the scheduler's acceptance, is not
  // wanted), or nullopt when the server stops or the client leaves first.
  std::optional<messages::FinalEvent> await_final(BridgeCall& call, const http::Request& req) const {
    while (auto reply = await(call, std::nullopt, &req)) {
      if (auto* final_event = std::get_if<messages::FinalEvent>(&reply->payload)) {
        call.ended();
        return std::move(*final_event);
      }
    }
    return std::nullopt;
  }

  // The status line waits for the scheduler's first word on the request, so that a refusal
  // (unknown model, queue full, prompt too long) is an HTTP error; once it is accepted, the
  // headers go out and keepalives with them. The first word is a token, the final or the
  // StatusReport that says the scheduler took the request.
  void stream(std::shared_ptr<BridgeCall> call, openai::CompletionRequest request, openai::ResponseIdentity identity,
              const http::Request& req, http::Response& res) const {
    std::deque<Message> early;
    while (early.empty()) {
      auto reply = await(*call, std::nullopt, &req);
      if (!reply) {
        reply_error(res, server_error(503, "the server stopped before this request started", "shutting_down"));
        return;
      }
      if (const auto* final_event = reply->as<messages::FinalEvent>();
          final_event != nullptr && !openai::finish_reason(*final_event)) {
        call->ended();
        reply_error(res, openai::error_for(*final_event));
        return;
      }
      early.push_back(std::move(*reply));
    }
    auto sse = std::make_shared<SseStream>(std::move(call), server,
                                           openai::StreamRenderer(std::move(request), std::move(identity)),
                                           std::move(early), config_.sse_keepalive);
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    res.set_chunked_content_provider("text/event-stream",
                                     [sse](http::DataSink& sink) { return sse->pump(sink); });
  }

  // ---- status ---------------------------------------------------------------------------------

  // The actor's status answer, or the error response already written.
  // trim: the executor trims its pool first, so the pool's figures are after the trim.
  std::optional<StatusAnswer> ask_status(http::Response& res, bool trim = false) const {
    BridgeCall call(context_, bridge_);
    if (call.ask(messages::StatusQuery{trim})) {
      const auto deadline = Clock::now() + config_.status_timeout;
      std::optional<messages::ModelsReport> memory;
      while (auto reply = await(call, deadline)) {
        if (const auto* report = reply->as<messages::StatusReport>()) {
          auto figures = http_bridge::figures_of(*reply);
          if (!figures) break;
          return StatusAnswer{*report, std::move(*figures), std::move(memory)};
        }
        if (const auto* models = reply->as<messages::ModelsReport>()) memory = *models;
        if (const auto* failure = reply->as<messages::FinalEvent>()) {
          reply_error(res, openai::error_for(*failure));
          return std::nullopt;
        }
      }
    }
    reply_error(res, server_error(503, "the server did not answer a status question in time: try again later",
                                  "unavailable"));
    return std::nullopt;
  }

  static const messages::ModelsReport* memory_of(const StatusAnswer& answer) {
    return answer.memory ? &*answer.memory : nullptr;
  }

  void status(const http::Request& req, http::Response& res) const {
    if (auto answer = ask_status(res, flag(req, "trim"))) {
      res.set_content(openai::dump(http_status::status_json(answer->report, answer->figures, memory_of(*answer),
                                                            flag(req, "history"))),
                      "application/json");
    }
  }

  // The status page, without the key: its own API calls ask for it when they get 401.
  static void page(http::Response& res) {
    res.set_header("Content-Security-Policy", std::string(status_page::kContentSecurityPolicy));
    res.set_content(std::string(status_page::html()), "text/html; charset=utf-8");
  }

  void metrics(const http::Request&, http::Response& res) const {
    if (auto answer = ask_status(res)) {
      res.set_content(http_status::prometheus_text(answer->report, answer->figures, memory_of(*answer)),
                      "text/plain; version=0.0.4; charset=utf-8");
    }
  }

  // ---- the model pool -------------------------------------------------------------------------

  // The answer of type T to `question`, or the error response already written. An unload is
  // answered twice (draining, then its end): wait_for_end skips the first.
  template <typename T>
  std::optional<T> ask_admin(const messages::Payload& question, http::Response& res,
                             bool wait_for_end = false) const {
    BridgeCall call(context_, bridge_);
    if (call.ask(question)) {
      const auto deadline = Clock::now() + kAdminTimeout;
      while (auto reply = await(call, deadline)) {
        if (const auto* failure = reply->as<messages::FinalEvent>()) {
          reply_error(res, openai::error_for(*failure));
          return std::nullopt;
        }
        const T* answer = reply->as<T>();
        if (answer == nullptr || (wait_for_end && draining(*answer))) continue;
        return *answer;
      }
    }
    reply_error(res, server_error(503, "the server did not answer in time, or is stopping: try again later",
                                  "unavailable"));
    return std::nullopt;
  }

  template <typename T>
  static bool draining(const T& answer) {
    if constexpr (std::is_same_v<T, messages::UnloadAnswer>) {
      return static_cast<messages::UnloadOutcome>(answer.outcome) == messages::UnloadOutcome::draining;
    }
    return false;
  }

  // A refusal as OpenAI's error body, with its figures beside message and code (a 507 says what
  // was needed, what could be made free, the ceiling and the pinned models).
  static void reply_refusal(http::Response& res, const model_admin::Refusal& refusal, int status_override = 0) {
    ApiError error = openai::error_for(front_end::error_final(refusal.code, refusal.message));
    if (status_override != 0) {
      error.status = status_override;
      error.code = "model_busy";
    }
    nlohmann::json body = openai::error_json(error);
    for (const auto& [key, value] : refusal.figures.items()) body["error"][key] = value;
    res.status = error.status;
    res.set_content(openai::dump(body), "application/json");
  }

  static bool flag(const http::Request& req, const std::string& name) {
    const std::string value = req.get_param_value(name);
    return value == "1" || value == "true";
  }

  // 200 once loaded (evictions listed); 404 unknown; 507 does not fit, with the figures; 500 the
  // load failed.
  void load_model(const http::Request& req, http::Response& res) const {
    auto answer = ask_admin<messages::LoadAnswer>(messages::LoadRequest{req.matches[1]}, res);
    if (!answer) return;
    if (auto refusal = model_admin::load_refusal(*answer)) {
      reply_refusal(res, *refusal);
      return;
    }
    res.set_content(openai::dump(model_admin::loaded_json(*answer)), "application/json");
  }

  // 202 draining (its requests end, then its memory is freed); ?wait=true: 200 once freed, with
  // the bytes; 200 when it was not loaded; ?if_idle=true: 409 while requests use it; 404 unknown.
  void unload_model(const http::Request& req, http::Response& res) const {
    auto answer = ask_admin<messages::UnloadAnswer>(messages::UnloadRequest{req.matches[1], flag(req, "if_idle")}, res,
                                                    flag(req, "wait"));
    if (!answer) return;
    if (auto refusal = model_admin::unload_refusal(*answer)) {
      reply_refusal(res, *refusal, refusal->code == messages::RequestError::busy ? 409 : 0);
      return;
    }
    res.status = draining(*answer) ? 202 : 200;
    res.set_content(openai::dump(model_admin::unload_json(*answer)), "application/json");
  }

  // ---- the tokenizers -------------------------------------------------------------------------

  // llama-server's /tokenize and /detokenize (and vLLM's shapes): the scheduler, which has every
  // configured model's tokenizer, answers.
  void tokenize(const http::Request& req, http::Response& res) const { tokenize_either(false, req, res); }
  void detokenize(const http::Request& req, http::Response& res) const { tokenize_either(true, req, res); }

  void tokenize_either(bool detokenize, const http::Request& req, http::Response& res) const {
    auto question = openai::parse_tokenize_request(req.body, detokenize);
    if (auto* error = std::get_if<ApiError>(&question)) {
      reply_error(res, *error);
      return;
    }
    const auto& asked = std::get<messages::Tokenize>(question);
    auto answer = ask_admin<messages::Tokenized>(asked, res);
    if (!answer) return;
    auto body = openai::tokenized_json(asked, *answer);
    if (auto* error = std::get_if<ApiError>(&body)) {
      reply_error(res, *error);
      return;
    }
    res.set_content(openai::dump(std::get<nlohmann::json>(body)), "application/json");
  }

  // ---- the KV prefix cache ---------------------------------------------------------------------

  // 200 with what was released (and what could not be, in problems); 400 when the server runs no
  // cache-writer; 503 when the cache-writer does not answer (unavailable) or its queue is full
  // (server_busy).
  void clear_cache(messages::CacheTier tier, http::Response& res) const {
    auto answer = ask_admin<messages::CacheCleared>(messages::ClearCache{static_cast<std::uint8_t>(tier)}, res);
    if (!answer) return;
    res.set_content(openai::dump(model_admin::cleared_json(*answer)), "application/json");
  }
  void clear_hot_cache(const http::Request&, http::Response& res) const {
    clear_cache(messages::CacheTier::hot, res);
  }
  void clear_ssd_cache(const http::Request&, http::Response& res) const {
    clear_cache(messages::CacheTier::ssd, res);
  }

  std::int64_t started_unix(const StatusAnswer& answer) const {
    return unix_seconds() - answer.figures.uptime_ns / 1'000'000'000;
  }

  void models(const http::Request&, http::Response& res) const {
    if (auto answer = ask_status(res)) {
      res.set_content(
          openai::dump(http_status::models_json(answer->report, started_unix(*answer), memory_of(*answer))),
          "application/json");
    }
  }

  void one_model(const http::Request& req, http::Response& res) const {
    auto answer = ask_status(res);
    if (!answer) return;
    const std::string name = req.matches[1];
    const nlohmann::json models = http_status::models_json(answer->report, started_unix(*answer), memory_of(*answer));
    for (const auto& model : models["data"]) {
      if (model["id"] == name) {
        res.set_content(openai::dump(model), "application/json");
        return;
      }
    }
    reply_error(res, ApiError{404, "invalid_request_error", "The model '" + name.substr(0, 256) + "' does not exist",
                              "model", "model_not_found"});
  }

  // Open to all, for load balancers and supervisors. /health (llama-server's): 200 while the
  // server takes requests, 503 while it loads, drains or every model asked for is failing.
  // /ready: the same, or with ?model=NAME that model's readiness. /live: 200 whenever the server
  // answers at all. Each body is health_json's picture.
  void health(const http::Request&, http::Response& res) const { answer_health(res, Probe::ready, ""); }
  void ready(const http::Request& req, http::Response& res) const {
    answer_health(res, Probe::ready, req.get_param_value("model"));
  }
  void live(const http::Request&, http::Response& res) const { answer_health(res, Probe::live, ""); }

  enum class Probe { live, ready };

  void answer_health(http::Response& res, Probe probe, const std::string& model) const {
    auto answer = ask_status(res);
    if (!answer) return;
    nlohmann::json picture = http_status::health_json(answer->report, answer->figures, memory_of(*answer));
    bool ok = probe == Probe::live || picture["ready"].get<bool>();
    if (!model.empty()) {
      if (!picture["models"].contains(model)) {
        reply_error(res, ApiError{404, "invalid_request_error", "The model '" + model.substr(0, 256) +
                                  "' does not exist", "model", "model_not_found"});
        return;
      }
      ok = picture["models"][model]["ready"].get<bool>();
    }
    res.status = ok ? 200 : 503;
    res.set_content(openai::dump(picture), "application/json");
  }
};

HttpServer::HttpServer(zmq::context_t& context, std::string bridge, HttpServerConfig config)
    : impl_(std::make_unique<Impl>(context, std::move(bridge), std::move(config))) {
  port_ = impl_->server.bind();
}

HttpServer::~HttpServer() { stop(); }

void HttpServer::start() { impl_->server.start(); }

void HttpServer::stop() { impl_->server.stop(); }

}  // namespace mqlm::actors
