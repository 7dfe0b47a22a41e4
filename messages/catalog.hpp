// The message catalog: every message type that crosses between actors, in one place.
//
// A message is a plain struct with a msgpack encoding (MSGPACK_DEFINE: a positional array), a
// one-byte kind, a schema version and a policy for a full mailbox. Large payloads (tensors, KV
// pages, logits) are never fields here: they travel as separate zero-copy frames beside the
// struct (Message::blobs).
//
// Adding a message: define its struct below, then add one line to MQLM_MESSAGE_CATALOG. Kinds
// are wire values: never renumber or reuse one.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <msgpack.hpp>

#include "messages/cache.hpp"
#include "messages/models.hpp"
#include "messages/serving.hpp"

namespace mqlm::messages {

// What a sender's runtime does when the recipient's mailbox is full (ZeroMQ high-water mark).
enum class WhenFull : std::uint8_t {
  drop,    // discard and count: a later message of the same kind supersedes it (probes, samples)
  reject,  // send() returns SendStatus::full at once; the sending code answers for it (e.g. 503)
  defer,   // keep it in the sender's bounded outbox for that peer, in order, and deliver when
           // there is room; the sender goes on handling its own inbox meanwhile
};

// ---- runtime ------------------------------------------------------------------------------

// Sent in answer to a message that could not be handled (malformed, unknown kind, rejected).
struct Error {
  std::uint16_t code = 0;      // ErrorCode
  std::string message;         // says what was wrong and what to do
  std::uint8_t about_kind = 0; // the kind of the message it answers, 0 if unknown
  MSGPACK_DEFINE(code, message, about_kind);
};

enum class ErrorCode : std::uint16_t {
  malformed = 1,       // the frames could not be decoded
  unknown_kind = 2,    // a kind this build does not know
  bad_version = 3,     // a schema version this build does not speak
  too_large = 4,       // a frame over the decoder's limits
  invalid = 5,         // decoded, but a field is out of range
  mailbox_full = 6,    // the recipient could not take it (WhenFull::reject)
  unknown_actor = 7,   // no address for the recipient
};

// Stop is handled after everything queued before it; the actor then acknowledges and exits.
struct Stop {
  std::string reason;
  MSGPACK_DEFINE(reason);
};

struct StopAck {
  std::uint64_t handled = 0;  // messages the actor handled in its life, Stop included
  MSGPACK_DEFINE(handled);
};

// The supervisor's liveness probe; the runtime answers it, not the actor's code, but only from
// the actor's own loop, so an actor stuck in a handler does not answer.
struct Heartbeat {
  std::uint64_t seq = 0;
  MSGPACK_DEFINE(seq);
};

struct HeartbeatAck {
  std::uint64_t seq = 0;
  MSGPACK_DEFINE(seq);
};

// A timer firing, delivered through the actor's own loop like any message. Its envelope's
// timestamp is the time the actor should take as "now" (this is what makes replay hold).
struct Timer {
  std::uint32_t timer_id = 0;
  std::uint64_t fire_count = 0;
  MSGPACK_DEFINE(timer_id, fire_count);
};

// An actor's thread ended without being stopped (sent by the dying thread to its supervisor).
struct ActorExited {
  std::string actor;
  std::string reason;
  MSGPACK_DEFINE(actor, reason);
};

// The supervisor's report of a failed child, to whoever is configured to hear it.
struct ActorFailed {
  std::string actor;
  std::uint8_t failure = 0;  // ActorFailure
  std::string detail;
  std::uint32_t restarts = 0;  // restarts so far, this one included if restarted
  bool restarted = false;
  MSGPACK_DEFINE(actor, failure, detail, restarts, restarted);
};

enum class ActorFailure : std::uint8_t { died = 1, unresponsive = 2 };

// ---- probes: liveness, echo, and the runtime benchmark --------------------------------------

// Ping carries an optional blob frame; the answer says what arrived.
struct Ping {
  std::uint64_t seq = 0;
  std::string text;
  MSGPACK_DEFINE(seq, text);
};

struct Pong {
  std::uint64_t seq = 0;
  std::string text;
  std::uint64_t blob_bytes = 0;
  std::uint64_t blob_hash = 0;  // xxh3-64 over the blob frames, 0 without any
  std::uint64_t pings_seen = 0;
  MSGPACK_DEFINE(seq, text, blob_bytes, blob_hash, pings_seen);
};

// What a prober learnt from a run of pings (the demo's and the runtime benchmark's result).
struct ProbeReport {
  std::string target;
  std::uint64_t pongs = 0;
  std::uint64_t mismatches = 0;   // pongs whose seq, size or hash did not match the ping
  std::uint64_t rejected = 0;     // pings the target's full mailbox turned away (then retried)
  std::int64_t elapsed_ns = 0;    // first ping sent to last pong handled
  std::int64_t rtt_p50_ns = 0;
  std::int64_t rtt_p99_ns = 0;
  std::int64_t rtt_max_ns = 0;
  MSGPACK_DEFINE(target, pongs, mismatches, rejected, elapsed_ns, rtt_p50_ns, rtt_p99_ns, rtt_max_ns);
};

// ---- serving: front ends, scheduler, executor (messages/serving.hpp) -------------------------

// X(kind byte, type, schema version, policy when the recipient's mailbox is full)
#define MQLM_MESSAGE_CATALOG(X)                         \
  X(1, Error, 1, WhenFull::drop)                        \
  X(2, Stop, 1, WhenFull::defer)                        \
  X(3, StopAck, 1, WhenFull::defer)                     \
  X(4, Heartbeat, 1, WhenFull::drop)                    \
  X(5, HeartbeatAck, 1, WhenFull::drop)                 \
  X(6, Timer, 1, WhenFull::drop)                        \
  X(7, ActorExited, 1, WhenFull::defer)                 \
  X(8, ActorFailed, 1, WhenFull::defer)                 \
  X(16, Ping, 1, WhenFull::reject)                      \
  X(17, Pong, 1, WhenFull::defer)                       \
  X(18, ProbeReport, 1, WhenFull::defer)               \
  X(32, Submit, 1, WhenFull::reject)                    \
  X(33, Abort, 1, WhenFull::defer)                      \
  X(34, TokenEvent, 1, WhenFull::defer)                 \
  X(35, FinalEvent, 1, WhenFull::defer)                 \
  X(36, StatusQuery, 1, WhenFull::reject)               \
  X(37, StatusReport, 2, WhenFull::defer)               \
  X(38, StepPlan, 2, WhenFull::defer)                   \
  X(39, StepResult, 1, WhenFull::defer)                 \
  X(40, ExecutorQuery, 1, WhenFull::defer)              \
  X(41, ExecutorReport, 3, WhenFull::defer)             \
  X(42, Drain, 1, WhenFull::defer)                      \
  X(43, Drained, 1, WhenFull::defer)                    \
  X(44, Tokenize, 1, WhenFull::reject)                  \
  X(45, Tokenized, 1, WhenFull::defer)                  \
  X(48, LoadModel, 1, WhenFull::defer)                  \
  X(49, ModelLoaded, 2, WhenFull::defer)                \
  X(50, UnloadModel, 1, WhenFull::defer)                \
  X(51, ModelUnloaded, 2, WhenFull::defer)              \
  X(52, AbortModel, 1, WhenFull::defer)                 \
  X(53, ModelDrained, 1, WhenFull::defer)               \
  X(54, ModelUsage, 1, WhenFull::defer)                 \
  X(55, LoadRequest, 1, WhenFull::reject)               \
  X(56, LoadAnswer, 1, WhenFull::defer)                 \
  X(57, UnloadRequest, 1, WhenFull::reject)             \
  X(58, UnloadAnswer, 2, WhenFull::defer)               \
  X(59, ModelsQuery, 1, WhenFull::reject)               \
  X(60, ModelsReport, 4, WhenFull::defer)               \
  X(64, KvPagesSpilled, 1, WhenFull::defer)             \
  X(65, PrefixLookup, 1, WhenFull::defer)               \
  X(66, CachedPrefix, 1, WhenFull::defer)               \
  X(67, CloseModelCache, 1, WhenFull::defer)            \
  X(68, ModelCacheClosed, 1, WhenFull::defer)           \
  X(69, ClearCache, 1, WhenFull::reject)                \
  X(70, CacheCleared, 1, WhenFull::defer)               \
  X(71, CacheQuery, 1, WhenFull::reject)                \
  X(72, ShrinkCache, 1, WhenFull::defer)                \
  X(73, CacheReport, 1, WhenFull::defer)

enum class Kind : std::uint8_t {
#define MQLM_KIND_ENUM(byte, type, version, policy) type = byte,
  MQLM_MESSAGE_CATALOG(MQLM_KIND_ENUM)
#undef MQLM_KIND_ENUM
};

using Payload = std::variant<
#define MQLM_VARIANT_ENTRY(byte, type, version, policy) type,
    MQLM_MESSAGE_CATALOG(MQLM_VARIANT_ENTRY)
#undef MQLM_VARIANT_ENTRY
        std::monostate>;

// What the catalog says about one type: MessageTraits<Ping>::kind, ::version, ::when_full.
template <typename T>
struct MessageTraits;

#define MQLM_TRAITS(byte, type, ver, policy)                  \
  template <>                                                 \
  struct MessageTraits<type> {                                \
    static constexpr Kind kind = Kind::type;                  \
    static constexpr std::uint8_t version = ver;              \
    static constexpr WhenFull when_full = policy;             \
    static constexpr std::string_view name = #type;           \
  };
MQLM_MESSAGE_CATALOG(MQLM_TRAITS)
#undef MQLM_TRAITS

// Lookups by kind byte; unknown kinds answer false / "unknown".
bool is_known_kind(std::uint8_t kind);
std::string_view kind_name(Kind kind);
std::uint8_t schema_version(Kind kind);
WhenFull when_full(Kind kind);
Kind kind_of(const Payload& payload);
// Every kind in the catalog, in catalog order (for tests and tools).
std::vector<Kind> all_kinds();
// A kind by its name ("Ping"), for command-line filters.
bool kind_from_name(std::string_view name, Kind& out);

}  // namespace mqlm::messages
