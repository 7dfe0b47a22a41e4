// The http actor's transport: HTTP/1.1 over Boost.Beast, bounded before it buffers anything.
//
// One I/O thread reads and writes every connection (a coroutine each), so an idle keep-alive
// connection or a client that trickles its headers costs a socket and a few kilobytes, never a
// thread. Handlers, which wait on the http actor's bridge, run on worker threads that are taken
// only while a request is being answered: POSTs on a pool of up to `threads`, GETs (health,
// status, models, the status page) on a small pool of their own so that a server busy with
// long completions still answers them.
//
// What a request must get past before a handler sees it, in order: a connection cap (beyond it,
// 503 and close; connections that have not sent a whole header yet may take all but
// `reserved_connections` of it), the header limit (431) within header_timeout, the routes
// (404), the authorizer (401, before any of the body is read), Content-Encoding (415: bodies are
// never decompressed) and Transfer-Encoding (400 unless chunked alone), the declared length
// (413), then the body as it arrives, chunked or not,
// within body_timeout (413 past the limit, 400 for a malformed one). Pipelined requests are
// answered in order, one at a time. An answer after which the connection's input cannot be
// trusted (an unread or refused body, a malformed request) closes the connection.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <regex>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace mqlm::actors::http {

using Fields = std::vector<std::pair<std::string, std::string>>;

struct Request {
  std::string method;
  std::string path;                   // percent-decoded, without the query
  std::vector<std::string> matches;   // the route's match: [0] the path, [1...] its groups
  Fields headers;
  Fields params;                      // the query's, percent-decoded
  std::string body;
  int socket = -1;                    // the connection's, for connection_closed()

  // "" when absent; names compare ignoring case.
  std::string get_header_value(std::string_view name) const;
  std::string get_param_value(std::string_view name) const;
  // The client hung up (or reset the connection): checked without reading, so a handler that
  // waits can give up on a request nobody will read.
  bool connection_closed() const;
};

// What a streaming handler writes to; the transport sends each turn's writes as one chunk.
class DataSink {
 public:
  bool write(const char* data, std::size_t size);
  void done() { done_ = true; }
  bool is_done() const { return done_; }
  std::string take() { return std::exchange(pending_, {}); }

 private:
  std::string pending_;
  bool done_ = false;
};

// Called until it returns false (the stream ends there, without its last chunk: the client is
// given up on) or the sink is done.
using ContentProvider = std::function<bool(DataSink&)>;

struct Response {
  int status = 200;
  Fields headers;
  std::string body;
  ContentProvider provider;  // set: the body is streamed, chunked

  void set_header(std::string name, std::string value);
  void set_content(std::string content, std::string content_type);
  void set_chunked_content_provider(std::string content_type, ContentProvider content);
};

// Who may call a route: anyone with a key (when the server has keys), anyone, or an admin key.
enum class Access { key, open, admin };

// Fills `res` for `req`. Runs on a worker thread.
using Handler = std::function<void(const Request& req, Response& res)>;
// Runs on the I/O thread before the body is read: true when it answered `res` itself.
using Gate = std::function<bool(const Request& req, Response& res)>;
using Authorizer = std::function<bool(const Request& req, Response& res, Access access)>;

struct TransportConfig {
  std::string host = "127.0.0.1";
  int port = 8080;                          // 0: any free port
  std::size_t max_body_bytes = 1'000'000;
  std::size_t max_header_bytes = 64 * 1024; // request line and every header together
  std::size_t threads = 1024;               // POST handlers at work at once, most
  std::size_t max_connections = 4096;
  std::size_t reserved_connections = 64;    // kept for connections that sent a whole header
  std::chrono::milliseconds header_timeout{10'000};  // from a request's first byte to its last header
  std::chrono::milliseconds body_timeout{60'000};
  std::chrono::milliseconds idle_timeout{60'000};    // a keep-alive connection between requests
  std::chrono::milliseconds write_timeout{30'000};   // one answer (or one streamed chunk) to go out
};

// The one request in `raw` (header and body) as the transport reads it under `config`'s limits:
// the request, or the status it would answer instead (400, 413, 415, 431). The transport reads
// from sockets with the same parser and limits; this is its form for fuzzers and tests.
std::variant<Request, int> parse_request(std::string_view raw, const TransportConfig& config);

class Transport {
 public:
  explicit Transport(TransportConfig config);
  ~Transport();  // stop()
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  // Routes, matched in the order given against the whole path. Register before start().
  void Get(const std::string& pattern, Handler handler, Access access = Access::key);
  void Post(const std::string& pattern, Handler handler, Access access = Access::key);
  // Before routing, for every request (CORS preflights): may answer, or add headers to `res`
  // that every answer to this request then carries.
  void set_pre_routing(Gate gate) { pre_routing_ = std::move(gate); }
  // For routes that are not Access::open, before the body is read.
  void set_authorizer(Authorizer gate) { authorizer_ = std::move(gate); }
  // Fills the body of an answer the transport gave itself (404, 413, 431, ...): res.status is
  // set and res.body empty.
  void set_error_handler(Handler handler) { error_handler_ = std::move(handler); }
  // A handler threw: `what` is the exception's text; fill res.
  void set_exception_handler(std::function<void(const Request&, Response&, const std::string& what)> handler) {
    exception_handler_ = std::move(handler);
  }

  // Binds and listens now: throws std::runtime_error when it cannot. Returns the port.
  int bind();
  // Serves on threads of its own.
  void start();
  // Stops accepting, tells handlers (stopping()) and waits a moment for them, closes every
  // connection and joins every thread.
  void stop();
  bool stopping() const { return stopping_.load(std::memory_order_relaxed); }

  struct Route {
    std::string method;
    std::regex pattern;
    Handler handler;
    Access access;
  };

 private:
  class Io;
  friend class Io;

  TransportConfig config_;
  std::vector<Route> routes_;
  Gate pre_routing_;
  Authorizer authorizer_;
  Handler error_handler_;
  std::function<void(const Request&, Response&, const std::string&)> exception_handler_;
  std::atomic<bool> stopping_{false};
  std::unique_ptr<Io> io_;
};

}  // namespace mqlm::actors::http
