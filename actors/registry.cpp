#include "actors/registry.hpp"

#include <stdexcept>

#include "actors/probe_actors.hpp"
#if MQLM_HAS_SCHEDULER
#include "actors/scheduler/scheduler.hpp"
#endif
#if MQLM_HAS_EXECUTOR
#include "actors/executor/executor.hpp"
#endif
#if MQLM_HAS_GATEWAY
#include "actors/gateway/gateway.hpp"
#endif
#if MQLM_HAS_HTTP
#include "actors/http/http.hpp"
#endif
#if MQLM_HAS_ENFORCER
#include "actors/enforcer/enforcer.hpp"
#endif
#if MQLM_HAS_CACHE_WRITER
#include "actors/cache_writer/cache_writer.hpp"
#endif

namespace mqlm::actors {

std::vector<std::string> actor_kinds() {
  std::vector<std::string> kinds{"echo", "prober"};
#if MQLM_HAS_SCHEDULER
  kinds.push_back("scheduler");
#endif
#if MQLM_HAS_EXECUTOR
  kinds.push_back("executor");
#endif
#if MQLM_HAS_GATEWAY
  kinds.push_back("gateway");
#endif
#if MQLM_HAS_HTTP
  kinds.push_back("http");
#endif
#if MQLM_HAS_ENFORCER
  kinds.push_back("enforcer");
#endif
#if MQLM_HAS_CACHE_WRITER
  kinds.push_back("cache-writer");
#endif
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
#if MQLM_HAS_SCHEDULER
  if (kind == "scheduler") return make_scheduler(options);
#endif
#if MQLM_HAS_EXECUTOR
  if (kind == "executor") return make_executor(options);
#endif
#if MQLM_HAS_GATEWAY
  if (kind == "gateway") return make_gateway(options);
#endif
#if MQLM_HAS_HTTP
  if (kind == "http") return make_http(options);
#endif
#if MQLM_HAS_ENFORCER
  if (kind == "enforcer") return make_enforcer(options);
#endif
#if MQLM_HAS_CACHE_WRITER
  if (kind == "cache-writer") return make_cache_writer(options);
#endif
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
