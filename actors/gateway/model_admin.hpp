// The model pool as the front ends show it: the enforcer's answers (messages/models.hpp) as JSON,
// one rendering for both protocols: the gateway packs it as msgpack (nlohmann's to_msgpack), the
// http actor writes it as JSON. Pure functions.
#pragma once

#include <optional>
#include <string_view>

#include <nlohmann/json.hpp>

#include "messages/models.hpp"
#include "messages/serving.hpp"

namespace mqlm::actors::model_admin {

std::string_view state_name(messages::ModelState state);   // "loading", "loaded", "draining", "unloaded"
std::string_view pressure_name(messages::Pressure pressure);  // "none", "soft", "hard"

// One model: id, state, pinned, bytes, estimated_bytes, requests, loads, unloads, last_problem.
nlohmann::json model_json(const messages::ModelStatus& model);
// The memory picture: ceiling_bytes, soft_bytes, hard_bytes, used_bytes, pressure, pressure_note,
// models [model_json...], pool {held_bytes, active_bytes, cached_bytes, blocks}.
nlohmann::json memory_json(const messages::ModelsReport& report);

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
