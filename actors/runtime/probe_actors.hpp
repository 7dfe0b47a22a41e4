// The runtime's own actors for checking a deployment end to end: echo answers every Ping with
// a Pong that says what arrived; prober sends pings to a target, checks the pongs, measures
// round trips and reports. The demo, the runtime benchmark and the tests use them.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "actors/runtime/actor.hpp"
#include "actors/runtime/topology.hpp"

namespace mqlm::actors {

class EchoActor final : public Actor {
 public:
  void on_message(Context& ctx, messages::Message& message) override;

 private:
  std::uint64_t pings_seen_ = 0;
};

struct ProberConfig {
  std::string target = "echo";
  std::string report_to;          // who gets the ProbeReport
  std::uint64_t rounds = 10;      // pings in all
  std::uint64_t window = 1;       // pings in flight at once
  std::uint64_t blob_bytes = 0;   // a blob frame of this size rides with every ping
  std::uint64_t seed = 1;         // what fills the blobs
};

class ProberActor final : public Actor {
 public:
  explicit ProberActor(ProberConfig config);
  void on_start(Context& ctx) override;
  void on_message(Context& ctx, messages::Message& message) override;

 private:
  void send_pings(Context& ctx);
  void report(Context& ctx);

  ProberConfig config_;
  std::shared_ptr<const std::vector<std::byte>> blob_;  // sent without copying
  std::uint64_t blob_hash_ = 0;
  std::uint64_t next_seq_ = 1;
  std::map<std::uint64_t, std::int64_t> in_flight_;  // seq -> sent at
  std::vector<std::int64_t> rtts_ns_;
  std::int64_t first_sent_ns_ = 0;
  std::uint64_t mismatches_ = 0;
  std::uint64_t rejected_ = 0;
  bool retry_pending_ = false;
  bool reported_ = false;
};

struct ProbeRun {
  Transport transport = Transport::inproc;
  ProberConfig prober;  // target is "echo"; report_to names the mailbox that waits for the report
  std::filesystem::path trace_file;  // empty: no trace
  bool trace_blobs = true;
  std::chrono::milliseconds timeout{60000};
  bool curve_links = false;  // over tcp://: CURVE links (links.hpp), with a key pair made for the run
};

// Runs an echo and a prober in one node over the transport, waits for the prober's report and
// stops the node; nothing if no report came in time.
std::optional<messages::ProbeReport> run_probe(ProbeRun run);

// xxh3-64 over the frames' bytes in order; 0 for none.
std::uint64_t hash_frames(const messages::Frames& frames);

}  // namespace mqlm::actors
