// One sample value per catalog message type, shared by the codec test and the fuzzer's seed corpus.
//
// Every field holds a value away from its default (codec_test checks this), so a field that the
// codec drops, reorders or truncates shows up as a difference. all_sample_payloads() calls
// sample() for every MQLM_MESSAGE_CATALOG row: a type added to the catalog without an overload
// here does not compile.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "messages/catalog.hpp"

namespace mqlm::messages::samples {

using namespace std::string_literals;

inline Error sample(std::type_identity<Error>) {
  return {static_cast<std::uint16_t>(ErrorCode::invalid), "Ping.text too long: send at most 1 KiB", 16};
}
inline Stop sample(std::type_identity<Stop>) { return {"node shutting down"}; }
inline StopAck sample(std::type_identity<StopAck>) { return {0x1'0000'0001ULL}; }
inline Heartbeat sample(std::type_identity<Heartbeat>) {
  return {std::numeric_limits<std::uint64_t>::max() - 1};
}
inline HeartbeatAck sample(std::type_identity<HeartbeatAck>) { return {42}; }
inline Timer sample(std::type_identity<Timer>) { return {0xFFFF'FFFFu, 1ULL << 40}; }
inline ActorExited sample(std::type_identity<ActorExited>) {
  return {"tokenizer", "std::bad_alloc in on_message (\xc3\xa9t\xc3\xa9)"};
}
inline ActorFailed sample(std::type_identity<ActorFailed>) {
  return {"gpu.worker_0", static_cast<std::uint8_t>(ActorFailure::unresponsive), "no heartbeat for 3 s", 4,
          true};
}
inline Ping sample(std::type_identity<Ping>) { return {9, "bytes\0with a nul"s}; }
inline Pong sample(std::type_identity<Pong>) {
  return {9, "echo", 1u << 20, 0x9E37'79B9'7F4A'7C15ULL, 123456};
}
inline ProbeReport sample(std::type_identity<ProbeReport>) {
  return {"echo", 1000, 3, 2, 5'000'000'000, 12'345, 67'890, std::numeric_limits<std::int64_t>::max()};
}

template <typename T>
T sample() {
  return sample(std::type_identity<T>{});
}

// Catalog order.
inline std::vector<Payload> all_sample_payloads() {
  return {
#define MQLM_SAMPLE_PAYLOAD(byte, type, version, policy) Payload{sample<type>()},
      MQLM_MESSAGE_CATALOG(MQLM_SAMPLE_PAYLOAD)
#undef MQLM_SAMPLE_PAYLOAD
  };
}

}  // namespace mqlm::messages::samples
