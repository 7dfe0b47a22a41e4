#include "actors/http/http_transport.hpp"
#include "actors/http/http_request_reading.hpp"

#include <poll.h>
#include <sys/socket.h>

#include <array>
#include <condition_variable>
#include <deque>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>
#include <unordered_set>
#include <variant>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <spdlog/spdlog.h>

namespace mqlm::actors::http {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using asio::ip::tcp;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// How long stop() lets handlers notice it and return before it closes their connections.
constexpr auto kStopGrace = 5s;
// A connection refused for the cap gets its 503 within this long, or is dropped.
constexpr auto kRefusalTimeout = 1s;
// A connection the server ends is half-closed, and what the client still sends is read and
// dropped for at most this long and this much, so that the kernel does not reset the connection
// under an answer the client has not read yet (a 413 while it is still sending its body).
constexpr auto kLingerTime = 1s;
constexpr std::size_t kLingerBytes = 8 << 20;

// Threads that run handlers: `least` started at once and always kept, more started as they are
// needed (up to `most`), each of those ending after it has been idle for kRetireAfter. So a burst
// of requests leaves no threads behind, and a steady load starts none.
class WorkerPool {
 public:
  WorkerPool(std::size_t least, std::size_t most) : least_(std::min(least, most)), most_(most) {
    std::lock_guard lock(mutex_);
    while (threads_.size() < least_) start_thread();
  }
  ~WorkerPool() {
    {
      std::lock_guard lock(mutex_);
      closing_ = true;
    }
    wake_.notify_all();
    for (auto& [id, thread] : threads_) thread.join();
    for (auto& thread : retired_) thread.join();
  }
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  void run(std::function<void()> task) {
    std::lock_guard lock(mutex_);
    tasks_.push_back(std::move(task));
    if (idle_ < tasks_.size() && threads_.size() < most_) {
      start_thread();
    } else {
      wake_.notify_one();
    }
  }

 private:
  static constexpr auto kRetireAfter = std::chrono::seconds(10);

  // With mutex_ held.
  void start_thread() {
    std::thread thread([this] { work(); });
    const auto id = thread.get_id();
    threads_.emplace(id, std::move(thread));
  }

  void work() {
    std::unique_lock lock(mutex_);
    while (true) {
      ++idle_;
      const bool woken = wake_.wait_for(lock, kRetireAfter, [this] { return closing_ || !tasks_.empty(); });
      --idle_;
      if (!woken && threads_.size() > least_) {
        // Idle too long and beyond the threads always kept: this one ends (joined later).
        auto self = threads_.find(std::this_thread::get_id());
        retired_.push_back(std::move(self->second));
        threads_.erase(self);
        return;
      }
      if (tasks_.empty()) {
        if (closing_) return;
        continue;
      }
      auto task = std::move(tasks_.front());
      tasks_.pop_front();
      lock.unlock();
      task();
      lock.lock();
      // Threads that retired earlier are joined here, off the request's path.
      for (auto& thread : std::exchange(retired_, {})) {
        lock.unlock();
        thread.join();
        lock.lock();
      }
    }
  }

  const std::size_t least_;
  const std::size_t most_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> tasks_;
  std::map<std::thread::id, std::thread> threads_;
  std::vector<std::thread> retired_;
  std::size_t idle_ = 0;
  bool closing_ = false;
};

// Runs `work` on `pool` and resumes the awaiting coroutine on its own executor after.
template <typename Work>
asio::awaitable<void> on_worker(WorkerPool& pool, Work& work) {
  auto executor = co_await asio::this_coro::executor;
  co_await asio::async_initiate<decltype(asio::use_awaitable), void()>(
      [&pool, &work, executor](auto handler) {
        auto resume = std::make_shared<decltype(handler)>(std::move(handler));
        pool.run([&work, executor, resume] {
          work();
          asio::post(executor, [resume]() mutable { (*resume)(); });
        });
      },
      asio::use_awaitable);
}

}  // namespace

// ---- requests and responses --------------------------------------------------------------------

bool Request::connection_closed() const {
  if (socket < 0) return false;
  pollfd item{socket, POLLIN | POLLRDHUP, 0};
  if (::poll(&item, 1, 0) <= 0) return false;
  if ((item.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0) return true;
  // Readable: a pipelined request, or the end of the stream (a peek of nothing).
  char byte = 0;
  return ::recv(socket, &byte, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

bool DataSink::write(const char* data, std::size_t size) {
  pending_.append(data, size);
  return true;
}

void Response::set_header(std::string name, std::string value) {
  for (auto& [key, existing] : headers) {
    if (same_ignoring_case(key, name)) {
      existing = std::move(value);
      return;
    }
  }
  headers.emplace_back(std::move(name), std::move(value));
}

void Response::set_content(std::string content, std::string content_type) {
  body = std::move(content);
  set_header("Content-Type", std::move(content_type));
}

void Response::set_chunked_content_provider(std::string content_type, ContentProvider content) {
  provider = std::move(content);
  set_header("Content-Type", std::move(content_type));
}

// ---- the I/O side ------------------------------------------------------------------------------

class Transport::Io {
 public:
  explicit Io(Transport& owner)
      : owner_(owner),
        config_(owner.config_),
        acceptor_(context_),
        posts_(kPostThreadsKept, config_.threads),
        gets_(kGetThreads, kGetThreads) {}

  int bind() {
    boost::system::error_code ec;
    const auto address = asio::ip::make_address(config_.host, ec);
    if (!ec) {
      const tcp::endpoint endpoint(address, static_cast<unsigned short>(config_.port));
      acceptor_.open(endpoint.protocol(), ec);
      // SO_REUSEADDR alone: rebinding after a restart, never sharing a port that is taken.
      if (!ec) acceptor_.set_option(tcp::acceptor::reuse_address(true), ec);
      if (!ec) acceptor_.bind(endpoint, ec);
      if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
    }
    if (ec) {
      throw std::runtime_error("the http actor cannot listen on " + config_.host + ":" + std::to_string(config_.port) +
                               " (" + ec.message() + ": is the address taken, or not one of this host's?)");
    }
    return acceptor_.local_endpoint().port();
  }

  void start() {
    asio::co_spawn(context_, accept(), asio::detached);
    thread_ = std::thread([this] { context_.run(); });
  }

  void stop() {
    asio::post(context_, [this] {
      boost::system::error_code ignored;
      acceptor_.close(ignored);
    });
    // Handlers see stopping() within their poll tick and return; their connections end then.
    const auto deadline = Clock::now() + kStopGrace;
    while (busy_.load() > 0 && Clock::now() < deadline) std::this_thread::sleep_for(10ms);
    asio::post(context_, [this] {
      for (tcp::socket* socket : sockets_) {
        boost::system::error_code ignored;
        socket->shutdown(tcp::socket::shutdown_both, ignored);
        socket->close(ignored);
      }
    });
    while (open_.load() > 0 && Clock::now() < deadline + 1s) std::this_thread::sleep_for(10ms);
    context_.stop();
    if (thread_.joinable()) thread_.join();
  }

 private:
  static constexpr std::size_t kGetThreads = 16;
  static constexpr std::size_t kPostThreadsKept = 16;

  struct Connection;
  struct Exchange;

  asio::awaitable<void> accept();
  asio::awaitable<void> refuse(tcp::socket socket);
  asio::awaitable<void> serve(tcp::socket socket);
  asio::awaitable<void> linger(Connection& connection);
  asio::awaitable<bool> serve_one(Connection& connection);
  asio::awaitable<bool> read_body(Connection& connection, Exchange& exchange);
  asio::awaitable<bool> answer(Connection& connection, Exchange& exchange);
  asio::awaitable<bool> write_fixed(Connection& connection, const Exchange& exchange, bool keep_alive);
  asio::awaitable<bool> write_stream(Connection& connection, Exchange& exchange);
  bool gate(Exchange& exchange) const;
  void handle(Exchange& exchange) const;
  void fail(Exchange& exchange, int status) const;

  Transport& owner_;
  const TransportConfig& config_;
  asio::io_context context_{1};
  tcp::acceptor acceptor_;
  WorkerPool posts_;
  WorkerPool gets_;
  std::thread thread_;
  // The I/O thread's alone.
  std::unordered_set<tcp::socket*> sockets_;
  std::size_t headerless_ = 0;  // connections that have not sent a whole header yet
  std::atomic<std::size_t> open_{0};
  std::atomic<std::size_t> busy_{0};  // handlers at work
};

struct Transport::Io::Connection {
  beast::tcp_stream stream;
  beast::flat_buffer buffer;
  bool headerless = true;
};

struct Transport::Io::Exchange {
  Request req;
  Response res;
  const Route* route = nullptr;
  bool keep_alive = true;
  bool body_read = false;
  std::optional<bhttp::request_parser<bhttp::empty_body>> head;
};

asio::awaitable<void> Transport::Io::accept() {
  while (true) {
    boost::system::error_code ec;
    tcp::socket socket = co_await acceptor_.async_accept(asio::redirect_error(asio::use_awaitable, ec));
    if (ec == asio::error::operation_aborted || !acceptor_.is_open()) co_return;
    if (ec) {
      // Out of descriptors, say: the listening socket stays, the next accept may succeed.
      spdlog::warn("http: accepting a connection failed: {}", ec.message());
      asio::steady_timer pause(context_, 10ms);
      co_await pause.async_wait(asio::use_awaitable);
      continue;
    }
    const bool full = open_.load() >= config_.max_connections ||
                      headerless_ + config_.reserved_connections >= config_.max_connections;
    if (full) {
      asio::co_spawn(context_, refuse(std::move(socket)), asio::detached);
    } else {
      asio::co_spawn(context_, serve(std::move(socket)), asio::detached);
    }
  }
}

asio::awaitable<void> Transport::Io::refuse(tcp::socket socket) {
  beast::tcp_stream stream(std::move(socket));
  stream.expires_after(kRefusalTimeout);
  static constexpr std::string_view kRefusal =
      "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: "
      "120\r\n\r\n"
      R"({"error":{"message":"this server has all the connections it takes: try again later","type":"server_error",)"
      R"("code":"too_many_connections"}})";
  boost::system::error_code ec;
  co_await asio::async_write(stream, asio::buffer(kRefusal), asio::redirect_error(asio::use_awaitable, ec));
  stream.socket().shutdown(tcp::socket::shutdown_both, ec);
}

asio::awaitable<void> Transport::Io::serve(tcp::socket socket) {
  socket.set_option(tcp::no_delay(true));
  Connection connection{beast::tcp_stream(std::move(socket)), {}};
  tcp::socket* raw = &connection.stream.socket();
  sockets_.insert(raw);
  ++open_;
  ++headerless_;
  while (!owner_.stopping()) {
    bool again = false;
    try {
      again = co_await serve_one(connection);
    } catch (const std::exception& e) {
      spdlog::debug("http: a connection ended: {}", e.what());
    }
    if (!again) break;
  }
  if (connection.headerless) --headerless_;
  if (!owner_.stopping()) co_await linger(connection);
  sockets_.erase(raw);
  connection.stream.close();
  --open_;
}

asio::awaitable<void> Transport::Io::linger(Connection& connection) {
  boost::system::error_code ec;
  connection.stream.socket().shutdown(tcp::socket::shutdown_send, ec);
  connection.stream.expires_after(kLingerTime);
  std::array<char, 16384> dropped{};
  std::size_t read = 0;
  while (!ec && read < kLingerBytes) {
    read += co_await connection.stream.async_read_some(asio::buffer(dropped),
                                                        asio::redirect_error(asio::use_awaitable, ec));
  }
}

// One request and its answer: true when the connection may carry another.
asio::awaitable<bool> Transport::Io::serve_one(Connection& connection) {
  boost::system::error_code ec;
  auto& stream = connection.stream;
  if (connection.buffer.size() == 0) {
    // Between requests the client may take its time; once it starts one, header_timeout holds.
    stream.expires_after(connection.headerless ? config_.header_timeout : config_.idle_timeout);
    const std::size_t got = co_await stream.async_read_some(connection.buffer.prepare(4096),
                                                             asio::redirect_error(asio::use_awaitable, ec));
    if (ec) co_return false;
    connection.buffer.commit(got);
  }
  Exchange exchange;
  exchange.head.emplace();
  exchange.head->header_limit(static_cast<std::uint32_t>(config_.max_header_bytes));
  // The declared length is judged by gate() (413 with its error body), not by the header's parse.
  exchange.head->body_limit(std::numeric_limits<std::uint64_t>::max());
  stream.expires_after(config_.header_timeout);
  co_await bhttp::async_read_header(stream, connection.buffer, *exchange.head,
                                    asio::redirect_error(asio::use_awaitable, ec));
  if (ec == bhttp::error::header_limit) {
    exchange.keep_alive = false;
    fail(exchange, 431);
    co_return co_await answer(connection, exchange);
  }
  if (ec == beast::error::timeout || ec == bhttp::error::end_of_stream || ec == bhttp::error::partial_message ||
      ec == asio::error::eof || ec == asio::error::operation_aborted || ec == asio::error::connection_reset) {
    co_return false;  // the client went away or took too long: nobody to answer
  }
  if (ec) {
    exchange.keep_alive = false;
    fail(exchange, 400);
    co_return co_await answer(connection, exchange);
  }
  if (connection.headerless) {
    connection.headerless = false;
    --headerless_;
  }
  const auto& header = exchange.head->get();
  Request& req = exchange.req;
  fill_request(header, req);
  req.socket = stream.socket().native_handle();
  exchange.keep_alive = header.keep_alive();
  if (gate(exchange)) co_return co_await answer(connection, exchange);
  if (!co_await read_body(connection, exchange)) co_return co_await answer(connection, exchange);
  if (exchange.route != nullptr) {
    auto& pool = req.method == "GET" ? gets_ : posts_;
    auto work = [this, &exchange] { handle(exchange); };
    ++busy_;
    co_await on_worker(pool, work);
    --busy_;
  }
  co_return co_await answer(connection, exchange);
}

// Everything decided from the header alone: true when `exchange` is answered (or failed) here.
bool Transport::Io::gate(Exchange& exchange) const {
  Request& req = exchange.req;
  Response& res = exchange.res;
  if (owner_.pre_routing_ && owner_.pre_routing_(req, res)) return true;
  bool path_known = false;
  for (const Route& route : owner_.routes_) {
    std::smatch match;
    if (!std::regex_match(req.path, match, route.pattern)) continue;
    path_known = true;
    if (route.method != req.method) continue;
    exchange.route = &route;
    for (const auto& group : match) req.matches.push_back(group.str());
    break;
  }
  if (exchange.route == nullptr) {
    fail(exchange, path_known ? 405 : 404);
    return true;
  }
  if (exchange.route->access != Access::open && owner_.authorizer_ &&
      owner_.authorizer_(req, res, exchange.route->access)) {
    exchange.route = nullptr;
    return true;
  }
  if (auto status = refused_coding(req)) {
    fail(exchange, *status);
    return true;
  }
  const auto declared = exchange.head->content_length();
  if (declared && *declared > config_.max_body_bytes) {
    fail(exchange, 413);
    return true;
  }
  return false;
}

// The body, bounded as it arrives: false when the exchange failed (its answer is set).
asio::awaitable<bool> Transport::Io::read_body(Connection& connection, Exchange& exchange) {
  auto& stream = connection.stream;
  boost::system::error_code ec;
  if (same_ignoring_case(exchange.req.get_header_value("Expect"), "100-continue")) {
    bhttp::response<bhttp::empty_body> proceed{bhttp::status::continue_, 11};
    stream.expires_after(config_.write_timeout);
    co_await bhttp::async_write(stream, proceed, asio::redirect_error(asio::use_awaitable, ec));
    if (ec) co_return false;
  }
  bhttp::request_parser<bhttp::string_body> parser(std::move(*exchange.head));
  parser.body_limit(config_.max_body_bytes);
  stream.expires_after(config_.body_timeout);
  co_await bhttp::async_read(stream, connection.buffer, parser, asio::redirect_error(asio::use_awaitable, ec));
  if (ec) {
    exchange.keep_alive = false;
    exchange.route = nullptr;
    fail(exchange, ec == bhttp::error::body_limit ? 413 : ec == beast::error::timeout ? 408 : 400);
    co_return false;
  }
  exchange.body_read = true;
  exchange.req.body = std::move(parser.get().body());
  co_return true;
}

void Transport::Io::handle(Exchange& exchange) const {
  try {
    exchange.route->handler(exchange.req, exchange.res);
  } catch (const std::exception& e) {
    // Headers set before the handler (CORS) stay; whatever the handler wrote goes.
    Response fresh;
    fresh.headers = std::move(exchange.res.headers);
    exchange.res = std::move(fresh);
    if (owner_.exception_handler_) owner_.exception_handler_(exchange.req, exchange.res, e.what());
  }
}

void Transport::Io::fail(Exchange& exchange, int status) const {
  exchange.res.status = status;
  exchange.res.body.clear();
  exchange.res.provider = nullptr;
  if (owner_.error_handler_) owner_.error_handler_(exchange.req, exchange.res);
}

asio::awaitable<bool> Transport::Io::answer(Connection& connection, Exchange& exchange) {
  // A body left unread (refused before it was read) would be taken for the next request.
  const bool body_pending = !exchange.body_read && exchange.head &&
                            (exchange.head->content_length().value_or(0) > 0 || exchange.head->chunked());
  const bool keep_alive = exchange.keep_alive && !body_pending && !owner_.stopping();
  if (exchange.res.provider && exchange.res.status == 200) co_return co_await write_stream(connection, exchange);
  co_return co_await write_fixed(connection, exchange, keep_alive);
}

asio::awaitable<bool> Transport::Io::write_fixed(Connection& connection, const Exchange& exchange, bool keep_alive) {
  bhttp::response<bhttp::string_body> message{static_cast<bhttp::status>(exchange.res.status), 11};
  for (const auto& [name, value] : exchange.res.headers) message.set(name, value);
  message.body() = exchange.res.body;
  message.keep_alive(keep_alive);
  message.prepare_payload();
  boost::system::error_code ec;
  connection.stream.expires_after(config_.write_timeout);
  co_await bhttp::async_write(connection.stream, message, asio::redirect_error(asio::use_awaitable, ec));
  co_return !ec && keep_alive;
}

// The headers, then each turn of the provider as one chunk, until it is done (the connection
// stays) or gives up or a write fails (it closes).
asio::awaitable<bool> Transport::Io::write_stream(Connection& connection, Exchange& exchange) {
  auto& stream = connection.stream;
  bhttp::response<bhttp::empty_body> message{bhttp::status::ok, 11};
  for (const auto& [name, value] : exchange.res.headers) message.set(name, value);
  message.chunked(true);
  message.keep_alive(exchange.keep_alive);
  bhttp::response_serializer<bhttp::empty_body> serializer(message);
  boost::system::error_code ec;
  stream.expires_after(config_.write_timeout);
  co_await bhttp::async_write_header(stream, serializer, asio::redirect_error(asio::use_awaitable, ec));
  DataSink sink;
  bool going = !ec;
  while (going && !sink.is_done()) {
    auto work = [&] { going = exchange.res.provider(sink); };
    ++busy_;
    co_await on_worker(posts_, work);
    --busy_;
    const std::string chunk = sink.take();
    if (chunk.empty()) continue;
    stream.expires_after(config_.write_timeout);
    co_await asio::async_write(stream, bhttp::make_chunk(asio::buffer(chunk)),
                               asio::redirect_error(asio::use_awaitable, ec));
    if (ec) going = false;
  }
  // Dropping the provider now tells the actor, when the stream did not end, that its client is
  // gone.
  exchange.res.provider = nullptr;
  if (!going || !sink.is_done()) co_return false;
  stream.expires_after(config_.write_timeout);
  co_await asio::async_write(stream, bhttp::make_chunk_last(), asio::redirect_error(asio::use_awaitable, ec));
  co_return !ec && exchange.keep_alive && !owner_.stopping();
}

// ---- the transport -----------------------------------------------------------------------------

Transport::Transport(TransportConfig config) : config_(std::move(config)) {}

Transport::~Transport() { stop(); }

void Transport::Get(const std::string& pattern, Handler handler, Access access) {
  routes_.push_back(Route{"GET", std::regex(pattern), std::move(handler), access});
}

void Transport::Post(const std::string& pattern, Handler handler, Access access) {
  routes_.push_back(Route{"POST", std::regex(pattern), std::move(handler), access});
}

int Transport::bind() {
  if (!io_) io_ = std::make_unique<Io>(*this);
  return io_->bind();
}

void Transport::start() {
  if (!io_) bind();
  io_->start();
}

void Transport::stop() {
  if (!io_ || stopping_.exchange(true)) return;
  io_->stop();
  io_.reset();
}

}  // namespace mqlm::actors::http
