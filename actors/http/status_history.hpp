// The status page's plots: the http actor asks the scheduler (and the enforcer) for their status
// on a timer of its own, as its handler threads do, and keeps the answers as a ring of samples;
// /api/status?history=1 shows them. Rates come from the difference of the scheduler's counters
// between two samples, so they count every front end's requests, the ZeroMQ gateway's too.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <vector>

#include <msgpack.hpp>
#include <nlohmann/json.hpp>

#include "messages/models.hpp"
#include "messages/serving.hpp"

namespace mqlm::actors::http_status {

struct StatusSample {
  double uptime_s = 0.0;            // when taken, in the http actor's uptime
  double generated_per_s = 0.0;     // tokens sampled since the sample before, per second
  double prompt_per_s = 0.0;        // tokens run through the model that were no generated token fed back
  std::uint32_t running = 0;
  std::uint32_t waiting = 0;
  std::uint64_t pool_active_bytes = 0;
  std::uint64_t pool_held_bytes = 0;    // from the driver, by the executor's buffer pool
  std::uint64_t device_usage_bytes = 0; // the driver's figure for the process (0: not reported)
  std::uint64_t host_rss_bytes = 0;     // the executor's resident set (0: not reported)
  MSGPACK_DEFINE(uptime_s, generated_per_s, prompt_per_s, running, waiting, pool_active_bytes, pool_held_bytes,
                 device_usage_bytes, host_rss_bytes);
};

class StatusHistory {
 public:
  static constexpr std::size_t kDefaultCapacity = 360;  // an hour at the default 10 s

  explicit StatusHistory(std::size_t capacity = kDefaultCapacity) : capacity_(capacity) {}

  // memory: the enforcer's report, when the server has one and it answered.
  void add(const messages::StatusReport& report, const messages::ModelsReport* memory, std::int64_t uptime_ns);
  // Oldest first.
  std::vector<StatusSample> samples() const { return {ring_.begin(), ring_.end()}; }
  std::size_t capacity() const { return capacity_; }

 private:
  struct Counters {
    std::int64_t uptime_ns = 0;
    std::uint64_t generated = 0;
    std::uint64_t computed = 0;
  };

  std::size_t capacity_;
  std::deque<StatusSample> ring_;
  std::optional<Counters> last_;
};

// {"interval_seconds", "capacity", "samples": [{"t": seconds before now, ...}]}: t is negative
// (or 0), measured from now_uptime_s, so that a page needs no clock of the server's.
nlohmann::json history_json(const std::vector<StatusSample>& samples, double interval_s, std::size_t capacity,
                            double now_uptime_s);

}  // namespace mqlm::actors::http_status
