// The gateway actor over real ZeroMQ: it runs in an ActorThread; the scheduler is a scripted
// Mailbox named "scheduler" that sees every Submit, Abort and StatusQuery and answers as a test
// says, and the cache-writer one named "cache-writer" that sees every ClearCache; clients are
// DEALER (or REQ) sockets on a TCP or IPC address, speaking msgpack built with nlohmann::json as
// a foreign client would.
#include <gtest/gtest.h>

#include <deque>
#include <map>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "actors/gateway/gateway.hpp"
#include "tests/actors/runtime/test_actors.hpp"

namespace mqlm::actors {
namespace {

using namespace messages;
using namespace std::chrono_literals;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

std::string packed(const json& value) {
  auto bytes = json::to_msgpack(value);
  return std::string(bytes.begin(), bytes.end());
}

json generate(json id, std::string prompt, bool stream = true) {
  return {{"op", "generate"}, {"id", std::move(id)}, {"prompt", std::move(prompt)}, {"stream", stream}};
}

FinalEvent final_with(FinishReason finish, std::string text = {}) {
  FinalEvent event;
  event.finish = static_cast<std::uint8_t>(finish);
  event.text = std::move(text);
  return event;
}

// The gateway, the scripted scheduler and cache-writer, and a control mailbox (the Drain's
// sender). Waiting on a client or on the scheduler pumps both scripted mailboxes, answering the
// gateway's heartbeats unless a test has one fall silent.
class Harness {
 public:
  explicit Harness(ActorOptions options = {}, int mailbox_capacity = 1000) {
    world_.topology.mailbox_capacity = mailbox_capacity;
    world_.topology.send_capacity = std::min(mailbox_capacity, 100);
    world_.topology.add("gateway");
    world_.topology.add("scheduler");
    world_.topology.add("control");
    world_.topology.add("cache-writer");
    auto topology = world_.freeze();
    scheduler_ = std::make_unique<Mailbox>(world_.context, topology, "scheduler");
    cache_writer_ = std::make_unique<Mailbox>(world_.context, topology, "cache-writer");
    control_ = std::make_unique<Mailbox>(world_.context, topology, "control");
    if (!options.contains("listen")) options["listen"] = make_endpoint(Transport::tcp, "clients");
    listen_ = options["listen"];
    gateway_ = std::make_unique<ActorThread>(world_.context, topology, "gateway", make_gateway(options));
    gateway_->start();
  }
  ~Harness() { stop(); }

  void stop() {
    if (gateway_) gateway_->stop(10s);
  }

  zmq::context_t& context() { return world_.context; }
  const std::string& listen() const { return listen_; }
  Mailbox& control() { return *control_; }

  bool answer_heartbeats = true;
  bool scheduler_reads = true;  // false: the scheduler's mailbox fills up
  std::uint64_t heartbeats_seen = 0;
  bool cache_writer_answers_heartbeats = true;
  bool cache_writer_reads = true;  // false: the cache-writer's mailbox fills up
  std::uint64_t cache_writer_heartbeats = 0;

  // Takes what reaches the scheduler within the timeout, and what has reached the cache-writer.
  void pump(std::chrono::milliseconds timeout) {
    pump_cache_writer();
    if (!scheduler_reads) {
      std::this_thread::sleep_for(timeout);
      return;
    }
    auto message = scheduler_->receive(timeout);
    if (!message) return;
    if (const auto* beat = message->as<Heartbeat>()) {
      ++heartbeats_seen;
      if (answer_heartbeats) reply(*message, HeartbeatAck{beat->seq});
      return;
    }
    at_scheduler_.push_back(std::move(*message));
  }

  void pump_cache_writer() {
    while (cache_writer_reads) {
      auto message = cache_writer_->receive(0ms);
      if (!message) return;
      if (const auto* beat = message->as<Heartbeat>()) {
        ++cache_writer_heartbeats;
        if (cache_writer_answers_heartbeats) reply_from_cache_writer(*message, HeartbeatAck{beat->seq});
        continue;
      }
      at_cache_writer_.push_back(std::move(*message));
    }
  }

  // The first message of kind T that reaches the cache-writer (heartbeats aside) within the timeout.
  template <typename T>
  std::optional<Message> expect_at_cache_writer(std::chrono::milliseconds timeout = 5s) {
    auto deadline = Clock::now() + timeout;
    while (true) {
      for (auto it = at_cache_writer_.begin(); it != at_cache_writer_.end(); ++it) {
        if (it->as<T>() != nullptr) {
          Message found = std::move(*it);
          at_cache_writer_.erase(it);
          return found;
        }
      }
      if (Clock::now() >= deadline) return std::nullopt;
      pump(10ms);
    }
  }

  void reply_from_cache_writer(const Message& to, Payload payload) {
    cache_writer_->send(to.envelope.from, std::move(payload),
                        SendOptions{to.envelope.correlation_id, to.envelope.request_id, {}});
  }

  // The first message of kind T that reaches the scheduler (heartbeats aside) within the timeout.
  template <typename T>
  std::optional<Message> expect(std::chrono::milliseconds timeout = 5s) {
    auto deadline = Clock::now() + timeout;
    while (true) {
      for (auto it = at_scheduler_.begin(); it != at_scheduler_.end(); ++it) {
        if (it->as<T>() != nullptr) {
          Message found = std::move(*it);
          at_scheduler_.erase(it);
          return found;
        }
      }
      if (Clock::now() >= deadline) return std::nullopt;
      pump(10ms);
    }
  }

  // Everything but heartbeats that reached the scheduler within the window.
  std::vector<Message> collect(std::chrono::milliseconds window) {
    auto deadline = Clock::now() + window;
    while (Clock::now() < deadline) pump(10ms);
    std::vector<Message> all(std::make_move_iterator(at_scheduler_.begin()), std::make_move_iterator(at_scheduler_.end()));
    at_scheduler_.clear();
    return all;
  }

  // The scheduler's answers about a request.
  void token(std::uint64_t request_id, TokenEvent event) {
    scheduler_->send("gateway", std::move(event), SendOptions{0, request_id, {}});
  }
  void finish(std::uint64_t request_id, FinalEvent event) {
    scheduler_->send("gateway", std::move(event), SendOptions{0, request_id, {}});
  }
  void reply(const Message& to, Payload payload) {
    scheduler_->send(to.envelope.from, std::move(payload),
                     SendOptions{to.envelope.correlation_id, to.envelope.request_id, {}});
  }
  void send_from_scheduler(Payload payload, SendOptions options) {
    scheduler_->send("gateway", std::move(payload), std::move(options));
  }

 private:
  testing::World world_;
  std::unique_ptr<Mailbox> scheduler_;
  std::unique_ptr<Mailbox> cache_writer_;
  std::unique_ptr<Mailbox> control_;
  std::unique_ptr<ActorThread> gateway_;
  std::string listen_;
  std::deque<Message> at_scheduler_;
  std::deque<Message> at_cache_writer_;
};

class Client {
 public:
  Client(Harness& harness, zmq::socket_type type = zmq::socket_type::dealer)
      : harness_(harness), socket_(harness.context(), type) {
    socket_.set(zmq::sockopt::linger, 0);
    socket_.connect(harness.listen());
  }

  void send(const json& request) { send_raw({packed(request)}); }
  void send_raw(const std::vector<std::string>& frames) {
    for (std::size_t i = 0; i < frames.size(); ++i) {
      socket_.send(zmq::buffer(frames[i]), i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
    }
  }

  // The next event (keepalives counted and skipped), pumping the scheduler meanwhile.
  std::optional<json> next(std::chrono::milliseconds timeout = 5s) {
    auto deadline = Clock::now() + timeout;
    while (Clock::now() < deadline) {
      zmq::pollitem_t item{socket_.handle(), 0, ZMQ_POLLIN, 0};
      zmq::poll(&item, 1, 5ms);
      zmq::message_t frame;
      while (socket_.recv(frame, zmq::recv_flags::dontwait)) {
        EXPECT_FALSE(frame.more()) << "an event is one frame";
        if (frame.size() == 0) {
          ++keepalives;
          continue;
        }
        return json::from_msgpack(frame.to_string_view());
      }
      harness_.pump(5ms);
    }
    return std::nullopt;
  }

  // Collects events until one is the final of `id`.
  std::vector<json> until_final(const json& id, std::chrono::milliseconds timeout = 5s) {
    std::vector<json> events;
    auto deadline = Clock::now() + timeout;
    while (Clock::now() < deadline) {
      auto event = next(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()));
      if (!event) break;
      events.push_back(*event);
      if ((*event)["event"] == "final" && (*event)["id"] == id) break;
    }
    return events;
  }

  void close() { socket_.close(); }

  int keepalives = 0;

 private:
  Harness& harness_;
  zmq::socket_t socket_;
};

// Opens a request and returns the Submit that reached the scheduler.
Message open_request(Harness& h, Client& client, const json& request) {
  client.send(request);
  auto submit = h.expect<Submit>();
  EXPECT_TRUE(submit.has_value()) << "no Submit for " << request.dump();
  return submit ? std::move(*submit) : Message{};
}

std::string code_of(const json& event) {
  if (event.contains("error") && event["error"].is_object()) return event["error"]["code"];
  return event.value("code", "");
}

TEST(GatewayTest, StreamsTokensThenTheFinalAndForwardsEachPromptKind) {
  Harness h;
  Client client(h);

  client.send({{"op", "generate"}, {"id", "a"}, {"prompt", "Hello"}, {"model", "tiny"}, {"temperature", 0.25},
               {"top_k", 40}, {"seed", 7}, {"max_tokens", 3}, {"stop", {"\n"}}, {"logprobs", true},
               {"top_logprobs", 1}});
  auto submit = h.expect<Submit>();
  ASSERT_TRUE(submit.has_value());
  EXPECT_EQ(submit->envelope.from, "gateway");
  const std::uint64_t request_id = submit->envelope.request_id;
  EXPECT_NE(request_id, 0u);
  const Submit& s = *submit->as<Submit>();
  EXPECT_EQ(s.model, "tiny");
  EXPECT_EQ(s.prompt_kind, static_cast<std::uint8_t>(PromptKind::text));
  EXPECT_EQ(s.text, "Hello");
  EXPECT_FLOAT_EQ(s.sampling.temperature, 0.25f);
  EXPECT_EQ(s.sampling.top_k, 40);
  EXPECT_EQ(s.sampling.seed, 7u);
  EXPECT_EQ(s.sampling.max_tokens, 3);
  EXPECT_EQ(s.sampling.stop, std::vector<std::string>{"\n"});
  EXPECT_TRUE(s.sampling.logprobs);
  EXPECT_EQ(s.sampling.top_logprobs, 1);

  h.token(request_id, TokenEvent{{5}, "He", {{5, -0.5f, {5}, {-0.5f}}}});
  h.token(request_id, TokenEvent{{6, 7}, "llo", {{6, -1.0f, {6}, {-1.0f}}, {7, -1.5f, {7}, {-1.5f}}}});
  FinalEvent end = final_with(FinishReason::stop);
  end.stop = "\n";
  end.prompt_tokens = 2;
  end.completion_tokens = 3;
  end.cached_tokens = 1;
  end.queue_ns = 1'500'000;
  end.ttft_ns = 4'000'000;
  end.total_ns = 9'000'000;
  h.finish(request_id, end);

  auto events = client.until_final("a");
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0], (json{{"event", "token"}, {"id", "a"}, {"tokens", {5}}, {"text", "He"},
                             {"logprobs", {{{"token", 5}, {"logprob", -0.5}, {"top", {{5, -0.5}}}}}}}));
  EXPECT_EQ(events[1]["tokens"], (json{6, 7}));
  EXPECT_EQ(events[1]["text"], "llo");
  const json& final_event = events[2];
  EXPECT_EQ(final_event["finish_reason"], "stop");
  EXPECT_EQ(final_event["stop"], "\n");
  EXPECT_EQ(final_event["text"], "");
  EXPECT_EQ(final_event["tokens"], json::array());  // streamed already
  EXPECT_EQ(final_event["usage"], (json{{"prompt_tokens", 2}, {"completion_tokens", 3}, {"cached_tokens", 1}}));
  EXPECT_DOUBLE_EQ(final_event["timings"]["queue_ms"].get<double>(), 1.5);
  EXPECT_DOUBLE_EQ(final_event["timings"]["ttft_ms"].get<double>(), 4.0);
  EXPECT_DOUBLE_EQ(final_event["timings"]["total_ms"].get<double>(), 9.0);

  // Token ids and a chat, with integer ids; each its own request id.
  auto tokens = open_request(h, client, {{"op", "generate"}, {"id", 2}, {"tokens", {1, 2, 3}}});
  EXPECT_EQ(tokens.as<Submit>()->prompt_kind, static_cast<std::uint8_t>(PromptKind::tokens));
  EXPECT_EQ(tokens.as<Submit>()->tokens, (std::vector<std::int32_t>{1, 2, 3}));
  auto chat = open_request(h, client, {{"op", "generate"}, {"id", 3},
                                       {"messages", {{{"role", "user"}, {"content", "Hi"}}}}});
  EXPECT_EQ(chat.as<Submit>()->prompt_kind, static_cast<std::uint8_t>(PromptKind::chat));
  ASSERT_EQ(chat.as<Submit>()->chat.size(), 1u);
  EXPECT_EQ(chat.as<Submit>()->chat[0].content, "Hi");
  EXPECT_NE(tokens.envelope.request_id, chat.envelope.request_id);
  EXPECT_NE(tokens.envelope.request_id, request_id);

  h.finish(chat.envelope.request_id, final_with(FinishReason::length));
  h.finish(tokens.envelope.request_id, final_with(FinishReason::length));
  auto rest = client.until_final(2);
  ASSERT_EQ(rest.size(), 2u);
  EXPECT_EQ(rest[0]["id"], 3);
  EXPECT_EQ(rest[0]["finish_reason"], "length");
  EXPECT_EQ(rest[1]["id"], 2);
}

TEST(GatewayTest, NonStreamingClientGetsEverythingInTheFinal) {
  Harness h;
  Client client(h);
  json request = generate("quiet", "Hi", false);
  request["logprobs"] = true;
  auto submit = open_request(h, client, request);
  const std::uint64_t request_id = submit.envelope.request_id;
  h.token(request_id, TokenEvent{{10}, "Hel", {{10, -0.1f, {}, {}}}});
  h.token(request_id, TokenEvent{{11}, "", {{11, -0.2f, {}, {}}}});
  h.token(request_id, TokenEvent{{12}, "lo", {{12, -0.3f, {}, {}}}});
  h.finish(request_id, final_with(FinishReason::length, " w"));

  auto events = client.until_final("quiet");
  ASSERT_EQ(events.size(), 1u) << "no token events for a client that does not stream";
  EXPECT_EQ(events[0]["finish_reason"], "length");
  EXPECT_EQ(events[0]["text"], "Hello w");  // the held-back text last
  EXPECT_EQ(events[0]["tokens"], (json{10, 11, 12}));
  ASSERT_EQ(events[0]["logprobs"].size(), 3u);
  EXPECT_EQ(events[0]["logprobs"][2]["token"], 12);
}

TEST(GatewayTest, MalformedFramesAreAnsweredAndServingGoesOn) {
  Harness h;
  Client client(h);
  struct Case {
    std::string name;
    std::vector<std::string> frames;
    std::string event;  // "error" or "final"
    std::string code;
  };
  std::string huge_declared = "\x83\xa2op\xa8generate\xa2id\x01\xa6tokens\xdd\xff\xff\xff\xff";
  std::vector<Case> cases = {
      {"not msgpack", {"\xc1\xc1"}, "error", "malformed"},
      {"not a map", {packed(json::array({"generate"}))}, "error", "malformed"},
      {"unknown op", {packed({{"op", "fly"}, {"id", 1}})}, "error", "malformed"},
      {"missing id", {packed({{"op", "generate"}, {"prompt", "x"}})}, "error", "malformed"},
      {"unknown key", {packed({{"op", "generate"}, {"id", 1}, {"prompt", "x"}, {"colour", "red"}})}, "final",
       "malformed"},
      {"wrong type", {packed({{"op", "generate"}, {"id", 2}, {"prompt", "x"}, {"top_k", "many"}})}, "final",
       "malformed"},
      {"out of range", {packed({{"op", "generate"}, {"id", 3}, {"prompt", "x"}, {"top_p", 0}})}, "final",
       "invalid_request"},
      {"huge array", {huge_declared}, "error", "malformed"},
      {"too many tokens",
       {packed({{"op", "generate"}, {"id", 4}, {"tokens", std::vector<int>((1 << 18) + 1, 1)}})}, "final",
       "invalid_request"},
      {"over the frame limit", {packed(generate(5, std::string(1'200'000, 'a')))}, "error", "malformed"},
      {"extra frames", {packed(generate(6, "x")), packed(generate(7, "y"))}, "error", "malformed"},
      {"nonempty second frame", {"junk", packed(generate(8, "x"))}, "error", "malformed"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    client.send_raw(c.frames);
    auto event = client.next();
    ASSERT_TRUE(event.has_value());
    EXPECT_EQ((*event)["event"], c.event) << event->dump();
    EXPECT_EQ(code_of(*event), c.code) << event->dump();
  }
  // A frame over ZMQ_MAXMSGSIZE costs its sender the connection, and nobody else anything.
  {
    Client flood(h);
    flood.send(generate(1, std::string(5 << 20, 'z')));
    EXPECT_FALSE(flood.next(300ms).has_value());
  }
  // None of them reached the scheduler; a good request still goes through.
  auto submit = open_request(h, client, generate("good", "fine"));
  EXPECT_EQ(submit.as<Submit>()->text, "fine");
  h.finish(submit.envelope.request_id, final_with(FinishReason::stop, "ok"));
  auto events = client.until_final("good");
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back()["text"], "ok");
  EXPECT_TRUE(h.collect(100ms).empty());
}

TEST(GatewayTest, DuplicateOpenIdIsRefusedAndTheOriginalGoesOn) {
  Harness h;
  Client client(h);
  auto first = open_request(h, client, generate(7, "one"));
  client.send(generate(7, "two"));
  auto refused = client.next();
  ASSERT_TRUE(refused.has_value());
  EXPECT_EQ((*refused)["event"], "final");
  EXPECT_EQ((*refused)["id"], 7);
  EXPECT_EQ(code_of(*refused), "invalid_request");
  EXPECT_NE((*refused)["error"]["message"].get<std::string>().find("already open"), std::string::npos);

  // Another client may use the same id.
  Client other(h);
  auto theirs = open_request(h, other, generate(7, "theirs"));
  EXPECT_NE(theirs.envelope.request_id, first.envelope.request_id);

  h.finish(first.envelope.request_id, final_with(FinishReason::stop, "first"));
  auto events = client.until_final(7);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0]["text"], "first");
  // Once finished, the id is free again.
  auto again = open_request(h, client, generate(7, "three"));
  EXPECT_EQ(again.as<Submit>()->text, "three");
}

TEST(GatewayTest, AbortIsForwardedWithTheRequestId) {
  Harness h;
  Client client(h);
  auto keep = open_request(h, client, generate("keep", "a"));
  auto stop = open_request(h, client, generate("stop", "b"));
  client.send({{"op", "abort"}, {"id", "stop"}});
  auto abort = h.expect<Abort>();
  ASSERT_TRUE(abort.has_value());
  EXPECT_EQ(abort->envelope.request_id, stop.envelope.request_id);
  EXPECT_EQ(abort->as<Abort>()->reason, static_cast<std::uint8_t>(AbortReason::client));

  // An id that is not open is ignored.
  client.send({{"op", "abort"}, {"id", "never"}});
  EXPECT_FALSE(h.expect<Abort>(300ms).has_value());

  h.finish(stop.envelope.request_id, final_with(FinishReason::abort));
  auto events = client.until_final("stop");
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0]["finish_reason"], "abort");
  h.finish(keep.envelope.request_id, final_with(FinishReason::stop));
  EXPECT_EQ(client.until_final("keep").size(), 1u);
}

TEST(GatewayTest, ClientThatDisconnectsHasItsRequestsAborted) {
  Harness h;
  Client streaming(h);
  Client quiet(h);
  auto streamed = open_request(h, streaming, generate("s", "a", true));
  auto gathered = open_request(h, quiet, generate("q", "b", false));
  // The streaming client saw a token: it is connected and reading.
  h.token(streamed.envelope.request_id, TokenEvent{{1}, "x", {}});
  ASSERT_TRUE(streaming.next().has_value());

  auto closed_at = Clock::now();
  streaming.close();
  quiet.close();
  // The streaming request learns it at its next token; the quiet one from the keepalive.
  h.token(streamed.envelope.request_id, TokenEvent{{2}, "y", {}});
  std::map<std::uint64_t, double> aborted_after_s;
  while (aborted_after_s.size() < 2 && Clock::now() - closed_at < 3s) {
    auto abort = h.expect<Abort>(100ms);
    if (!abort) continue;
    EXPECT_EQ(abort->as<Abort>()->reason, static_cast<std::uint8_t>(AbortReason::client_gone));
    aborted_after_s[abort->envelope.request_id] = std::chrono::duration<double>(Clock::now() - closed_at).count();
  }
  ASSERT_EQ(aborted_after_s.size(), 2u);
  EXPECT_LT(aborted_after_s[streamed.envelope.request_id], 1.0);
  EXPECT_LT(aborted_after_s[gathered.envelope.request_id], 1.0);

  // Their last events are dropped, and the gateway forgets them at their finals.
  h.token(streamed.envelope.request_id, TokenEvent{{3}, "z", {}});
  h.finish(streamed.envelope.request_id, final_with(FinishReason::abort));
  h.finish(gathered.envelope.request_id, final_with(FinishReason::abort));
  Client asker(h);
  asker.send({{"op", "status"}});
  auto query = h.expect<StatusQuery>();
  ASSERT_TRUE(query.has_value());
  h.reply(*query, StatusReport{});
  auto status = asker.next();
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ((*status)["gateway_requests"], 0);
}

TEST(GatewayTest, SilentSchedulerFailsOpenRequestsWithUnavailable) {
  Harness h;
  Client client(h);
  auto submit = open_request(h, client, generate("w", "wait", false));
  h.token(submit.envelope.request_id, TokenEvent{{4}, "so", {}});

  h.answer_heartbeats = false;  // the scheduler's process "dies"
  auto silent_from = Clock::now();
  auto events = client.until_final("w", 3s);
  double after_s = std::chrono::duration<double>(Clock::now() - silent_from).count();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0]["finish_reason"], "error");
  EXPECT_EQ(code_of(events[0]), "unavailable");
  EXPECT_NE(events[0]["error"]["message"].get<std::string>().find("has not answered"), std::string::npos);
  EXPECT_EQ(events[0]["tokens"], (json{4}));  // what it had is not lost
  EXPECT_GT(after_s, 0.5);
  EXPECT_LT(after_s, 1.25);
  // The scheduler is told to drop it, in case it is only slow.
  auto abort = h.expect<Abort>(1s);
  ASSERT_TRUE(abort.has_value());
  EXPECT_EQ(abort->envelope.request_id, submit.envelope.request_id);

  // While it stays silent, new work is refused at once.
  auto asked = Clock::now();
  client.send(generate("x", "again"));
  auto refused = client.next(1s);
  ASSERT_TRUE(refused.has_value());
  EXPECT_EQ(code_of(*refused), "unavailable");
  EXPECT_LT(Clock::now() - asked, 200ms);
  EXPECT_FALSE(h.expect<Submit>(100ms).has_value());

  // Back again: requests flow once the gateway has heard from it.
  h.answer_heartbeats = true;
  bool flowed = false;
  for (int attempt = 0; attempt < 20 && !flowed; ++attempt) {
    client.send(generate("y" + std::to_string(attempt), "back"));
    flowed = h.expect<Submit>(300ms).has_value();
    if (!flowed) {
      auto refusal = client.next(100ms);
      ASSERT_TRUE(refusal.has_value());
      EXPECT_EQ(code_of(*refusal), "unavailable");
    }
  }
  EXPECT_TRUE(flowed);
}

TEST(GatewayTest, StatusRoundTrip) {
  Harness h;
  Client client(h);
  auto submit = open_request(h, client, generate(1, "busy"));
  client.send({{"op", "status"}, {"id", "st"}, {"trim", true}});
  auto query = h.expect<StatusQuery>();
  ASSERT_TRUE(query.has_value());
  EXPECT_TRUE(query->as<StatusQuery>()->trim);
  EXPECT_NE(query->envelope.correlation_id, 0u);
  StatusReport report;
  report.models = {"tiny"};
  report.running = 1;
  report.kv_pages = 32;
  report.executor_ready = true;
  report.pool.active_by_owner = {{"kv", 4096}};
  h.reply(*query, report);
  auto status = client.next();
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ((*status)["event"], "status");
  EXPECT_EQ((*status)["id"], "st");
  EXPECT_EQ((*status)["models"], json{"tiny"});
  EXPECT_EQ((*status)["running"], 1);
  EXPECT_EQ((*status)["kv_pages"], 32);
  EXPECT_EQ((*status)["executor_ready"], true);
  EXPECT_EQ((*status)["pool"]["active_by_owner"]["kv"], 4096);
  EXPECT_EQ((*status)["gateway_requests"], 1);

  // A report nobody asked for is dropped.
  h.send_from_scheduler(StatusReport{}, SendOptions{999, 0, {}});
  EXPECT_FALSE(client.next(200ms).has_value());
}

TEST(GatewayTest, DrainRefusesNewWorkAndAnswersWhenTheLastRequestEnds) {
  Harness h;
  Client client(h);
  auto open = open_request(h, client, generate("old", "a"));
  h.control().send("gateway", Drain{false}, SendOptions{41, 0, {}});
  // The Drain and a client's frame come by different paths: give the Drain time to land.
  EXPECT_TRUE(h.collect(200ms).empty()) << "without abort_running, open requests run on";
  client.send(generate("new", "b"));
  auto refused = client.next();
  ASSERT_TRUE(refused.has_value());
  EXPECT_EQ((*refused)["finish_reason"], "error");
  EXPECT_EQ(code_of(*refused), "shutting_down");
  EXPECT_FALSE(h.expect<Submit>(100ms).has_value());
  EXPECT_FALSE(h.control().receive(100ms).has_value()) << "a request is still open";

  h.finish(open.envelope.request_id, final_with(FinishReason::stop, "done"));
  EXPECT_EQ(client.until_final("old").back()["text"], "done");
  auto drained = h.control().receive(2s);
  ASSERT_TRUE(drained.has_value());
  ASSERT_NE(drained->as<Drained>(), nullptr);
  EXPECT_EQ(drained->as<Drained>()->requests_served, 1u);
  EXPECT_EQ(drained->envelope.correlation_id, 41u);
}

TEST(GatewayTest, DrainWithNothingOpenAnswersAtOnce) {
  Harness h;
  h.control().send("gateway", Drain{true});
  auto drained = h.control().receive(2s);
  ASSERT_TRUE(drained.has_value());
  ASSERT_NE(drained->as<Drained>(), nullptr);
  EXPECT_EQ(drained->as<Drained>()->requests_served, 0u);
}

TEST(GatewayTest, DrainWithAbortRunningAbortsEveryOpenRequest) {
  Harness h;
  Client client(h);
  auto a = open_request(h, client, generate("a", "x"));
  auto b = open_request(h, client, generate("b", "y", false));
  h.control().send("gateway", Drain{true});
  std::set<std::uint64_t> aborted;
  for (int i = 0; i < 2; ++i) {
    auto abort = h.expect<Abort>();
    ASSERT_TRUE(abort.has_value());
    EXPECT_EQ(abort->as<Abort>()->reason, static_cast<std::uint8_t>(AbortReason::shutdown));
    aborted.insert(abort->envelope.request_id);
  }
  EXPECT_EQ(aborted, (std::set<std::uint64_t>{a.envelope.request_id, b.envelope.request_id}));
  client.send(generate("c", "z"));
  auto refused = client.next();
  ASSERT_TRUE(refused.has_value());
  EXPECT_EQ(code_of(*refused), "shutting_down");

  h.finish(a.envelope.request_id, final_with(FinishReason::abort));
  EXPECT_EQ(client.until_final("a").back()["finish_reason"], "abort");
  EXPECT_FALSE(h.control().receive(100ms).has_value());
  h.finish(b.envelope.request_id, final_with(FinishReason::abort));
  EXPECT_EQ(client.until_final("b").back()["finish_reason"], "abort");
  auto drained = h.control().receive(2s);
  ASSERT_TRUE(drained.has_value());
  ASSERT_NE(drained->as<Drained>(), nullptr);
  EXPECT_EQ(drained->as<Drained>()->requests_served, 2u);
}

TEST(GatewayTest, RequestsBeyondTheLimitAreBusy) {
  Harness h(ActorOptions{{"max_requests", "2"}});
  Client client(h);
  auto one = open_request(h, client, generate(1, "a"));
  open_request(h, client, generate(2, "b"));
  client.send(generate(3, "c"));
  auto refused = client.next();
  ASSERT_TRUE(refused.has_value());
  EXPECT_EQ((*refused)["id"], 3);
  EXPECT_EQ(code_of(*refused), "busy");
  h.finish(one.envelope.request_id, final_with(FinishReason::stop));
  client.until_final(1);
  open_request(h, client, generate(3, "c"));
}

TEST(GatewayTest, FullSchedulerMailboxIsBusy) {
  Harness h(ActorOptions{}, 4);  // the scheduler's mailbox takes a few messages
  h.scheduler_reads = false;
  Client client(h);
  for (int i = 0; i < 40; ++i) client.send(generate(i, "p"));
  // Well before the scheduler counts as silent (800 ms), the Submits it cannot take are busy.
  auto event = client.next(500ms);
  ASSERT_TRUE(event.has_value());
  EXPECT_EQ(code_of(*event), "busy");
  EXPECT_NE((*event)["error"]["message"].get<std::string>().find("queue is full"), std::string::npos);
  // The scheduler reads again: the requests it took run to their end.
  h.scheduler_reads = true;
  for (auto& submit : h.collect(200ms)) {
    if (submit.as<Submit>() != nullptr) h.finish(submit.envelope.request_id, final_with(FinishReason::stop));
  }
}

TEST(GatewayTest, ReqClientOverIpcGetsItsAnswer) {
  Harness h(ActorOptions{{"listen", make_endpoint(Transport::ipc, "gateway-clients")}});
  Client client(h, zmq::socket_type::req);
  auto submit = open_request(h, client, generate("r", "hi", false));
  h.token(submit.envelope.request_id, TokenEvent{{1, 2}, "ok", {}});
  h.finish(submit.envelope.request_id, final_with(FinishReason::stop));
  auto events = client.until_final("r");
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0]["text"], "ok");
  EXPECT_EQ(client.keepalives, 0) << "a REQ socket would take a keepalive for its answer";
}

TEST(GatewayTest, EventsForUnknownRequestsAreDropped) {
  Harness h;
  Client client(h);
  h.token(12345, TokenEvent{{1}, "x", {}});
  h.finish(12345, final_with(FinishReason::stop));
  EXPECT_FALSE(client.next(200ms).has_value());
  auto submit = open_request(h, client, generate("n", "x"));
  h.finish(submit.envelope.request_id, final_with(FinishReason::stop));
  EXPECT_EQ(client.until_final("n").size(), 1u);
}

TEST(GatewayTest, SchedulerErrorAboutASubmitFailsTheRequest) {
  Harness h;
  Client client(h);
  auto submit = open_request(h, client, generate("e", "x"));
  h.send_from_scheduler(Error{static_cast<std::uint16_t>(ErrorCode::invalid), "Submit.prompt_kind out of range",
                              static_cast<std::uint8_t>(Kind::Submit)},
                        SendOptions{0, submit.envelope.request_id, {}});
  auto events = client.until_final("e");
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(code_of(events[0]), "internal");
}

TEST(GatewayTest, StopEndsOpenRequestsWithShuttingDown) {
  Harness h;
  Client client(h);
  auto submit = open_request(h, client, generate("cut", "x"));
  h.stop();
  auto events = client.until_final("cut", 2s);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(code_of(events[0]), "shutting_down");
  auto abort = h.expect<Abort>(1s);
  ASSERT_TRUE(abort.has_value());
  EXPECT_EQ(abort->envelope.request_id, submit.envelope.request_id);
  EXPECT_EQ(abort->as<Abort>()->reason, static_cast<std::uint8_t>(AbortReason::shutdown));
}

// ---- the KV prefix cache's clear -----------------------------------------------------------------

const ActorOptions kWithCacheWriter{{"cache_writer", "cache-writer"}};

TEST(GatewayTest, ClearCacheReachesTheCacheWriterAndItsFiguresComeBackExactly) {
  Harness h(kWithCacheWriter);
  Client client(h);
  client.send({{"op", "clear_cache"}, {"id", "c1"}, {"tier", "ssd"}});
  auto clear = h.expect_at_cache_writer<ClearCache>();
  ASSERT_TRUE(clear.has_value());
  EXPECT_EQ(clear->envelope.from, "gateway");
  EXPECT_NE(clear->envelope.correlation_id, 0u);
  EXPECT_EQ(clear->as<ClearCache>()->tier, static_cast<std::uint8_t>(CacheTier::ssd));
  EXPECT_FALSE(client.next(100ms).has_value()) << "the answer waits for the cache-writer's";
  // Figures past 2^53 stay exact.
  h.reply_from_cache_writer(*clear, CacheCleared{static_cast<std::uint8_t>(CacheTier::ssd),
                                                 (std::uint64_t{1} << 60) + 3, 70000,
                                                 {"page 7: delete failed: permission denied"}});
  auto event = client.next();
  ASSERT_TRUE(event.has_value());
  EXPECT_EQ(*event, (json{{"event", "cache_cleared"},
                          {"id", "c1"},
                          {"tier", "ssd"},
                          {"released_bytes", (std::uint64_t{1} << 60) + 3},
                          {"released_pages", 70000},
                          {"problems", {"page 7: delete failed: permission denied"}}}));
  EXPECT_EQ((*event)["released_bytes"].get<std::uint64_t>(), (std::uint64_t{1} << 60) + 3);

  // The hot tier, with an integer id and then none.
  client.send({{"op", "clear_cache"}, {"id", 9}, {"tier", "hot"}});
  clear = h.expect_at_cache_writer<ClearCache>();
  ASSERT_TRUE(clear.has_value());
  EXPECT_EQ(clear->as<ClearCache>()->tier, static_cast<std::uint8_t>(CacheTier::hot));
  h.reply_from_cache_writer(*clear, CacheCleared{static_cast<std::uint8_t>(CacheTier::hot), 4096, 2, {}});
  event = client.next();
  ASSERT_TRUE(event.has_value());
  EXPECT_EQ(*event, (json{{"event", "cache_cleared"}, {"id", 9}, {"tier", "hot"}, {"released_bytes", 4096},
                          {"released_pages", 2}, {"problems", json::array()}}));
  client.send({{"op", "clear_cache"}, {"tier", "hot"}});
  clear = h.expect_at_cache_writer<ClearCache>();
  ASSERT_TRUE(clear.has_value());
  h.reply_from_cache_writer(*clear, CacheCleared{static_cast<std::uint8_t>(CacheTier::hot), 0, 0, {}});
  event = client.next();
  ASSERT_TRUE(event.has_value());
  EXPECT_FALSE(event->contains("id"));
  EXPECT_EQ((*event)["event"], "cache_cleared");

  // An answer nobody waits for (a second one, or a stranger's) is dropped.
  h.reply_from_cache_writer(*clear, CacheCleared{1, 5, 5, {}});
  EXPECT_FALSE(client.next(200ms).has_value());
  // A bad tier never reaches the cache-writer.
  client.send({{"op", "clear_cache"}, {"id", 3}, {"tier", "gpu"}});
  event = client.next();
  ASSERT_TRUE(event.has_value());
  EXPECT_EQ((*event)["event"], "error");
  EXPECT_EQ((*event)["id"], 3);
  EXPECT_EQ(code_of(*event), "invalid_request");
  EXPECT_FALSE(h.expect_at_cache_writer<ClearCache>(200ms).has_value());
}

TEST(GatewayTest, SilentCacheWriterFailsTheClearWithUnavailable) {
  Harness h(kWithCacheWriter);
  h.cache_writer_answers_heartbeats = false;  // its process "died" with the ClearCache queued
  Client client(h);
  const auto asked = Clock::now();
  client.send({{"op", "clear_cache"}, {"id", "c"}, {"tier", "hot"}});
  ASSERT_TRUE(h.expect_at_cache_writer<ClearCache>().has_value());
  auto event = client.next(3s);
  const double after_s = std::chrono::duration<double>(Clock::now() - asked).count();
  ASSERT_TRUE(event.has_value());
  EXPECT_EQ((*event)["event"], "error");
  EXPECT_EQ((*event)["id"], "c");
  EXPECT_EQ(code_of(*event), "unavailable");
  EXPECT_NE((*event)["message"].get<std::string>().find("cache-writer 'cache-writer' has not answered"),
            std::string::npos)
      << event->dump();
  EXPECT_GT(after_s, 0.75);  // unavailable_ms, 800 by default
  EXPECT_LT(after_s, 1.5);
  EXPECT_GT(h.cache_writer_heartbeats, 0u) << "a clear that waits has its cache-writer heartbeaten";
  // Serving goes on meanwhile: the scheduler is not the cache-writer.
  auto submit = open_request(h, client, generate("g", "x"));
  h.finish(submit.envelope.request_id, final_with(FinishReason::stop));
  EXPECT_EQ(client.until_final("g").size(), 1u);
}

TEST(GatewayTest, ACacheWriterThatAnswersHeartbeatsMayTakeItsTime) {
  // An SSD clear deletes a file per page: longer than unavailable_ms is not silence.
  Harness h(kWithCacheWriter);
  Client client(h);
  client.send({{"op", "clear_cache"}, {"id", "slow"}, {"tier", "ssd"}});
  auto clear = h.expect_at_cache_writer<ClearCache>();
  ASSERT_TRUE(clear.has_value());
  EXPECT_FALSE(client.next(1500ms).has_value()) << "failed while the cache-writer answered its heartbeats";
  EXPECT_GT(h.cache_writer_heartbeats, 2u);
  h.reply_from_cache_writer(*clear, CacheCleared{static_cast<std::uint8_t>(CacheTier::ssd), 1 << 20, 16, {}});
  auto event = client.next();
  ASSERT_TRUE(event.has_value());
  EXPECT_EQ((*event)["event"], "cache_cleared");
  EXPECT_EQ((*event)["released_pages"], 16);
}

TEST(GatewayTest, ClearCacheWithoutACacheWriterIsAnInvalidRequest) {
  Harness h;  // no cache_writer option: the server runs none
  Client client(h);
  client.send({{"op", "clear_cache"}, {"id", 1}, {"tier", "hot"}});
  auto event = client.next();
  ASSERT_TRUE(event.has_value());
  EXPECT_EQ((*event)["event"], "error");
  EXPECT_EQ((*event)["id"], 1);
  EXPECT_EQ(code_of(*event), "invalid_request");
  EXPECT_NE((*event)["message"].get<std::string>().find("no cache-writer"), std::string::npos) << event->dump();
  EXPECT_FALSE(h.expect_at_cache_writer<ClearCache>(200ms).has_value());
}

TEST(GatewayTest, FullCacheWriterMailboxIsBusy) {
  Harness h(kWithCacheWriter, 4);  // the cache-writer's mailbox takes a few messages
  h.cache_writer_reads = false;
  Client client(h);
  for (int i = 0; i < 40; ++i) client.send({{"op", "clear_cache"}, {"id", i}, {"tier", "hot"}});
  // Well before the cache-writer counts as silent (800 ms), the clears it cannot take are busy.
  auto event = client.next(500ms);
  ASSERT_TRUE(event.has_value());
  EXPECT_EQ((*event)["event"], "error");
  EXPECT_EQ(code_of(*event), "busy");
  EXPECT_NE((*event)["message"].get<std::string>().find("cache-writer's queue is full"), std::string::npos)
      << event->dump();
}

TEST(GatewayTest, OptionsAreChecked) {
  EXPECT_THROW(make_gateway({{"port", "5555"}}), std::invalid_argument);
  EXPECT_THROW(make_gateway({{"max_requests", "lots"}}), std::invalid_argument);
  EXPECT_THROW(make_gateway({{"max_requests", "0"}}), std::invalid_argument);
  EXPECT_THROW(make_gateway({{"listen", "5555"}}), std::invalid_argument);
  EXPECT_THROW(make_gateway({{"heartbeat_ms", "500"}, {"unavailable_ms", "400"}}), std::invalid_argument);
  EXPECT_TRUE(make_gateway({{"keepalive_ms", "100"}, {"scheduler", "sched-2"}}) != nullptr);
  EXPECT_TRUE(make_gateway({{"enforcer", "enforcer"}, {"cache_writer", "cache-writer"}}) != nullptr);

  // A second gateway on a taken address fails to start, and says where.
  Harness h;
  auto topology = std::make_shared<Topology>();
  topology->add("gateway-2");
  ActorThread second(h.context(), topology, "gateway-2", make_gateway({{"listen", h.listen()}}));
  try {
    second.start();
    ADD_FAILURE() << "a second bind on " << h.listen() << " succeeded";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find(h.listen()), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace mqlm::actors
