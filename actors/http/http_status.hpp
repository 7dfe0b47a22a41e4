// What /api/status, /metrics and /v1/models show: the scheduler's StatusReport (its tables and
// the executor's buffer pool) beside the http actor's own figures (requests by finish reason,
// token counts, time-to-first-token and time-per-output-token histograms), rendered as JSON and
// as Prometheus' text exposition format. Pure functions; the figures travel from the actor to
// the handler threads as msgpack, so that no thread reads another's state.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <msgpack.hpp>
#include <nlohmann/json.hpp>

#include "actors/http/status_history.hpp"
#include "messages/models.hpp"
#include "messages/serving.hpp"

namespace mqlm::actors::http_status {

// A Prometheus-style histogram: counts[i] observations <= bounds[i] and above the bound before
// it; counts.back() those above every bound. Rendered cumulatively.
struct Histogram {
  std::vector<double> bounds;
  std::vector<std::uint64_t> counts;
  double sum = 0.0;
  std::uint64_t count = 0;
  MSGPACK_DEFINE(bounds, counts, sum, count);

  static Histogram with_bounds(std::vector<double> bounds);
  void observe(double value);
};

// The http actor's own figures, kept in its thread and copied into each status answer.
struct HttpFigures {
  std::int64_t uptime_ns = 0;
  std::uint32_t open_requests = 0;                 // opened here and not yet ended
  std::map<std::string, std::uint64_t> finished;   // by finish reason: stop, length, abort, error
  std::map<std::string, std::uint64_t> errors;     // requests ended with an error, by its code
  std::uint64_t prompt_tokens = 0;
  std::uint64_t completion_tokens = 0;
  std::uint64_t cached_tokens = 0;
  Histogram ttft_seconds;   // submit to first token
  Histogram tpot_seconds;   // first token to last, per token after the first
  bool draining = false;    // told to Drain: new requests are refused
  // The status page's samples (status_history.hpp), oldest first, taken every history_interval_s.
  std::vector<StatusSample> history;
  double history_interval_s = 0.0;
  std::uint32_t history_capacity = 0;
  MSGPACK_DEFINE(uptime_ns, open_requests, finished, errors, prompt_tokens, completion_tokens, cached_tokens,
                 ttft_seconds, tpot_seconds, draining, history, history_interval_s, history_capacity);

  HttpFigures();
  // Counts one ended request; its timings go to the histograms when it had the tokens to time.
  void record(const messages::FinalEvent& final_event);
};

// The bytes of a model's weights in the pool (owner "weights:<model>"), 0 when not reported.
std::uint64_t model_bytes(const messages::StatusReport& report, const std::string& model);

// memory: the enforcer's report, when the server has one: /api/status's "memory" (the ceiling,
// watermarks, pressure, each model's state and bytes, the device), and its Prometheus gauges.
// with_history: the figures' samples as "history" (history_json), for the status page.
nlohmann::json status_json(const messages::StatusReport& report, const HttpFigures& figures,
                           const messages::ModelsReport* memory = nullptr, bool with_history = false);
std::string prometheus_text(const messages::StatusReport& report, const HttpFigures& figures,
                            const messages::ModelsReport* memory = nullptr);
// A model shows as failing once this many of its latest requests failed one after another by
// the server's fault (messages::ModelOutcomes); one that ends well clears it.
constexpr std::uint32_t kFailingAfter = 3;

// /health, /ready and /live's picture: "status" ok, loading, draining or failing (every model
// that has been asked for is failing); "live" (the server answers); "ready" (it takes requests
// now: its executor is ready, it is not draining, not every model is failing); and "models", each
// configured model's ready, failing, failed_in_a_row and, with the enforcer's report, state.
nlohmann::json health_json(const messages::StatusReport& report, const HttpFigures& figures,
                           const messages::ModelsReport* memory = nullptr);

// /v1/models, created: when this server started (Unix seconds). With the enforcer's report every
// configured model is listed with its state, pinned and bytes; without, the scheduler's models.
nlohmann::json models_json(const messages::StatusReport& report, std::int64_t created,
                           const messages::ModelsReport* memory = nullptr);

}  // namespace mqlm::actors::http_status
