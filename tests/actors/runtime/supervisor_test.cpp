// The supervisor notices a child whose thread died and one that stopped answering heartbeats.
#include <gtest/gtest.h>

#include "actors/runtime/node.hpp"
#include "test_actors.hpp"

namespace mqlm::actors {
namespace {

using namespace messages;
using testing::Gate;
using testing::ReportingActor;

// heartbeat_timeout: generous by default, since CI machines are loaded; a test about deaths, which
// the supervisor learns from the dying thread, gives one no slow start can reach.
NodeConfig config_with(std::vector<ChildSpec> children,
                       std::chrono::milliseconds heartbeat_timeout = std::chrono::milliseconds(1000)) {
  NodeConfig config;
  config.topology.add("tester");
  config.actors = std::move(children);
  config.supervisor.heartbeat_interval = std::chrono::milliseconds(20);
  config.supervisor.heartbeat_timeout = heartbeat_timeout;
  config.supervisor.report_to = "tester";
  return config;
}

std::optional<ActorFailed> next_failure(Mailbox& tester) {
  for (int i = 0; i < 100; ++i) {
    auto m = tester.receive(std::chrono::milliseconds(100));
    if (m && m->as<ActorFailed>()) return *m->as<ActorFailed>();
  }
  return std::nullopt;
}

TEST(SupervisorTest, NoticesADeadChildAndRestartsItByPolicy) {
  Node node(config_with({{"worker", [] { return std::make_unique<ReportingActor>("tester"); }, {true, 1}}},
                        std::chrono::minutes(1)));
  Mailbox tester(node.context(), node.topology(), "tester");
  node.start();

  tester.send("worker", Ping{1, "die"});
  auto failure = next_failure(tester);
  ASSERT_TRUE(failure.has_value());
  EXPECT_EQ(failure->actor, "worker");
  EXPECT_EQ(failure->failure, static_cast<std::uint8_t>(ActorFailure::died));
  EXPECT_NE(failure->detail.find("poisoned by the test"), std::string::npos);
  EXPECT_TRUE(failure->restarted);
  EXPECT_EQ(failure->restarts, 1u);

  // The restarted worker answers again.
  tester.send("worker", Ping{2, "hello"});
  auto answer = tester.receive(std::chrono::seconds(5));
  ASSERT_TRUE(answer.has_value());
  ASSERT_NE(answer->as<Pong>(), nullptr);
  EXPECT_EQ(answer->as<Pong>()->seq, 2u);

  // Its policy allowed one restart: the second death is reported and not restarted.
  tester.send("worker", Ping{3, "die"});
  failure = next_failure(tester);
  ASSERT_TRUE(failure.has_value());
  EXPECT_FALSE(failure->restarted);
  node.stop();
}

TEST(SupervisorTest, NoticesAChildThatStoppedAnswering) {
  Gate gate;
  auto gate_future = gate.future;
  Node node(config_with({{"stuck", [gate_future] { return std::make_unique<ReportingActor>("tester", gate_future); }, {}},
                         {"healthy", [] { return std::make_unique<ReportingActor>("tester"); }, {}}}));
  Mailbox tester(node.context(), node.topology(), "tester");
  node.start();

  tester.send("stuck", Ping{1, "block in the handler"});
  auto failure = next_failure(tester);
  ASSERT_TRUE(failure.has_value());
  EXPECT_EQ(failure->actor, "stuck");  // and not "healthy", which goes on answering
  EXPECT_EQ(failure->failure, static_cast<std::uint8_t>(ActorFailure::unresponsive));
  EXPECT_NE(failure->detail.find("no heartbeat answer"), std::string::npos);

  gate.open();  // let it finish, so the node can stop in order
  node.stop();
}

}  // namespace
}  // namespace mqlm::actors
