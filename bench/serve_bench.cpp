#include "bench/serve_bench.hpp"

#include <algorithm>
#include <cmath>
#include <ctime>
#include <fstream>
#include <iostream>
#include <numeric>
#include <sstream>
#include <unordered_map>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "tools/command_options.hpp"
#include "tools/commands.hpp"

namespace mqlm::tools {

// ---- workload -------------------------------------------------------------------------------

double PoissonArrivals::next_gap() {
  if (std::isinf(rate_)) return 0;
  // Inverse transform of a uniform in [0, 1) with 53 random bits: the same gaps from the same
  // seed whatever the standard library (std::exponential_distribution's algorithm is its own).
  const double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53;
  return -std::log1p(-u) / rate_;
}

std::vector<double> plan_arrivals(std::size_t count, double rate, std::uint64_t seed) {
  // Another stream of the seed than the prompts', so the prompts do not depend on the rate.
  PoissonArrivals gaps(rate, seed ^ 0x9e3779b97f4a7c15ull);
  std::vector<double> arrivals;
  double at = 0;
  for (std::size_t i = 0; i < count; ++i) {
    arrivals.push_back(at);
    at += gaps.next_gap();
  }
  return arrivals;
}

std::vector<std::int32_t> random_prompt(std::mt19937_64& rng, std::size_t count, std::int32_t vocab_size) {
  std::vector<std::int32_t> ids(count);
  for (auto& id : ids) id = static_cast<std::int32_t>(rng() % static_cast<std::uint64_t>(vocab_size));
  return ids;
}

std::vector<std::int32_t> repeated_prompt(std::mt19937_64& rng, std::size_t count, std::size_t repeats,
                                          std::int32_t vocab_size) {
  const std::size_t run = (count + std::max<std::size_t>(repeats, 1) - 1) / std::max<std::size_t>(repeats, 1);
  const std::vector<std::int32_t> once = random_prompt(rng, run, vocab_size);
  std::vector<std::int32_t> ids;
  for (std::size_t i = 0; i < count; ++i) ids.push_back(once[i % run]);
  return ids;
}

// ---- metrics --------------------------------------------------------------------------------

double percentile(const std::vector<double>& sorted, double p) {
  const double rank = p / 100.0 * static_cast<double>(sorted.size() - 1);
  const auto low = static_cast<std::size_t>(std::floor(rank));
  const auto high = static_cast<std::size_t>(std::ceil(rank));
  return sorted[low] + (sorted[high] - sorted[low]) * (rank - static_cast<double>(low));
}

Distribution summarize(std::vector<double> values) {
  Distribution d;
  if (values.empty()) return d;
  std::sort(values.begin(), values.end());
  d.count = values.size();
  d.mean = std::accumulate(values.begin(), values.end(), 0.0) / static_cast<double>(values.size());
  d.p50 = percentile(values, 50);
  d.p90 = percentile(values, 90);
  d.p99 = percentile(values, 99);
  return d;
}

ServeMetrics compute_metrics(const std::vector<RequestTimeline>& requests, double duration_s,
                             std::int64_t asked_output_tokens) {
  ServeMetrics m;
  m.duration_s = duration_s;
  std::vector<double> ttft, tpot, itl, e2el;
  for (const auto& r : requests) {
    if (!r.ok) {
      ++m.failed;
      ++m.failures[r.error];
      continue;
    }
    ++m.completed;
    m.input_tokens += r.prompt_tokens;
    m.output_tokens += r.output_tokens;
    if (r.output_tokens < asked_output_tokens) ++m.short_outputs;
    const double first = r.token_events.empty() ? r.finished : r.token_events.front().first;
    const double ttft_s = first - r.sent;
    const double e2el_s = r.finished - r.sent;
    ttft.push_back(ttft_s * 1e3);
    e2el.push_back(e2el_s * 1e3);
    if (r.output_tokens > 1) tpot.push_back((e2el_s - ttft_s) / static_cast<double>(r.output_tokens - 1) * 1e3);
    for (std::size_t i = 1; i < r.token_events.size(); ++i) {
      itl.push_back((r.token_events[i].first - r.token_events[i - 1].first) * 1e3);
    }
  }
  if (duration_s > 0) {
    m.request_throughput = static_cast<double>(m.completed) / duration_s;
    m.output_throughput = static_cast<double>(m.output_tokens) / duration_s;
    m.total_token_throughput = static_cast<double>(m.input_tokens + m.output_tokens) / duration_s;
  }
  m.ttft_ms = summarize(std::move(ttft));
  m.tpot_ms = summarize(std::move(tpot));
  m.itl_ms = summarize(std::move(itl));
  m.e2el_ms = summarize(std::move(e2el));
  return m;
}

// ---- the run --------------------------------------------------------------------------------

namespace {

using Clock = std::chrono::steady_clock;

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// Requests of one phase (the warmup or the timed one): what each sends and when it arrives.
struct Plan {
  std::vector<Prompt> prompts;
  std::vector<double> arrivals;  // seconds from the phase's start, ascending
  std::int64_t first_id = 0;     // request i has id first_id + i
};

Plan make_plan(const ServeBenchOptions& o, std::size_t count, std::uint64_t seed, double rate, std::int64_t first_id) {
  Plan plan;
  plan.first_id = first_id;
  plan.arrivals = plan_arrivals(count, rate, seed);
  std::mt19937_64 prompt_rng(seed);
  for (std::size_t i = 0; i < count; ++i) {
    if (o.prompt.empty()) {
      plan.prompts.emplace_back(repeated_prompt(prompt_rng, o.prompt_tokens, o.prompt_repeats, o.vocab_size));
    } else {
      plan.prompts.emplace_back(o.prompt);
    }
  }
  return plan;
}

class PhaseRunner {
 public:
  PhaseRunner(ServeClient& client, const ServeBenchOptions& o, const Plan& plan)
      : client_(client), o_(o), plan_(plan), timelines_(plan.prompts.size()) {}

  ServeRun run() {
    start_ = Clock::now();
    end_ = start_;
    last_progress_ = start_;
    while (done_ < timelines_.size()) {
      send_due();
      if (done_ == timelines_.size()) break;
      auto received = client_.receive(wait_time());
      if (std::holds_alternative<NoEvent>(received)) {
        if (!open_.empty() && Clock::now() - last_progress_ >= o_.timeout) {
          give_up();
          break;
        }
        continue;
      }
      if (auto* bad = std::get_if<BadEvent>(&received)) {
        abort_open();
        throw CommandFailed("the server sent a frame that is not a protocol event: " + bad->reason);
      }
      handle(std::get<ServeEvent>(received));
    }
    return {std::move(timelines_), seconds(end_ - start_)};
  }

 private:
  bool below_limit() const { return o_.concurrency == 0 || open_.size() < o_.concurrency; }

  void send_due() {
    while (next_ < timelines_.size() && below_limit() && seconds(Clock::now() - start_) >= plan_.arrivals[next_]) {
      GenerateRequest request;
      request.id = plan_.first_id + static_cast<std::int64_t>(next_);
      request.model = o_.model;
      request.prompt = plan_.prompts[next_];
      request.sampling.max_tokens = o_.output_tokens;
      request.sampling.temperature = o_.temperature;
      request.sampling.top_p = o_.top_p;
      request.sampling.logit_bias = o_.logit_bias;
      request.sampling.response_format = o_.response_format;
      request.sampling.seed = o_.seed + next_;
      request.draft_max = o_.draft_max;
      RequestTimeline& t = timelines_[next_];
      if (const auto* ids = std::get_if<std::vector<std::int32_t>>(&request.prompt)) {
        t.prompt_tokens = static_cast<std::int64_t>(ids->size());
      }
      const auto now = Clock::now();
      t.sent = seconds(now - start_);
      if (client_.send_generate(request)) {
        open_[std::get<std::int64_t>(request.id)] = next_;
        last_progress_ = now;
      } else {
        finish(t, "send queue full", now);
      }
      ++next_;
    }
  }

  // Until the next arrival when one may be sent, else until the timeout would pass.
  std::chrono::milliseconds wait_time() const {
    const auto now = Clock::now();
    // With nothing open there is only the next arrival to wait for (one is always left then).
    Clock::duration wait = o_.timeout - (now - last_progress_);
    if (open_.empty()) wait = std::chrono::hours(24);
    if (next_ < timelines_.size() && below_limit()) {
      const auto due = start_ + std::chrono::duration_cast<Clock::duration>(
                                    std::chrono::duration<double>(plan_.arrivals[next_]));
      wait = std::min<Clock::duration>(wait, due - now);
    }
    return std::max(std::chrono::milliseconds(0), std::chrono::ceil<std::chrono::milliseconds>(wait));
  }

  void handle(const ServeEvent& e) {
    if (e.kind == EventKind::error) {
      abort_open();
      // Error events answer frames that start no request: one of ours was not understood.
      throw CommandFailed(fmt::format("the server answered with an error event: {}: {}", e.error_code,
                                      e.error_message));
    }
    if (e.kind == EventKind::status) return;
    const auto* id = e.id ? std::get_if<std::int64_t>(&*e.id) : nullptr;
    auto it = id ? open_.find(*id) : open_.end();
    if (it == open_.end()) {
      spdlog::warn("bench serve: a {} event for request {}, which is not open", to_string(e.kind),
                   e.id ? to_string(*e.id) : "(none)");
      return;
    }
    last_progress_ = e.received_at;
    RequestTimeline& t = timelines_[it->second];
    const double at = seconds(e.received_at - start_);
    if (e.kind == EventKind::token) {
      if (!e.tokens.empty()) t.token_events.emplace_back(at, static_cast<std::int64_t>(e.tokens.size()));
      return;
    }
    std::int64_t streamed = 0;
    for (const auto& [time, tokens] : t.token_events) streamed += tokens;
    t.output_tokens = e.usage ? e.usage->completion_tokens : streamed;
    if (e.usage) t.prompt_tokens = e.usage->prompt_tokens;
    t.ok = e.finish_reason == FinishReason::stop || e.finish_reason == FinishReason::length ||
           e.finish_reason == FinishReason::tool_calls;
    std::string why;
    if (e.finish_reason == FinishReason::abort) why = "abort";
    if (e.finish_reason == FinishReason::error) why = e.error_code.empty() ? "error" : e.error_code;
    t.error_message = e.error_message;
    open_.erase(it);
    finish(t, why, e.received_at);
  }

  void finish(RequestTimeline& t, std::string error, Clock::time_point at) {
    t.error = std::move(error);
    t.finished = seconds(at - start_);
    end_ = std::max(end_, at);
    ++done_;
  }

  // The server stopped answering: the open requests are aborted (it may yet be computing them)
  // and those not sent are not sent.
  void give_up() {
    const auto now = Clock::now();
    for (const auto& [id, index] : open_) {
      (void)client_.send_abort(id);
      finish(timelines_[index], "timeout", now);
    }
    open_.clear();
    for (; next_ < timelines_.size(); ++next_) {
      finish(timelines_[next_], "not sent (the server stopped answering)", now);
    }
  }

  void abort_open() {
    for (const auto& [id, index] : open_) (void)client_.send_abort(id);
  }

  ServeClient& client_;
  const ServeBenchOptions& o_;
  const Plan& plan_;
  std::vector<RequestTimeline> timelines_;
  std::unordered_map<std::int64_t, std::size_t> open_;  // request id -> index
  std::size_t next_ = 0;                                 // the next request to send
  std::size_t done_ = 0;
  Clock::time_point start_, end_, last_progress_;
};

}  // namespace

ServeRun run_serve_bench(ServeClient& client, const ServeBenchOptions& o) {
  if (o.warmup > 0) {
    // All at once within the concurrency limit, from a stream of the seed of their own, so the
    // timed requests are the same whatever the warmup.
    const Plan warmup = make_plan(o, o.warmup, o.seed + 0x5eed, std::numeric_limits<double>::infinity(), 0);
    const ServeRun run = PhaseRunner(client, o, warmup).run();
    for (const auto& r : run.requests) {
      if (!r.ok) throw CommandFailed("a warmup request failed (" + r.error + "): the server is not ready to measure");
    }
  }
  const Plan timed = make_plan(o, o.requests, o.seed, o.rate, static_cast<std::int64_t>(o.warmup));
  return PhaseRunner(client, o, timed).run();
}

// ---- reports --------------------------------------------------------------------------------

namespace {

std::string rate_text(double rate) { return std::isinf(rate) ? "inf" : fmt::format("{:g}", rate); }

std::string response_format_name(const model::ResponseFormat& f) {
  if (!f.constrained()) return "text";
  return f.kind == static_cast<std::uint8_t>(model::ResponseKind::json_object) ? "json_object" : "json_schema";
}

// OpenAI's form: {"id": bias}.
nlohmann::json logit_bias_json(const std::vector<model::TokenBias>& logit_bias) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& entry : logit_bias) out[std::to_string(entry.token)] = entry.bias;
  return out;
}

nlohmann::json distribution_json(const Distribution& d) {
  return {{"count", d.count}, {"mean", d.mean}, {"p50", d.p50}, {"p90", d.p90}, {"p99", d.p99}};
}

}  // namespace

std::string sampling_text(const ServeBenchOptions& o) {
  if (o.temperature == 0.0f) return "greedy (temperature 0)";
  std::string text = fmt::format("temperature {:g}, top_p {:g}", o.temperature, o.top_p);
  if (!o.logit_bias.empty()) text += fmt::format(", {} logit_bias", o.logit_bias.size());
  if (o.response_format.constrained()) text += ", " + response_format_name(o.response_format);
  return text;
}

std::string format_report(const ServeMetrics& m, const ServeBenchOptions& o) {
  std::string out = fmt::format("{:=^62}\n", " Serving benchmark ");
  auto line = [&](std::string_view what, const std::string& value) {
    out += fmt::format("{:<44}{:>18}\n", what, value);
  };
  line("Server:", o.server);
  line("Request rate (req/s):", rate_text(o.rate));
  line("Concurrency limit:", o.concurrency == 0 ? "none" : std::to_string(o.concurrency));
  line("Sampling:", sampling_text(o));
  line("Successful requests:", std::to_string(m.completed));
  line("Failed requests:", std::to_string(m.failed));
  for (const auto& [why, count] : m.failures) line(fmt::format("  {}:", why), std::to_string(count));
  line("Ended before max tokens (EOS or stop):", std::to_string(m.short_outputs));
  line("Duration (s):", fmt::format("{:.2f}", m.duration_s));
  line("Total input tokens:", std::to_string(m.input_tokens));
  line("Total output tokens:", std::to_string(m.output_tokens));
  line("Request throughput (req/s):", fmt::format("{:.2f}", m.request_throughput));
  line("Output token throughput (tok/s):", fmt::format("{:.2f}", m.output_throughput));
  line("Total token throughput (tok/s):", fmt::format("{:.2f}", m.total_token_throughput));
  out += fmt::format("{:-^62}\n", " latency (ms) ");
  out += fmt::format("{:<14}{:>12}{:>12}{:>12}{:>12}\n", "", "mean", "p50", "p90", "p99");
  for (auto [name, d] : {std::pair{"TTFT", &m.ttft_ms}, std::pair{"TPOT", &m.tpot_ms}, std::pair{"ITL", &m.itl_ms},
                         std::pair{"E2E latency", &m.e2el_ms}}) {
    out += fmt::format("{:<14}{:>12.2f}{:>12.2f}{:>12.2f}{:>12.2f}\n", name, d->mean, d->p50, d->p90, d->p99);
  }
  out += std::string(62, '=') + "\n";
  return out;
}

nlohmann::json report_json(const ServeMetrics& m, const ServeBenchOptions& o) {
  std::time_t now = std::time(nullptr);
  char date[32];
  std::strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  nlohmann::json config = {
      {"server", o.server},
      {"model", o.model},
      {"requests", o.requests},
      {"concurrency", o.concurrency},
      {"rate", std::isinf(o.rate) ? nlohmann::json("inf") : nlohmann::json(o.rate)},
      {"max_tokens", o.output_tokens},
      {"sampling", o.temperature == 0.0f ? "greedy" : "sampled"},
      {"temperature", o.temperature},
      {"top_p", o.top_p},
      {"logit_bias", logit_bias_json(o.logit_bias)},
      {"response_format", response_format_name(o.response_format)},
      {"seed", o.seed},
      {"warmup", o.warmup},
  };
  if (o.prompt.empty()) {
    config["prompt_tokens"] = o.prompt_tokens;
    config["prompt_repeats"] = o.prompt_repeats;
    config["vocab_size"] = o.vocab_size;
  } else {
    config["prompt"] = o.prompt;
  }
  return {
      {"date", date},
      {"config", config},
      {"completed", m.completed},
      {"failed", m.failed},
      {"failures", m.failures},
      {"short_outputs", m.short_outputs},
      {"duration_s", m.duration_s},
      {"total_input_tokens", m.input_tokens},
      {"total_output_tokens", m.output_tokens},
      {"request_throughput", m.request_throughput},
      {"output_throughput", m.output_throughput},
      {"total_token_throughput", m.total_token_throughput},
      {"ttft_ms", distribution_json(m.ttft_ms)},
      {"tpot_ms", distribution_json(m.tpot_ms)},
      {"itl_ms", distribution_json(m.itl_ms)},
      {"e2el_ms", distribution_json(m.e2el_ms)},
  };
}

// ---- the command ----------------------------------------------------------------------------

namespace {

// --response-format: "" none, json_object, or a file holding a JSON schema.
model::ResponseFormat read_response_format_flag(const std::string& flag) {
  if (flag.empty()) return {};
  if (flag == "json_object") return {static_cast<std::uint8_t>(model::ResponseKind::json_object), "", false};
  std::ifstream file(flag);
  std::stringstream text;
  text << file.rdbuf();
  if (!file) throw CommandFailed("--response-format: " + flag + " is not json_object and cannot be read as a schema file", 2);
  return {static_cast<std::uint8_t>(model::ResponseKind::json_schema), text.str(), true};
}

}  // namespace

void add_serve_bench(CLI::App& bench) {
  struct Options {
    ServeBenchOptions bench;
    std::int64_t timeout_ms = ServeBenchOptions{}.timeout.count();
    std::string json_path;
    std::string response_format;
    CurveClientFlags curve;
    std::int32_t draft_max = -1;
  };
  auto o = std::make_shared<Options>();
  auto& b = o->bench;
  auto* cmd = bench.add_subcommand(
      "serve", "requests/s, tokens/s, TTFT, TPOT, ITL and latency of a running `mqlm serve` (over its protocol)");
  cmd->add_option("--server", b.server, "the server's address")->capture_default_str();
  cmd->add_option("--model", b.model, "a model the server serves (default: its default)");
  cmd->add_option("--requests", b.requests, "requests to time")->capture_default_str();
  cmd->add_option("--concurrency", b.concurrency, "requests in flight at most (0: no limit)")->capture_default_str();
  cmd->add_option("--rate", b.rate, "requests per second, Poisson arrivals (inf: all at once)")->capture_default_str();
  cmd->add_option("--prompt-tokens", b.prompt_tokens, "prompt length: random token ids")->capture_default_str();
  cmd->add_option("--vocab-size", b.vocab_size, "the random ids are below this")->capture_default_str();
  cmd->add_option("--prompt-repeats", b.prompt_repeats,
                  "random ids: a random run this many times over (a text that repeats itself, where speculative "
                  "decoding's prompt lookup guesses)")
      ->capture_default_str()
      ->check(CLI::Range(std::size_t{1}, std::size_t{1} << 20));
  cmd->add_option("--prompt", b.prompt, "this text as every prompt instead of random ids");
  cmd->add_option("--output-tokens", b.output_tokens, "max_tokens of every request")->capture_default_str();
  cmd->add_option("--temperature", b.temperature, "0 is greedy (and top_p then changes nothing)")
      ->capture_default_str();
  cmd->add_option("--top-p", b.top_p, "1 is off")->capture_default_str();
  add_logit_bias_flag(*cmd, b.logit_bias);
  cmd->add_option("--response-format", o->response_format,
                  "json_object, or a file holding a JSON schema (json_schema, strict): constrained requests");
  cmd->add_option("--seed", b.seed, "the same seed, the same prompts and arrival times")->capture_default_str();
  cmd->add_option("--draft-max", o->draft_max,
                  "prompt-lookup drafts a step for every (greedy) request, 0 none (default: the server's --speculate)")
      ->check(CLI::Range(0, 32));
  cmd->add_option("--warmup", b.warmup, "requests run first and not counted")->capture_default_str();
  cmd->add_option("--timeout-ms", o->timeout_ms, "no event for this long stops the run")->capture_default_str();
  cmd->add_option("--json", o->json_path, "also write the results to this JSON file");
  add_curve_client_flags(*cmd, o->curve);
  cmd->callback([o] {
    ServeBenchOptions& b = o->bench;
    if (b.requests == 0) throw CommandFailed("--requests must be at least 1", 2);
    if (!(b.rate > 0)) throw CommandFailed("--rate must be above 0 (inf sends every request at once)", 2);
    if (b.prompt.empty() && b.prompt_tokens == 0) throw CommandFailed("--prompt-tokens must be at least 1", 2);
    if (b.vocab_size < 1) throw CommandFailed("--vocab-size must be at least 1", 2);
    if (o->timeout_ms < 1) throw CommandFailed("--timeout-ms must be at least 1", 2);
    model::SamplingParams sampling;
    sampling.max_tokens = b.output_tokens;
    sampling.temperature = b.temperature;
    sampling.top_p = b.top_p;
    sampling.logit_bias = b.logit_bias;
    b.response_format = read_response_format_flag(o->response_format);
    sampling.response_format = b.response_format;
    if (auto error = model::validate(sampling)) {
      std::string flag = error->field == "max_tokens" ? "--output-tokens"
                         : error->field.starts_with("logit_bias") ? "--logit-bias"
                         : error->field == "top_p" ? "--top-p"
                                                   : "--" + error->field;
      throw CommandFailed(flag + ": " + error->message, 2);
    }
    b.timeout = std::chrono::milliseconds(o->timeout_ms);
    if (o->draft_max >= 0) b.draft_max = o->draft_max;
    auto connected = ServeClient::connect(b.server, read_curve_client_flags(o->curve));
    if (auto* why = std::get_if<std::string>(&connected)) throw CommandFailed(*why, 2);
    auto& client = std::get<ServeClient>(connected);

    const ServeRun run = run_serve_bench(client, b);
    const ServeMetrics metrics = compute_metrics(run.requests, run.duration_s, b.output_tokens);
    std::cout << format_report(metrics, b) << std::flush;
    if (!o->json_path.empty()) {
      std::ofstream file(o->json_path);
      file << report_json(metrics, b).dump(2) << "\n";
      if (!file) throw CommandFailed("cannot write " + o->json_path);
    }
    if (metrics.failed > 0) {
      const auto first = std::find_if(run.requests.begin(), run.requests.end(), [](const auto& r) { return !r.ok; });
      throw CommandFailed(fmt::format("{} of {} requests failed; the first: {}{}", metrics.failed, b.requests,
                                      first->error, first->error_message.empty() ? "" : ": " + first->error_message));
    }
  });
}

}  // namespace mqlm::tools
