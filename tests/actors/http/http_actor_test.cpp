// The http actor over real sockets, against scripted peers: it runs in an ActorThread; the
// scheduler and the cache-writer are Mailboxes that answer its heartbeats (unless a test has one
// fall silent) and show the test what it sent them. HTTP requests go through cpp-httplib's
// client on threads of their own, so that the test's thread plays the peers meanwhile. Last, the
// clears against the real cache-writer actor.
#include <gtest/gtest.h>

#include <deque>
#include <filesystem>
#include <future>
#include <thread>

#include <unistd.h>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "actors/cache_writer/cache_writer.hpp"
#include "actors/http/http.hpp"
#include "tests/actors/runtime/test_actors.hpp"

namespace mqlm::actors {
namespace {

using namespace messages;
using namespace std::chrono_literals;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr const char* kApiKey = "test-key";

struct HttpReply {
  int status = 0;  // 0: no answer at all
  json body;
};

// A scripted peer: a Mailbox that answers heartbeats and keeps everything else for the test.
class Peer {
 public:
  Peer(zmq::context_t& context, std::shared_ptr<const Topology> topology, const std::string& name)
      : mailbox_(context, std::move(topology), name) {}

  bool answers_heartbeats = true;
  bool reads = true;  // false: its mailbox fills up
  std::uint64_t heartbeats = 0;

  void pump() {
    while (reads) {
      auto message = mailbox_.receive(0ms);
      if (!message) return;
      if (const auto* beat = message->as<Heartbeat>()) {
        ++heartbeats;
        if (answers_heartbeats) reply(*message, HeartbeatAck{beat->seq});
        continue;
      }
      received_.push_back(std::move(*message));
    }
  }

  template <typename T>
  std::optional<Message> take() {
    for (auto it = received_.begin(); it != received_.end(); ++it) {
      if (it->as<T>() != nullptr) {
        Message found = std::move(*it);
        received_.erase(it);
        return found;
      }
    }
    return std::nullopt;
  }

  void reply(const Message& to, Payload payload) {
    mailbox_.send(to.envelope.from, std::move(payload),
                  SendOptions{to.envelope.correlation_id, to.envelope.request_id, {}});
  }

 private:
  Mailbox mailbox_;
  std::deque<Message> received_;
};

class Harness {
  testing::World world_;  // first: its context outlives every socket below

 public:
  // real_cache_writer: the cache-writer actor with these options runs instead of the scripted
  // one, and a Mailbox "executor" may spill pages to it.
  explicit Harness(ActorOptions options = {}, int mailbox_capacity = 1000,
                   std::optional<ActorOptions> real_cache_writer = std::nullopt) {
    world_.topology.mailbox_capacity = mailbox_capacity;
    world_.topology.send_capacity = std::min(mailbox_capacity, 100);
    world_.topology.add("http");
    world_.topology.add("scheduler");
    world_.topology.add("cache-writer");
    world_.topology.add("executor");
    world_.topology.add("enforcer");
    auto topology = world_.freeze();
    scheduler = std::make_unique<Peer>(world_.context, topology, "scheduler");
    enforcer = std::make_unique<Peer>(world_.context, topology, "enforcer");
    if (real_cache_writer) {
      executor = std::make_unique<Mailbox>(world_.context, topology, "executor");
      cache_writer_actor_ = std::make_unique<ActorThread>(world_.context, topology, "cache-writer",
                                                          make_cache_writer(*real_cache_writer));
      cache_writer_actor_->start();
    } else {
      cache_writer = std::make_unique<Peer>(world_.context, topology, "cache-writer");
    }
    // A free port found now may be taken before the actor binds it; a clash fails the start loudly.
    const std::string endpoint = make_endpoint(Transport::tcp, "http");
    port_ = std::stoi(endpoint.substr(endpoint.rfind(':') + 1));
    options["listen"] = "127.0.0.1:" + std::to_string(port_);
    options["api_key"] = kApiKey;
    http_ = std::make_unique<ActorThread>(world_.context, topology, "http", make_http(options));
    http_->start();
  }
  ~Harness() {
    http_->stop(10s);
    if (cache_writer_actor_) cache_writer_actor_->stop(10s);
  }

  std::unique_ptr<Peer> scheduler;
  std::unique_ptr<Peer> enforcer;      // scripted; the actor knows it with option enforcer=enforcer
  std::unique_ptr<Peer> cache_writer;  // the scripted one
  std::unique_ptr<Mailbox> executor;   // with the real one

  // A POST on a thread of its own; with_key: with the API key.
  std::future<HttpReply> post(std::string path, bool with_key = true) {
    return std::async(std::launch::async, [this, path = std::move(path), with_key] {
      httplib::Client client("127.0.0.1", port_);
      client.set_read_timeout(20s);
      httplib::Headers headers;
      if (with_key) headers.emplace("Authorization", std::string("Bearer ") + kApiKey);
      auto result = client.Post(path, headers, std::string(), "application/json");
      HttpReply reply;
      if (!result) return reply;
      reply.status = result->status;
      reply.body = json::parse(result->body, nullptr, false);
      return reply;
    });
  }

  // Plays the peers until the reply comes (or the timeout passes: status 0).
  HttpReply wait(std::future<HttpReply>& reply, std::chrono::milliseconds timeout = 10s) {
    const auto deadline = Clock::now() + timeout;
    while (reply.wait_for(5ms) != std::future_status::ready) {
      if (Clock::now() >= deadline) return {};
      pump();
    }
    return reply.get();
  }

  // The first T that reaches `peer` within the timeout.
  template <typename T>
  std::optional<Message> expect_at(Peer& peer, std::chrono::milliseconds timeout = 5s) {
    const auto deadline = Clock::now() + timeout;
    while (Clock::now() < deadline) {
      pump();
      if (auto found = peer.take<T>()) return found;
      std::this_thread::sleep_for(5ms);
    }
    return std::nullopt;
  }
  template <typename T>
  std::optional<Message> expect_at_cache_writer(std::chrono::milliseconds timeout = 5s) {
    return expect_at<T>(*cache_writer, timeout);
  }

  void pump() {
    scheduler->pump();
    enforcer->pump();
    if (cache_writer) cache_writer->pump();
  }

 private:
  std::unique_ptr<ActorThread> cache_writer_actor_;
  std::unique_ptr<ActorThread> http_;
  int port_ = 0;
};

const ActorOptions kWithCacheWriter{{"cache_writer", "cache-writer"}};

TEST(HttpActorTest, ClearReachesTheCacheWriterAndItsFiguresComeBackExactly) {
  Harness h(kWithCacheWriter);
  auto pending = h.post("/api/hot-cache/clear");
  auto clear = h.expect_at_cache_writer<ClearCache>();
  ASSERT_TRUE(clear.has_value());
  EXPECT_EQ(clear->envelope.from, "http");
  EXPECT_NE(clear->envelope.correlation_id, 0u);
  EXPECT_EQ(clear->as<ClearCache>()->tier, static_cast<std::uint8_t>(CacheTier::hot));
  h.cache_writer->reply(*clear, CacheCleared{static_cast<std::uint8_t>(CacheTier::hot), 123456789012ull, 77, {}});
  HttpReply reply = h.wait(pending);
  EXPECT_EQ(reply.status, 200);
  EXPECT_EQ(reply.body, (json{{"tier", "hot"}, {"released_bytes", 123456789012ull}, {"released_pages", 77},
                              {"problems", json::array()}}));

  // The SSD tier, and what the cache-writer could not release; figures past 2^53 stay exact.
  pending = h.post("/api/ssd-cache/clear");
  clear = h.expect_at_cache_writer<ClearCache>();
  ASSERT_TRUE(clear.has_value());
  EXPECT_EQ(clear->as<ClearCache>()->tier, static_cast<std::uint8_t>(CacheTier::ssd));
  h.cache_writer->reply(*clear, CacheCleared{static_cast<std::uint8_t>(CacheTier::ssd), (std::uint64_t{1} << 60) + 1,
                                             4096, {"page 12: delete failed: permission denied"}});
  reply = h.wait(pending);
  EXPECT_EQ(reply.status, 200);
  EXPECT_EQ(reply.body, (json{{"tier", "ssd"},
                              {"released_bytes", (std::uint64_t{1} << 60) + 1},
                              {"released_pages", 4096},
                              {"problems", {"page 12: delete failed: permission denied"}}}));
  EXPECT_EQ(reply.body["released_bytes"].get<std::uint64_t>(), (std::uint64_t{1} << 60) + 1);
}

TEST(HttpActorTest, ClearWantsTheApiKey) {
  Harness h(kWithCacheWriter);
  for (const char* path : {"/api/hot-cache/clear", "/api/ssd-cache/clear"}) {
    SCOPED_TRACE(path);
    auto pending = h.post(path, false);
    HttpReply reply = h.wait(pending);
    EXPECT_EQ(reply.status, 401);
    EXPECT_EQ(reply.body["error"]["code"], "invalid_api_key");
  }
  EXPECT_FALSE(h.expect_at_cache_writer<ClearCache>(200ms).has_value());
}

TEST(HttpActorTest, SilentCacheWriterIsA503AfterUnavailableMs) {
  Harness h(kWithCacheWriter);
  h.cache_writer->answers_heartbeats = false;  // its process "died" with the ClearCache queued
  const auto asked = Clock::now();
  auto pending = h.post("/api/ssd-cache/clear");
  ASSERT_TRUE(h.expect_at_cache_writer<ClearCache>().has_value());
  HttpReply reply = h.wait(pending);
  const double after_s = std::chrono::duration<double>(Clock::now() - asked).count();
  EXPECT_EQ(reply.status, 503);
  EXPECT_EQ(reply.body["error"]["code"], "unavailable");
  EXPECT_NE(reply.body["error"]["message"].get<std::string>().find("cache-writer 'cache-writer' has not answered"),
            std::string::npos)
      << reply.body.dump();
  EXPECT_GT(after_s, 0.75);  // unavailable_ms, 800 by default
  EXPECT_LT(after_s, 2.0);
  EXPECT_GT(h.cache_writer->heartbeats, 0u) << "a clear that waits has its cache-writer heartbeaten";
}

TEST(HttpActorTest, ACacheWriterThatAnswersHeartbeatsMayTakeItsTime) {
  Harness h(kWithCacheWriter);
  auto pending = h.post("/api/ssd-cache/clear");
  auto clear = h.expect_at_cache_writer<ClearCache>();
  ASSERT_TRUE(clear.has_value());
  const auto until = Clock::now() + 1500ms;  // past unavailable_ms, heartbeats answered
  while (Clock::now() < until) {
    h.pump();
    std::this_thread::sleep_for(5ms);
  }
  ASSERT_NE(pending.wait_for(0ms), std::future_status::ready) << "answered before the cache-writer did";
  EXPECT_GT(h.cache_writer->heartbeats, 2u);
  h.cache_writer->reply(*clear, CacheCleared{static_cast<std::uint8_t>(CacheTier::ssd), 1 << 20, 16, {}});
  HttpReply reply = h.wait(pending);
  EXPECT_EQ(reply.status, 200);
  EXPECT_EQ(reply.body["released_pages"], 16);
}

TEST(HttpActorTest, FullCacheWriterMailboxIsA503Busy) {
  Harness h(kWithCacheWriter, 4);  // the cache-writer's mailbox takes a few messages
  h.cache_writer->reads = false;
  std::vector<std::future<HttpReply>> pending;
  for (int i = 0; i < 24; ++i) pending.push_back(h.post("/api/hot-cache/clear"));
  int busy = 0;
  for (auto& one : pending) {
    HttpReply reply = h.wait(one);
    EXPECT_EQ(reply.status, 503) << reply.body.dump();  // busy, or unavailable once the wait is over
    if (reply.body["error"]["code"] == "server_busy") {
      ++busy;
      EXPECT_NE(reply.body["error"]["message"].get<std::string>().find("cache-writer's queue is full"),
                std::string::npos);
    }
  }
  EXPECT_GT(busy, 0);
}

TEST(HttpActorTest, ClearWithoutACacheWriterIsA400) {
  Harness h;  // no cache_writer option: the server runs none
  auto pending = h.post("/api/hot-cache/clear");
  HttpReply reply = h.wait(pending);
  EXPECT_EQ(reply.status, 400);
  EXPECT_EQ(reply.body["error"]["type"], "invalid_request_error");
  EXPECT_NE(reply.body["error"]["message"].get<std::string>().find("no cache-writer"), std::string::npos)
      << reply.body.dump();
  EXPECT_FALSE(h.expect_at_cache_writer<ClearCache>(200ms).has_value());
}

// ---- against the real cache-writer ------------------------------------------------------------------

// Pages of `bytes` each, as the executor spills them.
void spill(Mailbox& executor, std::uint64_t first_key, int pages, std::size_t bytes) {
  KvPagesSpilled spilled{"m", 77, 2, bytes, {}};
  Frames blobs;
  for (int i = 0; i < pages; ++i) {
    const std::uint64_t key = first_key + static_cast<std::uint64_t>(i);
    spilled.pages.push_back(KvPageId{key, i == 0 ? 0 : key - 1, {i, i + 1}});
    blobs.emplace_back(bytes);
  }
  executor.send("cache-writer", std::move(spilled), SendOptions{0, 0, std::move(blobs)});
}

TEST(HttpActorTest, ClearsReachTheRealCacheWriter) {
  const std::filesystem::path ssd =
      std::filesystem::temp_directory_path() / ("mqlm-http-clear-" + std::to_string(::getpid()));
  std::filesystem::remove_all(ssd);
  {
    Harness h(kWithCacheWriter, 1000, ActorOptions{{"hot_bytes", "1048576"}, {"ssd_dir", ssd.string()}});
    spill(*h.executor, 100, 3, 4096);
    // The spill and the clear come by different paths: the clear retried until it sees the pages.
    HttpReply reply;
    for (int attempt = 0; attempt < 50; ++attempt) {
      auto pending = h.post("/api/hot-cache/clear");
      reply = h.wait(pending);
      if (reply.status != 200 || reply.body["released_pages"] != 0) break;
      std::this_thread::sleep_for(20ms);
    }
    EXPECT_EQ(reply.status, 200);
    EXPECT_EQ(reply.body, (json{{"tier", "hot"}, {"released_bytes", 3 * 4096}, {"released_pages", 3},
                                {"problems", json::array()}}));
    auto pending = h.post("/api/ssd-cache/clear");
    reply = h.wait(pending);
    EXPECT_EQ(reply.status, 200);
    EXPECT_EQ(reply.body, (json{{"tier", "ssd"}, {"released_bytes", 0}, {"released_pages", 0},
                                {"problems", json::array()}}));
  }
  std::filesystem::remove_all(ssd);

  // Without an SSD tier, its clear is answered with what is missing.
  Harness h(kWithCacheWriter, 1000, ActorOptions{{"hot_bytes", "1048576"}});
  auto pending = h.post("/api/ssd-cache/clear");
  HttpReply reply = h.wait(pending);
  EXPECT_EQ(reply.status, 200);
  EXPECT_EQ(reply.body["tier"], "ssd");
  ASSERT_EQ(reply.body["problems"].size(), 1u);
  EXPECT_NE(reply.body["problems"][0].get<std::string>().find("no SSD tier"), std::string::npos) << reply.body.dump();
}

// The enforcer answers an accepted unload twice: draining at once, unloaded at its end. A call
// without ?wait=true is answered with the first (202); one with it, with the second (200).
TEST(HttpActorTest, AnUnloadIsAnsweredAtOnceOrAtItsEndWhenItWaits) {
  Harness h(ActorOptions{{"enforcer", "enforcer"}});
  UnloadAnswer draining;
  draining.model = "a";
  draining.outcome = static_cast<std::uint8_t>(UnloadOutcome::draining);
  UnloadAnswer unloaded = draining;
  unloaded.outcome = static_cast<std::uint8_t>(UnloadOutcome::unloaded);
  unloaded.freed_bytes = 1234;

  auto at_once = h.post("/api/models/a/unload?if_idle=true");
  auto asked = h.expect_at<UnloadRequest>(*h.enforcer);
  ASSERT_TRUE(asked);
  EXPECT_EQ(asked->as<UnloadRequest>()->model, "a");
  EXPECT_TRUE(asked->as<UnloadRequest>()->if_idle);
  h.enforcer->reply(*asked, draining);
  HttpReply reply = h.wait(at_once);
  EXPECT_EQ(reply.status, 202) << reply.body.dump();
  EXPECT_EQ(reply.body["state"], "draining");
  h.enforcer->reply(*asked, unloaded);  // its caller is gone: nobody hears it

  auto waits = h.post("/api/models/a/unload?wait=true");
  asked = h.expect_at<UnloadRequest>(*h.enforcer);
  ASSERT_TRUE(asked);
  EXPECT_FALSE(asked->as<UnloadRequest>()->if_idle);
  h.enforcer->reply(*asked, draining);
  const auto until = Clock::now() + 200ms;
  while (Clock::now() < until) h.pump();
  ASSERT_NE(waits.wait_for(0ms), std::future_status::ready) << "answered before the unload ended";
  h.enforcer->reply(*asked, unloaded);
  reply = h.wait(waits);
  EXPECT_EQ(reply.status, 200) << reply.body.dump();
  EXPECT_EQ(reply.body["state"], "unloaded");
  EXPECT_EQ(reply.body["freed_bytes"], 1234);
}

TEST(HttpActorTest, OptionsAreChecked) {
  EXPECT_THROW(make_http({{"cache-writer", "x"}}), std::invalid_argument);
  EXPECT_TRUE(make_http({{"cache_writer", "cache-writer"}, {"enforcer", "enforcer"}}) != nullptr);
}

}  // namespace
}  // namespace mqlm::actors
