#include "actors/front_end/model_admin.hpp"

#include <algorithm>

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

std::string_view tier_name(CacheTier tier) {
  switch (tier) {
    case CacheTier::hot: return "hot";
    case CacheTier::ssd: return "ssd";
  }
  return "unknown";
}

std::optional<CacheTier> tier_named(std::string_view name) {
  if (name == "hot") return CacheTier::hot;
  if (name == "ssd") return CacheTier::ssd;
  return std::nullopt;
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
  json out = {{"ceiling_bytes", report.ceiling_bytes},
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
  if (report.has_cache) {
    out["host_soft_bytes"] = report.host_soft_bytes;
    out["cache_shrinks"] = report.cache_shrinks;
    out["cache"] = cache_json(report.cache);
  }
  return out;
}

json cache_json(const CacheReport& report) {
  json by_model = json::object();
  for (const auto& [model, bytes] : report.hot_bytes_by_model) by_model[model] = bytes;
  return {{"hot_bytes", report.hot_bytes},
          {"hot_budget_bytes", report.hot_budget_bytes},
          {"hot_pages", report.hot_pages},
          {"queued_write_bytes", report.queued_write_bytes},
          {"ssd_bytes", report.ssd_bytes},
          {"ssd_limit_bytes", report.ssd_limit_bytes},
          {"ssd_pages", report.ssd_pages},
          {"hot_hits", report.hot_hits},
          {"ssd_hits", report.ssd_hits},
          {"misses", report.misses},
          {"spilled", report.spilled},
          {"writes", report.writes},
          {"write_failures", report.write_failures},
          {"corrupt", report.corrupt},
          {"dropped", report.dropped},
          {"hot_bytes_by_model", std::move(by_model)}};
}

json cleared_json(const CacheCleared& cleared) {
  return {{"tier", tier_name(static_cast<CacheTier>(cleared.tier))},
          {"released_bytes", cleared.released_bytes},
          {"released_pages", cleared.released_pages},
          {"problems", cleared.problems}};
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

std::optional<std::string> clear_overdue(std::string_view cache_writer, std::int64_t now_ns, std::int64_t asked_ns,
                                         std::int64_t heard_ns, std::int64_t unavailable_ns) {
  const std::int64_t silent_ns = now_ns - std::max(asked_ns, heard_ns);
  std::string why;
  if (silent_ns > unavailable_ns) {
    why = "has not answered for " + std::to_string(silent_ns / 1'000'000) + " ms (its process may have died)";
  } else if (now_ns - asked_ns > kMaxClearWaitNs) {
    why = "did not finish the clear in " + std::to_string(kMaxClearWaitNs / 1'000'000'000) + " s";
  } else {
    return std::nullopt;
  }
  return "the cache-writer '" + std::string(cache_writer) + "' " + why + ": the tier may not be cleared; try again later";
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
