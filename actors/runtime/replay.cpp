#include "actors/runtime/replay.hpp"

#include <sstream>

namespace mqlm::actors {

using namespace messages;

namespace {

constexpr std::size_t kMaxDifferencesShown = 10;

// Captures sends instead of delivering them; answers each with the status the recorded
// instance got for its send at the same position, so status-dependent code replays the same.
class ReplayContext final : public Context {
 public:
  ReplayContext(std::string name, std::vector<const TraceRecord*> recorded_sends, bool keep_blobs)
      : name_(std::move(name)), recorded_(std::move(recorded_sends)), keep_blobs_(keep_blobs) {}

  const std::string& self() const override { return name_; }
  std::int64_t now_ns() const override { return now_ns_; }
  void set_timer(std::uint32_t, std::chrono::milliseconds, bool) override {}  // timers are in the trace
  void cancel_timer(std::uint32_t) override {}

  void set_now(std::int64_t now) { now_ns_ = now; }
  std::vector<TraceRecord>& sends() { return sends_; }

 protected:
  SendStatus deliver(const std::string&, Frames frames, WhenFull) override {
    std::size_t index = sends_.size();
    auto status = index < recorded_.size() ? static_cast<SendStatus>(recorded_[index]->status) : SendStatus::sent;
    sends_.push_back(make_trace_record(Direction::out, name_, now_ns_, frames, keep_blobs_,
                                       static_cast<std::uint8_t>(status)));
    return status;
  }

 private:
  std::string name_;
  std::vector<const TraceRecord*> recorded_;
  bool keep_blobs_;
  std::vector<TraceRecord> sends_;
  std::int64_t now_ns_ = 0;
};

// The envelope with its timestamp zeroed, so two sends compare on what the actor decided.
std::string comparable(const TraceRecord& record) {
  std::ostringstream key;
  if (record.frames.empty()) return {};
  auto envelope = decode_envelope(std::span<const std::byte>(
      reinterpret_cast<const std::byte*>(record.frames[0].data()), record.frames[0].size()));
  if (auto* e = std::get_if<Envelope>(&envelope)) {
    key << int(e->kind) << '|' << e->from << '|' << e->to << '|' << e->correlation_id << '|' << e->request_id;
  } else {
    key << record.frames[0];
  }
  for (std::size_t i = 1; i < record.frames.size(); ++i) key << '|' << record.frames[i].size() << ':' << record.frames[i];
  for (auto size : record.blob_sizes) key << '|' << size;
  return key.str();
}

}  // namespace

std::string describe_record(const TraceRecord& record) {
  std::ostringstream out;
  auto decoded = decode(record.to_frames());
  if (auto* m = std::get_if<Message>(&decoded)) {
    out << kind_name(m->kind()) << (record.dir() == Direction::in ? " from " : " to ") << record.peer;
    if (m->envelope.correlation_id) out << " corr=" << m->envelope.correlation_id;
    if (m->envelope.request_id) out << " req=" << m->envelope.request_id;
    out << ' ' << payload_to_text(m->payload);
    if (!m->blobs.empty()) {
      out << " blobs=[";
      for (std::size_t i = 0; i < m->blobs.size(); ++i) out << (i ? "," : "") << m->blobs[i].size();
      out << "]";
    }
  } else {
    out << "undecodable (" << std::get<DecodeError>(decoded).detail << ")";
  }
  return out.str();
}

ReplayReport replay_actor(const std::vector<TraceRecord>& trace, const std::string& actor_name, Actor& actor) {
  std::vector<const TraceRecord*> inbox;
  std::vector<const TraceRecord*> recorded;
  bool keep_blobs = true;
  for (const auto& r : trace) {
    if (r.actor != actor_name) continue;
    (r.dir() == Direction::in ? inbox : recorded).push_back(&r);
    if (r.blobs_left_out) keep_blobs = false;
  }
  ReplayReport report;
  report.inbox_messages = inbox.size();
  report.recorded_sends = recorded.size();

  ReplayContext ctx(actor_name, recorded, keep_blobs);
  Dispatcher dispatcher(actor_name, actor);
  // The start marker (a record without frames) gives on_start its time.
  std::size_t first = 0;
  if (!inbox.empty() && inbox.front()->frames.empty()) ctx.set_now(inbox[first++]->at_ns);
  actor.on_start(ctx);
  bool stopping = false;
  for (std::size_t i = first; i < inbox.size(); ++i) {
    ctx.set_now(inbox[i]->at_ns);
    if (dispatcher.dispatch(ctx, inbox[i]->to_frames()) == Dispatcher::Outcome::stop) stopping = true;
  }
  if (stopping) {
    actor.on_stop(ctx);
    ctx.reply(dispatcher.stop_message(), StopAck{dispatcher.stats().handled});
  }

  const auto& replayed = ctx.sends();
  report.replayed_sends = replayed.size();
  std::size_t n = std::max(recorded.size(), replayed.size());
  for (std::size_t i = 0; i < n; ++i) {
    bool have_recorded = i < recorded.size();
    bool have_replayed = i < replayed.size();
    if (have_recorded && have_replayed && comparable(*recorded[i]) == comparable(replayed[i])) continue;
    ++report.difference_count;
    if (report.differences.size() >= kMaxDifferencesShown) continue;
    std::ostringstream d;
    d << "send #" << (i + 1) << ": recorded " << (have_recorded ? describe_record(*recorded[i]) : "nothing")
      << "\n          replayed " << (have_replayed ? describe_record(replayed[i]) : "nothing");
    report.differences.push_back(d.str());
  }
  return report;
}

}  // namespace mqlm::actors
