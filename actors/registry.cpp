#include "actors/registry.hpp"

#include <stdexcept>

#include "actors/cache_writer/cache_writer.hpp"
#include "actors/enforcer/enforcer.hpp"
#include "actors/executor/executor.hpp"
#include "actors/gateway/gateway.hpp"
#include "actors/http/http.hpp"
#include "actors/runtime/probe_actors.hpp"
#include "actors/scheduler/scheduler.hpp"

namespace mqlm::actors {

namespace {

using MakeActor = std::unique_ptr<Actor> (*)(const ActorOptions&);

// The serving actors by kind; echo and prober are made below, with their options checked there.
struct ServingKind {
  const char* kind;
  MakeActor make;
};
constexpr ServingKind serving_kinds[] = {
    {"scheduler", make_scheduler}, {"executor", make_executor}, {"gateway", make_gateway},
    {"http", make_http},           {"enforcer", make_enforcer}, {"cache-writer", make_cache_writer},
};

}  // namespace

std::vector<std::string> actor_kinds() {
  std::vector<std::string> kinds{"echo", "prober"};
  for (const auto& serving : serving_kinds) kinds.emplace_back(serving.kind);
  return kinds;
}

std::unique_ptr<Actor> make_actor(const std::string& kind, const ActorOptions& options) {
  if (kind == "echo") {
    check_option_names(kind, options, {});
    return std::make_unique<EchoActor>();
  }
  if (kind == "prober") {
    check_option_names(kind, options, {"target", "report_to", "rounds", "window", "blob_bytes", "seed"});
    ProberConfig config;
    config.target = text_option(options, "target", config.target);
    config.report_to = text_option(options, "report_to", config.report_to);
    config.rounds = number_option(kind, options, "rounds", config.rounds);
    config.window = std::max<std::uint64_t>(1, number_option(kind, options, "window", config.window));
    config.blob_bytes = number_option(kind, options, "blob_bytes", config.blob_bytes);
    config.seed = number_option(kind, options, "seed", config.seed);
    if (config.blob_bytes > (std::uint64_t{1} << 30)) throw std::invalid_argument("prober blob_bytes is over 1 GiB");
    return std::make_unique<ProberActor>(config);
  }
  for (const auto& serving : serving_kinds) {
    if (kind == serving.kind) return serving.make(options);
  }
  std::string known;
  for (const auto& k : actor_kinds()) known += (known.empty() ? "" : ", ") + k;
  throw std::invalid_argument("unknown actor kind '" + kind + "' (known: " + known + ")");
}

bool parse_option(const std::string& text, std::string& key, std::string& value) {
  auto eq = text.find('=');
  if (eq == std::string::npos || eq == 0) return false;
  key = text.substr(0, eq);
  value = text.substr(eq + 1);
  return true;
}

}  // namespace mqlm::actors
