#include "actors/runtime/outbox.hpp"

#include <spdlog/spdlog.h>
#include <zmq_addon.hpp>

#include "actors/runtime/links.hpp"

namespace mqlm::actors {

using messages::WhenFull;

std::string_view send_status_name(SendStatus status) {
  switch (status) {
    case SendStatus::sent: return "sent";
    case SendStatus::deferred: return "deferred";
    case SendStatus::full: return "full";
    case SendStatus::dropped: return "dropped";
    case SendStatus::unknown_actor: return "unknown_actor";
  }
  return "?";
}

Outbox::Outbox(zmq::context_t& context, const Topology& topology)
    : context_(context), topology_(topology) {}

Outbox::Peer* Outbox::peer(const std::string& name) {
  if (auto it = peers_.find(name); it != peers_.end()) return &it->second;
  if (!topology_.knows(name)) return nullptr;
  zmq::socket_t socket(context_, zmq::socket_type::push);
  socket.set(zmq::sockopt::sndhwm, topology_.send_capacity);
  // Messages already handed to ZeroMQ (a last Pong, a StopAck) still leave over tcp/ipc when the
  // actor stops; a peer that is gone holds the shutdown up at most this long.
  socket.set(zmq::sockopt::linger, 500);
  connect_to_inbox(socket, topology_, name);
  return &peers_.emplace(name, Peer{std::move(socket), {}}).first->second;
}

bool Outbox::try_send(Peer& peer, messages::Frames& frames) {
  // ZeroMQ checks the high-water mark on a message's first frame only: either every frame
  // goes or, on EAGAIN, none has and the frames are still ours.
  return zmq::send_multipart(peer.socket, frames, zmq::send_flags::dontwait).has_value();
}

SendStatus Outbox::send(const std::string& to, messages::Frames frames, WhenFull when_full) {
  Peer* p = peer(to);
  if (p == nullptr) {
    ++counters_.unknown;
    return SendStatus::unknown_actor;
  }
  // A deferred message must not be overtaken by a later one of a deferring kind.
  if (!(when_full == WhenFull::defer && !p->deferred.empty()) && try_send(*p, frames)) {
    ++counters_.sent;
    return SendStatus::sent;
  }
  switch (when_full) {
    case WhenFull::reject:
      ++counters_.rejected;
      return SendStatus::full;
    case WhenFull::drop:
      ++counters_.dropped;
      return SendStatus::dropped;
    case WhenFull::defer:
      if (p->deferred.size() >= topology_.outbox_capacity) {
        ++counters_.dropped;
        spdlog::error("outbox to {} holds {} deferred messages; dropping one: the peer is not draining",
                      to, p->deferred.size());
        return SendStatus::dropped;
      }
      p->deferred.push_back(std::move(frames));
      ++counters_.deferred;
      return SendStatus::deferred;
  }
  return SendStatus::dropped;
}

std::size_t Outbox::flush() {
  std::size_t left = 0;
  for (auto& [name, p] : peers_) {
    while (!p.deferred.empty() && try_send(p, p.deferred.front())) {
      p.deferred.pop_front();
      ++counters_.sent;
    }
    left += p.deferred.size();
  }
  return left;
}

std::size_t Outbox::waiting() const {
  std::size_t n = 0;
  for (const auto& [name, p] : peers_) n += p.deferred.size();
  return n;
}

std::vector<zmq::pollitem_t> Outbox::pending_poll_items() {
  std::vector<zmq::pollitem_t> items;
  for (auto& [name, p] : peers_) {
    if (!p.deferred.empty()) items.push_back({p.socket.handle(), 0, ZMQ_POLLOUT, 0});
  }
  return items;
}

}  // namespace mqlm::actors
