// A recorded trace replays with no difference; a changed actor's difference is reported; a bad
// trace file is an error, not a crash.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "actors/runtime/node.hpp"
#include "actors/runtime/probe_actors.hpp"
#include "actors/runtime/replay.hpp"
#include "test_actors.hpp"

namespace mqlm::actors {
namespace {

using namespace messages;

// The trace file's name has the process id: two suites running at once (ctest -j, another build
// folder) would otherwise write one file.
std::filesystem::path record_conversation(const std::string& stem) {
  auto file = std::filesystem::temp_directory_path() / (stem + "-" + std::to_string(::getpid()) + ".trc");
  auto report = run_probe({Transport::inproc, ProberConfig{"echo", "tester", 60, 4, 3000, 9}, file, true,
                           std::chrono::seconds(20)});
  EXPECT_TRUE(report && report->pongs == 60);
  return file;
}

std::vector<TraceRecord> read_ok(const std::filesystem::path& file) {
  auto read = read_trace(file);
  if (auto* e = std::get_if<TraceReadError>(&read)) ADD_FAILURE() << e->detail;
  return std::get<std::vector<TraceRecord>>(std::move(read));
}

TEST(TraceTest, RecordedConversationReplaysWithNoDifference) {
  auto trace = read_ok(record_conversation("mqlm-trace-test-same"));
  EchoActor echo;
  ReplayReport report = replay_actor(trace, "echo", echo);
  EXPECT_EQ(report.inbox_messages, 1u + 60u + 1u);  // start marker, 60 pings, Stop
  EXPECT_EQ(report.recorded_sends, 61u);             // 60 pongs and the StopAck
  EXPECT_TRUE(report.same()) << (report.differences.empty() ? "" : report.differences.front());

  // The prober's replay reproduces its report too: it takes time only from its messages.
  ProberActor prober(ProberConfig{"echo", "tester", 60, 4, 3000, 9});
  ReplayReport prober_report = replay_actor(trace, "prober", prober);
  EXPECT_TRUE(prober_report.same()) << (prober_report.differences.empty() ? "" : prober_report.differences.front());
  EXPECT_EQ(prober_report.recorded_sends, 60u + 1u + 1u);  // pings, the report, the StopAck
}

// An echo with a deliberate change: it counts the pings it has seen from 2.
class ChangedEcho final : public Actor {
 public:
  void on_message(Context& ctx, Message& message) override {
    inner_.on_message(ctx, message);
  }
  void on_start(Context& ctx) override {
    Message warmup;
    warmup.envelope.from = "nobody";
    warmup.payload = Ping{0, "extra"};
    inner_.on_message(ctx, warmup);  // sends one more pong and shifts every later count
  }

 private:
  EchoActor inner_;
};

TEST(TraceTest, ChangedActorsDifferenceIsReported) {
  auto trace = read_ok(record_conversation("mqlm-trace-test-changed"));
  ChangedEcho changed;
  ReplayReport report = replay_actor(trace, "echo", changed);
  EXPECT_FALSE(report.same());
  EXPECT_EQ(report.replayed_sends, report.recorded_sends + 1);
  ASSERT_FALSE(report.differences.empty());
  EXPECT_NE(report.differences.front().find("send #1: recorded Pong to prober"), std::string::npos)
      << report.differences.front();
  EXPECT_NE(report.differences.front().find("replayed Pong to nobody"), std::string::npos);
}

TEST(TraceTest, DamagedTraceFilesAreErrorsWithAnOffset) {
  auto file = record_conversation("mqlm-trace-test-damaged");
  std::string bytes;
  {
    std::ifstream in(file, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  auto write = [&](const std::string& content) {
    std::ofstream out(file, std::ios::binary | std::ios::trunc);
    out << content;
  };
  write(bytes.substr(0, bytes.size() - 3));  // truncated inside the last record
  auto truncated = read_trace(file);
  ASSERT_TRUE(std::holds_alternative<TraceReadError>(truncated));
  EXPECT_GT(std::get<TraceReadError>(truncated).offset, 8u);

  write("NOTATRACE");
  ASSERT_TRUE(std::holds_alternative<TraceReadError>(read_trace(file)));

  std::string huge_length = std::string(kTraceMagic) + std::string("\xff\xff\xff\x7f", 4) + "x";
  write(huge_length);
  auto huge = read_trace(file);
  ASSERT_TRUE(std::holds_alternative<TraceReadError>(huge));
  EXPECT_NE(std::get<TraceReadError>(huge).detail.find("runs past the end"), std::string::npos);

  std::string garbage = std::string(kTraceMagic) + std::string("\x03\x00\x00\x00", 4) + "\x93\x01\x02";
  write(garbage);
  ASSERT_TRUE(std::holds_alternative<TraceReadError>(read_trace(file)));
}

}  // namespace
}  // namespace mqlm::actors
