// One sender's sockets towards its peers' inboxes, and what it does when a peer's mailbox is
// full (the message kind's WhenFull). Owned by exactly one thread.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <zmq.hpp>

#include "actors/runtime/topology.hpp"
#include "messages/codec.hpp"

namespace mqlm::actors {

enum class SendStatus : std::uint8_t {
  sent,           // in the peer's mailbox (or on its way over the transport)
  deferred,       // the peer is full; kept in order in our outbox and sent when it has room
  full,           // WhenFull::reject and the peer is full: the caller must answer for it
  dropped,        // WhenFull::drop and the peer is full, or the outbox itself overflowed
  unknown_actor,  // no address for that name
};

std::string_view send_status_name(SendStatus status);

struct OutboxCounters {
  std::uint64_t sent = 0;
  std::uint64_t deferred = 0;
  std::uint64_t rejected = 0;
  std::uint64_t dropped = 0;
  std::uint64_t unknown = 0;
};

class Outbox {
 public:
  Outbox(zmq::context_t& context, const Topology& topology);

  SendStatus send(const std::string& to, messages::Frames frames, messages::WhenFull when_full);

  // Sends what was deferred to peers that now have room; returns messages still waiting.
  std::size_t flush();
  std::size_t waiting() const;
  // Poll items (ZMQ_POLLOUT) for the peers that have deferred messages, in peer order.
  std::vector<zmq::pollitem_t> pending_poll_items();
  const OutboxCounters& counters() const { return counters_; }

 private:
  struct Peer {
    zmq::socket_t socket;
    std::deque<messages::Frames> deferred;
  };
  Peer* peer(const std::string& name);
  bool try_send(Peer& peer, messages::Frames& frames);

  zmq::context_t& context_;
  const Topology& topology_;
  std::map<std::string, Peer> peers_;
  OutboxCounters counters_;
};

}  // namespace mqlm::actors
