#include "messages/codec.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>

namespace mqlm::messages {
namespace {

constexpr std::uint32_t kEnvelopeFields = 8;

constexpr std::size_t kMaxDepth = 8;

msgpack::unpack_limit limits_for(std::size_t bytes) {
  // Counts can never exceed the bytes that carry them; depth stays small because no message
  // nests more than a few levels.
  return msgpack::unpack_limit(bytes, bytes, bytes, bytes, 0, kMaxDepth);
}

// unpack() reserves 24 bytes per element (48 per pair) as soon as it reads an array's or map's
// header. limits_for() caps each count at the frame's size, but nested headers could each claim
// that much: eight ~1M-element array headers in a 1 MiB payload made unpack() reserve 270 MB.
// Every element takes at least a byte of the frame, so a frame whose headers declare more
// elements in all than it has bytes is never valid; this pass, which allocates nothing, rejects
// it before unpack() runs, bounding what unpack() reserves to 24 bytes per frame byte.
class DeclaredElementBudget : public msgpack::null_visitor {
 public:
  explicit DeclaredElementBudget(std::size_t bytes) : left_(bytes) {}
  bool start_array(std::uint32_t elements) { return open(elements); }
  bool start_map(std::uint32_t pairs) { return open(std::uint64_t{pairs} * 2); }
  bool end_array() { return close(); }
  bool end_map() { return close(); }

 private:
  bool open(std::uint64_t elements) {
    if (++depth_ > kMaxDepth) throw msgpack::depth_size_overflow("depth size overflow");
    if (elements > left_) {
      throw msgpack::size_overflow("its containers declare more elements than it has bytes");
    }
    left_ -= elements;
    return true;
  }
  bool close() {
    --depth_;
    return true;
  }
  std::uint64_t left_;
  std::size_t depth_ = 0;
};

DecodeError error(ErrorCode code, std::string detail, std::optional<Envelope> envelope = {}) {
  return DecodeError{code, std::move(detail), std::move(envelope)};
}

// Unpacks exactly one msgpack object spanning the whole frame.
std::variant<msgpack::object_handle, DecodeError> unpack_whole(const char* data, std::size_t size,
                                                              std::string_view what) {
  try {
    DeclaredElementBudget budget(size);
    std::size_t scanned = 0;
    msgpack::parse(data, size, scanned, budget);  // throws if overspent; unpack() finds other faults
    std::size_t offset = 0;
    msgpack::object_handle handle =
        msgpack::unpack(data, size, offset, nullptr, nullptr, limits_for(size));
    if (offset != size) {
      return error(ErrorCode::malformed, std::string(what) + ": " + std::to_string(size - offset) +
                                             " trailing bytes after the msgpack object");
    }
    return handle;
  } catch (const msgpack::insufficient_bytes&) {
    return error(ErrorCode::malformed, std::string(what) + ": truncated msgpack");
  } catch (const std::exception& e) {
    return error(ErrorCode::malformed, std::string(what) + ": " + e.what());
  }
}

bool valid_actor_name(const std::string& name) {
  if (name.empty() || name.size() > kMaxActorNameBytes) return false;
  for (unsigned char c : name) {
    if (c < 0x21 || c > 0x7e) return false;
  }
  return true;
}

template <typename T>
std::uint32_t field_count() {
  static const std::uint32_t count = [] {
    msgpack::sbuffer buffer;
    msgpack::pack(buffer, T{});
    return msgpack::unpack(buffer.data(), buffer.size())->via.array.size;
  }();
  return count;
}

// Range checks beyond what the msgpack types enforce; empty means valid.
template <typename T>
std::string validate(const T&) { return {}; }

std::string validate(const Error& e) {
  return e.code >= 1 && e.code <= 7 ? std::string{} : "Error.code out of range";
}

std::string validate(const ActorFailed& f) {
  return f.failure == 1 || f.failure == 2 ? std::string{} : "ActorFailed.failure out of range";
}

std::string validate(const Submit& s) {
  return s.prompt_kind >= 1 && s.prompt_kind <= 3 ? std::string{} : "Submit.prompt_kind out of range";
}

std::string validate(const Abort& a) {
  return a.reason >= 1 && a.reason <= 3 ? std::string{} : "Abort.reason out of range";
}

std::string validate(const FinalEvent& f) {
  if (f.finish < 1 || f.finish > static_cast<std::uint8_t>(FinishReason::tool_calls)) {
    return "FinalEvent.finish out of range";
  }
  return f.error <= static_cast<std::uint16_t>(RequestError::forbidden) ? std::string{}
                                                                         : "FinalEvent.error out of range";
}

std::string validate(const LoadAnswer& a) {
  return a.outcome >= 1 && a.outcome <= 5 ? std::string{} : "LoadAnswer.outcome out of range";
}

std::string validate(const UnloadAnswer& a) {
  return a.outcome >= 1 && a.outcome <= 5 ? std::string{} : "UnloadAnswer.outcome out of range";
}

// A logprob is at most 0 (a little above from rounding); one past 1e9 is nonsense, and values
// near 2^64 would make msgpack's packer, which checks whether a float is a whole number by
// converting it to uint64, overflow when the message is encoded again (found by the fuzzer).
bool logprob_in_range(float value) { return !(value > 1e9f); }

bool logprobs_in_range(const TokenLogprobs& l) {
  return logprob_in_range(l.logprob) && std::all_of(l.top_logprobs.begin(), l.top_logprobs.end(), logprob_in_range);
}

std::string validate(const TokenEvent& e) {
  return std::all_of(e.logprobs.begin(), e.logprobs.end(), logprobs_in_range) ? std::string{}
                                                                                : "TokenEvent.logprobs out of range";
}

std::string validate(const StepResult& r) {
  for (const OutputToken& t : r.tokens) {
    if (!logprobs_in_range(t.logprobs)) return "StepResult.tokens[].logprobs out of range";
  }
  return {};
}

std::string validate(const ModelsReport& r) {
  if (r.pressure > 2) return "ModelsReport.pressure out of range";
  if (!(r.ceiling_fraction >= 0.0 && r.ceiling_fraction <= 1.0)) return "ModelsReport.ceiling_fraction out of range";
  for (const ModelStatus& m : r.models) {
    if (m.state < 1 || m.state > 4) return "ModelsReport.models[].state out of range";
  }
  return {};
}

std::string validate(const PrefixLookup& l) {
  return l.keys.size() <= kMaxPrefixPages ? std::string{} : "PrefixLookup.keys: more than kMaxPrefixPages";
}

std::string validate(const CachedPrefix& c) {
  if (c.pages.size() > kMaxPrefixPages) return "CachedPrefix.pages: more than kMaxPrefixPages";
  if (c.tiers.size() != c.pages.size()) return "CachedPrefix.tiers: not one per page";
  for (std::uint8_t t : c.tiers) {
    if (t < 1 || t > 2) return "CachedPrefix.tiers[] out of range";
  }
  return {};
}

std::string validate(const ClearCache& c) {
  return c.tier >= 1 && c.tier <= 2 ? std::string{} : "ClearCache.tier out of range";
}

std::string validate(const StepPlan& p) {
  if (p.restore.size() > kMaxPrefixPages || p.spill.size() > kMaxPrefixPages) {
    return "StepPlan: more restore or spill pages than kMaxPrefixPages";
  }
  return {};
}

// msgpack's packer tells whether a float is a whole number by converting it to a 64-bit integer,
// which overflows for finite values of 2^63 and more in magnitude; a message carrying one could
// not be encoded again. The fuzzer found such floats field after field (ModelsReport, TokenEvent,
// StepPlan's sampling parameters), so no field may carry one: the payload is invalid.
bool floats_encodable(const msgpack::object& o) {
  switch (o.type) {
    case msgpack::type::FLOAT32:
    case msgpack::type::FLOAT64: return std::isinf(o.via.f64) || !(std::abs(o.via.f64) >= 0x1p63);
    case msgpack::type::ARRAY:
      return std::all_of(o.via.array.ptr, o.via.array.ptr + o.via.array.size, floats_encodable);
    case msgpack::type::MAP:
      return std::all_of(o.via.map.ptr, o.via.map.ptr + o.via.map.size, [](const msgpack::object_kv& kv) {
        return floats_encodable(kv.key) && floats_encodable(kv.val);
      });
    default: return true;
  }
}

template <typename T>
std::variant<Payload, DecodeError> convert_payload(const msgpack::object& obj) {
  if (obj.type != msgpack::type::ARRAY) {
    return error(ErrorCode::malformed, std::string(MessageTraits<T>::name) + ": payload is not an array");
  }
  if (obj.via.array.size != field_count<T>()) {
    return error(ErrorCode::malformed, std::string(MessageTraits<T>::name) + ": expected " +
                                           std::to_string(field_count<T>()) + " fields, got " +
                                           std::to_string(obj.via.array.size));
  }
  if (!floats_encodable(obj)) {
    return error(ErrorCode::invalid, std::string(MessageTraits<T>::name) + ": a float of 2^63 or more in magnitude");
  }
  T value;
  try {
    obj.convert(value);
  } catch (const std::exception& e) {
    return error(ErrorCode::malformed,
                 std::string(MessageTraits<T>::name) + ": field of the wrong type (" + e.what() + ")");
  }
  if (std::string why = validate(value); !why.empty()) return error(ErrorCode::invalid, why);
  return Payload{std::move(value)};
}

std::variant<Payload, DecodeError> convert_by_kind(Kind kind, const msgpack::object& obj) {
  switch (kind) {
#define MQLM_CONVERT_CASE(byte, type, ver, policy) \
  case Kind::type:                                 \
    return convert_payload<type>(obj);
    MQLM_MESSAGE_CATALOG(MQLM_CONVERT_CASE)
#undef MQLM_CONVERT_CASE
  }
  return error(ErrorCode::unknown_kind, "unknown kind");
}

zmq::message_t to_frame(const msgpack::sbuffer& buffer) {
  return zmq::message_t(buffer.data(), buffer.size());
}

}  // namespace

std::variant<msgpack::object_handle, DecodeError> unpack_untrusted(std::span<const std::byte> bytes,
                                                                  std::string_view what) {
  return unpack_whole(reinterpret_cast<const char*>(bytes.data()), bytes.size(), what);
}

std::string_view error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::malformed: return "malformed";
    case ErrorCode::unknown_kind: return "unknown_kind";
    case ErrorCode::bad_version: return "bad_version";
    case ErrorCode::too_large: return "too_large";
    case ErrorCode::invalid: return "invalid";
    case ErrorCode::mailbox_full: return "mailbox_full";
    case ErrorCode::unknown_actor: return "unknown_actor";
  }
  return "unknown_error";
}

Frames encode(Envelope envelope, const Payload& payload, Frames blobs) {
  envelope.kind = kind_of(payload);
  envelope.version = schema_version(envelope.kind);

  msgpack::sbuffer head;
  msgpack::packer<msgpack::sbuffer> packer(head);
  packer.pack_array(kEnvelopeFields);
  packer.pack(kProtocolVersion);
  packer.pack(static_cast<std::uint8_t>(envelope.kind));
  packer.pack(envelope.version);
  packer.pack(envelope.from);
  packer.pack(envelope.to);
  packer.pack(envelope.correlation_id);
  packer.pack(envelope.request_id);
  packer.pack(envelope.sent_ns);

  Frames frames;
  frames.reserve(2 + blobs.size());
  frames.push_back(to_frame(head));
  frames.emplace_back(pack_payload(payload));
  for (auto& blob : blobs) frames.push_back(std::move(blob));
  return frames;
}

std::string pack_payload(const Payload& payload) {
  msgpack::sbuffer buffer;
  std::visit(
      [&](const auto& p) {
        using T = std::decay_t<decltype(p)>;
        if constexpr (!std::is_same_v<T, std::monostate>) msgpack::pack(buffer, p);
      },
      payload);
  return std::string(buffer.data(), buffer.size());
}

std::string payload_to_text(const Payload& payload) {
  std::string packed = pack_payload(payload);
  if (packed.empty()) return "-";
  std::ostringstream out;
  out << msgpack::unpack(packed.data(), packed.size()).get();
  return out.str();
}

std::variant<Envelope, DecodeError> decode_envelope(std::span<const std::byte> frame,
                                                    const DecodeLimits& limits) {
  if (frame.size() > limits.max_envelope_bytes) {
    return error(ErrorCode::too_large, "envelope of " + std::to_string(frame.size()) +
                                           " bytes exceeds " + std::to_string(limits.max_envelope_bytes));
  }
  auto unpacked = unpack_whole(reinterpret_cast<const char*>(frame.data()), frame.size(), "envelope");
  if (auto* e = std::get_if<DecodeError>(&unpacked)) return *e;
  const msgpack::object& obj = std::get<msgpack::object_handle>(unpacked).get();
  // Every protocol's envelope starts with its protocol number, whatever follows: check it before
  // the shape, so a peer on another protocol hears bad_version, not malformed.
  if (obj.type == msgpack::type::ARRAY && obj.via.array.size > 0 &&
      obj.via.array.ptr[0].type == msgpack::type::POSITIVE_INTEGER &&
      obj.via.array.ptr[0].via.u64 != kProtocolVersion) {
    return error(ErrorCode::bad_version, "envelope: protocol " + std::to_string(obj.via.array.ptr[0].via.u64) +
                                             ", this build speaks " + std::to_string(kProtocolVersion));
  }
  if (obj.type != msgpack::type::ARRAY || obj.via.array.size != kEnvelopeFields) {
    return error(ErrorCode::malformed, "envelope: expected an array of 8 fields");
  }
  const msgpack::object* f = obj.via.array.ptr;
  Envelope envelope;
  std::uint8_t protocol = 0;
  std::uint8_t kind = 0;
  try {
    f[0].convert(protocol);  // checked above to be kProtocolVersion if it is an integer at all
    f[1].convert(kind);
    f[2].convert(envelope.version);
    f[3].convert(envelope.from);
    f[4].convert(envelope.to);
    f[5].convert(envelope.correlation_id);
    f[6].convert(envelope.request_id);
    f[7].convert(envelope.sent_ns);
  } catch (const std::exception& e) {
    return error(ErrorCode::malformed, std::string("envelope: field of the wrong type (") + e.what() + ")");
  }
  if (!valid_actor_name(envelope.from) || !valid_actor_name(envelope.to)) {
    return error(ErrorCode::invalid, "envelope: actor names must be 1 to 64 printable ASCII characters");
  }
  envelope.kind = static_cast<Kind>(kind);
  // From here on the envelope is trustworthy enough to answer its sender.
  if (!is_known_kind(kind)) {
    return error(ErrorCode::unknown_kind, "unknown message kind " + std::to_string(kind), envelope);
  }
  if (envelope.version != schema_version(envelope.kind)) {
    return error(ErrorCode::bad_version,
                 std::string(kind_name(envelope.kind)) + " version " + std::to_string(envelope.version) +
                     ", this build speaks " + std::to_string(schema_version(envelope.kind)),
                 envelope);
  }
  return envelope;
}

DecodeResult decode(Frames frames, const DecodeLimits& limits) {
  if (frames.size() < 2) {
    return error(ErrorCode::malformed, "expected at least 2 frames (envelope, payload), got " +
                                           std::to_string(frames.size()));
  }
  if (frames.size() > limits.max_frames) {
    return error(ErrorCode::too_large, std::to_string(frames.size()) + " frames exceed the limit of " +
                                           std::to_string(limits.max_frames));
  }
  auto head = decode_envelope(
      std::span<const std::byte>(static_cast<const std::byte*>(frames[0].data()), frames[0].size()), limits);
  if (auto* e = std::get_if<DecodeError>(&head)) return *e;
  Envelope envelope = std::get<Envelope>(std::move(head));

  const zmq::message_t& body = frames[1];
  if (body.size() > limits.max_payload_bytes) {
    return error(ErrorCode::too_large, "payload of " + std::to_string(body.size()) + " bytes exceeds " +
                                           std::to_string(limits.max_payload_bytes), envelope);
  }
  for (std::size_t i = 2; i < frames.size(); ++i) {
    if (frames[i].size() > limits.max_blob_bytes) {
      return error(ErrorCode::too_large, "blob frame " + std::to_string(i - 2) + " exceeds " +
                                             std::to_string(limits.max_blob_bytes) + " bytes", envelope);
    }
  }
  auto unpacked = unpack_whole(static_cast<const char*>(body.data()), body.size(), "payload");
  if (auto* e = std::get_if<DecodeError>(&unpacked)) {
    e->envelope = envelope;
    return *e;
  }
  auto converted = convert_by_kind(envelope.kind, std::get<msgpack::object_handle>(unpacked).get());
  if (auto* e = std::get_if<DecodeError>(&converted)) {
    e->envelope = envelope;
    return *e;
  }
  Message message{std::move(envelope), std::get<Payload>(std::move(converted)), {}};
  message.blobs.reserve(frames.size() - 2);
  for (std::size_t i = 2; i < frames.size(); ++i) message.blobs.push_back(std::move(frames[i]));
  return message;
}

}  // namespace mqlm::messages
