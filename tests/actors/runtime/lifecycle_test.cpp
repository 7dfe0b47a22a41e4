// Actor lifecycle: start returns when ready, Stop drains what was queued before it, timers are
// messages through the actor's own loop.
#include <gtest/gtest.h>

#include <thread>

#include "test_actors.hpp"

namespace mqlm::actors {
namespace {

using namespace messages;
using testing::Gate;
using testing::ReportingActor;
using testing::World;

TEST(LifecycleTest, StopDrainsAFullMailboxInOrder) {
  World world;
  world.topology.mailbox_capacity = 50;
  world.topology.send_capacity = 50;
  world.topology.add("slow");
  world.topology.add("tester");
  // The tester's own inbox must hold every report.
  auto topology = world.freeze();
  Gate gate;
  Mailbox tester(world.context, topology, "tester");
  ActorThread slow(world.context, topology, "slow", std::make_unique<ReportingActor>("tester", gate.future));
  slow.start();

  std::uint64_t queued = 0;
  while (tester.send("slow", Ping{queued + 1, "q"}) == SendStatus::sent) ++queued;
  ASSERT_GT(queued, 50u);  // the mailbox is full now

  // Stop waits for room behind the queued messages; the actor is blocked until the gate opens.
  auto stopped = std::async(std::launch::async, [&] { return slow.stop(std::chrono::seconds(20)); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(stopped.wait_for(std::chrono::seconds(0)), std::future_status::timeout);
  gate.open();

  std::vector<Message> got;
  while (got.size() < queued + 1) {
    auto m = tester.receive(std::chrono::seconds(10));
    ASSERT_TRUE(m.has_value()) << "after " << got.size() << " of " << queued + 1;
    got.push_back(std::move(*m));
  }
  ASSERT_TRUE(stopped.get());
  for (std::uint64_t i = 0; i < queued; ++i) {
    EXPECT_EQ(got[i].as<Pong>()->text, "Ping");
    EXPECT_EQ(got[i].as<Pong>()->seq, i + 1);
  }
  EXPECT_EQ(got[queued].as<Pong>()->text, "stopped");  // on_stop ran after every queued message
  EXPECT_EQ(got[queued].as<Pong>()->pings_seen, queued);
  ActorExit exit = slow.join();
  EXPECT_TRUE(exit.clean);
  EXPECT_EQ(exit.stats.handled, queued + 1);  // the Stop itself included
}

// A sender whose next message is always waiting must not starve the others: a message from a
// second sender, sent while the actor works through the first one's queue, is handled within a
// few messages, not after the actor's whole batch (kMaxMessagesPerWake, 64). The executor with the
// scheduler a step ahead is such an actor; its heartbeats went unanswered for a minute on lavapipe.
TEST(LifecycleTest, ASenderAlwaysWaitingDoesNotStarveTheOthers) {
  World world;
  world.topology.mailbox_capacity = 1000;
  world.topology.send_capacity = 1000;
  for (const char* name : {"slow", "busy", "other", "tester"}) world.topology.add(name);
  auto topology = world.freeze();
  Gate gate;
  Mailbox tester(world.context, topology, "tester");
  Mailbox busy(world.context, topology, "busy");
  Mailbox other(world.context, topology, "other");
  ActorThread slow(world.context, topology, "slow", std::make_unique<ReportingActor>("tester", gate.future));
  slow.start();

  constexpr std::uint64_t kBusy = 200;
  for (std::uint64_t i = 1; i <= kBusy; ++i) ASSERT_EQ(busy.send("slow", Ping{i, "busy"}), SendStatus::sent);
  // The actor holds the first of them at the gate, inside its batch; then the other sender's comes.
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_EQ(other.send("slow", Ping{1000, "other"}), SendStatus::sent);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  gate.open();

  auto got = testing::receive_until(tester, [&](const std::vector<Message>& m) { return m.size() == kBusy + 1; });
  ASSERT_EQ(got.size(), kBusy + 1);
  std::size_t at = got.size();
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (got[i].as<Pong>()->seq == 1000) at = i;
  }
  EXPECT_LE(at, 3u) << "the other sender's message was handled after " << at << " of the busy one's";
  EXPECT_TRUE(slow.stop(std::chrono::seconds(10)));
}

// Sets a repeating timer at start; reports every Timer; cancels after three.
class Ticker final : public Actor {
 public:
  void on_start(Context& ctx) override { ctx.set_timer(5, std::chrono::milliseconds(10), true); }
  void on_message(Context& ctx, Message& message) override {
    const auto* timer = message.as<Timer>();
    if (timer == nullptr) return;
    EXPECT_EQ(message.envelope.from, ctx.self());  // through the actor's own loop
    ctx.send("tester", Pong{timer->fire_count, "tick", 0, 0, timer->timer_id});
    if (timer->fire_count == 3) ctx.cancel_timer(timer->timer_id);
  }
};

TEST(LifecycleTest, TimersAreMessagesThroughTheActorsOwnLoop) {
  World world;
  world.topology.add("ticker");
  world.topology.add("tester");
  auto topology = world.freeze();
  Mailbox tester(world.context, topology, "tester");
  ActorThread ticker(world.context, topology, "ticker", std::make_unique<Ticker>());
  ticker.start();
  for (std::uint64_t n = 1; n <= 3; ++n) {
    auto m = tester.receive(std::chrono::seconds(5));
    ASSERT_TRUE(m.has_value());
    EXPECT_EQ(m->as<Pong>()->seq, n);
    EXPECT_EQ(m->as<Pong>()->pings_seen, 5u);
  }
  EXPECT_FALSE(tester.receive(std::chrono::milliseconds(100)).has_value());  // cancelled
  EXPECT_TRUE(ticker.stop());
}

TEST(LifecycleTest, StartFailsClearlyWhenTheInboxCannotBind) {
  World world;
  world.topology.add("a", "inproc://mqlm/same");
  world.topology.add("b", "inproc://mqlm/same");
  auto topology = world.freeze();
  ActorThread a(world.context, topology, "a", std::make_unique<ReportingActor>("a"));
  a.start();
  ActorThread b(world.context, topology, "b", std::make_unique<ReportingActor>("b"));
  try {
    b.start();
    FAIL() << "a second actor bound the same address";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot bind its inbox at inproc://mqlm/same"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(a.stop());
}

TEST(LifecycleTest, MalformedFramesAreAnsweredAndTheActorGoesOn) {
  World world;
  world.topology.add("echo");
  world.topology.add("tester");
  auto topology = world.freeze();
  Mailbox tester(world.context, topology, "tester");
  ActorThread echo(world.context, topology, "echo", std::make_unique<ReportingActor>("tester"));
  echo.start();

  // A valid envelope from "tester" whose payload is garbage: answered with an Error.
  Frames bad = make_frames("tester", "echo", Ping{1, "x"});
  bad[1] = zmq::message_t(std::string("\xc1\xc1\xc1"));
  tester.send_raw("echo", std::move(bad));
  // A frame that is nothing at all: no sender to answer, dropped and counted.
  Frames junk;
  junk.emplace_back(std::string("junk"));
  tester.send_raw("echo", std::move(junk));
  tester.send("echo", Ping{2, "fine"});

  auto error = tester.receive(std::chrono::seconds(5));
  ASSERT_TRUE(error.has_value());
  ASSERT_NE(error->as<messages::Error>(), nullptr);
  EXPECT_EQ(error->as<messages::Error>()->code, static_cast<std::uint16_t>(ErrorCode::malformed));
  EXPECT_EQ(error->as<messages::Error>()->about_kind, static_cast<std::uint8_t>(Kind::Ping));
  auto fine = tester.receive(std::chrono::seconds(5));
  ASSERT_TRUE(fine.has_value());
  EXPECT_EQ(fine->as<Pong>()->seq, 2u);
  EXPECT_TRUE(echo.stop());
  EXPECT_EQ(echo.join().stats.malformed, 2u);
}

}  // namespace
}  // namespace mqlm::actors
