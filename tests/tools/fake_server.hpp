// A stand-in for the server side of docs/protocol.md, for testing the client without a GPU or
// a model: a ROUTER on a free loopback port whose frames the test reads and writes itself, and
// a StepServer that answers generate requests the way a continuous-batching server does (every
// step, one token to each open request).
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <msgpack.hpp>
#include <zmq.hpp>

namespace mqlm::tools::fake_serving {

// What a client sent: its routing id and the one frame.
struct FromClient {
  std::string routing_id;
  std::string frame;
};

class FakeServer {
 public:
  FakeServer() : socket_(context_, zmq::socket_type::router) {
    socket_.set(zmq::sockopt::linger, 0);
    socket_.bind("tcp://127.0.0.1:*");
    endpoint_ = socket_.get(zmq::sockopt::last_endpoint);
  }

  const std::string& endpoint() const { return endpoint_; }

  std::optional<FromClient> receive(std::chrono::milliseconds timeout) {
    std::vector<zmq::pollitem_t> items{{socket_.handle(), 0, ZMQ_POLLIN, 0}};
    if (zmq::poll(items, timeout) == 0) return std::nullopt;
    zmq::message_t id, frame;
    (void)socket_.recv(id);
    (void)socket_.recv(frame);
    return FromClient{id.to_string(), frame.to_string()};
  }

  // Sends one message of these frames to the client.
  void send(const std::string& routing_id, const std::vector<std::string>& frames) {
    socket_.send(zmq::buffer(routing_id), zmq::send_flags::sndmore);
    for (std::size_t i = 0; i < frames.size(); ++i) {
      socket_.send(zmq::buffer(frames[i]), i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
    }
  }

 private:
  zmq::context_t context_;
  zmq::socket_t socket_;
  std::string endpoint_;
};

// The request frame as a map from key to msgpack object (which `handle` keeps alive).
struct RequestMap {
  msgpack::object_handle handle;
  std::map<std::string, msgpack::object> keys;

  explicit RequestMap(const std::string& frame) : handle(msgpack::unpack(frame.data(), frame.size())) {
    const msgpack::object& map = handle.get();
    for (std::uint32_t i = 0; i < map.via.map.size; ++i) {
      keys[map.via.map.ptr[i].key.as<std::string>()] = map.via.map.ptr[i].val;
    }
  }
  bool has(const std::string& key) const { return keys.count(key) > 0; }
  template <typename T>
  T get(const std::string& key) const { return keys.at(key).as<T>(); }
};

template <typename Fill>
std::string pack_map(std::uint32_t size, Fill fill) {
  msgpack::sbuffer buffer;
  msgpack::packer<msgpack::sbuffer> p(buffer);
  p.pack_map(size);
  fill(p);
  return std::string(buffer.data(), buffer.size());
}

// Runs on its own thread until destroyed. Every `step`, each open generate request gets one
// token event (token id = the step of the request it was made at, text "t"), and a request that
// has max_tokens tokens gets its final event (finish "length"). Counts the most requests it
// ever had open at once.
class StepServer {
 public:
  explicit StepServer(std::chrono::milliseconds step) : step_(step), thread_([this] { run(); }) {}
  ~StepServer() {
    stop_ = true;
    thread_.join();
  }
  const std::string& endpoint() const { return server_.endpoint(); }
  std::size_t most_open() const { return most_open_; }
  std::size_t generates() const { return generates_; }
  // The sampling the last generate asked for (-1 before any).
  float last_temperature() const { return last_temperature_; }
  float last_top_p() const { return last_top_p_; }

 private:
  struct Open {
    std::string routing_id;
    std::int64_t id = 0;
    std::int32_t max_tokens = 0;
    std::int32_t sent = 0;
    std::int64_t prompt_tokens = 0;
  };

  void run() {
    auto next_step = std::chrono::steady_clock::now() + step_;
    while (!stop_) {
      auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(next_step - std::chrono::steady_clock::now());
      if (auto request = server_.receive(std::max(wait, std::chrono::milliseconds(0)))) {
        accept(*request);
        continue;
      }
      step();
      // The next step is a whole step away, as a real server's would be: a late step (a loaded
      // machine) does not make the steps after it come back to back to catch up.
      next_step = std::chrono::steady_clock::now() + step_;
    }
  }

  void accept(const FromClient& request) {
    RequestMap map(request.frame);
    if (map.get<std::string>("op") != "generate") return;
    ++generates_;
    last_temperature_ = map.get<float>("temperature");
    last_top_p_ = map.get<float>("top_p");
    open_.push_back({request.routing_id, map.get<std::int64_t>("id"), map.get<std::int32_t>("max_tokens"), 0,
                     static_cast<std::int64_t>(map.get<std::vector<std::int32_t>>("tokens").size())});
    most_open_ = std::max<std::size_t>(most_open_, open_.size());
  }

  void step() {
    for (auto it = open_.begin(); it != open_.end();) {
      Open& r = *it;
      server_.send(r.routing_id, {pack_map(4, [&](auto& p) {
                     p.pack("event"), p.pack("token");
                     p.pack("id"), p.pack(r.id);
                     p.pack("tokens"), p.pack(std::vector<std::int32_t>{r.sent});
                     p.pack("text"), p.pack("t");
                   })});
      if (++r.sent < r.max_tokens) {
        ++it;
        continue;
      }
      server_.send(r.routing_id, {pack_map(5, [&](auto& p) {
                     p.pack("event"), p.pack("final");
                     p.pack("id"), p.pack(r.id);
                     p.pack("finish_reason"), p.pack("length");
                     p.pack("text"), p.pack("");
                     p.pack("usage");
                     p.pack_map(3);
                     p.pack("prompt_tokens"), p.pack(r.prompt_tokens);
                     p.pack("completion_tokens"), p.pack(r.sent);
                     p.pack("cached_tokens"), p.pack(0);
                   })});
      it = open_.erase(it);
    }
  }

  std::chrono::milliseconds step_;
  FakeServer server_;
  std::vector<Open> open_;
  std::atomic<std::size_t> most_open_{0};
  std::atomic<std::size_t> generates_{0};
  std::atomic<float> last_temperature_{-1.0f};
  std::atomic<float> last_top_p_{-1.0f};
  std::atomic<bool> stop_{false};
  std::thread thread_;  // last: it starts once everything it uses exists
};

}  // namespace mqlm::tools::fake_serving
