// The links between participants: each one's inbox is a PULL socket bound at its address in the
// topology, and whoever sends to it connects a PUSH socket there. Over tcp://, with the topology's
// link keys, every link is CURVE (docs/protocol.md, "CURVE on the links between actors"): the
// inbox a CURVE server with this process's key pair, whose handshakes the link authenticator
// checks, and each sender a CURVE client that knows the public key of the process that binds the
// inbox. ipc:// and inproc:// links take no keys (the file system's permissions, the process).
//
// The link authenticator is a ZAP handler (zap_handler.hpp) in domain curve::kLinkZapDomain that
// lets in only the keys the topology names: the deployment's processes. It runs as an actor of
// its own, so that it answers handshakes whatever the other actors are doing (an executor loading
// a model in on_start, say); a Node starts it first and stops it last.
#pragma once

#include <memory>
#include <set>
#include <string>

#include <zmq.hpp>

#include "actors/runtime/actor_thread.hpp"
#include "actors/runtime/topology.hpp"

namespace mqlm::actors {

inline constexpr const char* kLinkAuthenticatorName = "link-authenticator";

bool is_tcp_endpoint(const std::string& endpoint);

// Binds `inbox` (a PULL socket, its other options set) at name's address. Throws
// std::runtime_error naming the participant and the address when it cannot, or when the key the
// topology gives that address is not this process's.
void bind_inbox(zmq::socket_t& inbox, const Topology& topology, const std::string& name);
// Connects `socket` (a PUSH socket, its other options set) to name's inbox. False when name has
// no address.
bool connect_to_inbox(zmq::socket_t& socket, const Topology& topology, const std::string& name);

// The keys let in to this process's tcp:// inboxes: every inbox key the topology names and this
// process's own (its actors send to each other over tcp:// when they are given such addresses).
std::set<std::string> link_senders(const Topology& topology);

// The link authenticator of `context`, started. The topology has link keys and lists
// kLinkAuthenticatorName. Start it before the context's tcp:// inboxes bind (a handshake that
// finds no handler is refused) and stop it after they are closed. It logs each refused key at
// most once a minute, and what it allowed and refused when it stops.
std::unique_ptr<ActorThread> start_link_authenticator(zmq::context_t& context,
                                                      std::shared_ptr<const Topology> topology);

}  // namespace mqlm::actors
