#include "actors/runtime/actor_thread.hpp"

#include <map>

#include <spdlog/spdlog.h>
#include <zmq_addon.hpp>

#include "actors/runtime/links.hpp"
#include "actors/runtime/trace.hpp"

namespace mqlm::actors {

using namespace messages;

namespace {

constexpr int kMaxMessagesPerWake = 64;  // then timers and deferred sends get their turn
constexpr auto kStopFlushTime = std::chrono::seconds(2);

struct TimerState {
  std::chrono::milliseconds interval{};
  std::int64_t due_ns = 0;
  bool repeat = false;
  std::uint64_t fire_count = 0;
};

// The loop itself, and the Context its handlers see. Lives on the actor's thread only.
class ActorLoop final : public Context {
 public:
  ActorLoop(zmq::context_t& context, const Topology& topology, std::string name, Actor& actor,
            zmq::socket_t& inbox)
      : context_(context),
        topology_(topology),
        name_(std::move(name)),
        actor_(actor),
        inbox_(inbox),
        outbox_(context, topology),
        dispatcher_(name_, actor) {}

  void open() {
    if (!topology_.trace_endpoint.empty()) {
      tap_.emplace(context_, topology_.trace_endpoint, topology_.trace_blobs);
    }
    now_ns_ = monotonic_ns();
    // A record without frames marks the start, so replay runs on_start at the same "now".
    if (tap_) tap_->record(Direction::in, name_, now_ns_, Frames{});
    actor_.on_start(*this);
  }

  // Runs until Stop has been handled; exceptions from handlers propagate (the actor dies).
  void run() {
    while (true) {
      std::vector<zmq::pollitem_t> items{{inbox_.handle(), 0, ZMQ_POLLIN, 0}};
      for (auto& [id, socket] : watched_) items.push_back(zmq::pollitem_t{socket.handle(), 0, ZMQ_POLLIN, 0});
      const std::size_t first_pending = items.size();
      auto pending = outbox_.pending_poll_items();
      items.insert(items.end(), pending.begin(), pending.end());
      zmq::poll(items.data(), items.size(), poll_timeout());
      if (items.size() > first_pending) outbox_.flush();
      fire_due_timers();
      std::size_t index = 1;
      std::vector<std::uint32_t> readable;
      for (const auto& [id, socket] : watched_) {
        if ((items[index++].revents & ZMQ_POLLIN) != 0) readable.push_back(id);
      }
      for (std::uint32_t id : readable) {
        if (!watched_.contains(id)) continue;  // unwatched by an earlier handler
        now_ns_ = monotonic_ns();
        actor_.on_readable(*this, id);
      }
      if ((items[0].revents & ZMQ_POLLIN) != 0 && drain_inbox()) return;
    }
  }

  void finish_stop() {
    drain_after_stop();
    // on_stop keeps the time of the last message handled, as replay does.
    actor_.on_stop(*this);
    reply(dispatcher_.stop_message(), StopAck{dispatcher_.stats().handled});
    auto deadline = std::chrono::steady_clock::now() + kStopFlushTime;
    while (outbox_.flush() > 0 && std::chrono::steady_clock::now() < deadline) {
      auto items = outbox_.pending_poll_items();
      zmq::poll(items.data(), items.size(), std::chrono::milliseconds(50));
    }
    if (outbox_.waiting() > 0) {
      spdlog::warn("{}: stopped with {} deferred messages undelivered", name_, outbox_.waiting());
    }
  }

  ActorExit exit_info(bool clean, std::string reason) const {
    return ActorExit{clean, std::move(reason), dispatcher_.stats(), outbox_.counters()};
  }

  // Context
  const std::string& self() const override { return name_; }
  std::int64_t now_ns() const override { return now_ns_; }
  void set_timer(std::uint32_t timer_id, std::chrono::milliseconds interval, bool repeat) override {
    auto& timer = timers_[timer_id];
    timer.interval = std::max(interval, std::chrono::milliseconds(1));
    timer.repeat = repeat;
    timer.due_ns = monotonic_ns() + std::chrono::nanoseconds(timer.interval).count();
  }
  void cancel_timer(std::uint32_t timer_id) override { timers_.erase(timer_id); }
  zmq::context_t* zmq_context() override { return &context_; }
  void watch(zmq::socket_ref socket, std::uint32_t id) override { watched_[id] = socket; }
  void unwatch(std::uint32_t id) override { watched_.erase(id); }

 protected:
  SendStatus deliver(const std::string& to, Frames frames, WhenFull when_full) override {
    if (!tap_) return outbox_.send(to, std::move(frames), when_full);
    // The record is made before the frames are handed over, and carries the outcome.
    auto record_frames = copy(frames);
    SendStatus status = outbox_.send(to, std::move(frames), when_full);
    tap_->record(Direction::out, name_, now_ns_, record_frames, static_cast<std::uint8_t>(status));
    return status;
  }

 private:
  static Frames copy(const Frames& frames) {
    Frames out;
    for (const auto& f : frames) out.emplace_back(f.data(), f.size());
    return out;
  }

  std::chrono::milliseconds poll_timeout() const {
    if (timers_.empty()) return std::chrono::milliseconds(-1);
    std::int64_t next = INT64_MAX;
    for (const auto& [id, t] : timers_) next = std::min(next, t.due_ns);
    std::int64_t wait_ns = std::max<std::int64_t>(0, next - monotonic_ns());
    return std::chrono::milliseconds((wait_ns + 999'999) / 1'000'000);
  }

  // A due timer becomes a Timer message from this actor to itself, handled like any other.
  void fire_due_timers() {
    std::int64_t now = monotonic_ns();
    std::vector<std::uint32_t> due;
    for (const auto& [id, t] : timers_) {
      if (t.due_ns <= now) due.push_back(id);
    }
    for (std::uint32_t id : due) {
      auto it = timers_.find(id);
      if (it == timers_.end()) continue;  // cancelled by an earlier timer's handler
      TimerState& t = it->second;
      Timer payload{id, ++t.fire_count};
      if (t.repeat) {
        t.due_ns = now + std::chrono::nanoseconds(t.interval).count();
      } else {
        timers_.erase(it);
      }
      handle(make_frames(name_, name_, payload));
    }
  }

  // Stop arrived through one sender's pipe; other senders' messages queued before it may still
  // wait in theirs (the inbox takes from its pipes in turn). Everything already queued is
  // handled before on_stop, up to what the mailbox and its senders' queues can hold.
  void drain_after_stop() {
    const std::size_t bound = 4 * static_cast<std::size_t>(topology_.mailbox_capacity) + 1024;
    for (std::size_t i = 0; i < bound; ++i) {
      Frames frames;
      if (!zmq::recv_multipart(inbox_, std::back_inserter(frames), zmq::recv_flags::dontwait)) return;
      handle(std::move(frames));
    }
  }

  // Returns true when Stop was taken. After each message the socket takes in the senders whose
  // pipes came alive meanwhile (ZMQ_EVENTS processes its commands): a non-blocking receive that
  // finds a message does not, so while one sender always has the next message waiting (the
  // scheduler's next plan, for an executor), the others (the supervisor's heartbeats, Stop) went
  // unread for up to kMaxMessagesPerWake messages: 60-90 s of lavapipe steps.
  bool drain_inbox() {
    for (int i = 0; i < kMaxMessagesPerWake; ++i) {
      Frames frames;
      if (!zmq::recv_multipart(inbox_, std::back_inserter(frames), zmq::recv_flags::dontwait)) {
        return false;
      }
      if (handle(std::move(frames))) return true;
      (void)inbox_.get(zmq::sockopt::events);
    }
    return false;
  }

  bool handle(Frames frames) {
    now_ns_ = monotonic_ns();
    if (tap_) tap_->record(Direction::in, name_, now_ns_, frames);
    return dispatcher_.dispatch(*this, std::move(frames)) == Dispatcher::Outcome::stop;
  }

  zmq::context_t& context_;
  const Topology& topology_;
  std::string name_;
  Actor& actor_;
  zmq::socket_t& inbox_;  // the ActorThread's: it outlives this loop, so a restart keeps the mailbox
  Outbox outbox_;
  Dispatcher dispatcher_;
  std::optional<TraceTap> tap_;
  std::map<std::uint32_t, TimerState> timers_;
  std::map<std::uint32_t, zmq::socket_ref> watched_;
  std::int64_t now_ns_ = 0;
};

}  // namespace

ActorThread::ActorThread(zmq::context_t& context, std::shared_ptr<const Topology> topology, std::string name,
                         std::unique_ptr<Actor> actor, std::string report_to)
    : context_(context),
      topology_(std::move(topology)),
      name_(std::move(name)),
      actor_(std::move(actor)),
      report_to_(std::move(report_to)) {}

ActorThread::~ActorThread() {
  if (thread_.joinable()) {
    if (!finished()) stop();
    if (finished()) join();
    else thread_.detach();  // stop() already said in the log that it did not finish
  }
}

void ActorThread::start() {
  if (thread_.joinable()) throw std::logic_error("actor " + name_ + " started twice");
  if (!inbox_) {
    inbox_ = zmq::socket_t(context_, zmq::socket_type::pull);
    inbox_.set(zmq::sockopt::rcvhwm, topology_->mailbox_capacity);
    inbox_.set(zmq::sockopt::linger, 0);
    bind_inbox(inbox_, *topology_, name_);
  }
  joined_ = false;
  std::promise<void> ready;
  auto ready_future = ready.get_future();
  std::promise<ActorExit> exit;
  exit_ = exit.get_future().share();
  thread_ = std::thread([this, ready = std::move(ready), exit = std::move(exit)]() mutable {
    ActorLoop loop(context_, *topology_, name_, *actor_, inbox_);
    try {
      loop.open();
    } catch (...) {
      ready.set_exception(std::current_exception());
      exit.set_value(loop.exit_info(false, "failed to start"));
      return;
    }
    ready.set_value();
    try {
      loop.run();
      loop.finish_stop();
      exit.set_value(loop.exit_info(true, "stopped"));
    } catch (const std::exception& e) {
      spdlog::error("actor {} died: {}", name_, e.what());
      if (!report_to_.empty()) loop.send(report_to_, ActorExited{name_, e.what()});
      exit.set_value(loop.exit_info(false, e.what()));
    } catch (...) {
      spdlog::error("actor {} died: an exception that is not a std::exception", name_);
      if (!report_to_.empty()) loop.send(report_to_, ActorExited{name_, "unknown exception"});
      exit.set_value(loop.exit_info(false, "unknown exception"));
    }
  });
  try {
    ready_future.get();
  } catch (...) {
    thread_.join();
    joined_ = true;
    throw;
  }
}

bool ActorThread::finished() const {
  return exit_.valid() && exit_.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
}

bool ActorThread::stop(std::chrono::milliseconds timeout, const std::string& from) {
  if (!thread_.joinable() || joined_) return true;
  if (!finished()) {
    zmq::socket_t control(context_, zmq::socket_type::push);
    control.set(zmq::sockopt::linger, 0);
    control.set(zmq::sockopt::sndtimeo, static_cast<int>(timeout.count()));
    connect_to_inbox(control, *topology_, name_);
    auto frames = make_frames(from, name_, Stop{"stop requested"});
    // Stop waits for room: it must arrive after everything already queued.
    if (!zmq::send_multipart(control, frames)) {
      spdlog::error("actor {}: mailbox stayed full for {} ms; Stop not delivered", name_, timeout.count());
      return false;
    }
    if (exit_.wait_for(timeout) != std::future_status::ready) {
      spdlog::error("actor {} did not finish within {} ms of Stop", name_, timeout.count());
      return false;
    }
  }
  join();
  return true;
}

void ActorThread::restart(std::unique_ptr<Actor> actor) {
  if (!finished()) throw std::logic_error("actor " + name_ + " restarted while its thread runs");
  join();
  thread_ = std::thread();
  actor_ = std::move(actor);
  start();
}

ActorExit ActorThread::join() {
  if (!joined_ && thread_.joinable()) {
    thread_.join();
    joined_ = true;
  }
  return exit_.get();
}

}  // namespace mqlm::actors
