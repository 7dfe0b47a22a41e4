// The gateway: the actor that speaks the client protocol (docs/protocol.md) on a ZeroMQ ROUTER
// socket. It is the client protocol's adapter to the front end's core (actors/front_end), which
// owns the request table, the scheduler's liveness, Drain and the status / admin / clear-cache
// fan-outs; the gateway parses client frames (hostile input) into the core's calls and encodes
// its answers as the protocol's events. A request is known by the client's (connection, id); a
// client that does not stream gets its output gathered into the final event. Every request it
// opened ends with exactly one final event: the scheduler's, or its own when the client went
// away, the scheduler fell silent or the server stops. Client input never ends or crashes it.
//
// Options (key=value, as `mqlm node` passes them):
//   listen=ADDRESS      where clients connect (tcp:// or ipc://); default tcp://127.0.0.1:5555
//   scheduler=NAME      the scheduler actor; default scheduler
//   enforcer=NAME       the memory enforcer; default none (admin requests are refused, status
//                       events have no "memory")
//   cache_writer=NAME   the KV prefix cache's cache-writer; default none (clear_cache is refused)
//   max_requests=N      requests open across all clients; beyond, a final with busy; default 4096
//   keepalive_ms=N      an empty frame to a client with requests open that was sent nothing for
//                       this long, to learn whether it is still there; default 250
//   heartbeat_ms=N      how often the scheduler is sent a Heartbeat; default 200
//   unavailable_ms=N    open requests fail with unavailable when the scheduler said nothing for
//                       this long (more than heartbeat_ms); default 800. A clear_cache fails
//                       with unavailable when the cache-writer (heartbeaten while clears wait)
//                       said nothing for this long.
//   api_key=KEY, api_keys=K1,K2, admin_api_keys=K1,K2   as the http actor's (front_end/api_keys.hpp)
//   curve_key=FILE      CURVE on the client socket with this key pair (`mqlm keygen`): clients
//                       encrypt and prove their key in the handshake, which a ZAP handler in this
//                       actor's loop answers (runtime/zap_handler.hpp), the client socket and it in
//                       a ZeroMQ context of their own (the node's may hold the links' handler);
//                       refusals are counted in the status event's curve_refused. Default: none
//                       (plain ZMTP)
//   curve_clients=PATH  with curve_key: the client keys let in, a file of them (one per line) or
//                       a directory of *.pub files, read at construction; default: any client
//                       that knows the server's public key
#pragma once

#include <memory>

#include "actors/runtime/actor.hpp"
#include "actors/runtime/actor_options.hpp"

namespace mqlm::actors {

// Throws std::invalid_argument naming an unknown option or a bad value.
std::unique_ptr<Actor> make_gateway(const ActorOptions& options);

}  // namespace mqlm::actors
