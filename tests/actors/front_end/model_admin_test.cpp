// The model pool as the front ends show it: the enforcer's answers rendered as JSON, and loads
// and unloads that did not happen turned into request errors with their figures.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "actors/front_end/events.hpp"
#include "actors/front_end/model_admin.hpp"

namespace mqlm::actors::model_admin {
namespace {

using messages::LoadAnswer;
using messages::LoadOutcome;
using messages::ModelState;
using messages::Pressure;
using messages::RequestError;
using messages::UnloadAnswer;
using messages::UnloadOutcome;
using nlohmann::json;

LoadAnswer load_answer(LoadOutcome outcome, std::string message = {}) {
  LoadAnswer answer;
  answer.model = "big";
  answer.outcome = static_cast<std::uint8_t>(outcome);
  answer.message = std::move(message);
  return answer;
}

UnloadAnswer unload_answer(UnloadOutcome outcome, std::string message = {}) {
  UnloadAnswer answer;
  answer.model = "small";
  answer.outcome = static_cast<std::uint8_t>(outcome);
  answer.message = std::move(message);
  return answer;
}

// The code's client-facing name, so that a failure reads "busy", not 4.
std::string code_name(const Refusal& refusal) {
  return std::string(front_end::error_code_name(refusal.code));
}

TEST(ModelAdmin, ALoadThatEndedLoadedIsNoRefusal) {
  LoadAnswer answer = load_answer(LoadOutcome::loaded, "loaded in 2 s");
  answer.needed_bytes = 5000;
  answer.evicted = {"old"};
  EXPECT_FALSE(load_refusal(answer).has_value());
  EXPECT_EQ(loaded_json(answer), (json{{"model", "big"},
                                       {"state", "loaded"},
                                       {"evicted", {"old"}},
                                       {"bytes", 5000},
                                       {"message", "loaded in 2 s"}}));
}

TEST(ModelAdmin, InsufficientMemoryCarriesItsFigures) {
  LoadAnswer answer = load_answer(LoadOutcome::insufficient_memory, "big needs 9000 bytes, 4000 are free");
  answer.needed_bytes = 9000;
  answer.available_bytes = 4000;
  answer.ceiling_bytes = 10000;
  answer.pinned = {"p1", "p2"};
  answer.evicted = {"ignored"};
  auto refusal = load_refusal(answer);
  ASSERT_TRUE(refusal.has_value());
  EXPECT_EQ(code_name(*refusal), "insufficient_memory");
  EXPECT_EQ(refusal->message, "big needs 9000 bytes, 4000 are free");
  EXPECT_EQ(refusal->figures, (json{{"needed_bytes", 9000},
                                    {"available_bytes", 4000},
                                    {"ceiling_bytes", 10000},
                                    {"pinned", {"p1", "p2"}}}));

  // Figures past 2^53 stay exact: they are integers, never doubles.
  answer.needed_bytes = (std::uint64_t{1} << 60) + 1;
  EXPECT_EQ(load_refusal(answer)->figures["needed_bytes"].get<std::uint64_t>(), (std::uint64_t{1} << 60) + 1);
  EXPECT_TRUE(load_refusal(answer)->figures["needed_bytes"].is_number_integer());
}

TEST(ModelAdmin, EveryOtherLoadOutcomeIsARefusalWithoutFigures) {
  struct Case {
    LoadOutcome outcome;
    std::string code;
  };
  for (const Case& c : {Case{LoadOutcome::failed, "model_failed"}, Case{LoadOutcome::unknown_model, "unknown_model"},
                        Case{LoadOutcome::shutting_down, "shutting_down"}}) {
    SCOPED_TRACE(c.code);
    auto refusal = load_refusal(load_answer(c.outcome, "why: " + c.code));
    ASSERT_TRUE(refusal.has_value());
    EXPECT_EQ(code_name(*refusal), c.code);
    EXPECT_EQ(refusal->message, "why: " + c.code);
    EXPECT_EQ(refusal->figures, json::object());
  }
  // An outcome this build does not know (a newer enforcer) is an internal error, not a load.
  LoadAnswer strange;
  strange.outcome = 99;
  auto refusal = load_refusal(strange);
  ASSERT_TRUE(refusal.has_value());
  EXPECT_EQ(code_name(*refusal), "internal");
  EXPECT_FALSE(refusal->message.empty());
}

TEST(ModelAdmin, UnloadRefusalsAreBusyAndUnknownModelOnly) {
  auto busy = unload_refusal(unload_answer(UnloadOutcome::busy, "small has 3 requests open"));
  ASSERT_TRUE(busy.has_value());
  EXPECT_EQ(code_name(*busy), "busy");
  EXPECT_EQ(busy->message, "small has 3 requests open");
  EXPECT_EQ(busy->figures, json::object());

  auto unknown = unload_refusal(unload_answer(UnloadOutcome::unknown_model, "no model 'small'"));
  ASSERT_TRUE(unknown.has_value());
  EXPECT_EQ(code_name(*unknown), "unknown_model");
  EXPECT_EQ(unknown->message, "no model 'small'");

  for (UnloadOutcome answer : {UnloadOutcome::draining, UnloadOutcome::unloaded, UnloadOutcome::not_loaded}) {
    EXPECT_FALSE(unload_refusal(unload_answer(answer)).has_value()) << static_cast<int>(answer);
  }
}

TEST(ModelAdmin, UnloadJsonShowsFiguresOnceUnloaded) {
  UnloadAnswer draining = unload_answer(UnloadOutcome::draining, "2 requests are ending");
  draining.model_bytes = 77;  // not yet meaningful: left out
  EXPECT_EQ(unload_json(draining), (json{{"model", "small"},
                                         {"state", "draining"},
                                         {"outcome", "draining"},
                                         {"message", "2 requests are ending"}}));

  UnloadAnswer unloaded = unload_answer(UnloadOutcome::unloaded, "freed");
  unloaded.model_bytes = 3000;
  unloaded.freed_bytes = 2048;
  unloaded.held_after = 1024;
  unloaded.problems = {"kv"};
  unloaded.unload_ns = 12'500'000;
  unloaded.total_ns = 1'250'000'000;
  json out = unload_json(unloaded);
  EXPECT_EQ(out["model"], "small");
  EXPECT_EQ(out["state"], "unloaded");
  EXPECT_EQ(out["outcome"], "unloaded");
  EXPECT_EQ(out["message"], "freed");
  EXPECT_EQ(out["model_bytes"], 3000);
  EXPECT_EQ(out["freed_bytes"], 2048);
  EXPECT_EQ(out["held_after"], 1024);
  EXPECT_EQ(out["problems"], (json{"kv"}));
  EXPECT_DOUBLE_EQ(out["unload_ms"].get<double>(), 12.5);
  EXPECT_DOUBLE_EQ(out["total_ms"].get<double>(), 1250.0);
  EXPECT_EQ(out.size(), 10u);

  json not_loaded = unload_json(unload_answer(UnloadOutcome::not_loaded, "small is not loaded"));
  EXPECT_EQ(not_loaded["state"], "unloaded");
  EXPECT_EQ(not_loaded["outcome"], "not_loaded");
  EXPECT_FALSE(not_loaded.contains("freed_bytes"));
  EXPECT_EQ(not_loaded.size(), 4u);
}

TEST(ModelAdmin, StateAndPressureNames) {
  EXPECT_EQ(state_name(ModelState::unloaded), "unloaded");
  EXPECT_EQ(state_name(ModelState::loading), "loading");
  EXPECT_EQ(state_name(ModelState::loaded), "loaded");
  EXPECT_EQ(state_name(ModelState::draining), "draining");
  EXPECT_EQ(state_name(static_cast<ModelState>(0)), "unknown");
  EXPECT_EQ(pressure_name(Pressure::none), "none");
  EXPECT_EQ(pressure_name(Pressure::soft), "soft");
  EXPECT_EQ(pressure_name(Pressure::hard), "hard");
  EXPECT_EQ(pressure_name(static_cast<Pressure>(7)), "unknown");
}

TEST(ModelAdmin, MemoryJsonShowsTheCeilingPressureModelsAndPool) {
  messages::ModelsReport report;
  messages::ModelStatus loaded;
  loaded.id = "a";
  loaded.path = "/secret/a.gguf";
  loaded.pinned = true;
  loaded.state = static_cast<std::uint8_t>(ModelState::loaded);
  loaded.bytes = 3000;
  loaded.estimated_bytes = 3100;
  loaded.last_used_ns = 55;
  loaded.requests = 2;
  loaded.loads = 3;
  loaded.unloads = 2;
  loaded.last_problem = "kv release failed";
  loaded.aliases = {"fast", "quick"};
  loaded.ttl_s = 600;
  messages::ModelStatus loading;
  loading.id = "b";
  loading.state = static_cast<std::uint8_t>(ModelState::loading);
  loading.estimated_bytes = 900;
  report.models = {loaded, loading};
  report.ceiling_bytes = 10000;
  report.soft_bytes = 8000;
  report.hard_bytes = 9500;
  report.used_bytes = 3900;
  report.pressure = static_cast<std::uint8_t>(Pressure::hard);
  report.pressure_note = "every loaded model is pinned";
  report.pool.held_bytes = 4096;
  report.pool.active_bytes = 3900;
  report.pool.cached_bytes = 196;
  report.pool.blocks = 2;

  json out = memory_json(report);
  EXPECT_EQ(out["ceiling_bytes"], 10000);
  EXPECT_EQ(out["soft_bytes"], 8000);
  EXPECT_EQ(out["hard_bytes"], 9500);
  EXPECT_EQ(out["used_bytes"], 3900);
  EXPECT_EQ(out["pressure"], "hard");
  EXPECT_EQ(out["pressure_note"], "every loaded model is pinned");
  EXPECT_EQ(out["pool"], (json{{"held_bytes", 4096}, {"active_bytes", 3900}, {"cached_bytes", 196}, {"blocks", 2}}));
  ASSERT_EQ(out["models"].size(), 2u);
  // A model's path is the server's business: it is not shown.
  EXPECT_EQ(out["models"][0], (json{{"id", "a"},
                                    {"state", "loaded"},
                                    {"pinned", true},
                                    {"bytes", 3000},
                                    {"estimated_bytes", 3100},
                                    {"requests", 2},
                                    {"loads", 3},
                                    {"unloads", 2},
                                    {"last_problem", "kv release failed"},
                                    {"aliases", {"fast", "quick"}},
                                    {"ttl_s", 600}}));
  EXPECT_EQ(out["models"][1]["state"], "loading");
  EXPECT_EQ(out["models"][1]["pinned"], false);
  EXPECT_EQ(out["models"][1]["estimated_bytes"], 900);
  EXPECT_EQ(model_json(loaded), out["models"][0]);

  // No report yet: every figure at 0, pressure none, no models.
  json empty = memory_json({});
  EXPECT_EQ(empty["pressure"], "none");
  EXPECT_EQ(empty["models"], json::array());
  EXPECT_EQ(empty["ceiling_bytes"], 0);
  // Without a cache-writer there is no cache to show, nor its host-memory mark.
  EXPECT_FALSE(out.contains("cache"));
  EXPECT_FALSE(out.contains("host_soft_bytes"));
  EXPECT_FALSE(out.contains("cache_shrinks"));
}

messages::CacheReport cache_report() {
  messages::CacheReport cache;
  cache.hot_bytes = 6'000'000;
  cache.hot_budget_bytes = 1ull << 30;
  cache.hot_pages = 3;
  cache.queued_write_bytes = 2'000'000;
  cache.ssd_bytes = (std::uint64_t{1} << 60) + 7;  // past 2^53: must stay exact
  cache.ssd_limit_bytes = 16ull << 30;
  cache.ssd_pages = 11;
  cache.hot_hits = 21;
  cache.ssd_hits = 13;
  cache.misses = 8;
  cache.spilled = 40;
  cache.writes = 17;
  cache.write_failures = 2;
  cache.corrupt = 1;
  cache.dropped = 5;
  cache.hot_bytes_by_model = {{"a", 4'000'000}, {"b \"q\"", 2'000'000}};
  return cache;
}

TEST(ModelAdmin, CacheJsonShowsEveryFigureOfBothTiers) {
  json out = cache_json(cache_report());
  EXPECT_EQ(out, (json{{"hot_bytes", 6'000'000},
                       {"hot_budget_bytes", 1ull << 30},
                       {"hot_pages", 3},
                       {"queued_write_bytes", 2'000'000},
                       {"ssd_bytes", (std::uint64_t{1} << 60) + 7},
                       {"ssd_limit_bytes", 16ull << 30},
                       {"ssd_pages", 11},
                       {"hot_hits", 21},
                       {"ssd_hits", 13},
                       {"misses", 8},
                       {"spilled", 40},
                       {"writes", 17},
                       {"write_failures", 2},
                       {"corrupt", 1},
                       {"dropped", 5},
                       {"hot_bytes_by_model", {{"a", 4'000'000}, {"b \"q\"", 2'000'000}}}}));
  EXPECT_EQ(out["ssd_bytes"].get<std::uint64_t>(), (std::uint64_t{1} << 60) + 7);
  EXPECT_TRUE(out["hot_bytes_by_model"].is_object());
  // An empty hot tier still shows its models as an object, not null.
  EXPECT_EQ(cache_json({})["hot_bytes_by_model"], json::object());
}

TEST(ModelAdmin, MemoryJsonShowsTheCacheWhenTheServerHasOne) {
  messages::ModelsReport report;
  report.ceiling_bytes = 10000;
  report.has_cache = true;
  report.cache = cache_report();
  report.host_soft_bytes = 64ull << 30;
  report.cache_shrinks = 4;
  json out = memory_json(report);
  EXPECT_EQ(out["cache"], cache_json(report.cache));
  EXPECT_EQ(out["host_soft_bytes"], 64ull << 30);
  EXPECT_EQ(out["cache_shrinks"], 4);
  // The rest is the picture without a cache.
  report.has_cache = false;
  json without = memory_json(report);
  EXPECT_FALSE(without.contains("cache"));
  out.erase("cache");
  out.erase("host_soft_bytes");
  out.erase("cache_shrinks");
  EXPECT_EQ(out, without);
}

TEST(ModelAdmin, ClearedJsonNamesTheTierAndWhatWasReleased) {
  messages::CacheCleared hot{static_cast<std::uint8_t>(messages::CacheTier::hot), 123456789012ull, 4321, {}};
  EXPECT_EQ(cleared_json(hot), (json{{"tier", "hot"},
                                     {"released_bytes", 123456789012ull},
                                     {"released_pages", 4321},
                                     {"problems", json::array()}}));
  messages::CacheCleared ssd{static_cast<std::uint8_t>(messages::CacheTier::ssd), 0, 0,
                             {"this server has no SSD tier (--ssd-cache-dir)"}};
  EXPECT_EQ(cleared_json(ssd), (json{{"tier", "ssd"},
                                     {"released_bytes", 0},
                                     {"released_pages", 0},
                                     {"problems", {"this server has no SSD tier (--ssd-cache-dir)"}}}));
}

TEST(ModelAdmin, AClearIsOverdueOnlyWhenTheCacheWriterFellSilent) {
  constexpr std::int64_t kMs = 1'000'000;
  constexpr std::int64_t unavailable = 800 * kMs;
  const std::int64_t asked = 10'000 * kMs;
  // Heard from before the clear: its silence counts from the clear.
  EXPECT_FALSE(clear_overdue("cw", asked + 800 * kMs, asked, asked - 5'000 * kMs, unavailable));
  auto overdue = clear_overdue("cw", asked + 801 * kMs, asked, asked - 5'000 * kMs, unavailable);
  ASSERT_TRUE(overdue.has_value());
  EXPECT_EQ(*overdue, "the cache-writer 'cw' has not answered for 801 ms (its process may have died): the tier may "
                      "not be cleared; try again later");
  // A cache-writer that answers its heartbeats may take longer than unavailable_ms...
  EXPECT_FALSE(clear_overdue("cw", asked + 5'000 * kMs, asked, asked + 4'900 * kMs, unavailable));
  // ...but not forever.
  const std::int64_t late = asked + kMaxClearWaitNs + kMs;
  overdue = clear_overdue("cw", late, asked, late - kMs, unavailable);
  ASSERT_TRUE(overdue.has_value());
  EXPECT_NE(overdue->find("did not finish the clear in 600 s"), std::string::npos) << *overdue;
}

TEST(ModelAdmin, TierNamesGoBothWays) {
  EXPECT_EQ(tier_name(messages::CacheTier::hot), "hot");
  EXPECT_EQ(tier_name(messages::CacheTier::ssd), "ssd");
  EXPECT_EQ(tier_name(static_cast<messages::CacheTier>(9)), "unknown");
  EXPECT_EQ(tier_named("hot"), messages::CacheTier::hot);
  EXPECT_EQ(tier_named("ssd"), messages::CacheTier::ssd);
  for (std::string_view other : {"", "HOT", "gpu", "unknown", "hot "}) EXPECT_FALSE(tier_named(other)) << other;
}

}  // namespace
}  // namespace mqlm::actors::model_admin
