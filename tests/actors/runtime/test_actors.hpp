// Actors and helpers the runtime tests share.
#pragma once

#include <gtest/gtest.h>

#include <future>
#include <memory>
#include <string>
#include <vector>

#include <zmq.hpp>

#include "actors/runtime/actor_thread.hpp"
#include "actors/runtime/mailbox.hpp"
#include "child_process.hpp"

namespace mqlm::actors::testing {

// A gate the test opens; an actor waiting on it is "slow" until then. The only state a test
// shares with an actor, and only to make slowness deterministic.
struct Gate {
  std::promise<void> promise;
  std::shared_future<void> future = promise.get_future().share();
  bool opened = false;
  void open() {
    if (!opened) promise.set_value();
    opened = true;
  }
  ~Gate() { open(); }  // a failed assertion must not leave an actor blocked forever
};

// Tells `observer` about every message it handles, as Pong{seq, kind name, .., count}; waits on
// the gate before its first message; throws on Ping "die"; says "stopped" from on_stop.
class ReportingActor final : public Actor {
 public:
  explicit ReportingActor(std::string observer, std::shared_future<void> gate = {})
      : observer_(std::move(observer)), gate_(std::move(gate)) {}

  void on_message(Context& ctx, messages::Message& message) override {
    if (gate_.valid()) gate_.wait();
    std::uint64_t seq = 0;
    if (const auto* ping = message.as<messages::Ping>()) {
      if (ping->text == "die") throw std::runtime_error("poisoned by the test");
      seq = ping->seq;
    } else if (const auto* pong = message.as<messages::Pong>()) {
      seq = pong->seq;
    }
    ctx.send(observer_, messages::Pong{seq, std::string(messages::kind_name(message.kind())), 0, 0, ++handled_});
  }
  void on_stop(Context& ctx) override { ctx.send(observer_, messages::Pong{0, "stopped", 0, 0, handled_}); }

 private:
  std::string observer_;
  std::shared_future<void> gate_;
  std::uint64_t handled_ = 0;
};

// A context and a topology for a test; participants are added before freeze().
struct World {
  zmq::context_t context;
  Topology topology;
  std::shared_ptr<const Topology> frozen;

  std::shared_ptr<const Topology> freeze() {
    frozen = std::make_shared<const Topology>(topology);
    return frozen;
  }
};

// Receives until the predicate holds or the time is up; returns all received.
template <typename Done>
std::vector<messages::Message> receive_until(Mailbox& mailbox, Done done,
                                             std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  std::vector<messages::Message> got;
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!done(got) && std::chrono::steady_clock::now() < deadline) {
    auto m = mailbox.receive(std::chrono::milliseconds(50));
    if (m) got.push_back(std::move(*m));
  }
  return got;
}

// A prober in `node` (an `mqlm node` child) pings `echo`, running here, `rounds` times and
// reports to `tester`: every ping answered and unchanged, and the echo handled each, then Stop.
inline void expect_probe_conversation(ChildProcess& node, Mailbox& tester, ActorThread& echo, std::uint64_t rounds) {
  EXPECT_EQ(node.read_line(), "ready");
  auto report = tester.receive(std::chrono::seconds(30));
  ASSERT_TRUE(report.has_value());
  ASSERT_NE(report->as<messages::ProbeReport>(), nullptr);
  EXPECT_EQ(report->as<messages::ProbeReport>()->pongs, rounds);
  EXPECT_EQ(report->as<messages::ProbeReport>()->mismatches, 0u);
  EXPECT_EQ(node.terminate(), 0);
  EXPECT_TRUE(echo.stop());
  EXPECT_EQ(echo.join().stats.handled, rounds + 1u);
}

}  // namespace mqlm::actors::testing
