// The front end's core as a plain object: a context that records what it sends (and refuses
// sends to the peers a case names) and a port that records what the callers hear. Both
// protocols' behaviour lives here; their own tests drive them over real sockets.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "actors/front_end/front_end.hpp"

namespace mqlm::actors::front_end {
namespace {

using namespace messages;
using namespace std::chrono_literals;

constexpr std::int64_t kMs = 1'000'000;

class RecordingContext final : public Context {
 public:
  const std::string& self() const override { return self_; }
  std::int64_t now_ns() const override { return now; }
  void set_timer(std::uint32_t, std::chrono::milliseconds, bool) override {}
  void cancel_timer(std::uint32_t) override {}

  // The messages sent to `to` of type T, in order.
  template <typename T>
  std::vector<Message> sent_to(const std::string& to) const {
    std::vector<Message> found;
    for (const auto& [peer, message] : sent) {
      if (peer == to && std::holds_alternative<T>(message.payload)) found.push_back(copy(message));
    }
    return found;
  }

  std::int64_t now = 1'000 * kMs;
  std::map<std::string, SendStatus> refuse;  // peers whose sends fail, and how
  std::vector<std::pair<std::string, Message>> sent;

 protected:
  SendStatus deliver(const std::string& to, Frames frames, WhenFull) override {
    if (auto it = refuse.find(to); it != refuse.end()) return it->second;
    sent.emplace_back(to, std::get<Message>(decode(std::move(frames))));
    return SendStatus::sent;
  }

 private:
  static Message copy(const Message& message) { return Message{message.envelope, message.payload, {}}; }
  std::string self_ = "front";
};

// What a caller heard, one line each: "final conn code text", "token conn text", ...
class RecordingPort final : public FrontEndPort {
 public:
  void send_token(Context&, const OpenRequest& request, const TokenEvent& event) override {
    heard.push_back("token " + request.caller.connection + " " + event.text);
  }
  void send_final(Context&, const OpenRequest& request, const FinalEvent& event) override {
    heard.push_back("final " + request.caller.connection + " " +
                    std::string(error_code_name(static_cast<RequestError>(event.error))) + " " + request.gathered.text +
                    event.message);
  }
  void request_ended(const FinalEvent&) override { ++ended; }
  void send_accepted(Context&, const OpenRequest& request, const StatusReport&) override {
    heard.push_back("accepted " + request.caller.connection);
  }
  void send_status(Context&, const Caller& caller, const StatusReport& report, const ModelsReport* memory) override {
    heard.push_back("status " + caller.connection + " " + std::to_string(report.steps) +
                    (memory != nullptr ? " memory" : ""));
  }
  void send_admin_answer(Context&, const Caller& caller, const AdminAnswer& answer) override {
    heard.push_back("admin " + caller.connection + " " + std::to_string(answer.index()));
  }
  void send_error(Context&, const Caller& caller, RequestError code, const std::string& message) override {
    heard.push_back("error " + caller.connection + " " + std::string(error_code_name(code)) + " " + message);
  }
  void on_timer(Context&, std::uint32_t timer_id) override { heard.push_back("timer " + std::to_string(timer_id)); }

  std::vector<std::string> heard;
  int ended = 0;
};

struct Harness {
  explicit Harness(FrontEndConfig config = test_config()) : core(std::move(config), port) { core.start(ctx); }

  static FrontEndConfig test_config() {
    FrontEndConfig config = named_config("test", "the test front end", "admin calls");
    config.enforcer = "enforcer";
    config.cache_writer = "cache-writer";
    config.max_requests = 2;
    return config;
  }

  // Delivers `payload` from `from` as the runtime would.
  void hear(const std::string& from, Payload payload, std::uint64_t correlation_id = 0, std::uint64_t request_id = 0) {
    Message message{Envelope{kind_of(payload), 1, from, "front", correlation_id, request_id, 0}, std::move(payload), {}};
    core.on_message(ctx, message);
    core.settle(ctx);
  }
  // Time passes in ticks of 50 ms (the core's, for heartbeat_ms 200); a live scheduler answers
  // each tick.
  void run_for(std::int64_t ms, bool scheduler_alive) {
    for (std::int64_t t = 0; t < ms; t += 50) {
      ctx.now += 50 * kMs;
      hear("front", Timer{1, 1});
      if (scheduler_alive) hear("scheduler", HeartbeatAck{1});
    }
  }
  // Opens a request and returns the request id the scheduler got.
  std::uint64_t open(const std::string& connection, bool stream = true) {
    core.open(ctx, Caller{connection, ClientId{std::int64_t{7}}, false}, Submit{}, stream);
    core.settle(ctx);
    auto submits = ctx.sent_to<Submit>("scheduler");
    return submits.empty() ? 0 : submits.back().envelope.request_id;
  }
  std::string last() const { return port.heard.empty() ? "" : port.heard.back(); }

  RecordingContext ctx;
  RecordingPort port;
  FrontEnd core;
};

FinalEvent finished() {
  FinalEvent event;
  event.finish = static_cast<std::uint8_t>(FinishReason::stop);
  return event;
}

TEST(FrontEnd, StreamsTokensThenEndsWithTheSchedulersFinal) {
  Harness h;
  const std::uint64_t id = h.open("a");
  ASSERT_NE(id, 0u);
  EXPECT_TRUE(h.core.is_open(Caller{"a", ClientId{std::int64_t{7}}, false}));
  h.hear("scheduler", TokenEvent{{1}, "hi", {}}, 0, id);
  EXPECT_EQ(h.last(), "token a hi");
  h.hear("scheduler", finished(), 0, id);
  EXPECT_EQ(h.last(), "final a none ");
  EXPECT_FALSE(h.core.is_open(Caller{"a", ClientId{std::int64_t{7}}, false}));
  EXPECT_EQ(h.core.served(), 1u);
  EXPECT_EQ(h.port.ended, 1);
  h.hear("scheduler", TokenEvent{{2}, "late", {}}, 0, id);
  EXPECT_EQ(h.core.dropped_events(), 1u);
}

// The adapter's own timers (the http actor's status sampler) reach it; the core's tick does not.
TEST(FrontEnd, PassesTheAdaptersTimersOnAndKeepsItsTick) {
  Harness h;
  const std::size_t heartbeats = h.ctx.sent_to<Heartbeat>("scheduler").size();
  h.ctx.now += 250 * kMs;
  h.hear("front", Timer{kCoreTickTimer, 1});
  EXPECT_TRUE(h.port.heard.empty());
  EXPECT_EQ(h.ctx.sent_to<Heartbeat>("scheduler").size(), heartbeats + 1);
  h.hear("front", Timer{kCoreTickTimer + 1, 1});
  EXPECT_EQ(h.last(), "timer 2");
  EXPECT_EQ(h.ctx.sent_to<Heartbeat>("scheduler").size(), heartbeats + 1);
}

TEST(FrontEnd, GathersTheOutputOfACallerThatDoesNotStream) {
  Harness h;
  const std::uint64_t id = h.open("a", false);
  h.hear("scheduler", TokenEvent{{1}, "hel", {}}, 0, id);
  h.hear("scheduler", TokenEvent{{2}, "lo", {}}, 0, id);
  EXPECT_TRUE(h.port.heard.empty());
  h.hear("scheduler", finished(), 0, id);
  EXPECT_EQ(h.last(), "final a none hello");
}

TEST(FrontEnd, RefusesWhatItCannotOpen) {
  struct Case {
    const char* name;
    void (*arrange)(Harness&);
    std::string heard;
  };
  const Case cases[] = {
      {"draining", [](Harness& h) { h.hear("supervisor", Drain{false}); },
       "final b shutting_down the server is draining and takes no new requests"},
      {"silent scheduler", [](Harness& h) { h.ctx.now += 801 * kMs; },
       "final b unavailable the scheduler 'scheduler' has not answered for 801 ms (its process may have died): try "
       "again later"},
      {"at max_requests",
       [](Harness& h) {
         h.open("x");
         h.open("y");
       },
       "final b busy the server has 2 requests open, its limit: try again later"},
      {"no scheduler address", [](Harness& h) { h.ctx.refuse["scheduler"] = SendStatus::unknown_actor; },
       "final b internal the test front end has no address for its scheduler 'scheduler'"},
      {"scheduler full", [](Harness& h) { h.ctx.refuse["scheduler"] = SendStatus::full; },
       "final b busy the scheduler's queue is full: try again later"},
  };
  for (const Case& c : cases) {
    Harness h;
    c.arrange(h);
    h.open("b");
    EXPECT_EQ(h.last(), c.heard) << c.name;
    EXPECT_FALSE(h.core.is_open(Caller{"b", ClientId{std::int64_t{7}}, false})) << c.name;
  }
}

TEST(FrontEnd, AGoneConnectionsRequestsAreAbortedAndEndUnheard) {
  Harness h;
  const std::uint64_t id = h.open("a");
  h.core.connection_gone("a");
  h.core.settle(h.ctx);
  auto aborts = h.ctx.sent_to<Abort>("scheduler");
  ASSERT_EQ(aborts.size(), 1u);
  EXPECT_EQ(aborts[0].envelope.request_id, id);
  EXPECT_EQ(aborts[0].as<Abort>()->reason, static_cast<std::uint8_t>(AbortReason::client_gone));
  h.hear("scheduler", TokenEvent{{1}, "x", {}}, 0, id);
  h.hear("scheduler", finished(), 0, id);
  EXPECT_TRUE(h.port.heard.empty());
  EXPECT_EQ(h.port.ended, 1);
  EXPECT_EQ(h.core.open_requests(), 0u);
}

TEST(FrontEnd, ASilentSchedulerFailsEveryOpenRequestAndStatus) {
  Harness h;
  const std::uint64_t id = h.open("a");
  h.core.ask_status(h.ctx, Caller{"s", std::nullopt, false}, false);
  h.run_for(800, false);  // heard nothing since start, but not yet for more than unavailable_ms
  EXPECT_TRUE(h.port.heard.empty());
  h.run_for(50, false);
  ASSERT_EQ(h.port.heard.size(), 2u);
  EXPECT_EQ(h.port.heard[0].rfind("final a unavailable the scheduler 'scheduler' has not answered for", 0), 0u);
  EXPECT_EQ(h.port.heard[1].rfind("error s unavailable", 0), 0u);
  auto aborts = h.ctx.sent_to<Abort>("scheduler");
  ASSERT_EQ(aborts.size(), 1u);
  EXPECT_EQ(aborts[0].envelope.request_id, id);
  EXPECT_FALSE(h.ctx.sent_to<Heartbeat>("scheduler").empty());
}

TEST(FrontEnd, DrainAbortsOnRequestAndAnswersOnceNothingIsOpen) {
  Harness h;
  const std::uint64_t id = h.open("a");
  h.hear("supervisor", Drain{true});
  EXPECT_TRUE(h.core.draining());
  EXPECT_EQ(h.ctx.sent_to<Abort>("scheduler").size(), 1u);
  EXPECT_TRUE(h.ctx.sent_to<Drained>("supervisor").empty());
  h.hear("scheduler", finished(), 0, id);
  auto drained = h.ctx.sent_to<Drained>("supervisor");
  ASSERT_EQ(drained.size(), 1u);
  EXPECT_EQ(drained[0].as<Drained>()->requests_served, 1u);
}

TEST(FrontEnd, AStatusWaitsForTheEnforcersMemoryUntilUnavailableMs) {
  Harness h;
  h.core.ask_status(h.ctx, Caller{"s", std::nullopt, false}, true);
  auto queries = h.ctx.sent_to<StatusQuery>("scheduler");
  ASSERT_EQ(queries.size(), 1u);
  EXPECT_TRUE(queries[0].as<StatusQuery>()->trim);
  const std::uint64_t correlation_id = queries[0].envelope.correlation_id;
  ASSERT_EQ(h.ctx.sent_to<ModelsQuery>("enforcer").size(), 1u);
  StatusReport report;
  report.steps = 5;
  h.hear("scheduler", report, correlation_id);
  EXPECT_TRUE(h.port.heard.empty());
  h.hear("enforcer", ModelsReport{}, correlation_id);
  EXPECT_EQ(h.last(), "status s 5 memory");

  h.core.ask_status(h.ctx, Caller{"t", std::nullopt, false}, false);
  const std::uint64_t second = h.ctx.sent_to<StatusQuery>("scheduler").back().envelope.correlation_id;
  h.hear("scheduler", report, second);
  h.run_for(800, true);
  EXPECT_EQ(h.last(), "status s 5 memory");
  h.run_for(50, true);
  EXPECT_EQ(h.last(), "status t 5");
}

TEST(FrontEnd, AdminQuestionsGoToTheirPeerOrAreRefused) {
  struct Case {
    const char* name;
    AdminQuestion question;
    bool draining;
    std::string peer;  // "" when refused
    std::string heard;
  };
  const Case cases[] = {
      {"load", LoadRequest{"m"}, false, "enforcer", ""},
      {"load while draining", LoadRequest{"m"}, true, "",
       "error c shutting_down the server is draining and loads no models"},
      {"unload while draining", UnloadRequest{"m", false}, true, "enforcer", ""},
      {"clear while draining", ClearCache{static_cast<std::uint8_t>(CacheTier::ssd)}, true, "cache-writer", ""},
      {"unknown tier", ClearCache{9}, false, "", "error c internal a handler asked to clear an unknown cache tier"},
  };
  for (const Case& c : cases) {
    Harness h;
    if (c.draining) h.hear("supervisor", Drain{false});
    h.core.ask_admin(h.ctx, Caller{"c", std::nullopt, false}, c.question);
    EXPECT_EQ(h.last(), c.heard) << c.name;
    if (!c.peer.empty()) {
      ASSERT_FALSE(h.ctx.sent.empty()) << c.name;
      EXPECT_EQ(h.ctx.sent.back().first, c.peer) << c.name;
    }
  }

  FrontEndConfig bare = Harness::test_config();
  bare.enforcer.clear();
  bare.cache_writer.clear();
  Harness h(bare);
  h.core.ask_admin(h.ctx, Caller{"c", std::nullopt, false}, LoadRequest{"m"});
  EXPECT_EQ(h.last(), "error c invalid_request this server has no model pool (no enforcer): it cannot load or "
                      "unload models");
  h.core.ask_admin(h.ctx, Caller{"c", std::nullopt, false}, ClearCache{1});
  EXPECT_EQ(h.last(), "error c invalid_request this server runs no cache-writer (no hot cache: --hot-cache 0), so "
                      "it has no KV cache to clear");
}

TEST(FrontEnd, AnUnloadIsAnsweredTwice) {
  Harness h;
  h.core.ask_admin(h.ctx, Caller{"c", std::nullopt, false}, UnloadRequest{"m", false});
  const std::uint64_t correlation_id = h.ctx.sent_to<UnloadRequest>("enforcer").back().envelope.correlation_id;
  UnloadAnswer answer;
  answer.outcome = static_cast<std::uint8_t>(UnloadOutcome::draining);
  h.hear("enforcer", answer, correlation_id);
  answer.outcome = static_cast<std::uint8_t>(UnloadOutcome::unloaded);
  h.hear("enforcer", answer, correlation_id);
  h.hear("enforcer", answer, correlation_id);  // a third has no question waiting
  EXPECT_EQ(h.port.heard, (std::vector<std::string>{"admin c 1", "admin c 1"}));
  EXPECT_EQ(h.core.dropped_events(), 1u);
}

TEST(FrontEnd, ABarrierTellsTheCallersTheSchedulerTookTheirRequests) {
  FrontEndConfig config = Harness::test_config();
  config.confirm_acceptance = true;
  Harness h(config);
  const std::uint64_t first = h.open("a");
  auto barriers = h.ctx.sent_to<StatusQuery>("scheduler");
  ASSERT_EQ(barriers.size(), 1u);
  h.hear("scheduler", FinalEvent{}, 0, first);  // refused before the barrier's answer
  const std::uint64_t second = h.open("b");
  ASSERT_NE(second, first);
  h.hear("scheduler", StatusReport{}, barriers[0].envelope.correlation_id);
  h.hear("scheduler", StatusReport{}, h.ctx.sent_to<StatusQuery>("scheduler").back().envelope.correlation_id);
  EXPECT_EQ(h.last(), "accepted b");
  EXPECT_EQ(std::count(h.port.heard.begin(), h.port.heard.end(), "accepted a"), 0);
}

TEST(FrontEnd, StopCutsOffWhatIsOpenAndWaiting) {
  Harness h;
  const std::uint64_t id = h.open("a");
  h.core.ask_status(h.ctx, Caller{"s", std::nullopt, false}, false);
  h.core.ask_admin(h.ctx, Caller{"c", std::nullopt, false}, LoadRequest{"m"});
  h.core.stop(h.ctx);
  EXPECT_EQ(h.port.heard,
            (std::vector<std::string>{"final a shutting_down the server stopped before this request finished",
                                      "error s shutting_down the server is stopping",
                                      "error c shutting_down the server is stopping"}));
  auto aborts = h.ctx.sent_to<Abort>("scheduler");
  ASSERT_EQ(aborts.size(), 1u);
  EXPECT_EQ(aborts[0].envelope.request_id, id);
  EXPECT_EQ(aborts[0].as<Abort>()->reason, static_cast<std::uint8_t>(AbortReason::shutdown));
}

TEST(FrontEnd, CoreOptionsAreChecked) {
  FrontEndConfig config = named_config("test", "the test front end", "admin calls");
  read_core_options({{"scheduler", "s2"}, {"heartbeat_ms", "50"}, {"unavailable_ms", "60"}}, 100, config);
  EXPECT_EQ(config.scheduler, "s2");
  EXPECT_EQ(config.heartbeat, 50ms);
  EXPECT_THROW(read_core_options({{"unavailable_ms", "50"}, {"heartbeat_ms", "50"}}, 100, config),
               std::invalid_argument);
  EXPECT_THROW(read_core_options({{"heartbeat_ms", "101"}}, 100, config), std::invalid_argument);
  EXPECT_THROW(read_core_options({{"scheduler", ""}}, 100, config), std::invalid_argument);
}

}  // namespace
}  // namespace mqlm::actors::front_end
