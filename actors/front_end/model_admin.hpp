// The model pool and the KV prefix cache as the front ends show them: the enforcer's and the
// cache-writer's answers (messages/models.hpp, messages/cache.hpp) as JSON, one rendering for both
// protocols: the gateway packs it as msgpack (nlohmann's to_msgpack), the http actor writes it as
// JSON. Pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "messages/cache.hpp"
#include "messages/models.hpp"
#include "messages/serving.hpp"

namespace mqlm::actors::model_admin {

std::string_view state_name(messages::ModelState state);   // "loading", "loaded", "draining", "unloaded"
std::string_view pressure_name(messages::Pressure pressure);  // "none", "soft", "hard"
std::string_view tier_name(messages::CacheTier tier);        // "hot", "ssd"
// The tier a client names ("hot", "ssd"), or nullopt.
std::optional<messages::CacheTier> tier_named(std::string_view name);

// One model: id, state, pinned, bytes, estimated_bytes, requests, loads, unloads, last_problem.
nlohmann::json model_json(const messages::ModelStatus& model);
// The memory picture: ceiling_bytes, soft_bytes, hard_bytes, used_bytes, pressure, pressure_note,
// models [model_json...], pool {held_bytes, active_bytes, cached_bytes, blocks}; and, when the
// server has a cache-writer (has_cache), host_soft_bytes, cache_shrinks and cache (cache_json).
nlohmann::json memory_json(const messages::ModelsReport& report);

// The cache-writer's tiers: every CacheReport field under its own name, hot_bytes_by_model as an
// object {model: bytes}.
nlohmann::json cache_json(const messages::CacheReport& report);
// A cleared tier: {tier: "hot" | "ssd", released_bytes, released_pages, problems}.
nlohmann::json cleared_json(const messages::CacheCleared& cleared);

// The most a clear waits for the cache-writer, whatever it says meanwhile.
inline constexpr std::int64_t kMaxClearWaitNs = 600'000'000'000;
// A clear asked at asked_ns of the cache-writer `cache_writer`, last heard from (any message, a
// HeartbeatAck included) at heard_ns: why it has waited too long, or nullopt while its answer may
// still come. An SSD clear deletes a file per page on the cache-writer's I/O thread and may take
// longer than unavailable_ns, while its actor answers heartbeats; so it is overdue when the
// cache-writer has said nothing at all since it was asked for unavailable_ns (its process died,
// or it is stuck), or after kMaxClearWaitNs.
std::optional<std::string> clear_overdue(std::string_view cache_writer, std::int64_t now_ns, std::int64_t asked_ns,
                                         std::int64_t heard_ns, std::int64_t unavailable_ns);

// A load that ended loaded: {model, state: "loaded", evicted, bytes (needed), message}.
nlohmann::json loaded_json(const messages::LoadAnswer& answer);
// An unload's draining / unloaded / not_loaded answer: {model, state, outcome, message} and, once
// unloaded, the figures (model_bytes, freed_bytes, held_after, problems, unload_ms, total_ms).
nlohmann::json unload_json(const messages::UnloadAnswer& answer);

// A load that did not end loaded, as a request error: its code (unknown_model,
// insufficient_memory, model_failed, shutting_down) and, for insufficient_memory, the figures
// {needed_bytes, available_bytes, ceiling_bytes, pinned}.
struct Refusal {
  messages::RequestError code = messages::RequestError::internal;
  std::string message;
  nlohmann::json figures = nlohmann::json::object();
};
std::optional<Refusal> load_refusal(const messages::LoadAnswer& answer);
// unknown_model, and busy (if_idle with requests open); draining, unloaded and not_loaded are
// answers, not refusals.
std::optional<Refusal> unload_refusal(const messages::UnloadAnswer& answer);

}  // namespace mqlm::actors::model_admin
