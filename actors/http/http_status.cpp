#include "actors/http/http_status.hpp"

#include <algorithm>
#include <array>
#include <tuple>
#include <cmath>

#include <fmt/format.h>

#include "actors/front_end/events.hpp"
#include "actors/front_end/model_admin.hpp"

namespace mqlm::actors::http_status {

using messages::FinalEvent;
using messages::FinishReason;
using messages::RequestError;
using messages::StatusReport;
using nlohmann::json;

namespace {

namespace fe = front_end;

constexpr double kNsPerSecond = 1e9;
constexpr FinishReason kFinishReasons[] = {FinishReason::stop, FinishReason::length, FinishReason::tool_calls,
                                           FinishReason::abort, FinishReason::error};

// Seconds, from interactive (5 ms) to a long queue (1 min).
std::vector<double> ttft_bounds() { return {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}; }
// Seconds per token, from a fast GPU (1 ms) to a CPU device (2.5 s).
std::vector<double> tpot_bounds() { return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5}; }

std::uint64_t kv_pages_free(const StatusReport& r) {
  const std::uint64_t taken = std::uint64_t{r.kv_pages_in_use} + r.kv_pages_cached;
  return r.kv_pages > taken ? r.kv_pages - taken : 0;
}

// Prometheus' text format: label values escape backslash, double quote and newline.
std::string label_value(std::string_view value) {
  std::string out;
  for (char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string number(double value) {
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  if (std::isnan(value)) return "NaN";
  return fmt::format("{}", value);
}

// One metric family: HELP and TYPE, then its samples.
class Exposition {
 public:
  void family(std::string_view name, std::string_view type, std::string_view help) {
    text_ += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  }
  void sample(std::string_view name, std::uint64_t value, std::string_view labels = {}) {
    text_ += fmt::format("{}{} {}\n", name, labels, value);
  }
  void sample(std::string_view name, double value, std::string_view labels = {}) {
    text_ += fmt::format("{}{} {}\n", name, labels, number(value));
  }
  void single(std::string_view name, std::string_view type, std::string_view help, std::uint64_t value) {
    family(name, type, help);
    sample(name, value);
  }
  void histogram(std::string_view name, std::string_view help, const Histogram& h) {
    family(name, "histogram", help);
    std::uint64_t cumulative = 0;
    for (std::size_t i = 0; i < h.bounds.size(); ++i) {
      cumulative += i < h.counts.size() ? h.counts[i] : 0;
      sample(fmt::format("{}_bucket", name), cumulative, fmt::format("{{le=\"{}\"}}", number(h.bounds[i])));
    }
    sample(fmt::format("{}_bucket", name), h.count, "{le=\"+Inf\"}");
    sample(fmt::format("{}_sum", name), h.sum);
    sample(fmt::format("{}_count", name), h.count);
  }
  std::string take() { return std::move(text_); }

 private:
  std::string text_;
};

std::string labels(std::string_view key, std::string_view value) {
  return fmt::format("{{{}=\"{}\"}}", key, label_value(value));
}

// The cache-writer's tiers, as the enforcer last sampled them: one family per figure, by tier
// where both tiers have it.
void cache_families(Exposition& e, const messages::ModelsReport& m) {
  const messages::CacheReport& c = m.cache;
  const std::string hot = labels("tier", "hot");
  const std::string ssd = labels("tier", "ssd");
  e.family("mqlm_cache_bytes", "gauge", "KV page bytes the cache-writer holds, by tier (hot: RAM).");
  e.sample("mqlm_cache_bytes", c.hot_bytes, hot);
  e.sample("mqlm_cache_bytes", c.ssd_bytes, ssd);
  e.family("mqlm_cache_limit_bytes", "gauge", "Each tier's budget (ssd 0: no SSD tier).");
  e.sample("mqlm_cache_limit_bytes", c.hot_budget_bytes, hot);
  e.sample("mqlm_cache_limit_bytes", c.ssd_limit_bytes, ssd);
  e.family("mqlm_cache_pages", "gauge", "KV pages the cache-writer holds, by tier.");
  e.sample("mqlm_cache_pages", std::uint64_t{c.hot_pages}, hot);
  e.sample("mqlm_cache_pages", std::uint64_t{c.ssd_pages}, ssd);
  e.single("mqlm_cache_queued_write_bytes", "gauge", "Hot-tier bytes waiting to be written to the SSD tier.",
           c.queued_write_bytes);
  e.family("mqlm_cache_model_hot_bytes", "gauge", "Hot-tier bytes of each model's pages.");
  for (const auto& [model, bytes] : c.hot_bytes_by_model) {
    e.sample("mqlm_cache_model_hot_bytes", bytes, labels("model", model));
  }
  e.family("mqlm_cache_hits_total", "counter", "Pages looked up and found, by the tier they were found in.");
  e.sample("mqlm_cache_hits_total", c.hot_hits, hot);
  e.sample("mqlm_cache_hits_total", c.ssd_hits, ssd);
  e.single("mqlm_cache_misses_total", "counter", "Pages looked up and found in neither tier.", c.misses);
  e.single("mqlm_cache_spilled_pages_total", "counter", "Pages the cache-writer received from the executor.",
           c.spilled);
  e.single("mqlm_cache_writes_total", "counter", "Pages written to the SSD tier.", c.writes);
  e.single("mqlm_cache_write_failures_total", "counter", "SSD writes that failed (the page was dropped).",
           c.write_failures);
  e.single("mqlm_cache_corrupt_total", "counter", "SSD page files that failed their check (deleted, recomputed).",
           c.corrupt);
  e.single("mqlm_cache_dropped_pages_total", "counter", "Pages let go without being written to the SSD tier.",
           c.dropped);
  e.single("mqlm_cache_shrinks_total", "counter", "Times the enforcer shrank the hot tier for host-memory pressure.",
           m.cache_shrinks);
  e.single("mqlm_host_memory_soft_bytes", "gauge",
           "Above this resident set of the executor, the hot tier is shrunk (0: never).", m.host_soft_bytes);
}

}  // namespace

Histogram Histogram::with_bounds(std::vector<double> bounds) {
  Histogram h;
  h.counts.assign(bounds.size() + 1, 0);
  h.bounds = std::move(bounds);
  return h;
}

void Histogram::observe(double value) {
  const auto bucket = static_cast<std::size_t>(std::lower_bound(bounds.begin(), bounds.end(), value) - bounds.begin());
  if (counts.size() != bounds.size() + 1) counts.resize(bounds.size() + 1, 0);
  ++counts[bucket];
  sum += value;
  ++count;
}

HttpFigures::HttpFigures() : ttft_seconds(Histogram::with_bounds(ttft_bounds())),
                             tpot_seconds(Histogram::with_bounds(tpot_bounds())) {
  for (FinishReason reason : kFinishReasons) finished[std::string(fe::finish_reason_name(reason))] = 0;
}

void HttpFigures::record(const FinalEvent& final_event) {
  const auto reason = static_cast<FinishReason>(final_event.finish);
  ++finished[std::string(fe::finish_reason_name(reason))];
  if (reason == FinishReason::error) {
    ++errors[std::string(fe::error_code_name(static_cast<RequestError>(final_event.error)))];
  }
  prompt_tokens += final_event.prompt_tokens;
  completion_tokens += final_event.completion_tokens;
  cached_tokens += final_event.cached_tokens;
  if (final_event.ttft_ns > 0) {
    ttft_seconds.observe(static_cast<double>(final_event.ttft_ns) / kNsPerSecond);
    // The first token's time is TTFT's; each later one took (total - ttft) / (tokens - 1).
    if (final_event.completion_tokens >= 2 && final_event.total_ns >= final_event.ttft_ns) {
      tpot_seconds.observe(static_cast<double>(final_event.total_ns - final_event.ttft_ns) / kNsPerSecond /
                           (final_event.completion_tokens - 1));
    }
  }
}

std::uint64_t model_bytes(const StatusReport& report, const std::string& model) {
  auto it = report.pool.active_by_owner.find("weights:" + model);
  return it == report.pool.active_by_owner.end() ? 0 : it->second;
}

json status_json(const StatusReport& r, const HttpFigures& f, const messages::ModelsReport* memory,
                 bool with_history) {
  json models = json::array();
  for (const auto& name : r.models) models.push_back({{"name", name}, {"bytes", model_bytes(r, name)}});
  json owners = json::object();
  for (const auto& [owner, bytes] : r.pool.active_by_owner) owners[owner] = bytes;
  json out = {{"uptime_seconds", static_cast<double>(f.uptime_ns) / kNsPerSecond},
          {"draining", f.draining},
          {"models", std::move(models)},
          {"requests",
           {{"tracked", r.requests}, {"running", r.running}, {"waiting", r.waiting}, {"http_open", f.open_requests}}},
          {"kv_pages",
           {{"total", r.kv_pages}, {"used", r.kv_pages_in_use}, {"free", kv_pages_free(r)},
            {"cached", r.kv_pages_cached}}},
          {"pool",
           {{"active_bytes", r.pool.active_bytes},
            {"cached_bytes", r.pool.cached_bytes},
            {"peak_active_bytes", r.pool.peak_active_bytes},
            {"held_bytes", r.pool.held_bytes},
            {"blocks", r.pool.blocks},
            {"active_by_owner", std::move(owners)}}},
          {"gpu_time",
           {{"busy_seconds", r.gpu_time.busy_seconds},
            {"queued_idle_seconds", r.gpu_time.queued_idle_seconds},
            {"host_idle_seconds", r.gpu_time.host_idle_seconds},
            {"submissions", r.gpu_time.submissions}}},
          {"scheduler",
           {{"steps", r.steps},
            {"finished", r.finished},
            {"preemptions", r.preemptions},
            {"computed_tokens", r.computed_tokens},
            {"generated_tokens", r.generated_tokens},
            {"drafted_tokens", r.drafted_tokens},
            {"accepted_tokens", r.accepted_tokens},
            {"prefix_hit_tokens", r.prefix_hit_tokens},
            {"restored_hot_tokens", r.restored_hot_tokens},
            {"restored_ssd_tokens", r.restored_ssd_tokens},
            {"spilled_pages", r.spilled_pages},
            {"executor_ready", r.executor_ready},
            {"executor_slots", r.executor_slots}}},
          {"http",
           {{"finished", f.finished},
            {"errors", f.errors},
            {"prompt_tokens", f.prompt_tokens},
            {"completion_tokens", f.completion_tokens},
            {"cached_tokens", f.cached_tokens}}}};
  if (memory != nullptr) {
    json picture = model_admin::memory_json(*memory);
    picture["device"] = {{"total_bytes", memory->device.total_bytes},
                         {"budget_bytes", memory->device.budget_bytes},
                         {"usage_bytes", memory->device.usage_bytes},
                         {"has_budget", memory->device.has_budget}};
    picture["process_rss_bytes"] = memory->device.process_rss_bytes;
    picture["ceiling_fraction"] = memory->ceiling_fraction;
    out["memory"] = std::move(picture);
  }
  if (with_history) {
    const double uptime_s = static_cast<double>(f.uptime_ns) / kNsPerSecond;
    out["history"] = history_json(f.history, f.history_interval_s, f.history_capacity, uptime_s);
  }
  return out;
}

// Every request the scheduler ended, whichever front end (HTTP or ZeroMQ) opened it, by model.
void model_outcome_families(Exposition& e, const StatusReport& r) {
  using Figure = std::uint64_t (*)(const messages::ModelOutcomes&);
  const std::array<std::tuple<const char*, const char*, const char*, Figure>, 5> families{{
      {"mqlm_model_requests_total", "counter", "Requests ended, by model (both front ends).",
       [](const messages::ModelOutcomes& o) { return o.finished; }},
      {"mqlm_model_requests_failed_total", "counter", "Requests ended by the server's fault, by model.",
       [](const messages::ModelOutcomes& o) { return o.failed; }},
      {"mqlm_model_prompt_tokens_total", "counter", "Prompt tokens of ended requests, by model.",
       [](const messages::ModelOutcomes& o) { return o.prompt_tokens; }},
      {"mqlm_model_completion_tokens_total", "counter", "Tokens generated for ended requests, by model.",
       [](const messages::ModelOutcomes& o) { return o.completion_tokens; }},
      {"mqlm_model_failing", "gauge", "1 while a model's latest requests all failed by the server's fault.",
       [](const messages::ModelOutcomes& o) { return std::uint64_t{o.failed_in_a_row >= kFailingAfter}; }},
  }};
  for (const auto& [name, type, help, figure] : families) {
    e.family(name, type, help);
    for (const auto& [model, outcomes] : r.outcomes) e.sample(name, figure(outcomes), labels("model", model));
  }
}

std::string prometheus_text(const StatusReport& r, const HttpFigures& f, const messages::ModelsReport* memory) {
  Exposition e;
  e.family("mqlm_uptime_seconds", "gauge", "Seconds since the HTTP front end started.");
  e.sample("mqlm_uptime_seconds", static_cast<double>(f.uptime_ns) / kNsPerSecond);
  e.family("mqlm_model_weight_bytes", "gauge", "Device memory held by each loaded model's weights.");
  for (const auto& name : r.models) e.sample("mqlm_model_weight_bytes", model_bytes(r, name), labels("model", name));

  e.single("mqlm_scheduler_requests", "gauge", "Requests in the scheduler's table (running and waiting).", r.requests);
  e.single("mqlm_scheduler_requests_running", "gauge", "Requests being computed.", r.running);
  e.single("mqlm_scheduler_requests_waiting", "gauge", "Requests waiting to be scheduled.", r.waiting);
  e.single("mqlm_http_requests_open", "gauge", "Requests opened over HTTP and not yet ended.", f.open_requests);

  e.family("mqlm_kv_pages", "gauge", "KV cache pages by state: used by a sequence, cached prefix, free.");
  e.sample("mqlm_kv_pages", std::uint64_t{r.kv_pages_in_use}, labels("state", "used"));
  e.sample("mqlm_kv_pages", std::uint64_t{r.kv_pages_cached}, labels("state", "cached"));
  e.sample("mqlm_kv_pages", kv_pages_free(r), labels("state", "free"));

  e.single("mqlm_pool_active_bytes", "gauge", "Device memory in use from the buffer pool.", r.pool.active_bytes);
  e.single("mqlm_pool_cached_bytes", "gauge", "Freed device memory the pool keeps for reuse.", r.pool.cached_bytes);
  e.single("mqlm_pool_peak_active_bytes", "gauge", "The most device memory in use at once.", r.pool.peak_active_bytes);
  e.single("mqlm_pool_held_bytes", "gauge", "Device memory the pool holds from the driver.", r.pool.held_bytes);
  e.family("mqlm_pool_owner_active_bytes", "gauge", "Device memory in use from the pool, by owner.");
  for (const auto& [owner, bytes] : r.pool.active_by_owner) {
    e.sample("mqlm_pool_owner_active_bytes", bytes, labels("owner", owner));
  }

  e.family("mqlm_gpu_busy_seconds_total", "counter", "GPU time running the executor's submissions.");
  e.sample("mqlm_gpu_busy_seconds_total", r.gpu_time.busy_seconds);
  e.family("mqlm_gpu_idle_seconds_total", "counter",
           "GPU idle between submissions: queued (the next was sent in time) or host (the GPU waited for it).");
  e.sample("mqlm_gpu_idle_seconds_total", r.gpu_time.queued_idle_seconds, labels("reason", "queued"));
  e.sample("mqlm_gpu_idle_seconds_total", r.gpu_time.host_idle_seconds, labels("reason", "host"));
  e.single("mqlm_gpu_submissions_total", "counter", "Command buffers submitted to the GPU.", r.gpu_time.submissions);
  e.single("mqlm_scheduler_steps_total", "counter", "Steps run by the executor.", r.steps);
  e.single("mqlm_scheduler_preemptions_total", "counter", "Sequences preempted for lack of KV pages.", r.preemptions);
  e.single("mqlm_scheduler_computed_tokens_total", "counter", "Prompt and recomputed tokens run through the model.",
           r.computed_tokens);
  e.single("mqlm_scheduler_generated_tokens_total", "counter", "Tokens sampled, for every front end's requests.",
           r.generated_tokens);
  e.single("mqlm_scheduler_prefix_hit_tokens_total", "counter", "Prompt tokens taken from the prefix cache.",
           r.prefix_hit_tokens);
  e.single("mqlm_scheduler_drafted_tokens_total", "counter",
           "Speculative decoding: drafted tokens verified (computed with the token before them).", r.drafted_tokens);
  e.single("mqlm_scheduler_accepted_tokens_total", "counter",
           "Speculative decoding: drafted tokens the model agreed with, kept as output.", r.accepted_tokens);
  e.family("mqlm_scheduler_restored_tokens_total", "counter",
           "Prompt tokens restored from the cache-writer's tiers instead of computed, by tier.");
  e.sample("mqlm_scheduler_restored_tokens_total", r.restored_hot_tokens, labels("tier", "hot"));
  e.sample("mqlm_scheduler_restored_tokens_total", r.restored_ssd_tokens, labels("tier", "ssd"));
  e.single("mqlm_scheduler_spilled_pages_total", "counter",
           "Prefix pages the GPU gave up and sent to the cache-writer.", r.spilled_pages);

  e.family("mqlm_http_requests_total", "counter", "Requests ended, by finish reason.");
  for (const auto& [reason, count] : f.finished) {
    e.sample("mqlm_http_requests_total", count, labels("finish_reason", reason));
  }
  e.family("mqlm_http_request_errors_total", "counter", "Requests ended with an error, by error code.");
  for (const auto& [code, count] : f.errors) e.sample("mqlm_http_request_errors_total", count, labels("code", code));
  e.single("mqlm_http_prompt_tokens_total", "counter", "Prompt tokens of ended requests.", f.prompt_tokens);
  e.single("mqlm_http_completion_tokens_total", "counter", "Tokens generated for ended requests.",
           f.completion_tokens);
  e.single("mqlm_http_cached_prompt_tokens_total", "counter",
           "Prompt tokens of ended requests found in the prefix cache.", f.cached_tokens);

  model_outcome_families(e, r);

  e.histogram("mqlm_http_time_to_first_token_seconds", "Time from submit to the first generated token.",
              f.ttft_seconds);
  e.histogram("mqlm_http_time_per_output_token_seconds", "Time per generated token after the first.",
              f.tpot_seconds);
  if (memory != nullptr) {
    const messages::ModelsReport& m = *memory;
    e.single("mqlm_memory_ceiling_bytes", "gauge", "Device bytes the models may take (0: no ceiling).", m.ceiling_bytes);
    e.single("mqlm_memory_soft_bytes", "gauge", "Above this, idle unpinned models are evicted.", m.soft_bytes);
    e.single("mqlm_memory_hard_bytes", "gauge", "Above this, requests of the largest model are aborted.", m.hard_bytes);
    e.single("mqlm_memory_admitted_bytes", "gauge", "Bytes of the loaded and loading models.", m.used_bytes);
    e.single("mqlm_memory_pressure", "gauge", "Memory pressure: 0 none, 1 above soft, 2 above hard.",
             std::uint64_t{m.pressure});
    e.single("mqlm_device_memory_total_bytes", "gauge", "The device's device-local memory.", m.device.total_bytes);
    e.single("mqlm_process_resident_bytes", "gauge", "The executor process's resident set.",
             m.device.process_rss_bytes);
    e.family("mqlm_model_bytes", "gauge", "Device bytes of each configured model (measured when loaded).");
    for (const auto& model : m.models) e.sample("mqlm_model_bytes", model.bytes, labels("model", model.id));
    e.family("mqlm_model_state", "gauge", "1 for the state each configured model is in.");
    for (const auto& model : m.models) {
      e.sample("mqlm_model_state", std::uint64_t{1},
               fmt::format("{{model=\"{}\",state=\"{}\"}}", label_value(model.id),
                           model_admin::state_name(static_cast<messages::ModelState>(model.state))));
    }
    if (m.has_cache) cache_families(e, m);
  }
  return e.take();
}

json health_json(const StatusReport& report, const HttpFigures& figures, const messages::ModelsReport* memory) {
  const bool serving = report.executor_ready && !figures.draining;
  json models = json::object();
  std::size_t failing = 0;
  for (const auto& name : report.models) {
    const auto outcome = report.outcomes.find(name);
    const std::uint32_t in_a_row = outcome == report.outcomes.end() ? 0 : outcome->second.failed_in_a_row;
    const bool model_failing = in_a_row >= kFailingAfter;
    failing += model_failing ? 1 : 0;
    models[name] = {{"ready", serving && !model_failing}, {"failing", model_failing}, {"failed_in_a_row", in_a_row}};
  }
  if (memory != nullptr) {
    for (const auto& model : memory->models) {
      if (models.contains(model.id)) {
        models[model.id]["state"] = model_admin::state_name(static_cast<messages::ModelState>(model.state));
      }
    }
  }
  const bool all_failing = failing > 0 && failing == report.models.size();
  const char* status = !report.executor_ready ? "loading" : figures.draining ? "draining" : all_failing ? "failing" : "ok";
  return {{"status", status},
          {"live", true},
          {"ready", serving && !all_failing},
          {"models", std::move(models)}};
}

json models_json(const StatusReport& report, std::int64_t created, const messages::ModelsReport* memory) {
  json data = json::array();
  if (memory != nullptr) {
    // Each alias is listed too, as clients that check a name against the list would find it.
    for (const auto& model : memory->models) {
      json entry = {{"id", model.id},
                    {"object", "model"},
                    {"created", created},
                    {"owned_by", "mqlm"},
                    {"state", model_admin::state_name(static_cast<messages::ModelState>(model.state))},
                    {"pinned", model.pinned},
                    {"bytes", model.bytes},
                    {"aliases", model.aliases},
                    {"ttl_s", model.ttl_s}};
      data.push_back(entry);
      entry.erase("aliases");
      for (const auto& alias : model.aliases) {
        entry["id"] = alias;
        entry["alias_of"] = model.id;
        data.push_back(entry);
      }
    }
    return {{"object", "list"}, {"data", std::move(data)}};
  }
  for (const auto& name : report.models) {
    data.push_back({{"id", name}, {"object", "model"}, {"created", created}, {"owned_by", "mqlm"}});
  }
  return {{"object", "list"}, {"data", std::move(data)}};
}

}  // namespace mqlm::actors::http_status
