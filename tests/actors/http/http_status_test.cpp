// What /api/status, /metrics and /v1/models show, from a StatusReport and the http actor's
// figures: the counters and histograms the figures keep, and the Prometheus text read back line
// by line.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <sstream>

#include "actors/runtime/actor.hpp"
#include "actors/front_end/events.hpp"
#include "actors/http/bridge.hpp"
#include "actors/http/http_status.hpp"

namespace mqlm::actors::http_status {
namespace {

using messages::FinalEvent;
using messages::FinishReason;
using messages::RequestError;
using messages::StatusReport;

FinalEvent finished(FinishReason reason, std::uint32_t tokens, double ttft_s, double total_s) {
  FinalEvent event;
  event.finish = static_cast<std::uint8_t>(reason);
  event.prompt_tokens = 10;
  event.completion_tokens = tokens;
  event.cached_tokens = 4;
  event.ttft_ns = static_cast<std::int64_t>(ttft_s * 1e9);
  event.total_ns = static_cast<std::int64_t>(total_s * 1e9);
  return event;
}

TEST(HttpFigures, CountsByFinishReasonAndTimesTokens) {
  HttpFigures f;
  EXPECT_EQ(f.finished.size(), 5u);  // every reason shows, at 0 until it happens
  EXPECT_EQ(f.finished["tool_calls"], 0u);
  f.record(finished(FinishReason::length, 11, 0.02, 1.02));  // 10 tokens after the first in 1 s
  f.record(finished(FinishReason::stop, 1, 0.3, 0.3));        // one token: no time per token
  f.record(finished(FinishReason::abort, 0, 0, 0.5));         // no token: no timings
  f.record(front_end::error_final(RequestError::busy, "full"));
  EXPECT_EQ(f.finished["length"], 1u);
  EXPECT_EQ(f.finished["stop"], 1u);
  EXPECT_EQ(f.finished["abort"], 1u);
  EXPECT_EQ(f.finished["error"], 1u);
  EXPECT_EQ(f.errors["busy"], 1u);
  EXPECT_EQ(f.prompt_tokens, 30u);
  EXPECT_EQ(f.completion_tokens, 12u);
  EXPECT_EQ(f.cached_tokens, 12u);
  EXPECT_EQ(f.ttft_seconds.count, 2u);
  EXPECT_NEAR(f.ttft_seconds.sum, 0.32, 1e-9);
  ASSERT_EQ(f.tpot_seconds.count, 1u);
  EXPECT_NEAR(f.tpot_seconds.sum, 0.1, 1e-9);
}

TEST(Histogram, BucketsHoldValuesUpToTheirBound) {
  Histogram h = Histogram::with_bounds({1, 2});
  for (double v : {0.5, 1.0, 1.5, 2.0, 3.0}) h.observe(v);
  EXPECT_EQ(h.counts, (std::vector<std::uint64_t>{2, 2, 1}));
  EXPECT_EQ(h.count, 5u);
  EXPECT_DOUBLE_EQ(h.sum, 8.0);
}

StatusReport report() {
  StatusReport r;
  r.models = {"tiny"};
  r.requests = 3;
  r.running = 2;
  r.waiting = 1;
  r.kv_pages = 100;
  r.kv_pages_in_use = 10;
  r.kv_pages_cached = 5;
  r.pool.active_bytes = 1000;
  r.pool.cached_bytes = 200;
  r.pool.peak_active_bytes = 1500;
  r.pool.held_bytes = 4096;
  r.pool.active_by_owner = {{"weights:tiny", 700}, {"kv", 300}, {"a \"quoted\"\\owner", 0}};
  r.prefix_hit_tokens = 96;
  r.restored_hot_tokens = 48;
  r.restored_ssd_tokens = 32;
  r.spilled_pages = 7;
  r.drafted_tokens = 40;
  r.accepted_tokens = 25;
  r.gpu_time = {12.5, 0.25, 1.75, 4096};
  return r;
}

TEST(StatusJson, ShowsModelBytesRequestsPagesPoolAndUptime) {
  HttpFigures f;
  f.uptime_ns = 2'500'000'000;
  f.open_requests = 3;
  nlohmann::json s = status_json(report(), f);
  EXPECT_EQ(s["models"], nlohmann::json::parse(R"([{"name": "tiny", "bytes": 700}])"));
  EXPECT_EQ(s["requests"]["tracked"], 3);
  EXPECT_EQ(s["requests"]["running"], 2);
  EXPECT_EQ(s["requests"]["waiting"], 1);
  EXPECT_EQ(s["requests"]["http_open"], 3);
  EXPECT_EQ(s["kv_pages"]["used"], 10);
  EXPECT_EQ(s["kv_pages"]["cached"], 5);
  EXPECT_EQ(s["kv_pages"]["free"], 85);
  EXPECT_EQ(s["pool"]["held_bytes"], 4096);
  EXPECT_EQ(s["pool"]["active_by_owner"]["kv"], 300);
  EXPECT_DOUBLE_EQ(s["gpu_time"]["busy_seconds"].get<double>(), 12.5);
  EXPECT_DOUBLE_EQ(s["gpu_time"]["host_idle_seconds"].get<double>(), 1.75);
  EXPECT_EQ(s["gpu_time"]["submissions"], 4096);
  EXPECT_DOUBLE_EQ(s["uptime_seconds"].get<double>(), 2.5);
  EXPECT_EQ(s["draining"], false);
  EXPECT_EQ(s["scheduler"]["prefix_hit_tokens"], 96);
  EXPECT_EQ(s["scheduler"]["restored_hot_tokens"], 48);
  EXPECT_EQ(s["scheduler"]["restored_ssd_tokens"], 32);
  EXPECT_EQ(s["scheduler"]["spilled_pages"], 7);
  EXPECT_EQ(s["scheduler"]["drafted_tokens"], 40);
  EXPECT_EQ(s["scheduler"]["accepted_tokens"], 25);
  EXPECT_EQ(models_json(report(), 5)["data"][0]["id"], "tiny");
}

// The samples of the exposition by name and label text, and each family's TYPE.
struct Exposition {
  std::map<std::string, std::string> types;
  std::map<std::string, std::string> helps;
  std::map<std::string, std::string> samples;  // "name{labels}" -> value
};

Exposition read_back(const std::string& text) {
  Exposition e;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind("# TYPE ", 0) == 0) {
      std::istringstream words(line.substr(7));
      std::string name, type;
      words >> name >> type;
      EXPECT_FALSE(e.types.contains(name)) << "TYPE twice: " << name;
      e.types[name] = type;
    } else if (line.rfind("# HELP ", 0) == 0) {
      const std::string rest = line.substr(7);
      const std::string name = rest.substr(0, rest.find(' '));
      EXPECT_FALSE(e.helps.contains(name)) << "HELP twice: " << name;
      e.helps[name] = rest.substr(name.size());
    } else if (line.rfind("#", 0) != 0) {
      const auto space = line.rfind(' ');
      EXPECT_NE(space, std::string::npos) << line;
      e.samples[line.substr(0, space)] = line.substr(space + 1);
    }
  }
  return e;
}

// Every sample belongs to a family that has a TYPE, and every family has a HELP.
void expect_every_sample_typed(const Exposition& e) {
  for (const auto& [sample, value] : e.samples) {
    std::string name = sample.substr(0, sample.find('{'));
    bool typed = e.types.contains(name);
    for (const char* suffix : {"_bucket", "_sum", "_count"}) {
      if (!typed && name.ends_with(suffix)) typed = e.types.contains(name.substr(0, name.size() - std::strlen(suffix)));
    }
    EXPECT_TRUE(typed) << sample;
  }
  for (const auto& [name, type] : e.types) EXPECT_TRUE(e.helps.contains(name)) << "no HELP: " << name;
  for (const auto& [name, help] : e.helps) EXPECT_TRUE(e.types.contains(name)) << "no TYPE: " << name;
}

TEST(PrometheusText, HasTypedFamiliesEscapedLabelsAndCumulativeHistograms) {
  HttpFigures f;
  f.record(finished(FinishReason::length, 11, 0.02, 1.02));
  f.record(finished(FinishReason::length, 3, 0.2, 0.4));
  const std::string text = prometheus_text(report(), f);
  ASSERT_EQ(text.back(), '\n');
  Exposition e = read_back(text);
  EXPECT_EQ(e.types["mqlm_http_requests_total"], "counter");
  EXPECT_EQ(e.types["mqlm_kv_pages"], "gauge");
  EXPECT_EQ(e.types["mqlm_http_time_to_first_token_seconds"], "histogram");
  EXPECT_EQ(e.samples["mqlm_http_requests_total{finish_reason=\"length\"}"], "2");
  EXPECT_EQ(e.samples["mqlm_http_requests_total{finish_reason=\"abort\"}"], "0");
  EXPECT_EQ(e.samples["mqlm_kv_pages{state=\"free\"}"], "85");
  EXPECT_EQ(e.samples["mqlm_model_weight_bytes{model=\"tiny\"}"], "700");
  EXPECT_EQ(e.samples["mqlm_pool_owner_active_bytes{owner=\"a \\\"quoted\\\"\\\\owner\"}"], "0");
  EXPECT_EQ(e.samples["mqlm_http_time_to_first_token_seconds_bucket{le=\"0.01\"}"], "0");
  EXPECT_EQ(e.samples["mqlm_http_time_to_first_token_seconds_bucket{le=\"0.025\"}"], "1");
  EXPECT_EQ(e.samples["mqlm_http_time_to_first_token_seconds_bucket{le=\"0.25\"}"], "2");
  EXPECT_EQ(e.samples["mqlm_http_time_to_first_token_seconds_bucket{le=\"+Inf\"}"], "2");
  EXPECT_EQ(e.samples["mqlm_http_time_to_first_token_seconds_count"], "2");
  EXPECT_EQ(e.samples["mqlm_http_time_per_output_token_seconds_count"], "2");
  EXPECT_EQ(e.types["mqlm_scheduler_restored_tokens_total"], "counter");
  EXPECT_EQ(e.samples["mqlm_scheduler_restored_tokens_total{tier=\"hot\"}"], "48");
  EXPECT_EQ(e.samples["mqlm_scheduler_restored_tokens_total{tier=\"ssd\"}"], "32");
  EXPECT_EQ(e.types["mqlm_scheduler_spilled_pages_total"], "counter");
  EXPECT_EQ(e.samples["mqlm_scheduler_spilled_pages_total"], "7");
  EXPECT_EQ(e.types["mqlm_scheduler_drafted_tokens_total"], "counter");
  EXPECT_EQ(e.samples["mqlm_scheduler_drafted_tokens_total"], "40");
  EXPECT_EQ(e.samples["mqlm_scheduler_accepted_tokens_total"], "25");
  expect_every_sample_typed(e);
}

// The enforcer's picture: a (loaded, pinned, alias fast, ttl 300 s), b (unloaded), c "q"
// (draining, an id to escape).
messages::ModelsReport memory() {
  messages::ModelsReport m;
  messages::ModelStatus a;
  a.id = "a";
  a.pinned = true;
  a.state = static_cast<std::uint8_t>(messages::ModelState::loaded);
  a.bytes = 3000;
  a.aliases = {"fast"};
  a.ttl_s = 300;
  messages::ModelStatus b;
  b.id = "b";
  b.state = static_cast<std::uint8_t>(messages::ModelState::unloaded);
  b.estimated_bytes = 2000;
  messages::ModelStatus c;
  c.id = "c \"q\"";
  c.state = static_cast<std::uint8_t>(messages::ModelState::draining);
  c.bytes = 500;
  m.models = {a, b, c};
  m.ceiling_bytes = 10000;
  m.soft_bytes = 8000;
  m.hard_bytes = 9500;
  m.used_bytes = 3500;
  m.pressure = static_cast<std::uint8_t>(messages::Pressure::soft);
  m.pressure_note = "above soft";
  m.device = {80'000'000'000ull, 70'000'000'000ull, 5'000'000'000ull, true, 123'456'789};
  m.ceiling_fraction = 0.125;
  return m;
}

TEST(StatusJson, ShowsTheMemoryPictureOnlyWhenTheEnforcerReported) {
  const messages::ModelsReport m = memory();
  nlohmann::json s = status_json(report(), HttpFigures{}, &m);
  ASSERT_TRUE(s.contains("memory"));
  const nlohmann::json& picture = s["memory"];
  EXPECT_EQ(picture["ceiling_bytes"], 10000);
  EXPECT_EQ(picture["soft_bytes"], 8000);
  EXPECT_EQ(picture["hard_bytes"], 9500);
  EXPECT_EQ(picture["used_bytes"], 3500);
  EXPECT_EQ(picture["pressure"], "soft");
  EXPECT_EQ(picture["pressure_note"], "above soft");
  ASSERT_EQ(picture["models"].size(), 3u);
  EXPECT_EQ(picture["models"][0]["id"], "a");
  EXPECT_EQ(picture["models"][0]["state"], "loaded");
  EXPECT_EQ(picture["models"][0]["pinned"], true);
  EXPECT_EQ(picture["models"][0]["bytes"], 3000);
  EXPECT_EQ(picture["models"][1]["state"], "unloaded");
  EXPECT_EQ(picture["models"][2]["state"], "draining");
  EXPECT_EQ(picture["device"], nlohmann::json::parse(R"({"total_bytes": 80000000000, "budget_bytes": 70000000000,
                                                          "usage_bytes": 5000000000, "has_budget": true})"));
  EXPECT_EQ(picture["process_rss_bytes"], 123456789);
  EXPECT_DOUBLE_EQ(picture["ceiling_fraction"].get<double>(), 0.125);
  // The rest is the answer without memory.
  s.erase("memory");
  EXPECT_EQ(s, status_json(report(), HttpFigures{}));
  EXPECT_FALSE(status_json(report(), HttpFigures{}).contains("memory"));
}

TEST(ModelsJson, ListsEveryConfiguredModelWithTheEnforcersReport) {
  const messages::ModelsReport m = memory();
  nlohmann::json listed = models_json(report(), 1700000000, &m);
  EXPECT_EQ(listed["object"], "list");
  // The scheduler serves only tiny; the enforcer knows a (and its alias fast), b, c.
  ASSERT_EQ(listed["data"].size(), 4u);
  EXPECT_EQ(listed["data"][0], nlohmann::json::parse(R"({"id": "a", "object": "model", "created": 1700000000,
      "owned_by": "mqlm", "state": "loaded", "pinned": true, "bytes": 3000, "aliases": ["fast"], "ttl_s": 300})"));
  EXPECT_EQ(listed["data"][1], nlohmann::json::parse(R"({"id": "fast", "alias_of": "a", "object": "model",
      "created": 1700000000, "owned_by": "mqlm", "state": "loaded", "pinned": true, "bytes": 3000, "ttl_s": 300})"));
  EXPECT_EQ(listed["data"][2]["id"], "b");
  EXPECT_EQ(listed["data"][2]["state"], "unloaded");
  EXPECT_EQ(listed["data"][2]["pinned"], false);
  EXPECT_EQ(listed["data"][2]["bytes"], 0);
  EXPECT_EQ(listed["data"][2]["aliases"], nlohmann::json::array());
  EXPECT_EQ(listed["data"][3]["id"], "c \"q\"");
  EXPECT_EQ(listed["data"][3]["state"], "draining");
  EXPECT_EQ(listed["data"][3]["bytes"], 500);

  nlohmann::json scheduler = models_json(report(), 5);
  EXPECT_EQ(scheduler, nlohmann::json::parse(R"({"object": "list", "data": [
      {"id": "tiny", "object": "model", "created": 5, "owned_by": "mqlm"}]})"));
}

TEST(PrometheusText, MemoryGaugesAndOneStatePerModel) {
  const messages::ModelsReport m = memory();
  const std::string text = prometheus_text(report(), HttpFigures{}, &m);
  ASSERT_EQ(text.back(), '\n');
  Exposition e = read_back(text);
  expect_every_sample_typed(e);
  for (const char* family : {"mqlm_memory_ceiling_bytes", "mqlm_memory_soft_bytes", "mqlm_memory_hard_bytes",
                             "mqlm_memory_admitted_bytes", "mqlm_memory_pressure", "mqlm_device_memory_total_bytes",
                             "mqlm_process_resident_bytes", "mqlm_model_bytes", "mqlm_model_state"}) {
    EXPECT_EQ(e.types[family], "gauge") << family;
    EXPECT_TRUE(e.helps.contains(family)) << family;
  }
  EXPECT_EQ(e.samples["mqlm_memory_ceiling_bytes"], "10000");
  EXPECT_EQ(e.samples["mqlm_memory_soft_bytes"], "8000");
  EXPECT_EQ(e.samples["mqlm_memory_hard_bytes"], "9500");
  EXPECT_EQ(e.samples["mqlm_memory_admitted_bytes"], "3500");
  EXPECT_EQ(e.samples["mqlm_memory_pressure"], "1");
  EXPECT_EQ(e.samples["mqlm_device_memory_total_bytes"], "80000000000");
  EXPECT_EQ(e.samples["mqlm_process_resident_bytes"], "123456789");
  EXPECT_EQ(e.samples["mqlm_model_bytes{model=\"a\"}"], "3000");
  EXPECT_EQ(e.samples["mqlm_model_bytes{model=\"b\"}"], "0");
  EXPECT_EQ(e.samples["mqlm_model_bytes{model=\"c \\\"q\\\"\"}"], "500");
  EXPECT_EQ(e.samples["mqlm_model_state{model=\"a\",state=\"loaded\"}"], "1");
  EXPECT_EQ(e.samples["mqlm_model_state{model=\"b\",state=\"unloaded\"}"], "1");
  EXPECT_EQ(e.samples["mqlm_model_state{model=\"c \\\"q\\\"\",state=\"draining\"}"], "1");
  int states = 0;
  for (const auto& [sample, value] : e.samples) states += sample.starts_with("mqlm_model_state{") ? 1 : 0;
  EXPECT_EQ(states, 3);  // one line per model: the state it is in

  Exposition plain = read_back(prometheus_text(report(), HttpFigures{}));
  EXPECT_FALSE(plain.types.contains("mqlm_memory_ceiling_bytes"));
  EXPECT_FALSE(plain.types.contains("mqlm_model_state"));
  EXPECT_FALSE(plain.types.contains("mqlm_model_bytes"));
  // Without a cache-writer: no cache families.
  for (const auto& [name, type] : e.types) EXPECT_FALSE(name.starts_with("mqlm_cache_")) << name;
}

// A server with a cache-writer: the enforcer's report carries its tiers.
messages::ModelsReport memory_with_cache() {
  messages::ModelsReport m = memory();
  m.has_cache = true;
  m.cache.hot_bytes = 6'000'000;
  m.cache.hot_budget_bytes = 1ull << 30;
  m.cache.hot_pages = 3;
  m.cache.queued_write_bytes = 2'000'000;
  m.cache.ssd_bytes = 9'000'000'000ull;
  m.cache.ssd_limit_bytes = 16ull << 30;
  m.cache.ssd_pages = 11;
  m.cache.hot_hits = 21;
  m.cache.ssd_hits = 13;
  m.cache.misses = 8;
  m.cache.spilled = 40;
  m.cache.writes = 17;
  m.cache.write_failures = 2;
  m.cache.corrupt = 1;
  m.cache.dropped = 5;
  m.cache.hot_bytes_by_model = {{"a", 4'000'000}, {"c \"q\"", 2'000'000}};
  m.host_soft_bytes = 64ull << 30;
  m.cache_shrinks = 4;
  return m;
}

TEST(StatusJson, ShowsTheCacheTiersInTheMemoryPicture) {
  const messages::ModelsReport m = memory_with_cache();
  nlohmann::json s = status_json(report(), HttpFigures{}, &m);
  const nlohmann::json& picture = s["memory"];
  EXPECT_EQ(picture["host_soft_bytes"], 64ull << 30);
  EXPECT_EQ(picture["cache_shrinks"], 4);
  EXPECT_EQ(picture["cache"], nlohmann::json::parse(R"({
      "hot_bytes": 6000000, "hot_budget_bytes": 1073741824, "hot_pages": 3, "queued_write_bytes": 2000000,
      "ssd_bytes": 9000000000, "ssd_limit_bytes": 17179869184, "ssd_pages": 11,
      "hot_hits": 21, "ssd_hits": 13, "misses": 8, "spilled": 40, "writes": 17, "write_failures": 2,
      "corrupt": 1, "dropped": 5, "hot_bytes_by_model": {"a": 4000000, "c \"q\"": 2000000}})"));
  const messages::ModelsReport plain = memory();
  EXPECT_FALSE(status_json(report(), HttpFigures{}, &plain)["memory"].contains("cache"));
}

TEST(PrometheusText, CacheFamiliesByTierWhenTheServerHasACacheWriter) {
  const messages::ModelsReport m = memory_with_cache();
  Exposition e = read_back(prometheus_text(report(), HttpFigures{}, &m));
  expect_every_sample_typed(e);
  for (const char* family : {"mqlm_cache_bytes", "mqlm_cache_limit_bytes", "mqlm_cache_pages",
                             "mqlm_cache_queued_write_bytes", "mqlm_cache_model_hot_bytes",
                             "mqlm_host_memory_soft_bytes"}) {
    EXPECT_EQ(e.types[family], "gauge") << family;
  }
  for (const char* family : {"mqlm_cache_hits_total", "mqlm_cache_misses_total", "mqlm_cache_spilled_pages_total",
                             "mqlm_cache_writes_total", "mqlm_cache_write_failures_total", "mqlm_cache_corrupt_total",
                             "mqlm_cache_dropped_pages_total", "mqlm_cache_shrinks_total"}) {
    EXPECT_EQ(e.types[family], "counter") << family;
  }
  EXPECT_EQ(e.samples["mqlm_cache_bytes{tier=\"hot\"}"], "6000000");
  EXPECT_EQ(e.samples["mqlm_cache_bytes{tier=\"ssd\"}"], "9000000000");
  EXPECT_EQ(e.samples["mqlm_cache_limit_bytes{tier=\"hot\"}"], "1073741824");
  EXPECT_EQ(e.samples["mqlm_cache_limit_bytes{tier=\"ssd\"}"], "17179869184");
  EXPECT_EQ(e.samples["mqlm_cache_pages{tier=\"hot\"}"], "3");
  EXPECT_EQ(e.samples["mqlm_cache_pages{tier=\"ssd\"}"], "11");
  EXPECT_EQ(e.samples["mqlm_cache_queued_write_bytes"], "2000000");
  EXPECT_EQ(e.samples["mqlm_cache_model_hot_bytes{model=\"a\"}"], "4000000");
  EXPECT_EQ(e.samples["mqlm_cache_model_hot_bytes{model=\"c \\\"q\\\"\"}"], "2000000");
  EXPECT_EQ(e.samples["mqlm_cache_hits_total{tier=\"hot\"}"], "21");
  EXPECT_EQ(e.samples["mqlm_cache_hits_total{tier=\"ssd\"}"], "13");
  EXPECT_EQ(e.samples["mqlm_cache_misses_total"], "8");
  EXPECT_EQ(e.samples["mqlm_cache_spilled_pages_total"], "40");
  EXPECT_EQ(e.samples["mqlm_cache_writes_total"], "17");
  EXPECT_EQ(e.samples["mqlm_cache_write_failures_total"], "2");
  EXPECT_EQ(e.samples["mqlm_cache_corrupt_total"], "1");
  EXPECT_EQ(e.samples["mqlm_cache_dropped_pages_total"], "5");
  EXPECT_EQ(e.samples["mqlm_cache_shrinks_total"], "4");
  EXPECT_EQ(e.samples["mqlm_host_memory_soft_bytes"], "68719476736");
  // The scheduler's restored tokens are there with or without the enforcer's report.
  EXPECT_EQ(e.samples["mqlm_scheduler_restored_tokens_total{tier=\"hot\"}"], "48");
}

// A status answer is the scheduler's StatusReport with the http actor's figures as its blob.
TEST(ModelOutcomes, OnlyTheServersFaultsFailAndAGoodEndClearsTheStreak) {
  using messages::FinishReason;
  using messages::RequestError;
  messages::ModelOutcomes o;
  o.record(FinishReason::error, RequestError::model_failed, 3, 0);
  o.record(FinishReason::error, RequestError::gpu, 3, 0);
  o.record(FinishReason::error, RequestError::invalid_request, 3, 0);  // the client's: neither way
  o.record(FinishReason::abort, RequestError::none, 3, 1);
  EXPECT_EQ(o.failed_in_a_row, 2u);
  o.record(FinishReason::error, RequestError::internal, 3, 0);
  EXPECT_EQ(o.failed_in_a_row, 3u);
  o.record(FinishReason::length, RequestError::none, 3, 5);
  EXPECT_EQ(o.failed_in_a_row, 0u);
  EXPECT_EQ(o.finished, 6u);
  EXPECT_EQ(o.failed, 3u);
  EXPECT_EQ(o.prompt_tokens, 18u);
  EXPECT_EQ(o.completion_tokens, 6u);
}

TEST(HealthJson, LoadingDrainingOneFailingAndAllFailing) {
  messages::StatusReport report;
  report.models = {"a", "b"};
  HttpFigures figures;
  EXPECT_EQ(health_json(report, figures)["status"], "loading");
  EXPECT_EQ(health_json(report, figures)["ready"], false);
  report.executor_ready = true;
  EXPECT_EQ(health_json(report, figures)["status"], "ok");
  report.outcomes["a"].failed_in_a_row = kFailingAfter;
  auto one = health_json(report, figures);
  EXPECT_EQ(one["status"], "ok");
  EXPECT_EQ(one["models"]["a"]["ready"], false);
  EXPECT_EQ(one["models"]["a"]["failing"], true);
  EXPECT_EQ(one["models"]["b"]["ready"], true);
  report.outcomes["b"].failed_in_a_row = kFailingAfter + 4;
  auto both = health_json(report, figures);
  EXPECT_EQ(both["status"], "failing");
  EXPECT_EQ(both["ready"], false);
  EXPECT_EQ(both["live"], true);
  figures.draining = true;
  report.outcomes.clear();
  EXPECT_EQ(health_json(report, figures)["status"], "draining");
  EXPECT_EQ(health_json(report, figures)["models"]["a"]["ready"], false);
}

TEST(Bridge, StatusAnswersCarryTheFiguresAsTheirBlob) {
  HttpFigures figures;
  figures.record(finished(FinishReason::stop, 4, 0.1, 0.5));
  figures.open_requests = 3;
  messages::Frames blobs;
  blobs.push_back(http_bridge::figures_frame(figures));
  auto back = http_bridge::decode(http_bridge::encode(report(), std::move(blobs)));
  ASSERT_TRUE(back);
  const auto* status = back->as<StatusReport>();
  ASSERT_NE(status, nullptr);
  EXPECT_EQ(status->pool.active_by_owner, report().pool.active_by_owner);
  auto figures_back = http_bridge::figures_of(*back);
  ASSERT_TRUE(figures_back);
  EXPECT_EQ(figures_back->finished, figures.finished);
  EXPECT_EQ(figures_back->ttft_seconds.counts, figures.ttft_seconds.counts);
  EXPECT_EQ(figures_back->open_requests, 3u);

  // Without the blob, or with one that is no figures, there are none.
  EXPECT_FALSE(http_bridge::figures_of(*http_bridge::decode(http_bridge::encode(report()))));
  messages::Frames junk;
  junk.push_back(zmq::message_t("\x93\x01", 2));
  EXPECT_FALSE(http_bridge::figures_of(*http_bridge::decode(http_bridge::encode(report(), std::move(junk)))));
  // Frames that are no message decode to nothing.
  messages::Frames garbage;
  garbage.push_back(zmq::message_t("\x93\x01", 2));
  EXPECT_FALSE(http_bridge::decode(std::move(garbage)));
}

TEST(Bridge, CacheClearsCrossAsTheCatalogsMessages) {
  auto call = http_bridge::decode(http_bridge::encode(messages::ClearCache{static_cast<std::uint8_t>(messages::CacheTier::ssd)}));
  ASSERT_TRUE(call);
  ASSERT_NE(call->as<messages::ClearCache>(), nullptr);
  EXPECT_EQ(call->as<messages::ClearCache>()->tier, static_cast<std::uint8_t>(messages::CacheTier::ssd));

  messages::CacheCleared cleared{static_cast<std::uint8_t>(messages::CacheTier::ssd), (std::uint64_t{1} << 60) + 1, 9,
                                 {"x"}};
  auto back = http_bridge::decode(http_bridge::encode(cleared));
  ASSERT_TRUE(back);
  const auto* answer = back->as<messages::CacheCleared>();
  ASSERT_NE(answer, nullptr);
  EXPECT_EQ(answer->tier, cleared.tier);
  EXPECT_EQ(answer->released_bytes, cleared.released_bytes);
  EXPECT_EQ(answer->released_pages, 9u);
  EXPECT_EQ(answer->problems, cleared.problems);
}

// The token texts the scheduler adds to logprobs travel in TokenEvents like every other field.
TEST(Bridge, TokenTextsCrossTheWireInTokenEvents) {
  messages::TokenEvent event;
  event.tokens = {5};
  event.text = "caf";
  messages::TokenLogprobs entry;
  entry.token = 5;
  entry.logprob = -0.5f;
  entry.top_tokens = {5, 6};
  entry.top_logprobs = {-0.5f, -1.0f};
  entry.text = "caf\xc3";  // a piece may end inside a character
  entry.top_texts = {"caf\xc3", " tea"};
  event.logprobs = {entry};
  auto decoded = messages::decode(make_frames("scheduler", "http", event, {0, 9, {}}));
  ASSERT_TRUE(std::holds_alternative<messages::Message>(decoded));
  const auto* back = std::get<messages::Message>(decoded).as<messages::TokenEvent>();
  ASSERT_NE(back, nullptr);
  ASSERT_EQ(back->logprobs.size(), 1u);
  EXPECT_EQ(back->logprobs[0].text, "caf\xc3");
  EXPECT_EQ(back->logprobs[0].top_texts, entry.top_texts);
}

StatusReport counters(std::uint64_t generated, std::uint64_t computed, std::uint32_t running) {
  StatusReport r;
  r.generated_tokens = generated;
  r.computed_tokens = computed;
  r.running = running;
  r.pool.active_bytes = 1000 + running;
  return r;
}

constexpr std::int64_t kSecond = 1'000'000'000;

// Rates are the counters' growth between two samples; prompt tokens are those computed beyond
// the generated ones fed back.
TEST(StatusHistory, RatesFromTheSchedulersCountersBetweenSamples) {
  StatusHistory history(8);
  history.add(counters(0, 0, 0), nullptr, 1 * kSecond);
  history.add(counters(20, 120, 2), nullptr, 3 * kSecond);  // 20 generated, 100 prompt in 2 s
  messages::ModelsReport memory;
  memory.device.usage_bytes = 7;
  memory.device.process_rss_bytes = 9;
  history.add(counters(10, 10, 1), &memory, 4 * kSecond);  // the scheduler restarted: no rate
  const std::vector<StatusSample> samples = history.samples();
  ASSERT_EQ(samples.size(), 3u);
  EXPECT_DOUBLE_EQ(samples[0].generated_per_s, 0.0);  // nothing to compare the first with
  EXPECT_DOUBLE_EQ(samples[1].generated_per_s, 10.0);
  EXPECT_DOUBLE_EQ(samples[1].prompt_per_s, 50.0);
  EXPECT_EQ(samples[1].running, 2u);
  EXPECT_EQ(samples[1].pool_active_bytes, 1002u);
  EXPECT_EQ(samples[1].device_usage_bytes, 0u);
  EXPECT_DOUBLE_EQ(samples[2].generated_per_s, 0.0);
  EXPECT_DOUBLE_EQ(samples[2].prompt_per_s, 0.0);
  EXPECT_EQ(samples[2].device_usage_bytes, 7u);
  EXPECT_EQ(samples[2].host_rss_bytes, 9u);
  EXPECT_DOUBLE_EQ(samples[2].uptime_s, 4.0);
}

// Drafts computed and not kept (speculative decoding) are neither generated nor prompt.
TEST(StatusHistory, RejectedDraftsAreNotCountedAsPrompt) {
  StatusHistory history(4);
  history.add(counters(0, 0, 0), nullptr, 1 * kSecond);
  StatusReport drafting = counters(30, 50, 1);  // 30 generated, 20 of them drafts kept, 20 drafts not
  drafting.drafted_tokens = 40;
  drafting.accepted_tokens = 20;
  history.add(drafting, nullptr, 2 * kSecond);
  const std::vector<StatusSample> samples = history.samples();
  ASSERT_EQ(samples.size(), 2u);
  EXPECT_DOUBLE_EQ(samples[1].generated_per_s, 30.0);
  EXPECT_DOUBLE_EQ(samples[1].prompt_per_s, 0.0);
}

TEST(StatusHistory, KeepsTheNewestCapacitySamplesOldestFirst) {
  StatusHistory history(3);
  for (std::uint32_t i = 0; i < 5; ++i) history.add(counters(0, 0, i), nullptr, i * kSecond);
  const std::vector<StatusSample> samples = history.samples();
  ASSERT_EQ(samples.size(), 3u);
  EXPECT_EQ(samples.front().running, 2u);
  EXPECT_EQ(samples.back().running, 4u);
}

// /api/status?history=1: the samples with their age, the interval and how many are kept; the
// figures carry them across the bridge.
TEST(StatusJson, ShowsTheHistoryOnlyWhenAskedWithAgesBeforeNow) {
  StatusHistory history;
  history.add(counters(0, 0, 0), nullptr, 8 * kSecond);
  history.add(counters(30, 30, 3), nullptr, 9 * kSecond);
  HttpFigures figures;
  figures.uptime_ns = 10 * kSecond;
  figures.history = history.samples();
  figures.history_interval_s = 1.0;
  figures.history_capacity = 360;
  messages::Frames blobs;
  blobs.push_back(http_bridge::figures_frame(figures));
  auto back = http_bridge::figures_of(*http_bridge::decode(http_bridge::encode(report(), std::move(blobs))));
  ASSERT_TRUE(back);
  EXPECT_FALSE(status_json(report(), *back).contains("history"));
  const nlohmann::json j = status_json(report(), *back, nullptr, true)["history"];
  EXPECT_EQ(j["interval_seconds"], 1.0);
  EXPECT_EQ(j["capacity"], 360);
  ASSERT_EQ(j["samples"].size(), 2u);
  EXPECT_DOUBLE_EQ(j["samples"][0]["t"].get<double>(), -2.0);
  EXPECT_DOUBLE_EQ(j["samples"][1]["t"].get<double>(), -1.0);
  EXPECT_DOUBLE_EQ(j["samples"][1]["generated_tokens_per_s"].get<double>(), 30.0);
  EXPECT_EQ(j["samples"][1]["running"], 3);
}

}  // namespace
}  // namespace mqlm::actors::http_status
