// The gateway: the actor that speaks the client protocol (docs/protocol.md) on a ZeroMQ ROUTER
// socket and turns it into the serving messages (messages/serving.hpp). It owns the map from a
// client's (connection, id) to the request id it gave the scheduler, streams or gathers each
// request's output, and ends every request it opened with exactly one final event: the
// scheduler's, or its own when the client went away, the scheduler fell silent or the server
// stops. Client input never ends or crashes it. The model pool's admin requests (load, unload,
// models) go to the enforcer, whose memory report also joins each status event; clear_cache goes
// to the cache-writer.
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
#pragma once

#include <memory>

#include "actors/runtime/actor.hpp"
#include "actors/runtime/actor_options.hpp"

namespace mqlm::actors {

// Throws std::invalid_argument naming an unknown option or a bad value.
std::unique_ptr<Actor> make_gateway(const ActorOptions& options);

}  // namespace mqlm::actors
