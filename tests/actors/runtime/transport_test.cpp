// The same conversation in one process (inproc) and across two OS processes over ipc:// and
// tcp:// on 127.0.0.1: only the topology changes, never the actors' code.
#include <gtest/gtest.h>

#include <tuple>

#include "actors/runtime/probe_actors.hpp"
#include "child_process.hpp"
#include "test_actors.hpp"

namespace mqlm::actors {
namespace {

using namespace messages;
using testing::ChildProcess;
using testing::World;

using Exchange = std::vector<std::tuple<std::uint64_t, std::string, std::uint64_t, std::uint64_t, std::uint64_t>>;

// Pings with blob frames of awkward sizes; returns what the echo said about each.
Exchange converse(Mailbox& tester) {
  Exchange pongs;
  const std::uint64_t sizes[] = {0, 1, 4095, 65536, 1 << 20};
  for (std::uint64_t seq = 1; seq <= 25; ++seq) {
    SendOptions options;
    std::uint64_t size = sizes[seq % 5];
    if (size > 0) {
      std::string blob(size, static_cast<char>('a' + seq % 26));
      options.blobs.emplace_back(blob.data(), blob.size());
    }
    EXPECT_EQ(tester.send("echo", Ping{seq, "hello " + std::to_string(seq)}, std::move(options)), SendStatus::sent);
    auto m = tester.receive(std::chrono::seconds(10));
    if (!m || m->as<Pong>() == nullptr) {
      ADD_FAILURE() << "no pong for ping " << seq;
      break;
    }
    const Pong& p = *m->as<Pong>();
    EXPECT_EQ(m->envelope.correlation_id, 0u);
    pongs.emplace_back(p.seq, p.text, p.blob_bytes, p.blob_hash, p.pings_seen);
  }
  return pongs;
}

Exchange in_process() {
  World world;
  world.topology.add("echo");
  world.topology.add("tester");
  auto topology = world.freeze();
  Mailbox tester(world.context, topology, "tester");
  ActorThread echo(world.context, topology, "echo", std::make_unique<EchoActor>());
  echo.start();
  return converse(tester);
}

Exchange across_processes(Transport transport) {
  World world;
  world.topology.add("echo", make_endpoint(transport, "echo"));
  world.topology.add("tester", make_endpoint(transport, "tester"));
  auto topology = world.freeze();
  Mailbox tester(world.context, topology, "tester");
  std::vector<std::string> argv{MQLM_BINARY, "node", "--actor", "echo", "--address",
                                "echo=" + *topology->endpoint_of("echo"), "--address",
                                "tester=" + *topology->endpoint_of("tester")};
  if (transport == Transport::tcp) argv.push_back("--insecure");  // CURVE links: links_test.cpp
  ChildProcess node(argv);
  EXPECT_EQ(node.read_line(), "ready");
  Exchange pongs = converse(tester);
  EXPECT_EQ(node.terminate(), 0);
  return pongs;
}

TEST(TransportTest, SameConversationInOneProcessAndAcrossProcesses) {
  Exchange local = in_process();
  ASSERT_EQ(local.size(), 25u);
  EXPECT_EQ(std::get<4>(local.back()), 25u);
  EXPECT_EQ(across_processes(Transport::ipc), local);
  EXPECT_EQ(across_processes(Transport::tcp), local);
}

// Two actors, one in each process: the prober runs in the child, the echo here.
class CrossProcessActors : public ::testing::TestWithParam<Transport> {};

TEST_P(CrossProcessActors, ProberAndEchoConverse) {
  World world;
  for (const char* name : {"echo", "tester", "prober"}) world.topology.add(name, make_endpoint(GetParam(), name));
  auto topology = world.freeze();
  Mailbox tester(world.context, topology, "tester");
  ActorThread echo(world.context, topology, "echo", std::make_unique<EchoActor>());
  echo.start();
  std::vector<std::string> argv{MQLM_BINARY, "node", "--actor", "prober", "--set", "prober.report_to=tester",
                                "--set", "prober.rounds=200", "--set", "prober.window=8", "--set",
                                "prober.blob_bytes=100000"};
  for (const char* name : {"echo", "tester", "prober"}) {
    argv.push_back("--address");
    argv.push_back(std::string(name) + "=" + *topology->endpoint_of(name));
  }
  if (GetParam() == Transport::tcp) argv.push_back("--insecure");
  ChildProcess node(argv);
  testing::expect_probe_conversation(node, tester, echo, 200);
}

INSTANTIATE_TEST_SUITE_P(IpcAndTcp, CrossProcessActors, ::testing::Values(Transport::ipc, Transport::tcp),
                         [](const auto& info) { return info.param == Transport::ipc ? "ipc" : "tcp"; });

}  // namespace
}  // namespace mqlm::actors
