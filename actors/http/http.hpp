// The http actor: the OpenAI API over HTTP (Boost.Beast), the second adapter to the front end's
// core (actors/front_end), beside the gateway: the core owns the request table, the scheduler's
// liveness, Drain and the status / admin / clear-cache fan-outs, so the scheduler cannot tell the
// front ends apart. The HTTP server's handler threads reach the actor only through an inproc
// ROUTER it watches, in the message catalog's own messages (actors/http/bridge.hpp); the actor
// passes them to the core and the core's answers back, and keeps the request counters and
// latency histograms that /api/status and /metrics show. Every request it opened ends with
// exactly one final: the scheduler's, or its own when the client went away, the scheduler fell
// silent or the server stops.
//
// Options (key=value, as `mqlm node` passes them):
//   listen=HOST:PORT     where HTTP clients connect; default 127.0.0.1:8080 (port 0: any free one)
//   scheduler=NAME       the scheduler actor; default scheduler
//   enforcer=NAME        the memory enforcer; default none (no admin endpoints, no memory in status)
//   cache_writer=NAME    the KV prefix cache's cache-writer; default none (the clears answer 400)
//   api_key=KEY, api_keys=K1,K2, admin_api_keys=K1,K2
//                        when any is set, every endpoint but /health, /ready and /live wants
//                        Authorization: Bearer KEY; with admin keys, only they may load, unload
//                        and clear caches
//   max_body_bytes=N     larger request bodies get 413; default and most 1000000 (the scheduler
//                        decodes Submits of up to 1 MiB)
//   max_requests=N       requests open at once; beyond, 503; default 4096
//   threads=N            requests being answered at once, most (a streaming request holds one
//                        while it waits for its next token; idle connections hold none); default 1024
//   max_connections=N    HTTP connections open at once; beyond, 503 and close; default 4096
//   keepalive_ms=N       an SSE comment to a stream that was sent nothing for this long, so that
//                        a vanished client is noticed; default 250
//   heartbeat_ms=N       how often the scheduler is sent a Heartbeat; default 200
//   unavailable_ms=N     open requests fail with 503 when the scheduler said nothing for this
//                        long (more than heartbeat_ms); default 800. A cache clear answers 503
//                        when the cache-writer (heartbeaten while clears wait) said nothing for
//                        this long.
//   history_ms=N         how often the status page's samples are taken (the last 360 are kept,
//                        an hour at the default 10000)
#pragma once

#include <memory>

#include "actors/runtime/actor.hpp"
#include "actors/runtime/actor_options.hpp"

namespace mqlm::actors {

// Throws std::invalid_argument naming an unknown option or a bad value.
std::unique_ptr<Actor> make_http(const ActorOptions& options);

}  // namespace mqlm::actors
