#include "actors/gateway/model_admin.hpp"

namespace mqlm::actors::model_admin {

using namespace messages;
using nlohmann::json;

namespace {

double to_ms(std::int64_t ns) { return static_cast<double>(ns) / 1e6; }

}  // namespace

std::string_view state_name(ModelState state) {
  switch (state) {
    case ModelState::unloaded: return "unloaded";
    case ModelState::loading: return "loading";
    case ModelState::loaded: return "loaded";
    case ModelState::draining: return "draining";
  }
  return "unknown";
}

std::string_view pressure_name(Pressure pressure) {
  switch (pressure) {
    case Pressure::none: return "none";
    case Pressure::soft: return "soft";
    case Pressure::hard: return "hard";
  }
  return "unknown";
}

json model_json(const ModelStatus& model) {
  return {{"id", model.id},
          {"state", state_name(static_cast<ModelState>(model.state))},
          {"pinned", model.pinned},
          {"bytes", model.bytes},
          {"estimated_bytes", model.estimated_bytes},
          {"requests", model.requests},
          {"loads", model.loads},
          {"unloads", model.unloads},
          {"last_problem", model.last_problem},
          {"aliases", model.aliases},
          {"ttl_s", model.ttl_s}};
}

json memory_json(const ModelsReport& report) {
  json models = json::array();
  for (const auto& model : report.models) models.push_back(model_json(model));
  return {{"ceiling_bytes", report.ceiling_bytes},
          {"soft_bytes", report.soft_bytes},
          {"hard_bytes", report.hard_bytes},
          {"used_bytes", report.used_bytes},
          {"pressure", pressure_name(static_cast<Pressure>(report.pressure))},
          {"pressure_note", report.pressure_note},
          {"models", std::move(models)},
          {"pool",
           {{"held_bytes", report.pool.held_bytes},
            {"active_bytes", report.pool.active_bytes},
            {"cached_bytes", report.pool.cached_bytes},
            {"blocks", report.pool.blocks}}}};
}

json loaded_json(const LoadAnswer& answer) {
  return {{"model", answer.model},
          {"state", "loaded"},
          {"evicted", answer.evicted},
          {"bytes", answer.needed_bytes},
          {"message", answer.message}};
}

json unload_json(const UnloadAnswer& answer) {
  const auto outcome = static_cast<UnloadOutcome>(answer.outcome);
  json out = {{"model", answer.model},
              {"state", outcome == UnloadOutcome::draining ? "draining" : "unloaded"},
              {"outcome", outcome == UnloadOutcome::draining   ? "draining"
                          : outcome == UnloadOutcome::unloaded ? "unloaded"
                                                               : "not_loaded"},
              {"message", answer.message}};
  if (outcome == UnloadOutcome::unloaded) {
    out["model_bytes"] = answer.model_bytes;
    out["freed_bytes"] = answer.freed_bytes;
    out["held_after"] = answer.held_after;
    out["problems"] = answer.problems;
    out["unload_ms"] = to_ms(answer.unload_ns);
    out["total_ms"] = to_ms(answer.total_ns);
  }
  return out;
}

std::optional<Refusal> load_refusal(const LoadAnswer& answer) {
  switch (static_cast<LoadOutcome>(answer.outcome)) {
    case LoadOutcome::loaded: return std::nullopt;
    case LoadOutcome::unknown_model: return Refusal{RequestError::unknown_model, answer.message};
    case LoadOutcome::insufficient_memory:
      return Refusal{RequestError::insufficient_memory, answer.message,
                     json{{"needed_bytes", answer.needed_bytes},
                          {"available_bytes", answer.available_bytes},
                          {"ceiling_bytes", answer.ceiling_bytes},
                          {"pinned", answer.pinned}}};
    case LoadOutcome::failed: return Refusal{RequestError::model_failed, answer.message};
    case LoadOutcome::shutting_down: return Refusal{RequestError::shutting_down, answer.message};
  }
  return Refusal{RequestError::internal, "the enforcer gave an unknown load outcome"};
}

std::optional<Refusal> unload_refusal(const UnloadAnswer& answer) {
  switch (static_cast<UnloadOutcome>(answer.outcome)) {
    case UnloadOutcome::unknown_model: return Refusal{RequestError::unknown_model, answer.message};
    case UnloadOutcome::busy: return Refusal{RequestError::busy, answer.message};
    default: return std::nullopt;
  }
}

}  // namespace mqlm::actors::model_admin
