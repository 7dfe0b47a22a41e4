// The inproc bridge between the http actor and cpp-httplib's handler threads. The threads share
// nothing with the actor: each HTTP request that needs the actor opens its own DEALER socket to
// the actor's ROUTER and speaks the message catalog (messages/catalog.hpp), encoded by its codec:
//
//   handler ──Submit / Abort / StatusQuery──▶ http actor (front end core) ──▶ scheduler
//   handler ──LoadRequest / UnloadRequest / ModelsQuery / ClearCache──▶ http actor ──▶ enforcer, cache-writer
//   handler ◀──TokenEvent / FinalEvent / StatusReport / ModelsReport── http actor
//   handler ◀──LoadAnswer / UnloadAnswer / CacheCleared── http actor
//
// The messages are those the front end's core sends on and hears back, with these meanings on
// a handler's socket: one Submit per socket; Abort: the HTTP client went away; a FinalEvent ends
// the request, or is the failure of a status or admin question; a StatusReport on a socket with
// a request open says the scheduler took it (no refusal can come any more); a status question
// is answered by the enforcer's ModelsReport when the server has one, then the StatusReport
// with the http actor's figures as its one blob; an unload is answered twice (draining, then
// its end), as the enforcer answers it. Both ends are this process's own code, but what they
// take is decoded like any message, without trusting it.
#pragma once

#include <optional>

#include <zmq.hpp>

#include "actors/http/http_status.hpp"
#include "messages/codec.hpp"

namespace mqlm::actors::http_bridge {

messages::Frames encode(const messages::Payload& payload, messages::Frames blobs = {});
// nullopt when the frames are not one message.
std::optional<messages::Message> decode(messages::Frames frames);

// The http actor's figures as a status answer's blob, and back (nullopt: not figures).
zmq::message_t figures_frame(const http_status::HttpFigures& figures);
std::optional<http_status::HttpFigures> figures_of(const messages::Message& answer);

}  // namespace mqlm::actors::http_bridge
