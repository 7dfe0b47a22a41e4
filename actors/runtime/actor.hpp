// An actor: state that one thread owns outright, and handlers the runtime calls from that
// thread's loop, one message at a time. Handlers never block on another actor: they send, and
// the answer arrives later as another message.
//
// Replay rule: a handler takes time only from ctx.now_ns() (the moment its message was taken
// from the inbox, as recorded in the trace) and randomness only from state seeded at
// construction. Then `mqlm trace replay` can rerun it on its recorded inbox and get the same
// sends.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include <zmq.hpp>

#include "actors/runtime/outbox.hpp"
#include "messages/codec.hpp"

namespace mqlm::actors {

struct SendOptions {
  std::uint64_t correlation_id = 0;
  std::uint64_t request_id = 0;
  messages::Frames blobs;
};

// What a handler can do. Implemented by the live loop (ActorThread) and by replay.
class Context {
 public:
  virtual ~Context() = default;

  virtual const std::string& self() const = 0;
  // The monotonic time at which the message being handled was taken from the inbox.
  virtual std::int64_t now_ns() const = 0;

  SendStatus send(const std::string& to, messages::Payload payload, SendOptions options = {});
  // Answers a message: to its sender, with its correlation and request ids.
  SendStatus reply(const messages::Message& to_message, messages::Payload payload,
                   messages::Frames blobs = {});

  // A timer delivers messages::Timer{timer_id} through this actor's own inbox loop.
  virtual void set_timer(std::uint32_t timer_id, std::chrono::milliseconds interval, bool repeat) = 0;
  virtual void cancel_timer(std::uint32_t timer_id) = 0;

  // A socket outside the runtime's mailboxes (the gateway's client-facing ROUTER), made from
  // this context and owned by the actor: the live loop polls it beside the inbox and calls
  // Actor::on_readable(ctx, id) when it has input. What arrives there is not in the trace, so
  // actors that watch sockets are not replayable (replay's context has no ZeroMQ context).
  virtual zmq::context_t* zmq_context() { return nullptr; }
  virtual void watch(zmq::socket_ref, std::uint32_t /*id*/) {}
  virtual void unwatch(std::uint32_t /*id*/) {}

 protected:
  virtual SendStatus deliver(const std::string& to, messages::Frames frames,
                             messages::WhenFull when_full) = 0;
};

class Actor {
 public:
  virtual ~Actor() = default;
  virtual void on_start(Context&) {}
  virtual void on_message(Context& ctx, messages::Message& message) = 0;
  // Called after Stop was taken from the inbox, i.e. after everything queued before it.
  virtual void on_stop(Context&) {}
  // A watched socket (Context::watch) has input; read it without blocking.
  virtual void on_readable(Context&, std::uint32_t /*watch_id*/) {}
};

// Counters every actor's runtime keeps.
struct ActorStats {
  std::uint64_t handled = 0;          // messages handed to the actor (and Heartbeats answered)
  std::uint64_t malformed = 0;        // frames that did not decode
  std::uint64_t heartbeats = 0;
};

// What the live loop and replay share: the one way inbox frames become handler calls.
class Dispatcher {
 public:
  enum class Outcome { handled, malformed, stop };

  Dispatcher(std::string name, Actor& actor) : name_(std::move(name)), actor_(actor) {}

  // Decodes and handles one message. On the first Stop it returns Outcome::stop and keeps the
  // message in stop_message; the caller then handles what is already queued, calls on_stop and
  // answers the Stop with StopAck.
  Outcome dispatch(Context& ctx, messages::Frames frames);

  const ActorStats& stats() const { return stats_; }
  const messages::Message& stop_message() const { return stop_; }

 private:
  std::string name_;
  Actor& actor_;
  ActorStats stats_;
  bool stopping_ = false;
  messages::Message stop_;
};

std::int64_t monotonic_ns();

// The frames of a message from one participant to another, stamped now.
messages::Frames make_frames(const std::string& from, const std::string& to,
                             const messages::Payload& payload, SendOptions options = {});

}  // namespace mqlm::actors
