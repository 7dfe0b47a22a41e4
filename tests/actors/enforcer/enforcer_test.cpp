// The memory enforcer in its own thread, against mailboxes that play its peers by hand: an
// "executor" that answers LoadModel and UnloadModel with chosen bytes, a "scheduler" that answers
// AbortModel with ModelDrained and reports usage, and an "admin" front end that asks. The models
// are tiny GGUF files written by the project's own writer, so every estimate is known exactly.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>

#include <unistd.h>

#include "actors/runtime/actor_thread.hpp"
#include "actors/enforcer/enforcer.hpp"
#include "actors/runtime/mailbox.hpp"
#include "model/gguf/synthetic_model.hpp"

namespace mqlm::actors {
namespace {

using namespace messages;
using namespace std::chrono_literals;

constexpr std::uint32_t kPages = 64;
constexpr std::uint32_t kPageSize = 4;
// Long enough that no sample fires during a test: the tests feed ExecutorReports by hand.
constexpr const char* kNoSampling = "3600000";
constexpr auto kQuiet = 300ms;  // how long "nothing was sent" is watched for

model::gguf::ModelShape tiny_shape() {
  model::gguf::ModelShape shape;
  shape.layers = 2;
  shape.hidden = 128;
  shape.heads = 2;
  shape.kv_heads = 1;
  shape.head_dim = 64;
  shape.ffn = 256;
  shape.vocab = 320;
  shape.context = 256;
  return shape;
}

// The tensor bytes of an F32 llama model of this shape, counted by hand: embeddings and output,
// the final norm, and per layer two norms, Q, K, V, O and the three FFN matrices.
std::uint64_t hand_tensor_bytes(const model::gguf::ModelShape& s) {
  const std::uint64_t q_dim = std::uint64_t{s.heads} * s.head_dim;
  const std::uint64_t kv_dim = std::uint64_t{s.kv_heads} * s.head_dim;
  const std::uint64_t per_layer = 2 * s.hidden + 2 * s.hidden * q_dim + 2 * s.hidden * kv_dim + 3 * s.hidden * s.ffn;
  return 4 * (2 * std::uint64_t{s.vocab} * s.hidden + s.hidden + s.layers * per_layer);
}

std::filesystem::path temp_file(const std::string& stem) {
  return std::filesystem::temp_directory_path() / (stem + "-" + std::to_string(getpid()) + ".gguf");
}

const std::filesystem::path& model_path() {
  static const std::filesystem::path path = [] {
    const auto p = temp_file("enforcer-test");
    auto made = model::gguf::make_synthetic_model(tiny_shape(), gpu::WeightType::f32, 31, "enforcer-test");
    if (auto error = made.writer.write(p)) throw std::runtime_error("cannot write a test model: " + error->message());
    return p;
  }();
  return path;
}

const std::filesystem::path& garbage_path() {
  static const std::filesystem::path path = [] {
    const auto p = temp_file("enforcer-test-garbage");
    std::ofstream(p) << "this is not a GGUF file";
    return p;
  }();
  return path;
}

class RemoveModelFiles : public ::testing::Environment {
 public:
  void TearDown() override {
    std::filesystem::remove(model_path());
    std::filesystem::remove(garbage_path());
  }
};
const auto* const remove_model_files = ::testing::AddGlobalTestEnvironment(new RemoveModelFiles);

// Every model of the tests is the same file under another id, so each estimates the same.
std::uint64_t estimate() {
  return hand_tensor_bytes(tiny_shape()) + 2ull * kPages * kPageSize * 1 * 64 * 2 * 2;
}

std::string models_option(std::initializer_list<const char*> ids) {
  std::string option;
  for (const char* id : ids) option += std::string(option.empty() ? "" : ";") + id + "=" + model_path().string();
  return option;
}

// An enforcer in its own thread and the mailboxes around it.
class Rig {
 public:
  explicit Rig(ActorOptions options) {
    for (const char* name : {"enforcer", "executor", "scheduler", "admin"}) topology_.add(name);
    auto frozen = std::make_shared<const Topology>(topology_);
    executor = std::make_unique<Mailbox>(context_, frozen, "executor");
    scheduler = std::make_unique<Mailbox>(context_, frozen, "scheduler");
    admin = std::make_unique<Mailbox>(context_, frozen, "admin");
    options.try_emplace("kv_pages", std::to_string(kPages));
    options.try_emplace("page_size", std::to_string(kPageSize));
    options.try_emplace("sample_ms", kNoSampling);
    enforcer_ = std::make_unique<ActorThread>(context_, frozen, "enforcer", make_enforcer(options));
    enforcer_->start();
    // It samples the pool at once.
    EXPECT_FALSE(expect<ExecutorQuery>(*executor).trim);
  }
  ~Rig() { enforcer_->stop(); }

  // The next message in `box`, which must be a T.
  template <class T>
  static T expect(Mailbox& box, std::optional<Envelope>* envelope = nullptr) {
    auto message = box.receive(5s);
    if (!message) throw std::runtime_error(box.name() + " got nothing in 5 s");
    if (envelope != nullptr) *envelope = message->envelope;
    if (const T* payload = message->as<T>()) return *payload;
    throw std::runtime_error(box.name() + " got an unexpected " + std::string(kind_name(message->kind())));
  }
  // Whatever reaches `box` within kQuiet.
  static std::optional<Kind> anything(Mailbox& box) {
    auto message = box.receive(kQuiet);
    return message ? std::optional<Kind>(message->kind()) : std::nullopt;
  }

  LoadAnswer load_answer() { return expect<LoadAnswer>(*admin); }
  UnloadAnswer unload(const std::string& model, bool if_idle) {
    admin->send("enforcer", UnloadRequest{model, if_idle});
    return expect<UnloadAnswer>(*admin);
  }
  ModelsReport query(const std::string& model = "") {
    admin->send("enforcer", ModelsQuery{model});
    return expect<ModelsReport>(*admin);
  }
  ModelStatus status(const std::string& model) {
    ModelsReport report = query(model);
    if (report.models.size() != 1) throw std::runtime_error("no status for model " + model);
    return report.models[0];
  }
  // Usage from the scheduler, then a query from the scheduler too: its answer proves the usage
  // was handled (one sender's messages arrive in order).
  void usage(const std::string& model, std::uint32_t requests, std::int64_t last_used_ns) {
    scheduler->send("enforcer", ModelUsage{model, requests, last_used_ns});
    scheduler->send("enforcer", ModelsQuery{model});
    EXPECT_EQ(expect<ModelsReport>(*scheduler).models.at(0).requests, requests);
  }

  // The executor's part of a load: LoadModel in, ModelLoaded out; the scheduler is told.
  void executor_loads(const std::string& model, std::uint64_t bytes) {
    EXPECT_EQ(expect<LoadModel>(*executor).model, model);
    ModelLoaded loaded;
    loaded.model = model;
    loaded.ok = true;
    loaded.bytes = bytes;
    executor->send("enforcer", loaded);
    const auto forwarded = expect<ModelLoaded>(*scheduler);
    EXPECT_EQ(forwarded.model, model);
    EXPECT_TRUE(forwarded.ok);
    EXPECT_EQ(forwarded.bytes, bytes);
  }
  // The scheduler's and the executor's parts of the unload chain, from AbortModel on.
  void chain_unloads(const std::string& model, std::uint64_t held_after = 0) {
    EXPECT_EQ(expect<AbortModel>(*scheduler).model, model);
    scheduler->send("enforcer", ModelDrained{model, 0});
    EXPECT_EQ(expect<UnloadModel>(*executor).model, model);
    ModelUnloaded unloaded;
    unloaded.model = model;
    unloaded.was_loaded = true;
    unloaded.pool.held_bytes = held_after;
    executor->send("enforcer", unloaded);
    EXPECT_EQ(expect<ModelUnloaded>(*scheduler).model, model);
  }
  void load(const std::string& model, std::uint64_t bytes) {
    admin->send("enforcer", LoadRequest{model});
    executor_loads(model, bytes);
    EXPECT_EQ(load_answer().outcome, static_cast<std::uint8_t>(LoadOutcome::loaded));
  }
  void report(std::uint64_t held, const std::map<std::string, std::uint64_t>& owners = {}) {
    ExecutorReport report;
    report.pool.held_bytes = held;
    report.pool.active_by_owner = owners;
    executor->send("enforcer", report);
  }

  // Declared first, so destroyed last: a context closes only once its sockets have.
 private:
  zmq::context_t context_;
  Topology topology_;

 public:
  std::unique_ptr<Mailbox> executor;
  std::unique_ptr<Mailbox> scheduler;
  std::unique_ptr<Mailbox> admin;

 private:
  std::unique_ptr<ActorThread> enforcer_;
};

std::uint8_t outcome(LoadOutcome o) { return static_cast<std::uint8_t>(o); }
std::uint8_t outcome(UnloadOutcome o) { return static_cast<std::uint8_t>(o); }
std::uint8_t state(ModelState s) { return static_cast<std::uint8_t>(s); }

// ---- the estimate ------------------------------------------------------------------------------

TEST(EnforcerEstimate, IsEveryTensorPlusTheKvCache) {
  // 2 layers * 64 pages * 4 tokens * 1 KV head * 64 dims * (K, V) * 2 bytes.
  EXPECT_EQ(kv_cache_bytes(2, 1, 64, kPages, kPageSize), 131072u);
  EXPECT_EQ(hand_tensor_bytes(tiny_shape()), 1509888u);
  const auto estimated = estimate_model_bytes(model_path(), kPages, kPageSize);
  ASSERT_TRUE(std::holds_alternative<std::uint64_t>(estimated)) << std::get<std::string>(estimated);
  EXPECT_EQ(std::get<std::uint64_t>(estimated), 1509888u + 131072u);
  // Twice the pages, twice the cache; the weights stay.
  EXPECT_EQ(std::get<std::uint64_t>(estimate_model_bytes(model_path(), 2 * kPages, kPageSize)), 1509888u + 262144u);
}

TEST(EnforcerEstimate, AnUnreadableFileIsNamed) {
  const auto estimated = estimate_model_bytes(garbage_path(), kPages, kPageSize);
  ASSERT_TRUE(std::holds_alternative<std::string>(estimated));
  EXPECT_NE(std::get<std::string>(estimated).find(garbage_path().string()), std::string::npos);
  try {
    make_enforcer({{"models", "good=" + model_path().string() + ";bad=" + garbage_path().string()}});
    FAIL() << "an unreadable model was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("'bad'"), std::string::npos) << e.what();
  }
}

TEST(EnforcerOptions, BadOptionsAreNamed) {
  auto refused = [](ActorOptions options, const std::string& named) {
    options.try_emplace("models", models_option({"a", "b"}));
    try {
      make_enforcer(options);
      ADD_FAILURE() << "accepted, though " << named << " is bad";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(named), std::string::npos) << e.what();
    }
  };
  refused({{"soft", "1.5"}}, "soft=1.5");
  refused({{"soft", "0.9"}, {"hard", "0.8"}}, "soft");
  refused({{"pinned", "a,zz"}}, "'zz'");
  refused({{"preload", "q"}}, "'q'");
  refused({{"ceiling_bytes", "-1"}}, "ceiling_bytes");
  refused({{"celing_bytes", "10"}}, "celing_bytes");
  refused({{"models", "a"}}, "models=a");
  refused({{"ceiling_fraction", "0"}}, "ceiling_fraction=0");
  refused({{"ceiling_fraction", "1.2"}}, "ceiling_fraction=1.2");
  refused({{"ceiling_fraction", "0.5"}, {"ceiling_bytes", "10"}}, "give one");
  refused({{"aliases", "b=a"}}, "'b' is a model's id");
  refused({{"aliases", "fast=zz"}}, "'zz'");
  refused({{"aliases", "fast"}}, "'fast' is not NAME=VALUE");
  refused({{"ttl_s", "zz=5"}}, "'zz'");
  refused({{"ttl_s", "a=soon"}}, "ttl_s=soon");
  try {
    make_enforcer({});
    ADD_FAILURE() << "an enforcer without models was made";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("models="), std::string::npos) << e.what();
  }
}

// ---- admission ---------------------------------------------------------------------------------

TEST(Enforcer, AdmitsWithoutEvictionUnderALargeCeiling) {
  Rig rig({{"models", models_option({"a", "b"})}, {"ceiling_bytes", "1000000000"}});
  rig.admin->send("enforcer", LoadRequest{"a"}, SendOptions{41, 7, {}});
  rig.executor_loads("a", 1700000);
  std::optional<Envelope> envelope;
  const auto answer = Rig::expect<LoadAnswer>(*rig.admin, &envelope);
  EXPECT_EQ(answer.model, "a");
  EXPECT_EQ(answer.outcome, outcome(LoadOutcome::loaded));
  EXPECT_TRUE(answer.evicted.empty());
  EXPECT_EQ(envelope->correlation_id, 41u);  // answered as a reply to the request
  EXPECT_EQ(envelope->request_id, 7u);

  // Already loaded: answered at once, and the executor hears nothing.
  rig.admin->send("enforcer", LoadRequest{"a"});
  EXPECT_EQ(rig.load_answer().outcome, outcome(LoadOutcome::loaded));
  EXPECT_EQ(Rig::anything(*rig.executor), std::nullopt);

  rig.admin->send("enforcer", LoadRequest{"nope"});
  const auto unknown = rig.load_answer();
  EXPECT_EQ(unknown.outcome, outcome(LoadOutcome::unknown_model));
  EXPECT_NE(unknown.message.find("a, b"), std::string::npos) << unknown.message;
}

// A ceiling given as a fraction of the device's memory is set by the first report: a load asked
// before it waits for it, then is admitted against it (here one model fits, two do not).
TEST(Enforcer, ACeilingFractionIsSetFromTheFirstReport) {
  Rig rig({{"models", models_option({"a", "b"})}, {"ceiling_fraction", "0.5"}});
  rig.admin->send("enforcer", LoadRequest{"a"});
  EXPECT_EQ(Rig::anything(*rig.executor), std::nullopt);
  EXPECT_EQ(rig.query().ceiling_bytes, 0u);

  ExecutorReport report;
  report.memory.total_bytes = estimate() * 3;  // ceiling: 1.5 models
  report.memory.budget_bytes = report.memory.total_bytes;
  report.memory.process_rss_bytes = 12345;
  rig.executor->send("enforcer", report);
  rig.executor_loads("a", estimate());
  EXPECT_EQ(rig.load_answer().outcome, outcome(LoadOutcome::loaded));
  const auto after = rig.query();
  EXPECT_EQ(after.ceiling_bytes, estimate() * 3 / 2);
  EXPECT_DOUBLE_EQ(after.ceiling_fraction, 0.5);
  EXPECT_EQ(after.device.total_bytes, estimate() * 3);
  EXPECT_EQ(after.device.process_rss_bytes, 12345u);

  rig.admin->send("enforcer", LoadRequest{"b"});  // evicts a
  rig.chain_unloads("a");
  rig.executor_loads("b", estimate());
  const auto answer = rig.load_answer();
  EXPECT_EQ(answer.outcome, outcome(LoadOutcome::loaded));
  EXPECT_EQ(answer.evicted, std::vector<std::string>{"a"});
}

// A load that needs a busy model's memory: the model is aborted, drained and unloaded, and only
// the executor's ModelUnloaded lets the new load go to the executor.
TEST(Enforcer, EvictsABusyModelAndLoadsOnlyAfterItsUnload) {
  const std::uint64_t ceiling = estimate() * 3 / 2;  // one model fits, two do not
  Rig rig({{"models", models_option({"a", "b"})}, {"ceiling_bytes", std::to_string(ceiling)}});
  rig.load("a", estimate());
  rig.usage("a", 8, 1000);

  rig.admin->send("enforcer", LoadRequest{"b"}, SendOptions{5, 0, {}});
  const auto abort = Rig::expect<AbortModel>(*rig.scheduler);
  EXPECT_EQ(abort.model, "a");
  EXPECT_NE(abort.reason.find("room for b"), std::string::npos) << abort.reason;
  EXPECT_EQ(Rig::anything(*rig.executor), std::nullopt);  // no LoadModel b while a holds its memory
  EXPECT_EQ(rig.status("a").state, state(ModelState::draining));
  EXPECT_EQ(rig.status("b").state, state(ModelState::loading));

  rig.scheduler->send("enforcer", ModelDrained{"a", 8});
  EXPECT_EQ(Rig::expect<UnloadModel>(*rig.executor).model, "a");
  EXPECT_EQ(Rig::anything(*rig.executor), std::nullopt);  // still none before ModelUnloaded

  ModelUnloaded unloaded;
  unloaded.model = "a";
  unloaded.was_loaded = true;
  unloaded.freed_bytes = estimate();
  rig.executor->send("enforcer", unloaded);
  const auto forwarded = Rig::expect<ModelUnloaded>(*rig.scheduler);
  EXPECT_EQ(forwarded.model, "a");
  EXPECT_EQ(forwarded.freed_bytes, estimate());
  rig.executor_loads("b", estimate());

  const auto answer = rig.load_answer();
  EXPECT_EQ(answer.outcome, outcome(LoadOutcome::loaded));
  EXPECT_EQ(answer.evicted, std::vector<std::string>{"a"});
  EXPECT_EQ(rig.status("a").state, state(ModelState::unloaded));
  EXPECT_EQ(rig.status("a").unloads, 1u);
  EXPECT_EQ(rig.status("b").state, state(ModelState::loaded));
}

// A load that a request set off (the scheduler asks) evicts only idle models: one client's request
// does not end another's streams. It is refused with the figures, the busy model named, and goes
// through once that model is idle.
TEST(Enforcer, ALoadForARequestDoesNotEvictABusyModel) {
  const std::uint64_t ceiling = estimate() * 3 / 2;  // one model fits, two do not
  Rig rig({{"models", models_option({"a", "b"})}, {"ceiling_bytes", std::to_string(ceiling)}});
  rig.load("a", estimate());
  rig.usage("a", 2, 1000);

  rig.scheduler->send("enforcer", LoadRequest{"b"});
  const auto refused = Rig::expect<LoadAnswer>(*rig.scheduler);
  EXPECT_EQ(refused.outcome, outcome(LoadOutcome::insufficient_memory));
  EXPECT_EQ(refused.needed_bytes, estimate());
  EXPECT_EQ(refused.available_bytes, ceiling - estimate());  // a's bytes are kept for its requests
  EXPECT_TRUE(refused.pinned.empty());
  EXPECT_NE(refused.message.find("when a (serving requests now) is idle"), std::string::npos) << refused.message;
  EXPECT_EQ(Rig::anything(*rig.scheduler), std::nullopt);  // no AbortModel for a
  EXPECT_EQ(rig.status("a").state, state(ModelState::loaded));
  EXPECT_EQ(rig.status("b").state, state(ModelState::unloaded));

  rig.usage("a", 0, 2000);  // idle now: the next request's load evicts it
  rig.scheduler->send("enforcer", LoadRequest{"b"});
  rig.chain_unloads("a");
  rig.executor_loads("b", estimate());
  const auto loaded = Rig::expect<LoadAnswer>(*rig.scheduler);
  EXPECT_EQ(loaded.outcome, outcome(LoadOutcome::loaded));
  EXPECT_EQ(loaded.evicted, std::vector<std::string>{"a"});
}

// Idle models go before busy ones, and the least recently used first; no more than needed.
TEST(Enforcer, EvictsTheIdleLeastRecentlyUsedFirst) {
  const std::uint64_t ceiling = estimate() * 3 + estimate() / 2;  // three fit, four do not
  Rig rig({{"models", models_option({"a", "b", "c", "d"})}, {"ceiling_bytes", std::to_string(ceiling)}});
  rig.load("a", estimate());
  rig.load("b", estimate());
  rig.load("c", estimate());
  rig.usage("a", 0, 100);  // idle, used longest ago, but...
  rig.usage("b", 0, 200);
  rig.usage("c", 0, 300);
  rig.usage("a", 3, 400);  // ...now busy: b is the idle one used least recently
  rig.admin->send("enforcer", LoadRequest{"d"});
  rig.chain_unloads("b");
  rig.executor_loads("d", estimate());
  EXPECT_EQ(rig.load_answer().evicted, std::vector<std::string>{"b"});
  EXPECT_EQ(Rig::anything(*rig.scheduler), std::nullopt);  // nothing else was aborted
}

TEST(Enforcer, RefusesWhenPinnedModelsLeaveNoRoom) {
  const std::uint64_t ceiling = estimate() * 3 / 2;
  Rig rig({{"models", models_option({"a", "b"})},
           {"pinned", "a"},
           {"preload", "a"},
           {"ceiling_bytes", std::to_string(ceiling)}});
  // The preloaded model's real bytes come from the pool's owners in the first report.
  const std::uint64_t measured = estimate() + 4096;
  rig.report(measured, {{"weights:a", estimate() - 1000}, {"kv:a", 5096}});
  const auto a = rig.status("a");
  EXPECT_EQ(a.state, state(ModelState::loaded));
  EXPECT_EQ(a.bytes, measured);
  EXPECT_EQ(a.estimated_bytes, estimate());
  EXPECT_TRUE(a.pinned);

  rig.admin->send("enforcer", LoadRequest{"b"});
  const auto answer = rig.load_answer();
  EXPECT_EQ(answer.outcome, outcome(LoadOutcome::insufficient_memory));
  EXPECT_EQ(answer.needed_bytes, estimate());
  EXPECT_EQ(answer.available_bytes, ceiling - measured);
  EXPECT_EQ(answer.ceiling_bytes, ceiling);
  EXPECT_EQ(answer.pinned, std::vector<std::string>{"a"});
  EXPECT_TRUE(answer.evicted.empty());
  EXPECT_EQ(Rig::anything(*rig.scheduler), std::nullopt);  // nothing aborted
  EXPECT_EQ(Rig::anything(*rig.executor), std::nullopt);   // nothing loaded
  EXPECT_EQ(rig.status("b").state, state(ModelState::unloaded));
  EXPECT_EQ(rig.status("a").state, state(ModelState::loaded));
}

TEST(Enforcer, AFailedLoadIsAnsweredAndForwarded) {
  Rig rig({{"models", models_option({"a"})}});
  rig.admin->send("enforcer", LoadRequest{"a"});
  rig.admin->send("enforcer", LoadRequest{"a"});  // a second asker waits for the same load
  EXPECT_EQ(Rig::expect<LoadModel>(*rig.executor).model, "a");
  ModelLoaded failed;
  failed.model = "a";
  failed.error = "out of device memory";
  rig.executor->send("enforcer", failed);
  EXPECT_FALSE(Rig::expect<ModelLoaded>(*rig.scheduler).ok);
  for (int asker = 0; asker < 2; ++asker) {
    const auto answer = rig.load_answer();
    EXPECT_EQ(answer.outcome, outcome(LoadOutcome::failed));
    EXPECT_EQ(answer.message, "out of device memory");
  }
  const auto a = rig.status("a");
  EXPECT_EQ(a.state, state(ModelState::unloaded));
  EXPECT_EQ(a.last_problem, "out of device memory");
  EXPECT_EQ(a.loads, 0u);
}

// A load that fits only by evicting an unpinned model that is still loading is neither refused
// nor sent: it waits for that load to end, then evicts it.
TEST(Enforcer, ALoadWaitsForALoadUnderWayRatherThanBeingRefused) {
  const std::uint64_t ceiling = estimate() * 3 / 2;
  Rig rig({{"models", models_option({"a", "b"})}, {"ceiling_bytes", std::to_string(ceiling)}});
  rig.admin->send("enforcer", LoadRequest{"a"});
  EXPECT_EQ(Rig::expect<LoadModel>(*rig.executor).model, "a");
  rig.admin->send("enforcer", LoadRequest{"b"});
  EXPECT_EQ(Rig::anything(*rig.admin), std::nullopt);      // not refused
  EXPECT_EQ(Rig::anything(*rig.scheduler), std::nullopt);  // nothing evicted yet
  ModelLoaded loaded;
  loaded.model = "a";
  loaded.ok = true;
  loaded.bytes = estimate();
  rig.executor->send("enforcer", loaded);
  Rig::expect<ModelLoaded>(*rig.scheduler);
  EXPECT_EQ(rig.load_answer().outcome, outcome(LoadOutcome::loaded));  // a's asker
  rig.chain_unloads("a");                                              // then b evicts it
  rig.executor_loads("b", estimate());
  const auto answer = rig.load_answer();
  EXPECT_EQ(answer.outcome, outcome(LoadOutcome::loaded));
  EXPECT_EQ(answer.evicted, std::vector<std::string>{"a"});
}

// ---- unloading -------------------------------------------------------------------------------

TEST(Enforcer, UnloadRequestsAndTheChain) {
  Rig rig({{"models", models_option({"a", "b"})}, {"preload", "a"}});
  rig.usage("a", 2, 10);
  EXPECT_EQ(rig.unload("a", true).outcome, outcome(UnloadOutcome::busy));
  EXPECT_EQ(Rig::anything(*rig.scheduler), std::nullopt);
  rig.usage("a", 0, 20);
  EXPECT_EQ(rig.unload("a", true).outcome, outcome(UnloadOutcome::draining));
  const auto abort = Rig::expect<AbortModel>(*rig.scheduler);
  EXPECT_EQ(abort.model, "a");
  EXPECT_NE(abort.reason.find("admin"), std::string::npos) << abort.reason;

  // A second unload joins the first: both askers hear its end.
  const auto again = rig.unload("a", false);
  EXPECT_EQ(again.outcome, outcome(UnloadOutcome::draining));
  EXPECT_NE(again.message.find("already"), std::string::npos) << again.message;
  EXPECT_EQ(Rig::anything(*rig.scheduler), std::nullopt);  // no second AbortModel
  EXPECT_EQ(rig.unload("zz", false).outcome, outcome(UnloadOutcome::unknown_model));
  EXPECT_EQ(rig.unload("b", false).outcome, outcome(UnloadOutcome::not_loaded));

  rig.scheduler->send("enforcer", ModelDrained{"a", 0});
  EXPECT_EQ(Rig::expect<UnloadModel>(*rig.executor).model, "a");
  rig.scheduler->send("enforcer", ModelDrained{"a", 0});  // twice: ignored
  EXPECT_EQ(Rig::anything(*rig.executor), std::nullopt);

  ModelUnloaded unloaded;
  unloaded.model = "a";
  unloaded.was_loaded = true;
  unloaded.problems = {"kv cache: release failed"};
  unloaded.model_bytes = 5000;
  unloaded.freed_bytes = 4096;
  unloaded.held_after = 100;
  rig.executor->send("enforcer", unloaded);
  EXPECT_EQ(Rig::expect<ModelUnloaded>(*rig.scheduler).problems, unloaded.problems);
  for (int asker = 0; asker < 2; ++asker) {
    const auto done = Rig::expect<UnloadAnswer>(*rig.admin);
    EXPECT_EQ(done.outcome, outcome(UnloadOutcome::unloaded));
    EXPECT_EQ(done.model, "a");
    EXPECT_EQ(done.model_bytes, 5000u);
    EXPECT_EQ(done.freed_bytes, 4096u);
    EXPECT_EQ(done.held_after, 100u);
    EXPECT_EQ(done.problems, unloaded.problems);
    EXPECT_GE(done.total_ns, done.unload_ns);
    EXPECT_GE(done.unload_ns, 0);
  }
  const auto a = rig.status("a");
  EXPECT_EQ(a.state, state(ModelState::unloaded));
  EXPECT_EQ(a.unloads, 1u);
  EXPECT_EQ(a.bytes, estimate());
  EXPECT_NE(a.last_problem.find("kv cache: release failed"), std::string::npos) << a.last_problem;

  // Out of place: an unload nobody asked for is neither forwarded nor counted.
  unloaded.model = "b";
  rig.executor->send("enforcer", unloaded);
  EXPECT_EQ(Rig::anything(*rig.scheduler), std::nullopt);
  EXPECT_EQ(rig.status("b").unloads, 0u);
  // From a peer that does not send these: ignored.
  rig.admin->send("enforcer", ModelDrained{"a", 0});
  EXPECT_EQ(Rig::anything(*rig.executor), std::nullopt);
}

// A load asked for while the model drains waits for the unload, then loads it again.
TEST(Enforcer, ALoadWhileDrainingFollowsTheUnload) {
  Rig rig({{"models", models_option({"a"})}, {"preload", "a"}});
  EXPECT_EQ(rig.unload("a", false).outcome, outcome(UnloadOutcome::draining));
  rig.admin->send("enforcer", LoadRequest{"a"});
  rig.chain_unloads("a");
  EXPECT_EQ(Rig::expect<UnloadAnswer>(*rig.admin).outcome, outcome(UnloadOutcome::unloaded));
  rig.executor_loads("a", estimate());
  EXPECT_EQ(rig.load_answer().outcome, outcome(LoadOutcome::loaded));
  EXPECT_EQ(rig.status("a").loads, 1u);
}

// The pool is sampled every sample_ms; while a query is unanswered (an executor busy loading)
// samples are skipped rather than piled up in its mailbox, up to a few.
TEST(Enforcer, SamplesThePoolOnATimer) {
  Rig rig({{"models", models_option({"a"})}, {"sample_ms", "20"}});
  rig.report(0);  // answers the first query
  EXPECT_FALSE(Rig::expect<ExecutorQuery>(*rig.executor).trim);
  const auto unanswered_since = std::chrono::steady_clock::now();
  EXPECT_FALSE(Rig::expect<ExecutorQuery>(*rig.executor).trim);  // asked again only after skipped samples
  EXPECT_GE(std::chrono::steady_clock::now() - unanswered_since, 80ms);
}

// ---- the report and pressure -------------------------------------------------------------------

TEST(Enforcer, ModelsQueryFollowsALoadAndAnUnload) {
  Rig rig({{"models", models_option({"a", "b"})}, {"ceiling_bytes", "100000000"}});
  auto report = rig.query();
  ASSERT_EQ(report.models.size(), 2u);
  EXPECT_EQ(report.ceiling_bytes, 100000000u);
  EXPECT_EQ(report.soft_bytes, 85000000u);
  EXPECT_EQ(report.hard_bytes, 95000000u);
  EXPECT_EQ(report.used_bytes, 0u);
  EXPECT_EQ(report.models[0].state, state(ModelState::unloaded));

  rig.admin->send("enforcer", LoadRequest{"a"});
  EXPECT_EQ(Rig::expect<LoadModel>(*rig.executor).model, "a");
  EXPECT_EQ(rig.status("a").state, state(ModelState::loading));
  EXPECT_EQ(rig.query().used_bytes, estimate());
  ModelLoaded loaded;
  loaded.model = "a";
  loaded.ok = true;
  loaded.bytes = 2000000;
  rig.executor->send("enforcer", loaded);
  Rig::expect<ModelLoaded>(*rig.scheduler);
  rig.load_answer();
  auto a = rig.status("a");
  EXPECT_EQ(a.state, state(ModelState::loaded));
  EXPECT_EQ(a.bytes, 2000000u);
  EXPECT_EQ(a.loads, 1u);
  EXPECT_EQ(rig.query().used_bytes, 2000000u);

  EXPECT_EQ(rig.unload("a", false).outcome, outcome(UnloadOutcome::draining));
  EXPECT_EQ(rig.status("a").state, state(ModelState::draining));
  rig.chain_unloads("a");
  EXPECT_EQ(Rig::expect<UnloadAnswer>(*rig.admin).outcome, outcome(UnloadOutcome::unloaded));
  a = rig.status("a");
  EXPECT_EQ(a.state, state(ModelState::unloaded));
  EXPECT_EQ(a.bytes, estimate());
  EXPECT_EQ(a.unloads, 1u);
  EXPECT_EQ(rig.query().used_bytes, 0u);
}

TEST(Enforcer, SoftPressureEvictsAnIdleUnpinnedModel) {
  Rig rig({{"models", models_option({"a", "b", "c"})},
           {"preload", "a,b,c"},
           {"pinned", "c"},
           {"ceiling_bytes", "10000000"},
           {"soft", "0.5"},
           {"hard", "0.9"}});
  rig.usage("a", 3, 500);  // busy
  rig.usage("b", 0, 900);  // idle
  rig.report(6000000);     // above soft (5 MB), below hard (9 MB)
  EXPECT_TRUE(Rig::expect<ExecutorQuery>(*rig.executor).trim);
  EXPECT_EQ(Rig::anything(*rig.scheduler), std::nullopt);  // the trim may be enough: nothing evicted yet
  rig.report(6000000);     // the trimmed sample: still above soft
  const auto abort = Rig::expect<AbortModel>(*rig.scheduler);
  EXPECT_EQ(abort.model, "b");
  EXPECT_NE(abort.reason.find("soft"), std::string::npos) << abort.reason;
  auto report = rig.query();
  EXPECT_EQ(report.pressure, static_cast<std::uint8_t>(Pressure::soft));
  EXPECT_EQ(report.pool.held_bytes, 6000000u);

  // Another sample while b drains: no second trim in this sample, no second eviction.
  rig.report(6000000);
  EXPECT_EQ(Rig::anything(*rig.executor), std::nullopt);
  EXPECT_EQ(Rig::anything(*rig.scheduler), std::nullopt);

  rig.scheduler->send("enforcer", ModelDrained{"b", 0});
  EXPECT_EQ(Rig::expect<UnloadModel>(*rig.executor).model, "b");
  ModelUnloaded unloaded;
  unloaded.model = "b";
  unloaded.was_loaded = true;
  unloaded.pool.held_bytes = 4000000;  // below soft now
  rig.executor->send("enforcer", unloaded);
  Rig::expect<ModelUnloaded>(*rig.scheduler);
  report = rig.query();
  EXPECT_EQ(report.pressure, static_cast<std::uint8_t>(Pressure::none));
  EXPECT_EQ(rig.status("a").state, state(ModelState::loaded));  // busy a was left alone
  EXPECT_EQ(rig.status("c").state, state(ModelState::loaded));
  EXPECT_EQ(Rig::anything(*rig.scheduler), std::nullopt);
}

TEST(Enforcer, HardPressureEvictsTheLargestBusyModel) {
  Rig rig({{"models", models_option({"a", "b"})},
           {"preload", "a,b"},
           {"ceiling_bytes", "10000000"},
           {"soft", "0.5"},
           {"hard", "0.9"}});
  rig.usage("a", 1, 100);
  rig.usage("b", 1, 100);
  rig.report(9500000, {{"weights:a", 1000000}, {"weights:b", 3000000}, {"kv:b", 500000}});
  EXPECT_TRUE(Rig::expect<ExecutorQuery>(*rig.executor).trim);
  rig.report(9500000, {{"weights:a", 1000000}, {"weights:b", 3000000}, {"kv:b", 500000}});
  EXPECT_EQ(Rig::expect<AbortModel>(*rig.scheduler).model, "b");
  EXPECT_EQ(rig.query().pressure, static_cast<std::uint8_t>(Pressure::hard));
}

TEST(Enforcer, PressureWithEverythingPinnedIsNotedAndEvictsNothing) {
  Rig rig({{"models", models_option({"a", "b"})},
           {"preload", "a,b"},
           {"pinned", "a,b"},
           {"ceiling_bytes", "10000000"}});
  rig.report(9800000);  // above hard
  EXPECT_TRUE(Rig::expect<ExecutorQuery>(*rig.executor).trim);
  rig.report(9800000);  // and so after the trim
  auto report = rig.query();
  EXPECT_EQ(report.pressure, static_cast<std::uint8_t>(Pressure::hard));
  EXPECT_NE(report.pressure_note.find("pinned"), std::string::npos) << report.pressure_note;
  EXPECT_EQ(Rig::anything(*rig.scheduler), std::nullopt);
  // Samples that find the same: no loop of trims or aborts.
  rig.report(9800000);
  rig.report(9800000);
  EXPECT_EQ(Rig::anything(*rig.executor), std::nullopt);
  EXPECT_EQ(Rig::anything(*rig.scheduler), std::nullopt);
  // The episode ends when the pool is back under soft.
  rig.report(1000000);
  report = rig.query();
  EXPECT_EQ(report.pressure, static_cast<std::uint8_t>(Pressure::none));
  EXPECT_TRUE(report.pressure_note.empty());
}

TEST(Enforcer, TrimThatBringsThePoolBelowTheMarkEvictsNothing) {
  Rig rig({{"models", models_option({"a", "b"})},
           {"preload", "a,b"},
           {"ceiling_bytes", "10000000"},
           {"soft", "0.5"},
           {"hard", "0.9"}});
  rig.report(9500000);  // above hard, but most of it cached
  EXPECT_TRUE(Rig::expect<ExecutorQuery>(*rig.executor).trim);
  rig.report(3000000);  // the trimmed sample
  EXPECT_EQ(Rig::anything(*rig.scheduler), std::nullopt);
  EXPECT_EQ(rig.query().pressure, static_cast<std::uint8_t>(Pressure::none));
  EXPECT_EQ(rig.status("a").state, state(ModelState::loaded));
  EXPECT_EQ(rig.status("b").state, state(ModelState::loaded));
}

// A model alone above the mark would be reloaded by its next request and evicted again: it stays,
// and the status says the ceiling is too small for it.
TEST(Enforcer, SoleModelAboveTheMarkIsNotedAndNotEvicted) {
  Rig rig({{"models", models_option({"a", "b"})},
           {"preload", "a"},
           {"ceiling_bytes", "10000000"},
           {"soft", "0.5"},
           {"hard", "0.9"}});
  rig.usage("a", 2, 100);
  rig.report(9800000, {{"weights:a", 9000000}});
  EXPECT_TRUE(Rig::expect<ExecutorQuery>(*rig.executor).trim);
  rig.report(9800000, {{"weights:a", 9000000}});
  rig.report(9800000, {{"weights:a", 9000000}});
  EXPECT_EQ(Rig::anything(*rig.scheduler), std::nullopt);
  const auto report = rig.query();
  EXPECT_EQ(report.pressure, static_cast<std::uint8_t>(Pressure::hard));
  EXPECT_NE(report.pressure_note.find("model a alone"), std::string::npos) << report.pressure_note;
  EXPECT_NE(report.pressure_note.find("--memory-ceiling"), std::string::npos) << report.pressure_note;
  EXPECT_EQ(rig.status("a").state, state(ModelState::loaded));
}

// ---- aliases and the idle ttl ------------------------------------------------------------------

TEST(Enforcer, AnAliasNamesItsModelInEveryAdminRequest) {
  Rig rig({{"models", models_option({"a", "b"})}, {"aliases", "fast=a;quick=a"}});
  rig.admin->send("enforcer", LoadRequest{"fast"});
  rig.executor_loads("a", 1000);
  const LoadAnswer loaded = rig.load_answer();
  EXPECT_EQ(loaded.outcome, static_cast<std::uint8_t>(LoadOutcome::loaded));
  EXPECT_EQ(loaded.model, "a");
  const ModelStatus a = rig.status("quick");
  EXPECT_EQ(a.id, "a");
  EXPECT_EQ(a.aliases, (std::vector<std::string>{"fast", "quick"}));
  EXPECT_TRUE(rig.status("b").aliases.empty());
  const UnloadAnswer draining = rig.unload("quick", false);
  EXPECT_EQ(draining.model, "a");
  EXPECT_EQ(draining.outcome, outcome(UnloadOutcome::draining));
  EXPECT_EQ(rig.unload("slow", false).outcome, outcome(UnloadOutcome::unknown_model));
}

TEST(Enforcer, AModelIdleForItsTtlIsUnloadedAndABusyOneIsNot) {
  Rig rig({{"models", models_option({"a", "b"})}, {"preload", "a,b"}, {"ttl_s", "a=1"}, {"sample_ms", "50"}});
  EXPECT_EQ(rig.status("a").ttl_s, 1u);
  EXPECT_EQ(rig.status("b").ttl_s, 0u);
  rig.usage("a", 1, 100);  // busy past its ttl: kept
  std::this_thread::sleep_for(1500ms);
  EXPECT_EQ(Rig::anything(*rig.scheduler), std::nullopt);
  const auto idle_from = std::chrono::steady_clock::now();
  rig.usage("a", 0, 200);  // idle from now
  const AbortModel abort = Rig::expect<AbortModel>(*rig.scheduler);
  const auto waited = std::chrono::steady_clock::now() - idle_from;
  EXPECT_EQ(abort.model, "a");
  EXPECT_NE(abort.reason.find("ttl"), std::string::npos) << abort.reason;
  EXPECT_GE(waited, 1000ms);  // not before the ttl
  EXPECT_EQ(rig.status("a").state, state(ModelState::draining));
  EXPECT_EQ(rig.status("b").state, state(ModelState::loaded));  // no ttl: never
}

// A load request for a model that is loaded and idle starts its ttl over.
TEST(Enforcer, ALoadRequestForALoadedModelRestartsItsTtl) {
  Rig rig({{"models", models_option({"a", "b"})}, {"preload", "a"}, {"ttl_s", "a=1"}, {"sample_ms", "50"}});
  std::this_thread::sleep_for(700ms);
  const auto asked = std::chrono::steady_clock::now();
  rig.admin->send("enforcer", LoadRequest{"a"});
  EXPECT_EQ(rig.load_answer().outcome, outcome(LoadOutcome::loaded));
  const AbortModel abort = Rig::expect<AbortModel>(*rig.scheduler);
  EXPECT_EQ(abort.model, "a");
  EXPECT_GE(std::chrono::steady_clock::now() - asked, 1000ms);  // a second after the request, not after start
}

}  // namespace
}  // namespace mqlm::actors
