// The client side of the gateway (docs/protocol.md): a client's frame, a msgpack map, parsed
// into a typed request or an error value; and the events the gateway sends back, encoded as
// msgpack maps. Frames come from anyone who can connect, so parsing bounds every size, checks
// every type and rejects unknown and repeated keys; it never throws on input.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/front_end/events.hpp"
#include "actors/front_end/front_end.hpp"
#include "messages/cache.hpp"
#include "messages/codec.hpp"
#include "messages/models.hpp"
#include "messages/serving.hpp"

namespace mqlm::actors::client_protocol {

// A request frame is at most as long as any front end's request (front_end::kMaxRequestBytes).
inline constexpr std::size_t kMaxFrameBytes = front_end::kMaxRequestBytes;
inline constexpr std::size_t kMaxKeys = 32;             // a generate has 28 known keys, and api_key
inline constexpr std::size_t kMaxKeyBytes = 64;
inline constexpr std::size_t kMaxIdBytes = 256;
using front_end::kMaxChatTurns;
using front_end::kMaxModelNameBytes;
using front_end::kMaxPromptTokens;
using front_end::kMaxRoleBytes;

// The client's name for a request, an integer or a string, echoed as the client gave it.
using ClientId = front_end::ClientId;

struct GenerateRequest {
  ClientId id;
  bool stream = true;
  messages::Submit submit;  // prompt kind, prompt, model and validated sampling parameters
};

struct AbortRequest {
  ClientId id;
};

struct StatusRequest {
  std::optional<ClientId> id;
  bool trim = false;
};

// The admin requests: the model pool's (answered by the enforcer through the gateway): load a
// model, unload it (if_idle: only when no request uses it), or list the models with their states;
// and the KV prefix cache's (answered by the cache-writer): empty its hot or SSD tier.
enum class AdminOp { load, unload, models, clear_cache };

struct AdminRequest {
  AdminOp op = AdminOp::models;
  std::optional<ClientId> id;
  std::string model;  // load, unload: required; models: "" for every model
  bool if_idle = false;
  messages::CacheTier tier = messages::CacheTier::hot;  // clear_cache: required
};

// A frame that is no usable request. code is RequestError::malformed (not a map of known keys
// and types) or invalid_request (a value out of range, a missing or ambiguous prompt).
struct RequestProblem {
  messages::RequestError code = messages::RequestError::malformed;
  std::string message;         // says what was wrong, naming the key
  std::optional<ClientId> id;  // the frame's id, when it had a usable one
  bool generate = false;       // the frame was a generate: with an id, it is answered by a final
};

using ClientRequest = std::variant<GenerateRequest, AbortRequest, StatusRequest, AdminRequest, RequestProblem>;

// api_key, when given, receives the frame's "api_key" (a string any request may carry; "" when
// it has none), which the parsed request leaves out.
inline constexpr std::size_t kMaxApiKeyBytes = 256;
ClientRequest parse_request(std::span<const std::byte> frame, std::string* api_key = nullptr);

// The event encoders; each returns one frame's bytes.
std::string encode_token_event(const ClientId& id, const messages::TokenEvent& event, bool with_logprobs);
// gathered: what a client that does not stream has not seen yet (empty for streaming clients).
std::string encode_final_event(const ClientId& id, const messages::FinalEvent& final_event,
                               const front_end::GatheredOutput& gathered, bool with_logprobs);
std::string encode_error_event(messages::RequestError code, std::string_view message,
                               const std::optional<ClientId>& id);
// The gateway's own figures in a status event.
struct GatewayFigures {
  std::uint64_t open_requests = 0;  // "gateway_requests"
  std::uint64_t curve_refused = 0;  // CURVE handshakes its ZAP handler refused
};
// memory: the enforcer's report, when the server has one (the event's "memory" key).
std::string encode_status_event(const std::optional<ClientId>& id, const messages::StatusReport& report,
                                const GatewayFigures& gateway, const messages::ModelsReport* memory = nullptr);
// An event whose fields are `fields` (a JSON object) besides "event" and, when given, "id".
std::string encode_json_event(std::string_view event, const std::optional<ClientId>& id, nlohmann::json fields);

// The id as a person reads it in a message: 7 or "abc".
std::string describe(const ClientId& id);

}  // namespace mqlm::actors::client_protocol
