#include "actors/runtime/probe_actors.hpp"

#include <algorithm>
#include <random>

#include <spdlog/spdlog.h>
#include <xxhash.h>

#include "actors/runtime/mailbox.hpp"
#include "actors/runtime/node.hpp"

namespace mqlm::actors {

using namespace messages;

namespace {
constexpr std::uint32_t kRetryTimer = 1;
}

std::uint64_t hash_frames(const Frames& frames) {
  if (frames.empty()) return 0;
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  for (const auto& f : frames) XXH3_64bits_update(state, f.data(), f.size());
  std::uint64_t hash = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return hash;
}

void EchoActor::on_message(Context& ctx, Message& message) {
  const auto* ping = message.as<Ping>();
  if (ping == nullptr) return;
  ++pings_seen_;
  std::uint64_t bytes = 0;
  for (const auto& b : message.blobs) bytes += b.size();
  ctx.reply(message, Pong{ping->seq, ping->text, bytes, hash_frames(message.blobs), pings_seen_});
}

ProberActor::ProberActor(ProberConfig config) : config_(std::move(config)) {
  std::mt19937_64 rng(config_.seed);
  auto blob = std::make_shared<std::vector<std::byte>>(config_.blob_bytes);
  for (auto& b : *blob) b = static_cast<std::byte>(rng());
  blob_ = std::move(blob);
  Frames one;
  if (!blob_->empty()) one.push_back(shared_frame(blob_));
  blob_hash_ = hash_frames(one);
  rtts_ns_.reserve(config_.rounds);
}

void ProberActor::on_start(Context& ctx) {
  first_sent_ns_ = ctx.now_ns();
  send_pings(ctx);
}

void ProberActor::send_pings(Context& ctx) {
  while (next_seq_ <= config_.rounds && in_flight_.size() < config_.window) {
    SendOptions options;
    options.correlation_id = next_seq_;
    if (!blob_->empty()) options.blobs.push_back(shared_frame(blob_));
    SendStatus status = ctx.send(config_.target, Ping{next_seq_, "ping " + std::to_string(next_seq_)},
                                 std::move(options));
    if (status == SendStatus::full) {
      // The target's mailbox is full: try again shortly rather than queue without bound.
      ++rejected_;
      if (!retry_pending_) ctx.set_timer(kRetryTimer, std::chrono::milliseconds(1), false);
      retry_pending_ = true;
      return;
    }
    in_flight_[next_seq_++] = ctx.now_ns();
  }
}

void ProberActor::on_message(Context& ctx, Message& message) {
  if (const auto* timer = message.as<Timer>(); timer && timer->timer_id == kRetryTimer) {
    retry_pending_ = false;
    send_pings(ctx);
    return;
  }
  const auto* pong = message.as<Pong>();
  if (pong == nullptr) return;
  auto it = in_flight_.find(pong->seq);
  if (it == in_flight_.end() || pong->blob_bytes != blob_->size() || pong->blob_hash != blob_hash_ ||
      pong->text != "ping " + std::to_string(pong->seq)) {
    ++mismatches_;
  }
  if (it != in_flight_.end()) {
    rtts_ns_.push_back(ctx.now_ns() - it->second);
    in_flight_.erase(it);
  }
  send_pings(ctx);
  if (next_seq_ > config_.rounds && in_flight_.empty()) report(ctx);
}

void ProberActor::report(Context& ctx) {
  if (reported_) return;
  reported_ = true;
  ProbeReport r;
  r.target = config_.target;
  r.pongs = rtts_ns_.size();
  r.mismatches = mismatches_;
  r.rejected = rejected_;
  r.elapsed_ns = ctx.now_ns() - first_sent_ns_;
  std::vector<std::int64_t> sorted = rtts_ns_;
  std::sort(sorted.begin(), sorted.end());
  if (!sorted.empty()) {
    r.rtt_p50_ns = sorted[sorted.size() / 2];
    r.rtt_p99_ns = sorted[std::min(sorted.size() - 1, sorted.size() * 99 / 100)];
    r.rtt_max_ns = sorted.back();
  }
  spdlog::info("prober: {} pings to {}, {} pongs, {} mismatched, {} refused by a full mailbox; "
               "round trip p50 {:.1f} us, p99 {:.1f} us",
               config_.rounds, r.target, r.pongs, r.mismatches, r.rejected, r.rtt_p50_ns / 1e3, r.rtt_p99_ns / 1e3);
  if (!config_.report_to.empty()) ctx.send(config_.report_to, r);
}

}  // namespace mqlm::actors

namespace mqlm::actors {

std::optional<messages::ProbeReport> run_probe(ProbeRun run) {
  run.prober.target = "echo";
  if (run.prober.report_to.empty()) run.prober.report_to = "client";
  NodeConfig config;
  if (run.curve_links && run.transport == Transport::tcp) config.topology.link_keys = curve::generate();
  for (const auto& name : {std::string("echo"), std::string("prober"), run.prober.report_to}) {
    config.topology.add(name, make_endpoint(run.transport, name));
    if (config.topology.link_keys) config.topology.inbox_keys[name] = config.topology.link_keys->public_key;
  }
  config.topology.trace_blobs = run.trace_blobs;
  config.trace_file = run.trace_file;
  config.actors.push_back({"echo", [] { return std::make_unique<EchoActor>(); }, {}});
  config.actors.push_back({"prober", [prober = run.prober] { return std::make_unique<ProberActor>(prober); }, {}});
  Node node(std::move(config));
  Mailbox client(node.context(), node.topology(), run.prober.report_to);
  node.start();
  auto deadline = std::chrono::steady_clock::now() + run.timeout;
  std::optional<messages::ProbeReport> report;
  while (!report && std::chrono::steady_clock::now() < deadline) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    auto message = client.receive(left);
    if (message && message->as<messages::ProbeReport>()) report = *message->as<messages::ProbeReport>();
  }
  node.stop();
  return report;
}

}  // namespace mqlm::actors
