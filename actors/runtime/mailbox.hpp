// A participant that is not an actor: a thread that is not an actor loop (a command-line tool,
// a test, a benchmark) talks to actors through its own named inbox. It must be listed in the
// topology like any actor, and used from one thread only.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include <zmq.hpp>

#include "actors/runtime/actor.hpp"
#include "actors/runtime/topology.hpp"

namespace mqlm::actors {

class Mailbox {
 public:
  Mailbox(zmq::context_t& context, std::shared_ptr<const Topology> topology, std::string name);

  SendStatus send(const std::string& to, messages::Payload payload, SendOptions options = {});
  // Sends frames as they are (tests use it to send malformed input).
  SendStatus send_raw(const std::string& to, messages::Frames frames,
                      messages::WhenFull when_full = messages::WhenFull::defer);
  // The next message that decodes, or nothing after the timeout. Messages that do not decode
  // are counted and skipped.
  std::optional<messages::Message> receive(std::chrono::milliseconds timeout);
  // Delivers deferred sends, waiting up to the timeout for room.
  bool flush(std::chrono::milliseconds timeout);

  const std::string& name() const { return name_; }
  std::uint64_t malformed() const { return malformed_; }
  const OutboxCounters& counters() const { return outbox_.counters(); }

 private:
  std::shared_ptr<const Topology> topology_;
  std::string name_;
  zmq::socket_t inbox_;
  Outbox outbox_;
  std::uint64_t malformed_ = 0;
};

}  // namespace mqlm::actors
