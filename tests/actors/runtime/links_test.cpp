// CURVE on the links between actor processes (actors/runtime/links): a prober in a real `mqlm node`
// process and an echo here, over tcp:// on 127.0.0.1 with each process's key pair. The keys the
// topology names get through; a node with any other key gets nothing through, and its refusals
// are logged (once a minute per key) and counted. Without keys a tcp:// node refuses to start
// unless --insecure.
#include <gtest/gtest.h>
#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <regex>

#include "actors/runtime/links.hpp"
#include "actors/runtime/probe_actors.hpp"
#include "child_process.hpp"
#include "test_actors.hpp"

namespace mqlm::actors {
namespace {

namespace fs = std::filesystem;
using namespace messages;
using testing::ChildProcess;
using testing::World;

// Key pairs written as `mqlm keygen NAME` writes them, in a folder removed after the test.
class Keys {
 public:
  Keys() : folder_(fs::temp_directory_path() / ("mqlm-links-" + std::to_string(::getpid()))) {
    fs::remove_all(folder_);
    fs::create_directories(folder_);
  }
  ~Keys() { fs::remove_all(folder_); }

  const curve::KeyPair& pair(const std::string& name) {
    auto found = pairs_.find(name);
    if (found != pairs_.end()) return found->second;
    curve::KeyPair made = curve::generate();
    EXPECT_TRUE(std::holds_alternative<std::monostate>(curve::write_key_files(base(name), made)));
    return pairs_.emplace(name, made).first->second;
  }
  std::string key_file(const std::string& name) {
    pair(name);
    return base(name) + ".key";
  }
  std::string pub_file(const std::string& name) {
    pair(name);
    return base(name) + ".pub";
  }

 private:
  std::string base(const std::string& name) const { return (folder_ / name).string(); }
  fs::path folder_;
  std::map<std::string, curve::KeyPair> pairs_;
};

// The log of this process, kept for the test to read.
class CapturedLog {
 public:
  CapturedLog() : previous_(spdlog::default_logger()) {
    spdlog::set_default_logger(std::make_shared<spdlog::logger>("links-test", sink_));
  }
  ~CapturedLog() { spdlog::set_default_logger(previous_); }
  std::vector<std::string> lines_with(const std::string& text) const {
    std::vector<std::string> found;
    for (const std::string& line : sink_->last_formatted()) {
      if (line.find(text) != std::string::npos) found.push_back(line);
    }
    return found;
  }

 private:
  std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt> sink_ = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(256);
  std::shared_ptr<spdlog::logger> previous_;
};

// This process runs the echo and the tester's mailbox (key pair "here"); the prober's inbox is
// the child's, whose key the topology says is `prober_key`.
struct LinkedWorld {
  World world;
  std::shared_ptr<const Topology> topology;
  std::unique_ptr<ActorThread> authenticator;

  LinkedWorld(Keys& keys, const std::string& prober_key) {
    for (const char* name : {"echo", "tester", "prober"}) world.topology.add(name, make_endpoint(Transport::tcp, name));
    world.topology.add(kLinkAuthenticatorName);
    world.topology.link_keys = keys.pair("here");
    world.topology.inbox_keys = {{"echo", keys.pair("here").public_key},
                                 {"tester", keys.pair("here").public_key},
                                 {"prober", keys.pair(prober_key).public_key}};
    topology = world.freeze();
    authenticator = start_link_authenticator(world.context, topology);
  }

  // `mqlm node` running a prober of 50 pings to the echo, with key pair `key`, which its
  // --address calls the prober's.
  std::vector<std::string> prober_node(Keys& keys, const std::string& key) const {
    std::vector<std::string> argv{MQLM_BINARY, "node", "--actor", "prober", "--set", "prober.report_to=tester",
                                  "--set", "prober.rounds=50", "--set", "prober.blob_bytes=100000",
                                  "--link-key", keys.key_file(key)};
    for (const char* name : {"echo", "tester", "prober"}) {
      const std::string owner = std::string(name) == "prober" ? key : "here";
      argv.push_back("--address");
      argv.push_back(std::string(name) + "=" + *topology->endpoint_of(name) + "@" + keys.pub_file(owner));
    }
    return argv;
  }
};

TEST(Links, ProcessesWithListedKeysConverseOverCurve) {
  Keys keys;
  LinkedWorld linked(keys, "node");
  Mailbox tester(linked.world.context, linked.topology, "tester");
  ActorThread echo(linked.world.context, linked.topology, "echo", std::make_unique<EchoActor>());
  echo.start();
  ChildProcess node(linked.prober_node(keys, "node"));
  testing::expect_probe_conversation(node, tester, echo, 50);
}

TEST(Links, ANodeWithAnUnlistedKeyGetsNothingThroughAndIsLoggedOnce) {
  Keys keys;
  CapturedLog log;
  LinkedWorld linked(keys, "node");  // the prober's process should have "node"'s key
  Mailbox tester(linked.world.context, linked.topology, "tester");
  ActorThread echo(linked.world.context, linked.topology, "echo", std::make_unique<EchoActor>());
  echo.start();
  ChildProcess node(linked.prober_node(keys, "mallory"));  // ...but has mallory's
  EXPECT_EQ(node.read_line(), "ready");
  EXPECT_FALSE(tester.receive(std::chrono::seconds(3)).has_value());
  EXPECT_EQ(node.terminate(), 0);
  EXPECT_TRUE(echo.stop());
  EXPECT_EQ(echo.join().stats.handled, 1u);  // the Stop alone
  EXPECT_TRUE(linked.authenticator->stop());

  const std::string mallory = keys.pair("mallory").public_key;
  const auto refusals = log.lines_with("refused a CURVE handshake");
  ASSERT_EQ(refusals.size(), 1u) << "each key is logged at most once a minute";
  EXPECT_NE(refusals[0].find(mallory), std::string::npos) << refusals[0];
  EXPECT_NE(refusals[0].find(curve::kLinkZapDomain), std::string::npos) << refusals[0];
  // Every refused handshake is counted. (libzmq 4.3 does not try again after one: its session
  // ends, and mallory's sends wait in vain.)
  const auto stopped = log.lines_with("link authenticator stopped");
  ASSERT_EQ(stopped.size(), 1u);
  std::smatch counts;
  const std::regex figures(R"((\d+) CURVE link handshakes allowed, (\d+) refused)");
  ASSERT_TRUE(std::regex_search(stopped[0], counts, figures)) << stopped[0];
  EXPECT_GE(std::stoi(counts[2]), 1) << stopped[0];
}

TEST(Links, AnInboxWhoseAddressNamesAnotherProcessKeyDoesNotBind) {
  Keys keys;
  World world;
  world.topology.add("echo", make_endpoint(Transport::tcp, "echo"));
  world.topology.link_keys = keys.pair("here");
  world.topology.inbox_keys = {{"echo", keys.pair("elsewhere").public_key}};
  auto topology = world.freeze();
  ActorThread echo(world.context, topology, "echo", std::make_unique<EchoActor>());
  try {
    echo.start();
    ADD_FAILURE() << "the inbox bound with another process's key";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("not this process's"), std::string::npos) << e.what();
  }
}

TEST(Links, TcpWithoutKeysRefusesToStartUnlessInsecure) {
  const std::string address = "echo=" + make_endpoint(Transport::tcp, "echo");
  ChildProcess refused({MQLM_BINARY, "node", "--actor", "echo", "--address", address});
  EXPECT_EQ(refused.read_line(), "");  // it ended without "ready"
  EXPECT_EQ(refused.terminate(), 2);
  ChildProcess insecure({MQLM_BINARY, "node", "--actor", "echo", "--address", address, "--insecure"});
  EXPECT_EQ(insecure.read_line(), "ready");
  EXPECT_EQ(insecure.terminate(), 0);
  // ipc:// needs nothing.
  const std::string ipc_address = "echo=" + make_endpoint(Transport::ipc, "echo");
  ChildProcess ipc({MQLM_BINARY, "node", "--actor", "echo", "--address", ipc_address});
  EXPECT_EQ(ipc.read_line(), "ready");
  EXPECT_EQ(ipc.terminate(), 0);
}

}  // namespace
}  // namespace mqlm::actors
