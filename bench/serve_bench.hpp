// `mqlm bench serve`: drives a running `mqlm serve` over its client protocol (docs/protocol.md)
// and reports what vLLM's benchmark_serving.py reports: request and token throughput, and the
// distributions of TTFT, TPOT, ITL and end-to-end latency.
//
// One thread and one DEALER socket hold every request in flight: requests leave when their
// (Poisson) arrival time has come and the concurrency limit allows, and events are read as they
// come, each timed when it arrives.
//
// Metric definitions (as benchmark_serving.py and vllm/benchmarks/lib/endpoint_request_func.py,
// times measured by this client from the moment the request was sent):
// - TTFT: the first token event that carries tokens (the final event, if no token event does).
// - E2E latency: the final event.
// - TPOT, per request with more than one output token: (E2E - TTFT) / (output tokens - 1).
// - ITL: one sample per token event after the first, the gap since the previous token event,
//   whatever the number of tokens it carries. (vLLM appends one gap per streamed chunk; with a
//   token event per step, as the server sends, that is a gap per token. Were events to carry
//   several tokens, ITL would show the gaps between them as the user sees them, and TPOT the
//   time per token.)
// - Output tokens: the final's usage.completion_tokens, else the tokens streamed. Input tokens:
//   usage.prompt_tokens, else the prompt's length when it was given as token ids.
// - Percentiles interpolate linearly between the closest ranks (numpy's default).
// - Throughputs divide by the duration: from the first request sent to the last final event.
// Only requests that finished with "stop" or "length" count; the rest are failed.
#pragma once

#include <chrono>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "tools/serve_client.hpp"

namespace mqlm::tools {

// The gaps between the arrivals of a Poisson process of `rate` requests per second: exponential,
// drawn from a seeded generator so a run can be repeated. An infinite rate gives gaps of 0
// (every request arrives at once).
class PoissonArrivals {
 public:
  PoissonArrivals(double rate, std::uint64_t seed) : rate_(rate), rng_(seed) {}
  double next_gap();  // seconds

 private:
  double rate_;
  std::mt19937_64 rng_;
};

// When each of `count` requests arrives, in seconds from the start: the first at once (as in
// benchmark_serving.py), the rest after gaps from PoissonArrivals(rate, a stream of `seed`).
std::vector<double> plan_arrivals(std::size_t count, double rate, std::uint64_t seed);

// `count` token ids drawn uniformly below `vocab_size`.
std::vector<std::int32_t> random_prompt(std::mt19937_64& rng, std::size_t count, std::int32_t vocab_size);
// `count` ids: a random run of count / repeats (rounded up) ids, repeated and cut to `count`.
std::vector<std::int32_t> repeated_prompt(std::mt19937_64& rng, std::size_t count, std::size_t repeats,
                                          std::int32_t vocab_size);

// What the client saw of one request; times are seconds from the start of the run.
struct RequestTimeline {
  double sent = 0;
  std::vector<std::pair<double, std::int64_t>> token_events;  // (arrival, tokens), events with tokens
  double finished = 0;               // the final event's arrival
  std::int64_t prompt_tokens = 0;
  std::int64_t output_tokens = 0;
  bool ok = false;                   // finished with stop or length
  std::string error;                 // why not: an error code, "abort", "timeout", ...
  std::string error_message;         // the server's words, for an error code
};

struct Distribution {  // milliseconds; all zero when there were no samples
  std::size_t count = 0;
  double mean = 0;
  double p50 = 0;
  double p90 = 0;
  double p99 = 0;
};

// numpy.percentile's default ("linear"): the rank p/100 * (n - 1), interpolated. `sorted` must
// be sorted and not empty.
double percentile(const std::vector<double>& sorted, double p);
Distribution summarize(std::vector<double> values);

struct ServeMetrics {
  std::size_t completed = 0;
  std::size_t failed = 0;
  std::map<std::string, std::size_t> failures;  // by reason
  std::size_t short_outputs = 0;                // completed with fewer tokens than asked (EOS, stop)
  double duration_s = 0;
  std::int64_t input_tokens = 0;
  std::int64_t output_tokens = 0;
  double request_throughput = 0;  // completed requests per second
  double output_throughput = 0;   // output tokens per second
  double total_token_throughput = 0;
  Distribution ttft_ms, tpot_ms, itl_ms, e2el_ms;
};

ServeMetrics compute_metrics(const std::vector<RequestTimeline>& requests, double duration_s,
                             std::int64_t asked_output_tokens);

struct ServeBenchOptions {
  std::string server = "tcp://127.0.0.1:5555";
  std::string model;                 // "": the server's default
  std::size_t requests = 100;
  std::size_t concurrency = 0;       // requests in flight at most; 0: no limit
  double rate = std::numeric_limits<double>::infinity();  // arrivals per second
  std::size_t prompt_tokens = 128;   // random ids, so the prompt length is exact
  std::size_t prompt_repeats = 1;    // random ids: one random run this many times over, cut to length
  std::string prompt;                // when given: this text for every request instead
  std::int32_t vocab_size = 1000;    // random ids are below this
  std::int32_t output_tokens = 128;  // max_tokens
  // What applications send (issue 32): sampled requests unless told otherwise; temperature 0 is
  // greedy, and top_p then changes nothing.
  float temperature = 0.7f;
  float top_p = 0.95f;
  std::vector<model::TokenBias> logit_bias;
  model::ResponseFormat response_format;  // json_object or a json_schema: grammar-constrained requests
  std::uint64_t seed = 0;
  std::optional<std::int32_t> draft_max;  // speculative decoding's drafts a step (greedy); none: the server's
  std::size_t warmup = 0;            // requests run first and not counted
  std::chrono::milliseconds timeout{60000};  // no event for this long, with requests open: stop
};

struct ServeRun {
  std::vector<RequestTimeline> requests;  // in the order they were planned
  double duration_s = 0;
};

// Runs the timed requests (after the warmup ones) against the server `client` is connected to.
// A frame from the server that is not a protocol event, or an error event (the server could not
// read one of our frames), stops the run with a CommandFailed.
ServeRun run_serve_bench(ServeClient& client, const ServeBenchOptions& options);

// "greedy (temperature 0)" or "temperature 0.7, top_p 0.95": what the reports say was asked.
std::string sampling_text(const ServeBenchOptions& options);

std::string format_report(const ServeMetrics& metrics, const ServeBenchOptions& options);
nlohmann::json report_json(const ServeMetrics& metrics, const ServeBenchOptions& options);

}  // namespace mqlm::tools
