// The client side of mqlm's serving protocol (docs/protocol.md): request frames, event decoding
// and a DEALER socket that sends the one and receives the other. `mqlm client` and
// `mqlm bench serve` are built on it.
//
// The server is another process, so every frame it sends is decoded as untrusted input: a frame
// that is not an event of the protocol comes back as a BadEvent value, never as a crash or an
// allocation that the frame's size does not bound.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>
#include <zmq.hpp>

#include "actors/runtime/curve_keys.hpp"
#include "model/sampling/sampling_params.hpp"

namespace mqlm::tools {

// The client's name for a request: the protocol takes a string or an integer.
using RequestId = std::variant<std::int64_t, std::string>;
std::string to_string(const RequestId& id);

struct ChatMessage {
  std::string role;  // "system", "user", "assistant"
  std::string content;
};

// Exactly one way of giving the prompt: text (tokenized by the server), token ids (used exactly
// as given) or a chat (rendered with the model's chat template).
using Prompt = std::variant<std::string, std::vector<std::int32_t>, std::vector<ChatMessage>>;

struct GenerateRequest {
  RequestId id = std::int64_t{0};
  std::string model;  // "": the key is left out and the server uses its default model
  Prompt prompt;
  bool stream = true;
  // Sent in full (every field, defaults too), so a request says what it asked for whatever the
  // server's defaults are.
  model::SamplingParams sampling;
  std::string api_key;  // "": none sent
  std::optional<std::int32_t> draft_max;  // speculative decoding's drafts a step; none: the server's setting
};

struct StatusRequest {
  std::optional<RequestId> id;  // echoed by the status event
  bool trim = false;            // the executor trims its buffer pool first
  std::string api_key;          // "": none sent
};

// One msgpack map each, as sent in one frame.
std::string encode_generate(const GenerateRequest& request);
std::string encode_abort(const RequestId& id, const std::string& api_key = {});
std::string encode_status(const StatusRequest& request);

enum class EventKind { token, final, error, status };
enum class FinishReason { stop, length, abort, error, tool_calls };
std::string_view to_string(EventKind kind);
std::string_view to_string(FinishReason reason);

struct TokenLogprob {
  std::int32_t token = 0;
  double logprob = 0;
  std::vector<std::pair<std::int32_t, double>> top;  // most likely first
};

struct Usage {
  std::int64_t prompt_tokens = 0;
  std::int64_t completion_tokens = 0;
  std::int64_t cached_tokens = 0;
};

struct Timings {  // measured by the server
  double queue_ms = 0;
  double ttft_ms = 0;
  double total_ms = 0;
};

// One event from the server. Fields that the event's kind does not carry stay empty.
struct ServeEvent {
  EventKind kind = EventKind::error;
  std::optional<RequestId> id;         // token and final always; status when the request gave one
  std::vector<std::int32_t> tokens;    // token: this step's tokens; final: all of them (not streaming)
  std::string text;                    // token: whole UTF-8 characters; final: the rest, or all of it
  std::vector<TokenLogprob> logprobs;  // when the request asked for them
  std::optional<FinishReason> finish_reason;  // final
  std::string stop;                    // final: the stop string that ended the request, if one did
  std::optional<Usage> usage;          // final
  std::optional<Timings> timings;      // final
  std::string error_code;              // error events, and finals whose finish reason is error
  std::string error_message;
  nlohmann::json fields;               // the whole event (status figures are read from here)
  std::chrono::steady_clock::time_point received_at;  // set by ServeClient::receive
};

// A frame that is not an event of the protocol: not one msgpack map with string keys, too large
// or too deep, an unknown event, a known key of the wrong type, a required key missing.
struct BadEvent {
  std::string reason;
};

// A long unstreamed final with logprobs is a few MB; unpacking may take ~24 bytes of memory per
// frame byte, so this bounds what a frame can make the client allocate.
inline constexpr std::size_t kMaxEventBytes = std::size_t{16} << 20;

// Decodes one non-empty frame. (An empty frame is a keepalive, which ServeClient skips.)
std::variant<ServeEvent, BadEvent> decode_event(std::span<const std::byte> frame);

// Nothing arrived before the timeout.
struct NoEvent {};
using Received = std::variant<ServeEvent, BadEvent, NoEvent>;

// A DEALER socket connected to a server's ROUTER. Requests go out as they are sent; one client
// may have many generate requests open, told apart by their ids in the events.
class ServeClient {
 public:
  // ZeroMQ connects in the background (and reconnects), so this fails only for an endpoint it
  // cannot use; the message says why. Whether a server answers shows in receive(). With `curve`,
  // the connection is CURVE (encrypted, and the server checks the client's key): a server
  // that refuses the key, or is not the server the key names, never answers.
  static std::variant<ServeClient, std::string> connect(const std::string& endpoint,
                                                        const std::optional<actors::curve::ClientKeys>& curve = {});

  // False when the request could not be queued (ZeroMQ's send queue is full).
  [[nodiscard]] bool send_generate(const GenerateRequest& request);
  [[nodiscard]] bool send_abort(const RequestId& id, const std::string& api_key = {});
  [[nodiscard]] bool send_status(const StatusRequest& request = {});

  // The next event, waiting at most `timeout`. Keepalive frames are skipped without extending
  // the wait: the timeout bounds the time without an event.
  Received receive(std::chrono::milliseconds timeout);

  const std::string& endpoint() const { return endpoint_; }

 private:
  ServeClient(std::string endpoint, zmq::context_t context, zmq::socket_t socket)
      : endpoint_(std::move(endpoint)), context_(std::move(context)), socket_(std::move(socket)) {}
  bool send(const std::string& frame);

  std::string endpoint_;
  zmq::context_t context_;  // declared before socket_, so the socket closes first
  zmq::socket_t socket_;
};

}  // namespace mqlm::tools
