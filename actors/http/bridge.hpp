// The inproc bridge between the http actor and cpp-httplib's handler threads. The threads share
// nothing with the actor: each HTTP request that needs the scheduler opens its own DEALER socket
// to the actor's ROUTER and talks in these frames; the actor owns every table.
//
//   handler ──open / gone / status──▶ http actor ──Submit / Abort / StatusQuery──▶ scheduler
//   handler ◀──accepted / token / final / status── http actor ◀──TokenEvent / FinalEvent / StatusReport──
//   handler ──admin──▶ http actor ──LoadRequest / UnloadRequest / ModelsQuery──▶ enforcer
//   handler ◀──admin_answer── http actor ◀──LoadAnswer / UnloadAnswer / ModelsReport──
//   handler ──admin (clear_cache)──▶ http actor ──ClearCache──▶ cache-writer
//   handler ◀──admin_answer── http actor ◀──CacheCleared──
//
// A message is a one-byte tag frame, then a msgpack body frame when the tag has one. Both ends
// are this process's own code, but bodies are still decoded without trusting them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <msgpack.hpp>
#include <zmq.hpp>

#include "actors/http/http_status.hpp"
#include "messages/cache.hpp"
#include "messages/models.hpp"
#include "messages/serving.hpp"

namespace mqlm::actors::http_bridge {

enum class Tag : std::uint8_t {
  // handler -> actor
  open = 1,    // body: messages::Submit. One request per handler socket.
  gone = 2,    // the HTTP client went away (or the handler gave up): abort the request
  status = 3,  // body (optional): messages::StatusQuery; answered with status_answer
  admin = 4,   // body: AdminCall; answered with admin_answer
  // actor -> handler
  accepted = 11,       // the scheduler took the request into its queue (no error can come first now)
  token = 12,          // body: messages::TokenEvent
  final = 13,          // body: messages::FinalEvent; the request's last message
  status_answer = 14,  // body: StatusAnswer
  admin_answer = 15,   // body: AdminAnswer
};

// The answer to a status: the scheduler's report and the actor's figures, or why there is none.
struct StatusAnswer {
  bool ok = false;
  messages::FinalEvent failure;  // when not ok: finish error with the code and message
  messages::StatusReport report;
  http_status::HttpFigures figures;
  bool has_memory = false;         // the enforcer answered: the model pool and the memory picture
  messages::ModelsReport memory;
  MSGPACK_DEFINE(ok, failure, report, figures, has_memory, memory);
};

// load, unload, models: the enforcer's; clear_cache: the cache-writer's.
enum class AdminOp : std::uint8_t { load = 1, unload = 2, models = 3, clear_cache = 4 };

struct AdminCall {
  std::uint8_t op = 0;  // AdminOp
  std::string model;
  bool if_idle = false;  // unload: only when no request uses the model
  bool wait = false;     // unload: answer when the memory is freed, not when draining starts
  std::uint8_t tier = 0;  // clear_cache: messages::CacheTier
  MSGPACK_DEFINE(op, model, if_idle, wait, tier);
};

// The answer to the call (the one its op asks for), or why there is none.
struct AdminAnswer {
  bool ok = false;
  messages::FinalEvent failure;  // when not ok: finish error with the code and message
  messages::LoadAnswer load;
  messages::UnloadAnswer unload;
  messages::ModelsReport models;
  messages::CacheCleared cleared;
  MSGPACK_DEFINE(ok, failure, load, unload, models, cleared);
};

template <typename T>
std::string pack(const T& value) {
  msgpack::sbuffer buffer;
  msgpack::pack(buffer, value);
  return std::string(buffer.data(), buffer.size());
}

// nullopt when the bytes are not a T.
template <typename T>
std::optional<T> unpack(const zmq::message_t& frame) {
  try {
    msgpack::object_handle handle = msgpack::unpack(static_cast<const char*>(frame.data()), frame.size());
    return handle.get().as<T>();
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

}  // namespace mqlm::actors::http_bridge
