// The HTTP side of the http actor: the OpenAI API's handlers over the transport
// (actors/http/http_transport.hpp, Boost.Beast). The handlers run on the transport's worker
// threads and reach the actor only through the inproc bridge (actors/http/bridge.hpp), one
// DEALER socket per request. Nothing here touches the actor's state.
//
// Endpoints: POST /v1/chat/completions and /v1/completions (streaming as server-sent events
// ending in `data: [DONE]`, or not), POST /v1/embeddings, GET /v1/models and /v1/models/{id}, POST /tokenize and
// /detokenize (llama-server's), GET /health,
// GET /api/status (JSON) and GET /metrics (Prometheus text); the admin calls POST
// /api/models/{id}/load and /unload (the enforcer) and POST /api/hot-cache/clear and
// /api/ssd-cache/clear (the cache-writer). With cors_origins, a browser's preflight (OPTIONS)
// from an allowed origin is answered, and every answer to one carries Access-Control-Allow-Origin.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <zmq.hpp>

#include "actors/front_end/api_keys.hpp"

namespace mqlm::actors {

struct HttpServerConfig {
  std::string host = "127.0.0.1";
  int port = 8080;            // 0: any free port (port() says which)
  // None: no authentication; else Authorization: Bearer KEY everywhere but /health, /ready and
  // /live (and an admin key for the model pool's and the caches' endpoints, when there are any).
  front_end::ApiKeys keys;
  std::size_t max_body_bytes = 1'000'000;
  std::size_t threads = 1024;  // handlers at work at once, most (idle connections take none)
  std::size_t max_connections = 4096;
  std::chrono::milliseconds sse_keepalive{250};  // ": keepalive" after this long without output
  std::chrono::milliseconds status_timeout{10'000};  // a status question unanswered this long: 503
  // Origins whose browser pages may call the API (CORS); "*": any; empty: no CORS headers at all.
  std::vector<std::string> cors_origins;
  std::uint8_t pooling = 1;  // /v1/embeddings' model::Pooling: mean (1) or last (2)
};

class HttpServer {
 public:
  // Binds the listening socket now: throws std::runtime_error when it cannot. bridge: the
  // actor's ROUTER endpoint on `context`, which must outlive the server.
  HttpServer(zmq::context_t& context, std::string bridge, HttpServerConfig config);
  ~HttpServer();  // stop()
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Serves on threads of its own; connections are accepted from the constructor on and
  // answered from here on.
  void start();
  // Stops accepting, makes every handler give up its wait, closes every connection and joins
  // every thread. Streams still open end without [DONE]; their requests are reported gone to
  // the actor.
  void stop();
  int port() const { return port_; }

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
};

}  // namespace mqlm::actors
