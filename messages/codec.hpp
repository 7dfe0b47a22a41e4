// Wire encoding of a message: frame 0 is the envelope, frame 1 the msgpack payload, frames 2..
// the large payloads (blobs), sent and received without copying.
//
// Decoding takes untrusted bytes: every failure (malformed, truncated, oversized, unknown kind,
// wrong version, out-of-range field) is a DecodeError value, never a crash, a hang or an
// allocation that the input's size does not bound.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include <zmq.hpp>

#include "messages/catalog.hpp"

namespace mqlm::messages {

inline constexpr std::uint8_t kProtocolVersion = 1;
inline constexpr std::size_t kMaxActorNameBytes = 64;

struct Envelope {
  Kind kind{};
  std::uint8_t version = 0;
  std::string from;
  std::string to;
  std::uint64_t correlation_id = 0;  // ties an answer to its question
  std::uint64_t request_id = 0;      // the client request this is about, 0 if none
  std::int64_t sent_ns = 0;          // monotonic clock of the sender's process
};

using Frames = std::vector<zmq::message_t>;

struct Message {
  Envelope envelope;
  Payload payload;
  Frames blobs;

  template <typename T>
  const T* as() const { return std::get_if<T>(&payload); }
  Kind kind() const { return envelope.kind; }
};

struct DecodeLimits {
  std::size_t max_frames = 2 + 4096;                  // envelope, payload and a prefix's pages
                                                      // (kMaxPrefixPages) as blobs
  std::size_t max_envelope_bytes = 512;
  std::size_t max_payload_bytes = std::size_t{1} << 20;
  std::size_t max_blob_bytes = std::size_t{1} << 32;  // per blob frame
};

// The codes decode() can give; the others (mailbox_full, unknown_actor) belong to the runtime.
constexpr bool is_decode_error_code(ErrorCode code) {
  switch (code) {
    case ErrorCode::malformed:
    case ErrorCode::unknown_kind:
    case ErrorCode::bad_version:
    case ErrorCode::too_large:
    case ErrorCode::invalid:
      return true;
    default:
      return false;
  }
}

struct DecodeError {
  ErrorCode code = ErrorCode::malformed;
  std::string detail;
  // Set when the envelope decoded, so the receiver knows whom to answer.
  std::optional<Envelope> envelope;
};

using DecodeResult = std::variant<Message, DecodeError>;

// A blob frame that refers to bytes owned by `owner` instead of copying them: the frame keeps a
// reference until ZeroMQ is done with it (after the send, or after the receiver in this process
// drops it), so the sender may forget the buffer at once.
template <typename Buffer>
zmq::message_t shared_frame(std::shared_ptr<const Buffer> owner) {
  auto* keep = new std::shared_ptr<const Buffer>(owner);  // released by the free function below
  return zmq::message_t(
      const_cast<void*>(static_cast<const void*>(owner->data())), owner->size() * sizeof(*owner->data()),
      [](void*, void* hint) { delete static_cast<std::shared_ptr<const Buffer>*>(hint); }, keep);
}

// The envelope's kind, version and the payload must agree; encode fills kind and version from
// the payload, the caller the rest.
Frames encode(Envelope envelope, const Payload& payload, Frames blobs = {});

DecodeResult decode(Frames frames, const DecodeLimits& limits = {});

// Decodes only frame 0 (for trace filters and for answering a message whose payload is bad).
std::variant<Envelope, DecodeError> decode_envelope(std::span<const std::byte> frame,
                                                    const DecodeLimits& limits = {});

// The payload alone, packed (what replay compares and trace show prints).
std::string pack_payload(const Payload& payload);
// The payload as a msgpack-JSON-like text, for people.
std::string payload_to_text(const Payload& payload);

std::string_view error_code_name(ErrorCode code);

// Unpacks exactly one msgpack object spanning the whole buffer, with the defences decode()
// uses (declared element counts bounded by the bytes, nesting at most 8 deep), so what it
// allocates stays proportional to the buffer. For other untrusted msgpack: the gateway's
// client frames. `what` names the buffer in the error's detail.
std::variant<msgpack::object_handle, DecodeError> unpack_untrusted(std::span<const std::byte> bytes,
                                                                  std::string_view what);

}  // namespace mqlm::messages
