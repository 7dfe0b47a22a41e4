// Bounded mailboxes: what a sender sees when a slow actor's mailbox is full, per message kind,
// and that a slow actor only fills its own mailbox.
#include <gtest/gtest.h>

#include <thread>

#include "actors/runtime/probe_actors.hpp"
#include "test_actors.hpp"

namespace mqlm::actors {
namespace {

using namespace messages;
using testing::Gate;
using testing::ReportingActor;
using testing::World;

constexpr int kCapacity = 20;

struct SlowSink {
  World world;
  Gate gate;
  std::unique_ptr<Mailbox> tester;
  std::unique_ptr<ActorThread> sink;

  SlowSink() {
    world.topology.mailbox_capacity = kCapacity;
    world.topology.send_capacity = kCapacity;
    world.topology.add("sink");
    world.topology.add("tester");
    world.topology.add("relay");
    auto topology = world.freeze();
    tester = std::make_unique<Mailbox>(world.context, topology, "tester");
    sink = std::make_unique<ActorThread>(world.context, topology, "sink",
                                         std::make_unique<ReportingActor>("tester", gate.future));
    sink->start();
  }
  ~SlowSink() {
    gate.open();
    if (sink) sink->stop();
  }
};

TEST(MailboxTest, FullMailboxRejectsDropsOrDefersByKind) {
  SlowSink s;
  // Ping is WhenFull::reject: accepted until the bounded queues are full, then refused at once.
  std::uint64_t accepted = 0;
  SendStatus status = SendStatus::sent;
  for (std::uint64_t seq = 1; seq <= 10 * kCapacity && status == SendStatus::sent; ++seq) {
    status = s.tester->send("sink", Ping{seq, "p"});
    if (status == SendStatus::sent) ++accepted;
  }
  ASSERT_EQ(status, SendStatus::full);
  EXPECT_GE(accepted, static_cast<std::uint64_t>(kCapacity));      // at least the mailbox itself
  EXPECT_LE(accepted, static_cast<std::uint64_t>(4 * kCapacity));  // bounded: HWMs, not memory

  // Heartbeat is WhenFull::drop: discarded and counted.
  EXPECT_EQ(s.tester->send("sink", Heartbeat{1}), SendStatus::dropped);
  EXPECT_EQ(s.tester->counters().dropped, 1u);

  // Pong is WhenFull::defer: kept in the sender's outbox, in order, delivered once there is room.
  constexpr std::uint64_t kDeferred = 50;
  for (std::uint64_t seq = 1; seq <= kDeferred; ++seq) {
    EXPECT_EQ(s.tester->send("sink", Pong{1000 + seq, "d", 0, 0, 0}), SendStatus::deferred);
  }

  s.gate.open();
  auto got = testing::receive_until(s.tester.operator*(), [&](const auto& g) { return g.size() >= accepted + kDeferred; });
  ASSERT_EQ(got.size(), accepted + kDeferred);
  for (std::uint64_t i = 0; i < accepted; ++i) {
    ASSERT_EQ(got[i].as<Pong>()->text, "Ping");
    EXPECT_EQ(got[i].as<Pong>()->seq, i + 1);
  }
  for (std::uint64_t i = 0; i < kDeferred; ++i) {
    ASSERT_EQ(got[accepted + i].as<Pong>()->text, "Pong");
    EXPECT_EQ(got[accepted + i].as<Pong>()->seq, 1001 + i);  // in the order sent
  }
  // The dropped heartbeat never reached the sink (it would have been answered).
  EXPECT_FALSE(s.tester->receive(std::chrono::milliseconds(100)).has_value());
}

// An actor that forwards every Pong it gets to the sink and answers Pings itself.
class Relay final : public Actor {
 public:
  void on_message(Context& ctx, Message& message) override {
    if (const auto* pong = message.as<Pong>()) {
      SendStatus status = ctx.send("sink", *pong);
      if (status != SendStatus::sent && status != SendStatus::deferred) ++lost_;
    } else if (const auto* ping = message.as<Ping>()) {
      ctx.reply(message, Pong{ping->seq, "relay alive", 0, 0, lost_});
    }
  }

 private:
  std::uint64_t lost_ = 0;
};

TEST(MailboxTest, SlowActorOnlyFillsItsOwnMailbox) {
  SlowSink s;
  ActorThread relay(s.world.context, s.world.frozen, "relay", std::make_unique<Relay>());
  relay.start();
  constexpr std::uint64_t kForwarded = 300;  // far beyond the sink's capacity
  for (std::uint64_t seq = 1; seq <= kForwarded; ++seq) {
    ASSERT_NE(s.tester->send("relay", Pong{seq, "f", 0, 0, 0}), SendStatus::dropped);
    s.tester->flush(std::chrono::seconds(5));
  }
  // The sink is still blocked, yet the relay takes all of its inbox and answers: it never waits
  // on the sink. (Ping is WhenFull::reject, so it is refused while the relay's own mailbox still
  // holds the forwarded messages; the tester tries again, as a client would.)
  SendStatus status = SendStatus::full;
  for (int i = 0; i < 500 && status == SendStatus::full; ++i) {
    status = s.tester->send("relay", Ping{7, "alive?"});
    if (status == SendStatus::full) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(status, SendStatus::sent);
  auto answer = s.tester->receive(std::chrono::seconds(5));
  ASSERT_TRUE(answer.has_value());
  ASSERT_NE(answer->as<Pong>(), nullptr);
  EXPECT_EQ(answer->as<Pong>()->text, "relay alive");
  EXPECT_EQ(answer->as<Pong>()->pings_seen, 0u);  // nothing lost

  s.gate.open();
  auto got = testing::receive_until(*s.tester, [&](const auto& g) { return g.size() >= kForwarded; });
  ASSERT_EQ(got.size(), kForwarded);
  for (std::uint64_t i = 0; i < kForwarded; ++i) EXPECT_EQ(got[i].as<Pong>()->seq, i + 1);
  EXPECT_TRUE(relay.stop());
}

TEST(MailboxTest, UnknownRecipientIsRefusedWithoutOpeningASocket) {
  World world;
  world.topology.add("tester");
  Mailbox tester(world.context, world.freeze(), "tester");
  EXPECT_EQ(tester.send("nobody", Ping{1, "x"}), SendStatus::unknown_actor);
  EXPECT_EQ(tester.counters().unknown, 1u);
}

}  // namespace
}  // namespace mqlm::actors
