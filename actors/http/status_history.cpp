#include "actors/http/status_history.hpp"

#include <algorithm>

namespace mqlm::actors::http_status {

namespace {

constexpr double kNsPerSecond = 1e9;

// A counter's growth per second; 0 when it went back (the scheduler restarted) or no time passed.
double rate(std::uint64_t now, std::uint64_t before, double seconds) {
  if (now < before || seconds <= 0.0) return 0.0;
  return static_cast<double>(now - before) / seconds;
}

}  // namespace

void StatusHistory::add(const messages::StatusReport& report, const messages::ModelsReport* memory,
                        std::int64_t uptime_ns) {
  StatusSample sample;
  sample.uptime_s = static_cast<double>(uptime_ns) / kNsPerSecond;
  // Each generated token but a request's last is fed back through the model once: what was
  // computed beyond those is prompt (prefill, and recompute after a preemption), but for the drafts
  // that were computed and not kept (speculative decoding).
  const std::uint64_t rejected =
      report.drafted_tokens > report.accepted_tokens ? report.drafted_tokens - report.accepted_tokens : 0;
  const std::uint64_t computed = report.computed_tokens - std::min(rejected, report.computed_tokens);
  const std::uint64_t prompt = computed > report.generated_tokens ? computed - report.generated_tokens : 0;
  if (last_) {
    const double seconds = static_cast<double>(uptime_ns - last_->uptime_ns) / kNsPerSecond;
    const std::uint64_t prompt_before = last_->computed > last_->generated ? last_->computed - last_->generated : 0;
    sample.generated_per_s = rate(report.generated_tokens, last_->generated, seconds);
    sample.prompt_per_s = rate(prompt, prompt_before, seconds);
  }
  last_ = Counters{uptime_ns, report.generated_tokens, computed};
  sample.running = report.running;
  sample.waiting = report.waiting;
  sample.pool_active_bytes = report.pool.active_bytes;
  sample.pool_held_bytes = report.pool.held_bytes;
  if (memory != nullptr) {
    sample.device_usage_bytes = memory->device.usage_bytes;
    sample.host_rss_bytes = memory->device.process_rss_bytes;
  }
  ring_.push_back(sample);
  while (ring_.size() > capacity_) ring_.pop_front();
}

nlohmann::json history_json(const std::vector<StatusSample>& samples, double interval_s, std::size_t capacity,
                            double now_uptime_s) {
  nlohmann::json out = nlohmann::json::array();
  for (const StatusSample& s : samples) {
    out.push_back({{"t", s.uptime_s - now_uptime_s},
                   {"generated_tokens_per_s", s.generated_per_s},
                   {"prompt_tokens_per_s", s.prompt_per_s},
                   {"running", s.running},
                   {"waiting", s.waiting},
                   {"pool_active_bytes", s.pool_active_bytes},
                   {"pool_held_bytes", s.pool_held_bytes},
                   {"device_usage_bytes", s.device_usage_bytes},
                   {"host_rss_bytes", s.host_rss_bytes}});
  }
  return {{"interval_seconds", interval_s}, {"capacity", capacity}, {"samples", std::move(out)}};
}

}  // namespace mqlm::actors::http_status
