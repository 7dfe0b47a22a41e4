// `mqlm bench serve`'s arithmetic on timelines with known numbers, its arrival process, and its
// run loop against a stand-in server that streams a token per step.
#include <cmath>

#include <gtest/gtest.h>

#include "bench/serve_bench.hpp"
#include "tests/tools/fake_server.hpp"

namespace mqlm::tools {
namespace {

TEST(ServeBenchMetrics, PercentilesInterpolateLikeNumpy) {
  const std::vector<double> v{1, 2, 3, 4};
  // numpy.percentile([1, 2, 3, 4], [0, 50, 90, 99, 100]) = [1, 2.5, 3.7, 3.97, 4]
  EXPECT_DOUBLE_EQ(percentile(v, 0), 1);
  EXPECT_DOUBLE_EQ(percentile(v, 50), 2.5);
  EXPECT_NEAR(percentile(v, 90), 3.7, 1e-12);
  EXPECT_NEAR(percentile(v, 99), 3.97, 1e-12);
  EXPECT_DOUBLE_EQ(percentile(v, 100), 4);
  EXPECT_DOUBLE_EQ(percentile({5}, 99), 5);

  Distribution d = summarize({40, 10, 30, 20});  // unsorted in, sorted inside
  EXPECT_EQ(d.count, 4u);
  EXPECT_DOUBLE_EQ(d.mean, 25);
  EXPECT_DOUBLE_EQ(d.p50, 25);
  EXPECT_NEAR(d.p90, 37, 1e-12);
  EXPECT_NEAR(d.p99, 39.7, 1e-12);
  EXPECT_EQ(summarize({}).count, 0u);
}

TEST(ServeBenchMetrics, TtftTpotItlAndThroughputFromTimelines) {
  RequestTimeline a;  // four tokens in three events, the last carrying two
  a.sent = 0.0;
  a.token_events = {{0.100, 1}, {0.150, 1}, {0.250, 2}};
  a.finished = 0.300;
  a.prompt_tokens = 10;
  a.output_tokens = 4;
  a.ok = true;
  RequestTimeline b;  // one token: a TTFT and a latency but no TPOT and no ITL
  b.sent = 0.500;
  b.token_events = {{0.700, 1}};
  b.finished = 0.700;
  b.prompt_tokens = 20;
  b.output_tokens = 1;
  b.ok = true;
  RequestTimeline c;  // refused: counted as failed, in no distribution
  c.sent = 0.6;
  c.finished = 0.61;
  c.error = "busy";
  RequestTimeline d = c;
  d.error = "timeout";
  RequestTimeline e = c;

  ServeMetrics m = compute_metrics({a, b, c, d, e}, 1.0, 4);
  EXPECT_EQ(m.completed, 2u);
  EXPECT_EQ(m.failed, 3u);
  EXPECT_EQ(m.failures, (std::map<std::string, std::size_t>{{"busy", 2}, {"timeout", 1}}));
  EXPECT_EQ(m.short_outputs, 1u);  // b asked for 4 and made 1
  EXPECT_EQ(m.input_tokens, 30);
  EXPECT_EQ(m.output_tokens, 5);
  EXPECT_DOUBLE_EQ(m.request_throughput, 2);
  EXPECT_DOUBLE_EQ(m.output_throughput, 5);
  EXPECT_DOUBLE_EQ(m.total_token_throughput, 35);

  // TTFT: 100 and 200 ms.
  EXPECT_EQ(m.ttft_ms.count, 2u);
  EXPECT_NEAR(m.ttft_ms.mean, 150, 1e-9);
  EXPECT_NEAR(m.ttft_ms.p90, 190, 1e-9);
  // E2E: 300 and 200 ms.
  EXPECT_NEAR(m.e2el_ms.mean, 250, 1e-9);
  EXPECT_NEAR(m.e2el_ms.p99, 299, 1e-9);
  // TPOT, a's only: (300 - 100) / (4 - 1).
  EXPECT_EQ(m.tpot_ms.count, 1u);
  EXPECT_NEAR(m.tpot_ms.mean, 200.0 / 3, 1e-9);
  // ITL, a's gaps between token events: 50 and 100 ms (one gap per event, as vLLM counts).
  EXPECT_EQ(m.itl_ms.count, 2u);
  EXPECT_NEAR(m.itl_ms.mean, 75, 1e-9);
  EXPECT_NEAR(m.itl_ms.p50, 75, 1e-9);
  EXPECT_NEAR(m.itl_ms.p99, 99.5, 1e-9);
}

TEST(ServeBenchMetrics, AFinalWithoutTokenEventsIsTheFirstToken) {
  RequestTimeline r;
  r.sent = 1.0;
  r.finished = 1.25;
  r.output_tokens = 1;
  r.ok = true;
  ServeMetrics m = compute_metrics({r}, 2.0, 1);
  EXPECT_NEAR(m.ttft_ms.mean, 250, 1e-9);
  EXPECT_NEAR(m.e2el_ms.mean, 250, 1e-9);
  EXPECT_EQ(m.itl_ms.count, 0u);
  EXPECT_EQ(m.short_outputs, 0u);
}

TEST(ServeBenchArrivals, SeededAndExponentialWithTheRateAsked) {
  PoissonArrivals first(4.0, 11), second(4.0, 11), other(4.0, 12);
  bool differs = false;
  for (int i = 0; i < 100; ++i) {
    const double gap = first.next_gap();
    EXPECT_EQ(gap, second.next_gap());
    differs |= gap != other.next_gap();
    EXPECT_GE(gap, 0);
  }
  EXPECT_TRUE(differs);

  // Mean 1/rate, standard deviation 1/rate (an exponential's). Over 200000 draws the mean's
  // standard error is 0.22% of it; 1% is over four of those.
  PoissonArrivals arrivals(4.0, 3);
  const int n = 200000;
  double sum = 0, squares = 0;
  for (int i = 0; i < n; ++i) {
    const double gap = arrivals.next_gap();
    sum += gap;
    squares += gap * gap;
  }
  const double mean = sum / n;
  const double deviation = std::sqrt(squares / n - mean * mean);
  EXPECT_NEAR(mean, 0.25, 0.0025);
  EXPECT_NEAR(deviation, 0.25, 0.005);

  PoissonArrivals burst(std::numeric_limits<double>::infinity(), 1);
  EXPECT_EQ(burst.next_gap(), 0);
  EXPECT_EQ(plan_arrivals(3, 2.0, 9), plan_arrivals(3, 2.0, 9));
  EXPECT_EQ(plan_arrivals(3, std::numeric_limits<double>::infinity(), 9), (std::vector<double>{0, 0, 0}));
}

TEST(ServeBenchPrompts, SeededIdsBelowTheVocabulary) {
  std::mt19937_64 a(5), b(5);
  auto first = random_prompt(a, 1000, 17);
  EXPECT_EQ(first, random_prompt(b, 1000, 17));
  EXPECT_EQ(first.size(), 1000u);
  for (std::int32_t id : first) {
    EXPECT_GE(id, 0);
    EXPECT_LT(id, 17);
  }
  EXPECT_NE(first, random_prompt(a, 1000, 17));  // the generator moves on
}

TEST(ServeBenchPrompts, ARepeatedPromptIsOneRandomRunOverAndOver) {
  std::mt19937_64 a(5), b(5);
  const auto run = random_prompt(a, 4, 1000);
  const auto ids = repeated_prompt(b, 10, 3, 1000);  // a run of 4, twice and a half
  ASSERT_EQ(ids.size(), 10u);
  for (std::size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(ids[i], run[i % 4]) << i;
  std::mt19937_64 c(5), d(5);
  EXPECT_EQ(repeated_prompt(c, 7, 1, 1000), random_prompt(d, 7, 1000));
}

ServeClient connected(const std::string& endpoint) {
  auto result = ServeClient::connect(endpoint);
  if (auto* why = std::get_if<std::string>(&result)) ADD_FAILURE() << *why;
  return std::move(std::get<ServeClient>(result));
}

TEST(ServeBenchRun, EveryRequestCompletesWithinTheConcurrencyLimit) {
  fake_serving::StepServer server(std::chrono::milliseconds(5));
  ServeClient client = connected(server.endpoint());
  ServeBenchOptions o;
  o.requests = 10;
  o.concurrency = 3;
  o.prompt_tokens = 7;
  o.output_tokens = 4;
  o.warmup = 2;
  o.timeout = std::chrono::seconds(10);
  ServeRun run = run_serve_bench(client, o);

  ASSERT_EQ(run.requests.size(), 10u);
  EXPECT_EQ(server.generates(), 12u);  // the warmup's two too
  // Sampled by default, as applications ask (issue 32).
  EXPECT_FLOAT_EQ(server.last_temperature(), 0.7f);
  EXPECT_FLOAT_EQ(server.last_top_p(), 0.95f);
  EXPECT_EQ(server.most_open(), 3u);
  for (const auto& r : run.requests) {
    EXPECT_TRUE(r.ok) << r.error;
    EXPECT_EQ(r.prompt_tokens, 7);
    EXPECT_EQ(r.output_tokens, 4);
    EXPECT_EQ(r.token_events.size(), 4u);
    EXPECT_GE(r.finished, r.token_events.back().first);
    EXPECT_GE(r.token_events.front().first, r.sent);
  }
  ServeMetrics m = compute_metrics(run.requests, run.duration_s, o.output_tokens);
  EXPECT_EQ(m.completed, 10u);
  EXPECT_EQ(m.output_tokens, 40);
  EXPECT_GT(m.output_throughput, 0);
  // One gap per pair of token events, each a real interval of the run. (Not "about the 5 ms
  // step": a client thread that a loaded machine holds back reads several events at once, so
  // gaps shrink as well as stretch; the arithmetic on known gaps is tested above.)
  EXPECT_EQ(m.itl_ms.count, 30u);
  EXPECT_GE(m.itl_ms.p50, 0.0);
  EXPECT_LE(m.itl_ms.p99, run.duration_s * 1e3);
  for (const auto& r : run.requests) {
    for (std::size_t i = 1; i < r.token_events.size(); ++i) {
      EXPECT_GE(r.token_events[i].first, r.token_events[i - 1].first);
    }
  }

  nlohmann::json j = report_json(m, o);
  EXPECT_EQ(j["completed"], 10);
  EXPECT_EQ(j["config"]["rate"], "inf");
  EXPECT_EQ(j["config"]["concurrency"], 3);
  EXPECT_EQ(j["config"]["sampling"], "sampled");
  EXPECT_FLOAT_EQ(j["config"]["temperature"].get<float>(), 0.7f);
  EXPECT_FLOAT_EQ(j["config"]["top_p"].get<float>(), 0.95f);
  EXPECT_GT(j["output_throughput"].get<double>(), 0);
  EXPECT_NE(format_report(m, o).find("Successful requests:"), std::string::npos);
  EXPECT_NE(format_report(m, o).find("temperature 0.7, top_p 0.95"), std::string::npos);
}

TEST(ServeBenchReport, SaysWhetherTheRequestsWereGreedyOrSampled) {
  ServeBenchOptions o;
  o.temperature = 0;
  o.logit_bias = {{5, -100.0f}};
  nlohmann::json j = report_json(ServeMetrics{}, o);
  EXPECT_EQ(j["config"]["sampling"], "greedy");
  EXPECT_EQ(j["config"]["logit_bias"], (nlohmann::json{{"5", -100.0}}));
  EXPECT_NE(format_report(ServeMetrics{}, o).find("greedy (temperature 0)"), std::string::npos);
  o.temperature = 1.0f;
  o.top_p = 1.0f;
  EXPECT_EQ(sampling_text(o), "temperature 1, top_p 1, 1 logit_bias");
}

TEST(ServeBenchRun, PoissonArrivalsSpreadTheRequests) {
  fake_serving::StepServer server(std::chrono::milliseconds(2));
  ServeClient client = connected(server.endpoint());
  ServeBenchOptions o;
  o.requests = 20;
  o.rate = 100;  // a mean gap of 10 ms
  o.seed = 4;
  o.prompt_tokens = 3;
  o.output_tokens = 2;
  o.timeout = std::chrono::seconds(10);
  ServeRun run = run_serve_bench(client, o);

  // Each request left at its planned arrival (no concurrency limit holds any back), give or
  // take the scheduling of this thread.
  const std::vector<double> planned = plan_arrivals(o.requests, o.rate, o.seed);
  EXPECT_EQ(planned.front(), 0);
  EXPECT_GT(planned.back(), 0.05);  // 19 gaps of 10 ms on average
  for (std::size_t i = 0; i < run.requests.size(); ++i) {
    EXPECT_TRUE(run.requests[i].ok) << run.requests[i].error;
    EXPECT_GE(run.requests[i].sent, planned[i] - 1e-9);
    EXPECT_LT(run.requests[i].sent, planned[i] + 0.05);
  }
  EXPECT_GE(run.duration_s, run.requests.back().sent);
}

TEST(ServeBenchRun, ASilentServerTimesTheRunOut) {
  fake_serving::FakeServer silent;  // accepts the connection and never answers
  ServeClient client = connected(silent.endpoint());
  ServeBenchOptions o;
  o.requests = 5;
  o.concurrency = 2;
  o.prompt_tokens = 3;
  o.timeout = std::chrono::milliseconds(200);
  ServeRun run = run_serve_bench(client, o);
  ServeMetrics m = compute_metrics(run.requests, run.duration_s, o.output_tokens);
  EXPECT_EQ(m.completed, 0u);
  EXPECT_EQ(m.failures["timeout"], 2u);
  EXPECT_EQ(m.failed, 5u);
}

}  // namespace
}  // namespace mqlm::tools
