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

inline model::SamplingParams sample_sampling() {
  model::SamplingParams p;
  p.temperature = 0.7f;
  p.top_k = 40;
  p.top_p = 0.9f;
  p.min_p = 0.05f;
  p.repetition_penalty = 1.1f;
  p.repetition_last_n = 32;
  p.presence_penalty = -0.5f;
  p.frequency_penalty = 0.25f;
  p.seed = 0xDEAD'BEEF'0000'0001ULL;
  p.max_tokens = 77;
  p.stop = {"\n\n", "</s>"};
  p.stop_token_ids = {2, 128009};
  p.logprobs = true;
  p.top_logprobs = 5;
  p.response_format = {static_cast<std::uint8_t>(model::ResponseKind::json_schema),
                       R"({"type":"object","properties":{"b":{"type":"string"},"a":{"enum":[1,2]}}})", true};
  return p;
}
inline TokenLogprobs sample_logprobs() { return {128000, -0.25f, {128000, 13, 7}, {-0.25f, -1.5f, -3.0f}}; }
inline PoolStatsWire sample_pool() {
  return {1ULL << 33, 1ULL << 20, 1ULL << 34, (1ULL << 34) + 5, 7, {{"weights:tiny", 1ULL << 33}, {"kv", 4096}}};
}
inline Submit sample(std::type_identity<Submit>) {
  return {"llama3-8b", static_cast<std::uint8_t>(PromptKind::chat), "Hello \xe4\xb8\x96", {1, 2, 3},
          {{"system", "be brief"},
           {"user", "hi"},
           {"assistant", "", {{"call_7", "get_weather", R"({"city":"Oslo"})"}}, "", "", false},
           {"tool", "{\"c\":4}", {}, "call_7", "get_weather", true}},
          sample_sampling(),
          2,
          R"([{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}])",
          static_cast<std::uint8_t>(ToolChoice::function),
          "get_weather",
          false,
          R"({"enable_thinking":false})",
          4};
}
inline Abort sample(std::type_identity<Abort>) { return {static_cast<std::uint8_t>(AbortReason::client_gone)}; }
inline TokenEvent sample(std::type_identity<TokenEvent>) {
  return {{128000, 13}, "caf\xc3\xa9", {sample_logprobs(), sample_logprobs()}, "hmm", {{1, "call_2", "f", "{\"a\":"}}};
}
inline FinalEvent sample(std::type_identity<FinalEvent>) {
  return {static_cast<std::uint8_t>(FinishReason::error), static_cast<std::uint16_t>(RequestError::gpu),
          "device lost", "held", "\n\n", 602, 128, 592, 1'000, 20'000'000, 900'000'000, {0.6f, -0.8f}, "so",
          {{0, "", "", "1}"}}};
}
inline StatusQuery sample(std::type_identity<StatusQuery>) { return {true}; }
inline KvPageId sample_page_id() { return {0xFEDC'BA98'7654'3210ULL, 0x0123'4567'89AB'CDEFULL, {1, 2, 3, 4}}; }
inline CacheReport sample_cache_report() {
  return {1ULL << 30, 2ULL << 30, 512, 1ULL << 20, 5ULL << 30, 16ULL << 30, 2560, 100, 200, 300, 400, 500, 6, 7, 8,
          {{"tiny", 1ULL << 30}}};
}
inline StatusReport sample(std::type_identity<StatusReport>) {
  return {{"tiny", "llama3-8b"}, 3, 1, 2, 1ULL << 40, 99, 4, 123456, 4096, 512, 17, 9, 33, 2, true, sample_pool(),
          8000, 1600, 21, {{"tiny", {12, 3, 2, 340, 560}}}, 777, {12.5, 0.25, 1.75, 4096}, 96, 61};
}
inline StepPlan sample(std::type_identity<StepPlan>) {
  return {7,
          "tiny",
          {{42, sample_sampling(), {1, 2, 3}, 1, {2, 128009}}},
          {{42, 16, {5, 6, 7}, {3, 9}, true, false, 2}},
          {41, 40},
          true,
          {{11, sample_page_id()}},
          {12, 13},
          0xABCD'EF01'2345'6789ULL};
}
inline StepResult sample(std::type_identity<StepResult>) {
  return {7, {{42, 13, true, sample_logprobs(), {6, 7}}}, static_cast<std::uint16_t>(RequestError::gpu), "out of memory",
          true, 3, true, sample_pool(), 5'000'000, {43, 44}, {12.5, 0.25, 1.75, 4096}};
}
inline ExecutorQuery sample(std::type_identity<ExecutorQuery>) { return {true}; }
inline ExecutorReport sample(std::type_identity<ExecutorReport>) {
  return {{{"tiny", 512, 16, 4096, 32000, 2 << 20}},
          2,
          sample_pool(),
          "NVIDIA H100 80GB HBM3",
          {85'520'809'984, 80'000'000'000, 1ULL << 34, true, 3ULL << 30},
          1234,
          {12.5, 0.25, 1.75, 4096}};
}
inline Drain sample(std::type_identity<Drain>) { return {true}; }
inline Drained sample(std::type_identity<Drained>) { return {2000}; }
inline Tokenize sample(std::type_identity<Tokenize>) {
  return {"tiny", true, "Hi <|eot_id|>", {1, 2, 3}, true, false, true};
}
inline Tokenized sample(std::type_identity<Tokenized>) { return {3, "too long", {5, 6}, {"a", "\xC3"}, "ab"}; }
inline LoadModel sample(std::type_identity<LoadModel>) { return {"llama3-8b"}; }
inline ModelLoaded sample(std::type_identity<ModelLoaded>) {
  return {"tiny", true, "slow disk", {"tiny", 512, 16, 4096, 32000, 2 << 20}, 1ULL << 33, sample_pool(), 2'500'000'000};
}
inline UnloadModel sample(std::type_identity<UnloadModel>) { return {"tiny"}; }
inline ModelUnloaded sample(std::type_identity<ModelUnloaded>) {
  return {"tiny", true, 1ULL << 33, (1ULL << 34) + 5, 1ULL << 26, (1ULL << 34) + 5 - (1ULL << 26),
          {"weights: injected failure"}, sample_pool(), 40'000'000, 6ULL << 20};
}
inline AbortModel sample(std::type_identity<AbortModel>) { return {"tiny", "evicted to load llama3-8b"}; }
inline ModelDrained sample(std::type_identity<ModelDrained>) { return {"tiny", 8}; }
inline ModelUsage sample(std::type_identity<ModelUsage>) { return {"tiny", 3, 123'456'789}; }
inline LoadRequest sample(std::type_identity<LoadRequest>) { return {"qwen"}; }
inline LoadAnswer sample(std::type_identity<LoadAnswer>) {
  return {"qwen", static_cast<std::uint8_t>(LoadOutcome::insufficient_memory), "does not fit", 5ULL << 30,
          1ULL << 30, 8ULL << 30, {"tiny"}, {"other"}};
}
inline UnloadRequest sample(std::type_identity<UnloadRequest>) { return {"tiny", true}; }
inline UnloadAnswer sample(std::type_identity<UnloadAnswer>) {
  return {"tiny", static_cast<std::uint8_t>(UnloadOutcome::unloaded), "freed", 1ULL << 33, (1ULL << 33) - 4096,
          1ULL << 26, {"kv: injected failure"}, 40'000'000, 90'000'000};
}
inline ModelsQuery sample(std::type_identity<ModelsQuery>) { return {"tiny"}; }
inline ModelsReport sample(std::type_identity<ModelsReport>) {
  return {{{"tiny", "/m/tiny.gguf", true, static_cast<std::uint8_t>(ModelState::loaded), 1ULL << 33, 1ULL << 33, 77,
            2, 3, 2, "weights: injected", {"fast", "default"}, 300}},
          8ULL << 30, 6ULL << 30, 7ULL << 30, 1ULL << 33, static_cast<std::uint8_t>(Pressure::soft), "all pinned",
          sample_pool(), {80ULL << 30, 79ULL << 30, 1ULL << 33, true, 3ULL << 30}, 0.9, true, sample_cache_report(),
          48ULL << 30, 3};
}
inline KvPagesSpilled sample(std::type_identity<KvPagesSpilled>) {
  return {"tiny", 0x1234'5678'9ABC'DEF0ULL, 16, 2 << 20, {sample_page_id()}};
}
inline PrefixLookup sample(std::type_identity<PrefixLookup>) {
  return {"tiny", 0x1234'5678'9ABC'DEF0ULL, 16, 2 << 20, {7, 8, 1ULL << 63}};
}
inline CachedPrefix sample(std::type_identity<CachedPrefix>) {
  return {"tiny", {sample_page_id(), sample_page_id()}, {static_cast<std::uint8_t>(CacheTier::hot),
                                                         static_cast<std::uint8_t>(CacheTier::ssd)}};
}
inline CloseModelCache sample(std::type_identity<CloseModelCache>) { return {"tiny", false}; }
inline ModelCacheClosed sample(std::type_identity<ModelCacheClosed>) {
  return {"tiny", 6ULL << 20, 3, 2, 1, {"injected failure while closing"}};
}
inline ClearCache sample(std::type_identity<ClearCache>) { return {static_cast<std::uint8_t>(CacheTier::ssd)}; }
inline CacheCleared sample(std::type_identity<CacheCleared>) { return {2, 1ULL << 34, 8192, {"cannot delete"}}; }
inline CacheQuery sample(std::type_identity<CacheQuery>) { return {}; }
inline ShrinkCache sample(std::type_identity<ShrinkCache>) { return {1ULL << 29}; }
inline CacheReport sample(std::type_identity<CacheReport>) { return sample_cache_report(); }

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
