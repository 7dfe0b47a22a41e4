#include "actors/http/http_server.hpp"

#include <algorithm>
#include <cctype>
#include <deque>
#include <optional>
#include <random>
#include <stdexcept>
#include <variant>

#include <httplib.h>
#include <spdlog/spdlog.h>

#include "actors/front_end/events.hpp"
#include "actors/front_end/model_admin.hpp"
#include "actors/http/bridge.hpp"
#include "actors/http/http_status.hpp"
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
// An idle keep-alive connection is closed after this long. It holds a pool thread meanwhile, and
// stop() waits for it, so it is short.
constexpr time_t kKeepAliveTimeoutS = 2;
// How long a handler's last frames (its "gone") may wait to reach the actor when it closes.
constexpr int kBridgeLingerMs = 1000;
constexpr auto kStartTimeout = 5s;
// A load waits for the upload (minutes for a large model from a slow disk), an unload with
// wait=true for the model's requests to end.
constexpr auto kAdminTimeout = 600s;
// How long a browser may reuse a CORS preflight's answer (a day, Chromium's cap is 2 hours).
constexpr int kCorsMaxAgeS = 86400;

// httplib's Server and the one thing its handlers need beyond their request: whether it is
// stopping (stop() invalidates the listening socket; is_running() stays true until every
// handler has returned, so it cannot tell them).
class StoppableServer : public httplib::Server {
 public:
  bool stopping() const { return svr_sock_ == INVALID_SOCKET; }
};

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
  SseStream(std::shared_ptr<BridgeCall> call, const StoppableServer& server, openai::StreamRenderer renderer,
            std::deque<Message> early, std::chrono::milliseconds keepalive)
      : call_(std::move(call)),
        server_(server),
        renderer_(std::move(renderer)),
        early_(std::move(early)),
        keepalive_(keepalive) {}

  // httplib calls this until it returns false or the sink is done.
  bool pump(httplib::DataSink& sink) {
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
  bool handle(httplib::DataSink& sink, Message reply) {
    if (const auto* event = reply.as<messages::TokenEvent>()) return write(sink, renderer_.tokens(*event));
    if (const auto* final_event = reply.as<messages::FinalEvent>()) {
      call_->ended();
      finished_ = true;
      if (!write(sink, renderer_.finish(*final_event))) return false;
      sink.done();
    }
    return true;
  }

  bool write(httplib::DataSink& sink, std::string_view text) {
    if (text.empty()) return true;
    if (!sink.write(text.data(), text.size())) return false;
    last_write_ = Clock::now();
    return true;
  }

  std::shared_ptr<BridgeCall> call_;
  const StoppableServer& server_;
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

void reply_error(httplib::Response& res, const ApiError& error) {
  res.status = error.status;
  res.set_content(openai::error_body(error), "application/json");
}

ApiError server_error(int status, std::string message, std::string code) {
  return ApiError{status, "server_error", std::move(message), std::nullopt, std::move(code)};
}

bool equal_in_constant_time(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char difference = 0;
  for (std::size_t i = 0; i < a.size(); ++i) difference |= static_cast<unsigned char>(a[i] ^ b[i]);
  return difference == 0;
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
      : context_(context), bridge_(std::move(bridge)), config_(std::move(config)) {
    const std::size_t threads = config_.threads;
    // httplib owns the queue it is handed (its interface takes a raw pointer).
    server.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
    server.set_payload_max_length(config_.max_body_bytes);
    server.set_keep_alive_timeout(kKeepAliveTimeoutS);
    server.set_tcp_nodelay(true);
    // httplib's default adds SO_REUSEPORT, which would let a second server bind a taken port and
    // share its connections; SO_REUSEADDR alone only allows rebinding after a restart.
    server.set_socket_options([](socket_t sock) {
      int yes = 1;
      setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    });
    server.set_logger([](const httplib::Request& req, const httplib::Response& res) {
      spdlog::debug("http: {} {} -> {}", req.method, req.path, res.status);
    });
    server.set_error_handler(httplib::Server::HandlerWithResponse(
        [this](const httplib::Request& req, httplib::Response& res) { return fill_error(req, res); }));
    server.set_exception_handler([](const httplib::Request& req, httplib::Response& res, std::exception_ptr thrown) {
      std::string what = "unknown exception";
      try {
        if (thrown) std::rethrow_exception(thrown);
      } catch (const std::exception& e) {
        what = e.what();
      } catch (...) {
      }
      spdlog::error("http: {} {} failed: {}", req.method, req.path, what);
      reply_error(res, server_error(500, "the server failed on this request: " + what, "internal_error"));
    });
    if (!config_.cors_origins.empty()) {
      server.set_pre_routing_handler(
          [this](const httplib::Request& req, httplib::Response& res) { return cors(req, res); });
    }
    route();
  }

  StoppableServer server;

 private:
  using Handler = void (Impl::*)(const httplib::Request&, httplib::Response&) const;

  void route() {
    auto guarded = [this](Handler handler) {
      return [this, handler](const httplib::Request& req, httplib::Response& res) {
        if (authorized(req, res)) (this->*handler)(req, res);
      };
    };
    server.Post("/v1/chat/completions", guarded(&Impl::chat));
    server.Post("/v1/completions", guarded(&Impl::completions));
    server.Post("/v1/embeddings", guarded(&Impl::embeddings));
    server.Get("/v1/models", guarded(&Impl::models));
    server.Get(R"(/v1/models/(.+))", guarded(&Impl::one_model));
    server.Get("/api/status", guarded(&Impl::status));
    server.Get("/metrics", guarded(&Impl::metrics));
    server.Post(R"(/api/models/([^/]+)/load)", guarded(&Impl::load_model));
    server.Post(R"(/api/models/([^/]+)/unload)", guarded(&Impl::unload_model));
    server.Post("/api/hot-cache/clear", guarded(&Impl::clear_hot_cache));
    server.Post("/api/ssd-cache/clear", guarded(&Impl::clear_ssd_cache));
    server.Post("/tokenize", guarded(&Impl::tokenize));
    server.Post("/detokenize", guarded(&Impl::detokenize));
    server.Get("/health", [this](const httplib::Request& req, httplib::Response& res) { health(req, res); });
  }

  // CORS, before routing: a browser sends its preflight without the API key, and every answer to
  // an allowed origin (errors included, so that the page can read them) needs the header.
  httplib::Server::HandlerResponse cors(const httplib::Request& req, httplib::Response& res) const {
    const std::string origin = req.get_header_value("Origin");
    const auto& origins = config_.cors_origins;
    const bool any = std::find(origins.begin(), origins.end(), "*") != origins.end();
    const bool allowed = any || std::find(origins.begin(), origins.end(), origin) != origins.end();
    if (origin.empty() || !allowed) return httplib::Server::HandlerResponse::Unhandled;
    res.set_header("Access-Control-Allow-Origin", any ? "*" : origin);
    // The answer differs by origin, so caches must not give one origin's to another.
    if (!any) res.set_header("Vary", "Origin");
    if (req.method != "OPTIONS") return httplib::Server::HandlerResponse::Unhandled;
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
    return httplib::Server::HandlerResponse::Handled;
  }

  // Errors httplib answers itself (no route, a body over the limit, an unreadable request) get
  // OpenAI's JSON too; those a handler wrote are left alone.
  httplib::Server::HandlerResponse fill_error(const httplib::Request& req, httplib::Response& res) const {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    ApiError error = openai::invalid_request("the request could not be read", std::nullopt, "bad_request");
    if (res.status == 404) {
      error = openai::invalid_request("Unknown request URL: " + req.method + " " + req.path.substr(0, 256) +
                                          " (this server has POST /v1/chat/completions, POST /v1/completions, POST "
                                          "/v1/embeddings, GET /v1/models, POST /tokenize, POST /detokenize, GET /health, GET "
                                          "/api/status, GET /metrics, POST "
                                          "/api/models/{id}/load, POST /api/models/{id}/unload, POST "
                                          "/api/hot-cache/clear and POST /api/ssd-cache/clear)",
                                      std::nullopt, "unknown_url");
    } else if (res.status == 413) {
      error = openai::invalid_request("the request body is over this server's limit of " +
                                          std::to_string(config_.max_body_bytes) + " bytes",
                                      std::nullopt, "request_too_large");
    } else if (res.status >= 500) {
      error = server_error(res.status, "the server could not answer", "internal_error");
    }
    error.status = res.status;
    reply_error(res, error);
    return httplib::Server::HandlerResponse::Handled;
  }

  bool authorized(const httplib::Request& req, httplib::Response& res) const {
    if (config_.api_key.empty()) return true;
    constexpr std::string_view kScheme = "Bearer ";
    const std::string header = req.get_header_value("Authorization");
    const bool ok = starts_with_ignoring_case(header, kScheme) &&
                    equal_in_constant_time(std::string_view(header).substr(kScheme.size()), config_.api_key);
    if (ok) return true;
    reply_error(res, ApiError{401, "invalid_request_error",
                              header.empty() ? "You didn't provide an API key: send it as Authorization: Bearer KEY"
                                             : "Incorrect API key provided",
                              std::nullopt, "invalid_api_key"});
    res.set_header("WWW-Authenticate", "Bearer");
    return false;
  }

  // The next reply, or nullopt when the deadline passed or the server is stopping.
  std::optional<Message> await(BridgeCall& call, std::optional<Clock::time_point> deadline = std::nullopt) const {
    while (!server.stopping()) {
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

  void chat(const httplib::Request& req, httplib::Response& res) const { complete(Endpoint::chat, req, res); }
  void completions(const httplib::Request& req, httplib::Response& res) const {
    complete(Endpoint::completions, req, res);
  }

  void complete(Endpoint endpoint, const httplib::Request& req, httplib::Response& res) const {
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
      stream(std::move(call), std::move(request), std::move(identity), res);
    } else {
      gather(*call, request, identity, res);
    }
  }

  void gather(BridgeCall& call, const openai::CompletionRequest& request, const openai::ResponseIdentity& identity,
              httplib::Response& res) const {
    front_end::GatheredOutput output;
    while (auto reply = await(call)) {
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
    reply_error(res, server_error(503, "the server stopped before this request finished", "shutting_down"));
  }

  // ---- embeddings (openai_embeddings.hpp) ------------------------------------------------------

  // Every input is a request of its own, kInputsAtOnce of them open at once so that the scheduler
  // batches them; leaving early (an error, the server stopping) aborts those still open.
  void embeddings(const httplib::Request& req, httplib::Response& res) const {
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
          return reply_error(res, server_error(503, "the server cannot take requests now: try again later", "unavailable"));
        }
      }
      for (auto& call : calls) {
        std::optional<messages::FinalEvent> final_event = await_final(*call);
        if (!final_event) return reply_error(res, server_error(503, "the server stopped before this request finished", "shutting_down"));
        finals.push_back(std::move(*final_event));
      }
    }
    auto body = openai::embeddings_json(request, finals);
    if (auto* error = std::get_if<ApiError>(&body)) return reply_error(res, *error);
    res.set_content(openai::dump(std::get<nlohmann::json>(body)), "application/json");
  }

  // The request's FinalEvent (what comes before it, such as the scheduler's acceptance, is not
  // wanted), or nullopt when the server stops first.
  std::optional<messages::FinalEvent> await_final(BridgeCall& call) const {
    while (auto reply = await(call)) {
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
              httplib::Response& res) const {
    std::deque<Message> early;
    while (early.empty()) {
      auto reply = await(*call);
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
                                     [sse](std::size_t, httplib::DataSink& sink) { return sse->pump(sink); });
  }

  // ---- status ---------------------------------------------------------------------------------

  // The actor's status answer, or the error response already written.
  // trim: the executor trims its pool first, so the pool's figures are after the trim.
  std::optional<StatusAnswer> ask_status(httplib::Response& res, bool trim = false) const {
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

  void status(const httplib::Request& req, httplib::Response& res) const {
    if (auto answer = ask_status(res, flag(req, "trim"))) {
      res.set_content(openai::dump(http_status::status_json(answer->report, answer->figures, memory_of(*answer))),
                      "application/json");
    }
  }

  void metrics(const httplib::Request&, httplib::Response& res) const {
    if (auto answer = ask_status(res)) {
      res.set_content(http_status::prometheus_text(answer->report, answer->figures, memory_of(*answer)),
                      "text/plain; version=0.0.4; charset=utf-8");
    }
  }

  // ---- the model pool -------------------------------------------------------------------------

  // The answer of type T to `question`, or the error response already written. An unload is
  // answered twice (draining, then its end): wait_for_end skips the first.
  template <typename T>
  std::optional<T> ask_admin(const messages::Payload& question, httplib::Response& res,
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
  static void reply_refusal(httplib::Response& res, const model_admin::Refusal& refusal, int status_override = 0) {
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

  static bool flag(const httplib::Request& req, const std::string& name) {
    const std::string value = req.get_param_value(name);
    return value == "1" || value == "true";
  }

  // 200 once loaded (evictions listed); 404 unknown; 507 does not fit, with the figures; 500 the
  // load failed.
  void load_model(const httplib::Request& req, httplib::Response& res) const {
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
  void unload_model(const httplib::Request& req, httplib::Response& res) const {
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
  void tokenize(const httplib::Request& req, httplib::Response& res) const { tokenize_either(false, req, res); }
  void detokenize(const httplib::Request& req, httplib::Response& res) const { tokenize_either(true, req, res); }

  void tokenize_either(bool detokenize, const httplib::Request& req, httplib::Response& res) const {
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
  void clear_cache(messages::CacheTier tier, httplib::Response& res) const {
    auto answer = ask_admin<messages::CacheCleared>(messages::ClearCache{static_cast<std::uint8_t>(tier)}, res);
    if (!answer) return;
    res.set_content(openai::dump(model_admin::cleared_json(*answer)), "application/json");
  }
  void clear_hot_cache(const httplib::Request&, httplib::Response& res) const {
    clear_cache(messages::CacheTier::hot, res);
  }
  void clear_ssd_cache(const httplib::Request&, httplib::Response& res) const {
    clear_cache(messages::CacheTier::ssd, res);
  }

  std::int64_t started_unix(const StatusAnswer& answer) const {
    return unix_seconds() - answer.figures.uptime_ns / 1'000'000'000;
  }

  void models(const httplib::Request&, httplib::Response& res) const {
    if (auto answer = ask_status(res)) {
      res.set_content(
          openai::dump(http_status::models_json(answer->report, started_unix(*answer), memory_of(*answer))),
          "application/json");
    }
  }

  void one_model(const httplib::Request& req, httplib::Response& res) const {
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

  // Open to all: 200 once the scheduler answers and its executor is ready, 503 while the
  // server drains (so that a load balancer sends new requests elsewhere).
  void health(const httplib::Request&, httplib::Response& res) const {
    auto answer = ask_status(res);
    if (!answer) return;
    if (!answer->report.executor_ready) {
      reply_error(res, server_error(503, "the model is still loading", "loading"));
      return;
    }
    if (answer->figures.draining) {
      reply_error(res, server_error(503, "the server is draining and takes no new requests", "shutting_down"));
      return;
    }
    res.set_content(R"({"status":"ok"})", "application/json");
  }

  zmq::context_t& context_;
  std::string bridge_;
  HttpServerConfig config_;
};

HttpServer::HttpServer(zmq::context_t& context, std::string bridge, HttpServerConfig config)
    : impl_(std::make_unique<Impl>(context, std::move(bridge), config)) {
  const std::string where = config.host + ":" + std::to_string(config.port);
  if (config.port == 0) {
    port_ = impl_->server.bind_to_any_port(config.host);
  } else if (impl_->server.bind_to_port(config.host, config.port)) {
    port_ = config.port;
  } else {
    port_ = -1;
  }
  if (port_ <= 0) {
    throw std::runtime_error("the http actor cannot listen on " + where +
                             " (is the address taken, or not one of this host's?)");
  }
}

HttpServer::~HttpServer() { stop(); }

void HttpServer::start() {
  if (thread_.joinable()) return;
  thread_ = std::thread([this] { impl_->server.listen_after_bind(); });
  // stop() does nothing to a server that has not started listening, so start() waits for that.
  const auto deadline = Clock::now() + kStartTimeout;
  while (!impl_->server.is_running() && Clock::now() < deadline) std::this_thread::sleep_for(1ms);
  if (!impl_->server.is_running()) throw std::runtime_error("the http server did not start listening");
}

void HttpServer::stop() {
  if (!thread_.joinable()) return;
  impl_->server.stop();
  thread_.join();
}

}  // namespace mqlm::actors
