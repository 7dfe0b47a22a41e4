// The wire codec: every catalog type round-trips, and every way a peer can get the frames wrong
// comes back as the right DecodeError, with the envelope reported only once it is trustworthy.
#include "messages/codec.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <limits>
#include <map>
#include <new>
#include <random>
#include <string>
#include <vector>

#include "tests/messages/message_samples.hpp"

// ---- allocation probe ----------------------------------------------------------------------
// The test binary links with -Wl,--wrap=malloc, so every malloc in this executable (msgpack's
// zone chunks in codec.cpp included) and every operator new (replaced below) passes through
// here. While a probe is open it records the largest single request: that is how the tests prove
// that a declared 4 GiB length is never allocated, which a timing check alone cannot (a failed
// 4 GiB malloc returns quickly too).
namespace {
std::atomic<bool> g_probe_open{false};
std::atomic<std::size_t> g_largest_allocation{0};
std::atomic<std::size_t> g_total_allocated{0};
}  // namespace

extern "C" void* __real_malloc(std::size_t size);
extern "C" void* __wrap_malloc(std::size_t size) {
  if (g_probe_open.load(std::memory_order_relaxed)) {
    g_total_allocated.fetch_add(size, std::memory_order_relaxed);
    std::size_t seen = g_largest_allocation.load(std::memory_order_relaxed);
    while (size > seen && !g_largest_allocation.compare_exchange_weak(seen, size)) {
    }
  }
  return __real_malloc(size);
}

// Out of line, so that the compiler does not see free() meet operator new's pointer.
[[gnu::noinline]] void* operator new(std::size_t size) {
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
[[gnu::noinline]] void operator delete(void* p) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace mqlm::messages {
namespace {

using namespace std::string_literals;
using samples::sample;

struct DecodeCost {
  std::size_t largest_allocation = 0;
  std::size_t total_allocated = 0;  // frees not subtracted: an upper bound on the peak
  std::chrono::microseconds elapsed{};
};

DecodeCost measure(const std::function<void()>& run) {
  g_largest_allocation = 0;
  g_total_allocated = 0;
  g_probe_open = true;
  auto start = std::chrono::steady_clock::now();
  run();
  auto elapsed = std::chrono::steady_clock::now() - start;
  g_probe_open = false;
  return {g_largest_allocation.load(), g_total_allocated.load(), std::chrono::duration_cast<std::chrono::microseconds>(elapsed)};
}

// ---- building frames by hand ---------------------------------------------------------------

std::string bytes_of(const zmq::message_t& frame) {
  return std::string(static_cast<const char*>(frame.data()), frame.size());
}

template <typename T>
std::string packed(const T& value) {
  msgpack::sbuffer buffer;
  msgpack::pack(buffer, value);
  return std::string(buffer.data(), buffer.size());
}

std::string nil() { return packed(msgpack::type::nil_t{}); }

std::string packed_array(const std::vector<std::string>& packed_items) {
  msgpack::sbuffer buffer;
  msgpack::packer<msgpack::sbuffer>(buffer).pack_array(static_cast<std::uint32_t>(packed_items.size()));
  std::string out(buffer.data(), buffer.size());
  for (const auto& item : packed_items) out += item;
  return out;
}

// The elements of a packed msgpack array, each re-packed on its own.
std::vector<std::string> packed_elements(const std::string& packed_array_bytes) {
  msgpack::object_handle handle = msgpack::unpack(packed_array_bytes.data(), packed_array_bytes.size());
  const msgpack::object& array = handle.get();
  std::vector<std::string> items;
  for (std::uint32_t i = 0; i < array.via.array.size; ++i) items.push_back(packed(array.via.array.ptr[i]));
  return items;
}

Frames frames_of(const std::vector<std::string>& parts) {
  Frames frames;
  for (const auto& part : parts) frames.emplace_back(part.data(), part.size());
  return frames;
}

Envelope sample_envelope() {
  Envelope envelope;
  envelope.from = "client-7";
  envelope.to = "gpu.worker_0";
  envelope.correlation_id = 0xDEAD'BEEF'CAFE'BABEULL;
  envelope.request_id = std::numeric_limits<std::uint64_t>::max();
  envelope.sent_ns = std::numeric_limits<std::int64_t>::min();
  return envelope;
}

// The envelope's eight fields, each packed, in wire order; tests replace one to break it.
std::vector<std::string> envelope_fields(Kind kind, std::uint8_t version) {
  const Envelope e = sample_envelope();
  return {packed(kProtocolVersion), packed(static_cast<std::uint8_t>(kind)), packed(version), packed(e.from),
          packed(e.to), packed(e.correlation_id), packed(e.request_id), packed(e.sent_ns)};
}
std::vector<std::string> envelope_fields(Kind kind) { return envelope_fields(kind, schema_version(kind)); }

std::string envelope_bytes(Kind kind) { return packed_array(envelope_fields(kind)); }
std::string ping_envelope() { return envelope_bytes(Kind::Ping); }
std::string ping_payload() { return pack_payload(sample<Ping>()); }

DecodeResult decode_parts(const std::vector<std::string>& parts, const DecodeLimits& limits = {}) {
  return decode(frames_of(parts), limits);
}

std::vector<Payload> all_samples() { return samples::all_sample_payloads(); }

bool same_envelope(const Envelope& a, const Envelope& b) {
  return a.kind == b.kind && a.version == b.version && a.from == b.from && a.to == b.to &&
         a.correlation_id == b.correlation_id && a.request_id == b.request_id && a.sent_ns == b.sent_ns;
}

// A decode that must fail with `code`, reporting the envelope back or not.
testing::AssertionResult fails_with(const DecodeResult& result, ErrorCode code, bool envelope_reported) {
  const auto* error = std::get_if<DecodeError>(&result);
  if (error == nullptr) return testing::AssertionFailure() << "decoded, expected " << error_code_name(code);
  if (error->code != code) {
    return testing::AssertionFailure() << "got " << error_code_name(error->code) << " (" << error->detail
                                       << "), expected " << error_code_name(code);
  }
  if (error->detail.empty()) return testing::AssertionFailure() << "no detail for the user";
  if (error->envelope.has_value() != envelope_reported) {
    return testing::AssertionFailure() << "envelope " << (envelope_reported ? "missing" : "reported")
                                       << " (" << error->detail << ")";
  }
  if (envelope_reported) {
    const Envelope& e = *error->envelope;
    const Envelope expected = sample_envelope();
    if (e.from != expected.from || e.to != expected.to || e.correlation_id != expected.correlation_id ||
        e.request_id != expected.request_id || e.sent_ns != expected.sent_ns) {
      return testing::AssertionFailure() << "reported envelope differs from the one sent";
    }
  }
  return testing::AssertionSuccess() << error->detail;
}

testing::AssertionResult decodes(const DecodeResult& result) {
  if (const auto* error = std::get_if<DecodeError>(&result)) {
    return testing::AssertionFailure() << error_code_name(error->code) << ": " << error->detail;
  }
  return testing::AssertionSuccess();
}

// ---- round trip of the whole catalog -------------------------------------------------------

std::vector<std::vector<std::string>> blob_sets() {
  std::string big(1 << 20, '\0');
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 131 + (i >> 9));
  return {{}, {"\x00\x01\xfe\xff binary\0tail"s}, {""s, "x"s, big}};
}

template <typename T>
void expect_round_trip(std::uint8_t kind_byte, std::uint8_t version) {
  const T value = sample<T>();
  const std::vector<std::string> fields = packed_elements(packed(value));

  // A sample whose field equals the default would hide a codec that drops that field.
  const std::vector<std::string> defaults = packed_elements(packed(T{}));
  ASSERT_EQ(fields.size(), defaults.size());
  for (std::size_t i = 0; i < fields.size(); ++i) {
    EXPECT_NE(fields[i], defaults[i]) << "sample field " << i << " holds its default value";
  }

  for (const auto& blobs : blob_sets()) {
    SCOPED_TRACE(std::to_string(blobs.size()) + " blobs");
    Envelope sent = sample_envelope();
    sent.kind = Kind::Error;  // encode takes kind and version from the payload, not the caller
    sent.version = 99;
    Frames frames = encode(sent, Payload{value}, frames_of(blobs));
    ASSERT_EQ(frames.size(), 2 + blobs.size());

    DecodeResult result = decode(std::move(frames));
    ASSERT_TRUE(decodes(result));
    const Message& message = std::get<Message>(result);

    EXPECT_EQ(static_cast<std::uint8_t>(message.kind()), kind_byte);
    EXPECT_EQ(message.kind(), MessageTraits<T>::kind);
    EXPECT_EQ(message.envelope.version, version);
    const Envelope expected = sample_envelope();
    EXPECT_EQ(message.envelope.from, expected.from);
    EXPECT_EQ(message.envelope.to, expected.to);
    EXPECT_EQ(message.envelope.correlation_id, expected.correlation_id);
    EXPECT_EQ(message.envelope.request_id, expected.request_id);
    EXPECT_EQ(message.envelope.sent_ns, expected.sent_ns);

    const T* decoded = message.as<T>();
    ASSERT_NE(decoded, nullptr);
    EXPECT_EQ(packed_elements(packed(*decoded)), fields);  // field by field

    ASSERT_EQ(message.blobs.size(), blobs.size());
    for (std::size_t i = 0; i < blobs.size(); ++i) {
      EXPECT_TRUE(bytes_of(message.blobs[i]) == blobs[i]) << "blob " << i << " changed";
    }
  }
}

TEST(MessagesCodec, EveryCatalogTypeRoundTrips) {
#define MQLM_ROUND_TRIP(byte, type, version, policy) \
  {                                                  \
    SCOPED_TRACE(#type);                             \
    expect_round_trip<type>(byte, version);          \
  }
  MQLM_MESSAGE_CATALOG(MQLM_ROUND_TRIP)
#undef MQLM_ROUND_TRIP
}

TEST(MessagesCodec, CatalogLookupsAgreeWithTraits) {
  std::vector<bool> seen(256, false);
#define MQLM_CHECK_ROW(byte, type, version, policy)                          \
  {                                                                          \
    SCOPED_TRACE(#type);                                                     \
    EXPECT_FALSE(seen[byte]) << "kind byte used twice";                      \
    seen[byte] = true;                                                       \
    EXPECT_TRUE(is_known_kind(byte));                                        \
    EXPECT_EQ(kind_name(Kind::type), #type);                                 \
    EXPECT_EQ(schema_version(Kind::type), version);                          \
    EXPECT_EQ(when_full(Kind::type), policy);                                \
    EXPECT_EQ(kind_of(Payload{type{}}), Kind::type);                         \
    Kind by_name{};                                                          \
    EXPECT_TRUE(kind_from_name(#type, by_name));                             \
    EXPECT_EQ(by_name, Kind::type);                                          \
  }
  MQLM_MESSAGE_CATALOG(MQLM_CHECK_ROW)
#undef MQLM_CHECK_ROW
  EXPECT_EQ(all_kinds().size(), std::variant_size_v<Payload> - 1);  // every type but monostate
  EXPECT_EQ(all_samples().size(), all_kinds().size());
}

TEST(MessagesCodec, HandBuiltEnvelopeMatchesEncoder) {
  // The malformed-input tests below break one thing in a hand-built envelope; this proves the
  // unbroken one is byte-for-byte what encode() sends.
  for (const Payload& payload : all_samples()) {
    Frames frames = encode(sample_envelope(), payload);
    EXPECT_EQ(bytes_of(frames[0]), envelope_bytes(kind_of(payload)));
    EXPECT_TRUE(decodes(decode_parts({envelope_bytes(kind_of(payload)), pack_payload(payload)})));
  }
}

// ---- frame count and size limits -----------------------------------------------------------

TEST(MessagesCodec, FewerThanTwoFramesIsMalformed) {
  EXPECT_TRUE(fails_with(decode(Frames{}), ErrorCode::malformed, false));
  EXPECT_TRUE(fails_with(decode_parts({ping_envelope()}), ErrorCode::malformed, false));
}

TEST(MessagesCodec, TooManyFramesIsTooLargeBeforeTheEnvelopeIsRead) {
  DecodeLimits limits;
  limits.max_frames = 4;
  EXPECT_TRUE(decodes(decode_parts({ping_envelope(), ping_payload(), "a", "b"}, limits)));
  EXPECT_TRUE(fails_with(decode_parts({ping_envelope(), ping_payload(), "a", "b", "c"}, limits),
                         ErrorCode::too_large, false));
  // The default allows the envelope, the payload and a prefix's pages as blobs.
  std::vector<std::string> parts{ping_envelope(), ping_payload()};
  parts.resize(2 + kMaxPrefixPages);
  EXPECT_TRUE(decodes(decode_parts(parts)));
  parts.emplace_back();
  EXPECT_TRUE(fails_with(decode_parts(parts), ErrorCode::too_large, false));
}

TEST(MessagesCodec, OversizedEnvelopeIsTooLarge) {
  DecodeLimits limits;
  limits.max_envelope_bytes = ping_envelope().size();
  EXPECT_TRUE(decodes(decode_parts({ping_envelope(), ping_payload()}, limits)));
  limits.max_envelope_bytes -= 1;
  EXPECT_TRUE(fails_with(decode_parts({ping_envelope(), ping_payload()}, limits), ErrorCode::too_large, false));
}

TEST(MessagesCodec, OversizedPayloadIsTooLargeAndReportsTheEnvelope) {
  DecodeLimits limits;
  limits.max_payload_bytes = ping_payload().size();
  EXPECT_TRUE(decodes(decode_parts({ping_envelope(), ping_payload()}, limits)));
  limits.max_payload_bytes -= 1;
  EXPECT_TRUE(fails_with(decode_parts({ping_envelope(), ping_payload()}, limits), ErrorCode::too_large, true));
}

TEST(MessagesCodec, OversizedBlobIsTooLargeAndReportsTheEnvelope) {
  DecodeLimits limits;
  limits.max_blob_bytes = 8;
  EXPECT_TRUE(decodes(decode_parts({ping_envelope(), ping_payload(), "12345678", ""}, limits)));
  EXPECT_TRUE(fails_with(decode_parts({ping_envelope(), ping_payload(), "123456789"}, limits),
                         ErrorCode::too_large, true));
  EXPECT_TRUE(fails_with(decode_parts({ping_envelope(), ping_payload(), "ok", "123456789"}, limits),
                         ErrorCode::too_large, true));
}

// ---- the envelope --------------------------------------------------------------------------

TEST(MessagesCodec, TruncatedEnvelopeAtEveryLengthIsMalformed) {
  for (const Payload& payload : all_samples()) {
    const std::string envelope = envelope_bytes(kind_of(payload));
    for (std::size_t length = 0; length < envelope.size(); ++length) {
      SCOPED_TRACE(std::string(kind_name(kind_of(payload))) + " envelope cut to " + std::to_string(length));
      EXPECT_TRUE(fails_with(decode_parts({envelope.substr(0, length), pack_payload(payload)}),
                             ErrorCode::malformed, false));
    }
  }
}

TEST(MessagesCodec, TrailingBytesAfterTheEnvelopeAreMalformed) {
  EXPECT_TRUE(fails_with(decode_parts({ping_envelope() + nil(), ping_payload()}), ErrorCode::malformed, false));
  EXPECT_TRUE(fails_with(decode_parts({ping_envelope() + ping_envelope(), ping_payload()}), ErrorCode::malformed,
                         false));
}

TEST(MessagesCodec, EnvelopeThatIsNotAnArrayOfEightIsMalformed) {
  std::vector<std::string> fields = envelope_fields(Kind::Ping);
  std::vector<std::string> seven(fields.begin(), fields.end() - 1);
  std::vector<std::string> nine = fields;
  nine.push_back(packed(0));
  for (const std::string& envelope :
       {packed_array({}), packed_array(seven), packed_array(nine), nil(), packed(1), packed("envelope"s),
        packed(std::map<int, int>{{1, 1}})}) {
    EXPECT_TRUE(fails_with(decode_parts({envelope, ping_payload()}), ErrorCode::malformed, false));
  }
}

TEST(MessagesCodec, WrongTypeInEachEnvelopeFieldIsMalformed) {
  // Not 1.0: msgpack packs a whole double as an integer.
  const std::vector<std::string> not_an_integer{nil(), packed("1"s), packed(true), packed(1.5),
                                                packed(std::vector<int>{1}), packed(std::map<int, int>{{1, 1}})};
  const std::vector<std::string> not_a_string{nil(), packed(7), packed(true), packed(1.5),
                                              packed(std::vector<std::string>{"client-7"}),
                                              packed(std::map<int, int>{{1, 1}})};
  // Integers out of each field's range are also the wrong type for it.
  const std::vector<std::vector<std::string>> wrong_for_field{
      {packed(-1)},                                                           // protocol
      {packed(-1), packed(256 + static_cast<int>(Kind::Ping))},               // kind (uint8)
      {packed(-1), packed(257)},                                              // version (uint8)
      {},                                                                     // from
      {},                                                                     // to
      {packed(-1)},                                                           // correlation_id
      {packed(std::numeric_limits<std::int64_t>::min())},                     // request_id
      {packed(std::numeric_limits<std::uint64_t>::max())},                    // sent_ns (int64)
  };
  for (std::size_t field = 0; field < 8; ++field) {
    std::vector<std::string> bad = wrong_for_field[field];
    const auto& by_kind = (field == 3 || field == 4) ? not_a_string : not_an_integer;
    bad.insert(bad.end(), by_kind.begin(), by_kind.end());
    for (std::size_t i = 0; i < bad.size(); ++i) {
      SCOPED_TRACE("envelope field " + std::to_string(field) + ", bad value " + std::to_string(i));
      std::vector<std::string> fields = envelope_fields(Kind::Ping);
      fields[field] = bad[i];
      EXPECT_TRUE(fails_with(decode_parts({packed_array(fields), ping_payload()}), ErrorCode::malformed, false));
    }
  }
}

TEST(MessagesCodec, WrongProtocolVersionIsBadVersionWithoutEnvelope) {
  for (int protocol : {0, 2, 255, 256, 65537}) {
    SCOPED_TRACE("protocol " + std::to_string(protocol));
    std::vector<std::string> fields = envelope_fields(Kind::Ping);
    fields[0] = packed(protocol);
    EXPECT_TRUE(fails_with(decode_parts({packed_array(fields), ping_payload()}), ErrorCode::bad_version, false));
  }
}

TEST(MessagesCodec, FutureProtocolWithAnotherEnvelopeShapeIsBadVersion) {
  // A peer on protocol 2 may send an envelope of another shape: it must still hear "bad_version",
  // the one answer that tells its operator what to do, not "malformed".
  std::vector<std::string> fields = envelope_fields(Kind::Ping);
  fields[0] = packed(2);
  fields.push_back(packed("trace-id"s));
  EXPECT_TRUE(fails_with(decode_parts({packed_array(fields), ping_payload()}), ErrorCode::bad_version, false));
  EXPECT_TRUE(fails_with(decode_parts({packed_array({packed(2)}), ping_payload()}), ErrorCode::bad_version, false));
}

TEST(MessagesCodec, BadActorNamesAreInvalidWithoutEnvelope) {
  const std::vector<std::string> bad_names{
      ""s, std::string(kMaxActorNameBytes + 1, 'a'), "two words"s, "tab\tname"s, "line\n"s, "\x01"s, "del\x7f"s,
      "nul\0inside"s, "caf\xc3\xa9"s, "\xff"s};
  for (std::size_t field : {3u, 4u}) {
    for (const std::string& name : bad_names) {
      SCOPED_TRACE((field == 3 ? "from " : "to ") + testing::PrintToString(name));
      std::vector<std::string> fields = envelope_fields(Kind::Ping);
      fields[field] = packed(name);
      EXPECT_TRUE(fails_with(decode_parts({packed_array(fields), ping_payload()}), ErrorCode::invalid, false));
    }
    for (const std::string& name : {std::string(kMaxActorNameBytes, 'z'), "!"s, "~"s, "a.b-c_d/0:9"s}) {
      SCOPED_TRACE("good name " + name);
      std::vector<std::string> fields = envelope_fields(Kind::Ping);
      fields[field] = packed(name);
      EXPECT_TRUE(decodes(decode_parts({packed_array(fields), ping_payload()})));
    }
  }
}

TEST(MessagesCodec, EveryUnknownKindByteIsUnknownKindWithEnvelope) {
  int unknown = 0;
  for (int byte = 0; byte < 256; ++byte) {
    if (is_known_kind(static_cast<std::uint8_t>(byte))) continue;
    ++unknown;
    SCOPED_TRACE("kind " + std::to_string(byte));
    DecodeResult result =
        decode_parts({packed_array(envelope_fields(static_cast<Kind>(byte), 1)), ping_payload()});
    ASSERT_TRUE(fails_with(result, ErrorCode::unknown_kind, true));
    EXPECT_EQ(static_cast<int>(std::get<DecodeError>(result).envelope->kind), byte);
  }
  EXPECT_EQ(unknown, 256 - static_cast<int>(all_kinds().size()));
}

TEST(MessagesCodec, WrongSchemaVersionIsBadVersionWithEnvelope) {
  for (const Payload& payload : all_samples()) {
    const Kind kind = kind_of(payload);
    for (int version : {0, schema_version(kind) + 1, 255}) {
      SCOPED_TRACE(std::string(kind_name(kind)) + " version " + std::to_string(version));
      DecodeResult result = decode_parts(
          {packed_array(envelope_fields(kind, static_cast<std::uint8_t>(version))), pack_payload(payload)});
      ASSERT_TRUE(fails_with(result, ErrorCode::bad_version, true));
      EXPECT_EQ(std::get<DecodeError>(result).envelope->version, version);
    }
  }
}

// ---- the payload ---------------------------------------------------------------------------

TEST(MessagesCodec, TruncatedPayloadAtEveryLengthIsMalformedWithEnvelope) {
  for (const Payload& payload : all_samples()) {
    const std::string body = pack_payload(payload);
    for (std::size_t length = 0; length < body.size(); ++length) {
      SCOPED_TRACE(std::string(kind_name(kind_of(payload))) + " payload cut to " + std::to_string(length));
      EXPECT_TRUE(fails_with(decode_parts({envelope_bytes(kind_of(payload)), body.substr(0, length)}),
                             ErrorCode::malformed, true));
    }
  }
}

TEST(MessagesCodec, TrailingBytesAfterThePayloadAreMalformedWithEnvelope) {
  for (const Payload& payload : all_samples()) {
    SCOPED_TRACE(kind_name(kind_of(payload)));
    const std::string body = pack_payload(payload);
    for (const std::string& tail : {"\x00"s, nil(), body}) {
      EXPECT_TRUE(fails_with(decode_parts({envelope_bytes(kind_of(payload)), body + tail}), ErrorCode::malformed,
                             true));
    }
  }
}

TEST(MessagesCodec, PayloadThatIsNotAnArrayIsMalformedWithEnvelope) {
  for (const Payload& payload : all_samples()) {
    SCOPED_TRACE(kind_name(kind_of(payload)));
    for (const std::string& body : {nil(), packed(7), packed("[1]"s), packed(true), packed(std::map<int, int>{}),
                                    packed(std::map<int, int>{{0, 1}}), packed(2.5)}) {
      EXPECT_TRUE(fails_with(decode_parts({envelope_bytes(kind_of(payload)), body}), ErrorCode::malformed, true));
    }
  }
}

TEST(MessagesCodec, WrongFieldCountIsMalformedWithEnvelope) {
  for (const Payload& payload : all_samples()) {
    SCOPED_TRACE(kind_name(kind_of(payload)));
    const std::vector<std::string> fields = packed_elements(pack_payload(payload));
    std::vector<std::string> bodies;
    if (!fields.empty()) {  // CacheQuery has no fields: only one too many is wrong for it
      bodies.push_back(packed_array({}));
      bodies.push_back(packed_array({fields.begin(), fields.end() - 1}));
    }
    std::vector<std::string> more = fields;
    more.push_back(fields.empty() ? nil() : fields.back());
    bodies.push_back(packed_array(more));
    for (const std::string& body : bodies) {
      EXPECT_TRUE(fails_with(decode_parts({envelope_bytes(kind_of(payload)), body}), ErrorCode::malformed, true));
    }
  }
}

// A value of another msgpack type than `field` holds.
std::vector<std::string> wrong_types_for(const std::string& field) {
  msgpack::object_handle handle = msgpack::unpack(field.data(), field.size());
  std::vector<std::string> wrong{nil(), packed(0.5), packed(std::vector<int>{1}), packed(std::map<int, int>{{1, 1}})};
  switch (handle.get().type) {
    // Arrays (lists and nested structs) and maps: scalars of each kind, and the other container.
    case msgpack::type::ARRAY: return {nil(), packed(0.5), packed(7), packed("7"s), packed(std::map<int, int>{{1, 1}})};
    case msgpack::type::MAP: return {nil(), packed(0.5), packed(7), packed("7"s), packed(std::vector<int>{1})};
    case msgpack::type::STR: wrong.push_back(packed(7)); wrong.push_back(packed(true)); break;
    // Byte vectors (CachedPrefix.tiers) take arrays of small integers and strings too.
    case msgpack::type::BIN: return {nil(), packed(0.5), packed(7), packed(true), packed(std::map<int, int>{{1, 1}})};
    case msgpack::type::BOOLEAN: wrong.push_back(packed(1)); wrong.push_back(packed("true"s)); break;
    // Floating point (ModelsReport.ceiling_fraction): 0.5 is right, so not among the wrong.
    case msgpack::type::FLOAT32:
    case msgpack::type::FLOAT64:
      return {nil(), packed("0.5"s), packed(true), packed(std::vector<int>{1}), packed(std::map<int, int>{{1, 1}})};
    default: wrong.push_back(packed("7"s)); wrong.push_back(packed(true)); break;  // integers
  }
  return wrong;
}

TEST(MessagesCodec, FieldOfTheWrongTypeIsMalformedWithEnvelope) {
  for (const Payload& payload : all_samples()) {
    const std::vector<std::string> fields = packed_elements(pack_payload(payload));
    for (std::size_t field = 0; field < fields.size(); ++field) {
      const std::vector<std::string> wrong = wrong_types_for(fields[field]);
      for (std::size_t i = 0; i < wrong.size(); ++i) {
        SCOPED_TRACE(std::string(kind_name(kind_of(payload))) + " field " + std::to_string(field) +
                     ", wrong value " + std::to_string(i));
        std::vector<std::string> broken = fields;
        broken[field] = wrong[i];
        EXPECT_TRUE(fails_with(decode_parts({envelope_bytes(kind_of(payload)), packed_array(broken)}),
                               ErrorCode::malformed, true));
      }
    }
  }
}

// Sample's fields with one replaced, as a payload frame.
template <typename T>
std::string payload_with(std::size_t field, const std::string& value) {
  std::vector<std::string> fields = packed_elements(packed(sample<T>()));
  fields.at(field) = value;
  return packed_array(fields);
}

template <typename T>
DecodeResult decode_payload(const std::string& body) {
  return decode_parts({envelope_bytes(MessageTraits<T>::kind), body});
}

TEST(MessagesCodec, OutOfRangeEnumIsInvalidWithEnvelope) {
  for (int code : {0, 8, 99, 65535}) {
    SCOPED_TRACE("Error.code " + std::to_string(code));
    EXPECT_TRUE(fails_with(decode_payload<Error>(payload_with<Error>(0, packed(code))), ErrorCode::invalid, true));
  }
  for (int code = 1; code <= 7; ++code) {
    EXPECT_TRUE(decodes(decode_payload<Error>(payload_with<Error>(0, packed(code))))) << "Error.code " << code;
  }
  for (int failure : {0, 3, 255}) {
    SCOPED_TRACE("ActorFailed.failure " + std::to_string(failure));
    EXPECT_TRUE(fails_with(decode_payload<ActorFailed>(payload_with<ActorFailed>(1, packed(failure))),
                           ErrorCode::invalid, true));
  }
  for (int failure : {1, 2}) {
    EXPECT_TRUE(decodes(decode_payload<ActorFailed>(payload_with<ActorFailed>(1, packed(failure)))));
  }
  for (int finish : {0, 6, 255}) {
    SCOPED_TRACE("FinalEvent.finish " + std::to_string(finish));
    EXPECT_TRUE(fails_with(decode_payload<FinalEvent>(payload_with<FinalEvent>(0, packed(finish))), ErrorCode::invalid,
                           true));
  }
  for (int finish = 1; finish <= 5; ++finish) {  // stop ... tool_calls
    EXPECT_TRUE(decodes(decode_payload<FinalEvent>(payload_with<FinalEvent>(0, packed(finish))))) << finish;
  }
}

// Floats that no sender makes are invalid, among them those near 2^64, which msgpack's packer
// cannot encode again without overflow (the fuzzer found ModelsReport.ceiling_fraction = 2^64,
// then TokenEvent's logprobs, then StepPlan's sampling parameters): in any field.
TEST(MessagesCodec, FloatOutOfItsFieldsRangeIsInvalidWithEnvelope) {
  const std::string two_to_64_f64("\xcb\x43\xf0\x00\x00\x00\x00\x00\x00", 9);
  const std::string nan_f64("\xcb\x7f\xf8\x00\x00\x00\x00\x00\x00", 9);
  const std::string two_to_64_f32("\xca\x5f\x80\x00\x00", 5);
  for (const std::string& value : {two_to_64_f64, nan_f64, packed(1.5), packed(-0.25)}) {
    EXPECT_TRUE(fails_with(decode_payload<ModelsReport>(payload_with<ModelsReport>(9, value)), ErrorCode::invalid, true));
  }
  for (double fraction : {0.0, 0.9, 1.0}) {
    EXPECT_TRUE(decodes(decode_payload<ModelsReport>(payload_with<ModelsReport>(9, packed(fraction))))) << fraction;
  }
  auto logprobs = [](const std::string& logprob, const std::string& top) {
    return packed_array({packed_array({packed(7), logprob, packed(std::vector<int>{8}), packed_array({top}), packed("a"s),
                                       packed(std::vector<std::string>{"b"})})});
  };
  EXPECT_TRUE(fails_with(decode_payload<TokenEvent>(payload_with<TokenEvent>(2, logprobs(two_to_64_f32, packed(-1.0f)))),
                         ErrorCode::invalid, true));
  EXPECT_TRUE(fails_with(decode_payload<TokenEvent>(payload_with<TokenEvent>(2, logprobs(packed(-1.0f), two_to_64_f32))),
                         ErrorCode::invalid, true));
  EXPECT_TRUE(decodes(decode_payload<TokenEvent>(payload_with<TokenEvent>(2, logprobs(packed(-1.0f), packed(-2.5f))))));
  // Any field, however deep: a StepPlan's sampling temperature of 2^64 (the fuzzer's find) or -2^64.
  auto plan_with_temperature = [](const std::string& value) {
    std::string sampling = packed(samples::sample_sampling());
    const std::string seven_tenths("\xca\x3f\x33\x33\x33", 5);  // the sample's temperature, 0.7f
    sampling.replace(sampling.find(seven_tenths), seven_tenths.size(), value);
    return payload_with<StepPlan>(2, packed_array({packed_array({packed(42), sampling, packed(std::vector<int>{1, 2, 3})})}));
  };
  const std::string minus_two_to_64_f32("\xca\xdf\x80\x00\x00", 5);
  for (const std::string& value : {two_to_64_f32, minus_two_to_64_f32, two_to_64_f64}) {
    EXPECT_TRUE(fails_with(decode_payload<StepPlan>(plan_with_temperature(value)), ErrorCode::invalid, true));
  }
  EXPECT_TRUE(decodes(decode_payload<StepPlan>(plan_with_temperature(packed(0.5f)))));
}

TEST(MessagesCodec, IntegerOutOfItsFieldsRangeIsMalformedWithEnvelope) {
  const auto u64_max = std::numeric_limits<std::uint64_t>::max();
  const std::vector<std::pair<std::string, DecodeResult>> cases = [&] {
    std::vector<std::pair<std::string, DecodeResult>> c;
    c.emplace_back("Error.about_kind = 300 (uint8)", decode_payload<Error>(payload_with<Error>(2, packed(300))));
    c.emplace_back("Error.code = 70000 (uint16)", decode_payload<Error>(payload_with<Error>(0, packed(70000))));
    c.emplace_back("Error.code = -1", decode_payload<Error>(payload_with<Error>(0, packed(-1))));
    c.emplace_back("ActorFailed.failure = 258 (uint8)",
                   decode_payload<ActorFailed>(payload_with<ActorFailed>(1, packed(258))));
    c.emplace_back("Timer.timer_id = 2^32 (uint32)",
                   decode_payload<Timer>(payload_with<Timer>(0, packed(std::uint64_t{1} << 32))));
    c.emplace_back("StopAck.handled = -1", decode_payload<StopAck>(payload_with<StopAck>(0, packed(-1))));
    c.emplace_back("ProbeReport.elapsed_ns = 2^64-1 (int64)",
                   decode_payload<ProbeReport>(payload_with<ProbeReport>(4, packed(u64_max))));
    return c;
  }();
  for (const auto& [what, result] : cases) {
    EXPECT_TRUE(fails_with(result, ErrorCode::malformed, true)) << what;
  }
}

// ---- hostile shapes ------------------------------------------------------------------------

TEST(MessagesCodec, DeepNestingIsRejectedQuicklyWithoutRecursion) {
  DecodeLimits generous;
  generous.max_envelope_bytes = 1 << 20;
  const std::string arrays = std::string(10'000, '\x91') + nil();
  std::string maps;
  for (int i = 0; i < 10'000; ++i) maps += "\x81\x00"s;
  maps += nil();
  for (const std::string& nested : {arrays, maps}) {
    DecodeResult as_payload, as_envelope;
    DecodeCost cost = measure([&] {
      as_payload = decode_parts({ping_envelope(), nested});
      as_envelope = decode_parts({nested, ping_payload()}, generous);
    });
    EXPECT_TRUE(fails_with(as_payload, ErrorCode::malformed, true));
    EXPECT_TRUE(fails_with(as_envelope, ErrorCode::malformed, false));
    EXPECT_LT(cost.elapsed, std::chrono::milliseconds(250));  // generous: CI machines are shared
  }
}

TEST(MessagesCodec, AllocationProbeSeesMallocAndNew) {
  void* raw = nullptr;
  EXPECT_GE(measure([&] { raw = std::malloc(3 << 20); }).largest_allocation, std::size_t{3} << 20);
  std::free(raw);
  std::vector<char> grown;
  EXPECT_GE(measure([&] { grown.resize(5 << 20); }).largest_allocation, std::size_t{5} << 20);
}

TEST(MessagesCodec, HugeDeclaredLengthIsNotAllocated) {
  const std::vector<std::pair<std::string, std::string>> headers{
      {"array32 of 2^32-1", "\xdd\xff\xff\xff\xff"s},
      {"map32 of 2^32-1", "\xdf\xff\xff\xff\xff"s},
      {"str32 of 4 GiB", "\xdb\xff\xff\xff\xff" "abc"s},
      {"bin32 of 4 GiB", "\xc6\xff\xff\xff\xff" "abc"s},
      {"ext32 of 4 GiB", "\xc9\xff\xff\xff\xff\x01" "abc"s},
      {"array16 of 65535", "\xdc\xff\xff"s},
      {"str32 inside the payload array", "\x92\x09\xdb\xff\xff\xff\xff"s},
      {"array32 inside an array32", "\xdd\x00\x00\x00\x02\xdd\xff\xff\xff\xff"s},
  };
  for (const auto& [what, bytes] : headers) {
    SCOPED_TRACE(what);
    DecodeResult as_payload, as_envelope;
    DecodeCost cost = measure([&] {
      as_payload = decode_parts({ping_envelope(), bytes});
      as_envelope = decode_parts({bytes, ping_payload()});
    });
    EXPECT_TRUE(fails_with(as_payload, ErrorCode::malformed, true));
    EXPECT_TRUE(fails_with(as_envelope, ErrorCode::malformed, false));
    EXPECT_LT(cost.largest_allocation, std::size_t{64} << 10) << cost.largest_allocation;
    EXPECT_LT(cost.elapsed, std::chrono::milliseconds(250));  // generous: CI machines are shared
  }
}

std::string array32_header(std::uint32_t count) {
  std::string header = "\xdd"s;
  for (int shift = 24; shift >= 0; shift -= 8) header += static_cast<char>((count >> shift) & 0xff);
  return header;
}

TEST(MessagesCodec, AllocationStaysWithinAFixedMultipleOfTheFrame) {
  // msgpack reserves 24 bytes per declared element when it reads an array header, so a count the
  // frame's size allows costs up to 24 times the frame. Nested headers must not multiply that:
  // eight headers of ~1M elements each in a 1 MiB payload (the default limit) once cost 270 MB.
  const std::uint32_t count = (1 << 20) - 100;
  std::string one_array = array32_header(count) + std::string(count, '\xc0');
  std::string nested;
  for (int depth = 0; depth < 8; ++depth) nested += array32_header(count);
  nested += std::string(count, '\xc0');  // fills the innermost array; the outer ones stay short
  for (const auto& [what, body] : {std::pair{"one array"s, one_array}, std::pair{"nested arrays"s, nested}}) {
    SCOPED_TRACE(what);
    DecodeResult result;
    DecodeCost cost = measure([&] { result = decode_parts({ping_envelope(), body}); });
    EXPECT_TRUE(fails_with(result, ErrorCode::malformed, true));
    // 24 bytes an element, which msgpack's zone rounds up to a power of two, plus the frame's copy.
    EXPECT_LE(cost.total_allocated, 48 * body.size());
    EXPECT_LT(cost.elapsed, std::chrono::milliseconds(500));
    RecordProperty(what + " allocated", std::to_string(cost.total_allocated));
    RecordProperty(what + " bytes", std::to_string(body.size()));
  }
}

// ---- random input --------------------------------------------------------------------------

// Anything decode() returns for hostile input must be one of its documented outcomes.
testing::AssertionResult well_formed_outcome(DecodeResult& result) {
  if (auto* message = std::get_if<Message>(&result)) {
    if (!is_known_kind(static_cast<std::uint8_t>(message->kind())) || kind_of(message->payload) != message->kind()) {
      return testing::AssertionFailure() << "decoded a message whose payload does not match its kind";
    }
    // What decoded must survive a round trip unchanged.
    DecodeResult again = decode(encode(message->envelope, message->payload));
    const auto* copy = std::get_if<Message>(&again);
    if (copy == nullptr || !same_envelope(copy->envelope, message->envelope) ||
        pack_payload(copy->payload) != pack_payload(message->payload)) {
      return testing::AssertionFailure() << "a decoded message did not survive re-encoding";
    }
    return testing::AssertionSuccess();
  }
  const auto& error = std::get<DecodeError>(result);
  if (!is_decode_error_code(error.code)) {
    return testing::AssertionFailure() << "decode() returned " << error_code_name(error.code);
  }
  if (error.detail.empty()) return testing::AssertionFailure() << "an error without detail";
  return testing::AssertionSuccess();
}

TEST(MessagesCodec, RandomGarbageNeverCrashes) {
  std::mt19937_64 rng(0x6d71'6c6d);  // seeded: a failure reproduces
  auto below = [&](std::size_t n) { return static_cast<std::size_t>(rng() % n); };
  std::vector<std::vector<std::string>> valid;
  for (const Payload& payload : all_samples()) {
    valid.push_back({envelope_bytes(kind_of(payload)), pack_payload(payload)});
    valid.push_back({envelope_bytes(kind_of(payload)), pack_payload(payload), "blob"});
  }
  int decoded = 0;
  for (int round = 0; round < 4000; ++round) {
    std::vector<std::string> parts;
    if (round % 2 == 0) {  // bytes from nowhere
      parts.resize(below(5));
      for (auto& part : parts) {
        part.resize(below(80));
        for (auto& c : part) c = static_cast<char>(rng());
      }
    } else {  // a valid message, then a few bytes flipped, cut or spliced in
      parts = valid[below(valid.size())];
      for (std::size_t edits = 1 + below(4); edits > 0; --edits) {
        std::string& part = parts[below(parts.size())];
        if (part.empty()) continue;
        switch (below(3)) {
          case 0: part[below(part.size())] = static_cast<char>(rng()); break;
          case 1: part.resize(below(part.size())); break;
          default: part.insert(below(part.size()), 1 + below(8), static_cast<char>(rng())); break;
        }
      }
    }
    DecodeResult result = decode_parts(parts);
    decoded += std::holds_alternative<Message>(result);
    ASSERT_TRUE(well_formed_outcome(result)) << "round " << round;
  }
  RecordProperty("decoded", decoded);
}

}  // namespace
}  // namespace mqlm::messages
