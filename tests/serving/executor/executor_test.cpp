// The executor against real things: a GGUF model written to disk, lavapipe's Vulkan device and
// ZeroMQ mailboxes. A test Mailbox named "scheduler" sends StepPlans and ExecutorQueries and
// reads the answers, as the scheduler will.
//
// Greedy tokens are checked against GpuModel::forward_argmax driven directly with the same
// batches (the same kernels on the same inputs: the same bits), so they must match exactly.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <numeric>
#include <thread>

#include <unistd.h>

#include "actors/actor_thread.hpp"
#include "actors/executor/executor.hpp"
#include "actors/mailbox.hpp"
#include "model/gguf/gguf_file.hpp"
#include "model/gguf/synthetic_model.hpp"
#include "model/llama/gguf_model.hpp"
#include "model/llama/gpu_model.hpp"
#include "tests/gpu/gpu_fixture.hpp"

namespace mqlm::actors {
namespace {

using namespace messages;

constexpr std::uint32_t kPageSize = 4;  // small, so short sequences cross pages
constexpr std::uint32_t kPages = 64;
constexpr std::uint32_t kVocab = 320;
constexpr std::uint32_t kContext = 256;

// Two layers, head dim 64 (the attention kernel's smallest), F32 weights: small enough that a
// step takes milliseconds on two CPU cores, exact enough that batching changes no argmax.
model::gguf::ModelShape tiny_shape() {
  model::gguf::ModelShape shape;
  shape.layers = 2;
  shape.hidden = 128;
  shape.heads = 2;
  shape.kv_heads = 1;
  shape.head_dim = 64;
  shape.ffn = 256;
  shape.vocab = kVocab;
  shape.context = kContext;
  return shape;
}

// The model file, written once for the whole binary; its name makes the executor's default
// model name.
const std::filesystem::path& model_path() {
  static const std::filesystem::path path = [] {
    auto p = std::filesystem::temp_directory_path() / ("executor-test-" + std::to_string(getpid()) + ".gguf");
    auto made = model::gguf::make_synthetic_model(tiny_shape(), gpu::WeightType::f32, 21, "executor-test");
    if (auto error = made.writer.write(p)) throw std::runtime_error("cannot write the test model: " + error->message());
    return p;
  }();
  return path;
}

std::string model_name() { return model_path().stem().string(); }

class RemoveModelFile : public ::testing::Environment {
 public:
  void TearDown() override { std::filesystem::remove(model_path()); }
};
const auto* const remove_model_file = ::testing::AddGlobalTestEnvironment(new RemoveModelFile);

// An executor in its own thread and the "scheduler" mailbox that talks to it.
class Rig {
 public:
  explicit Rig(ActorOptions extra = {}) {
    topology_.add("executor");
    topology_.add("scheduler");
    auto frozen = std::make_shared<const Topology>(topology_);
    ActorOptions options{{"model", model_path().string()},
                         {"kv_pages", std::to_string(kPages)},
                         {"page_size", std::to_string(kPageSize)}};
    for (auto& [key, value] : extra) options.insert_or_assign(key, value);
    mailbox_ = std::make_unique<Mailbox>(context_, frozen, "scheduler");
    executor_ = std::make_unique<ActorThread>(context_, frozen, "executor", make_executor(options));
    executor_->start();
  }
  ~Rig() { executor_->stop(); }

  std::uint64_t next_step() { return ++steps_; }

  StepResult step(const StepPlan& plan) {
    mailbox_->send("executor", plan, SendOptions{plan.step, 0, {}});
    auto result = receive<StepResult>();
    if (result.step != plan.step) throw std::runtime_error("the answer is for another step");
    return result;
  }
  ExecutorReport query(bool trim) {
    mailbox_->send("executor", ExecutorQuery{trim});
    return receive<ExecutorReport>();
  }

 private:
  template <class T>
  T receive() {
    auto message = mailbox_->receive(std::chrono::seconds(60));
    if (!message) throw std::runtime_error("no answer from the executor in 60 s");
    if (const T* answer = message->as<T>()) return *answer;
    throw std::runtime_error("unexpected answer: " + std::string(kind_name(message->kind())));
  }

  zmq::context_t context_;
  Topology topology_;
  std::unique_ptr<Mailbox> mailbox_;
  std::unique_ptr<ActorThread> executor_;
  std::uint64_t steps_ = 0;
};

struct Sequence {
  std::uint64_t id = 0;
  std::vector<std::int32_t> prompt;
  std::vector<std::uint32_t> pages;  // enough for the prompt and every generated token
};

// The pages that hold positions 0 .. end - 1: what a scheduler allocating lazily sends.
std::vector<std::uint32_t> table_for(const Sequence& s, std::uint64_t end) {
  auto n = static_cast<std::ptrdiff_t>((end + kPageSize - 1) / kPageSize);
  return {s.pages.begin(), s.pages.begin() + n};
}

model::SamplingParams greedy() {
  model::SamplingParams p;
  p.temperature = 0.0f;
  return p;
}

// Starts the sequences and prefills their prompts in one plan, then decodes them together one
// token per plan, feeding back what was sampled; every output is kept, per sequence.
std::vector<std::vector<OutputToken>> generate(Rig& rig, const std::vector<Sequence>& seqs,
                                               const model::SamplingParams& params, int count) {
  std::vector<std::vector<OutputToken>> out(seqs.size());
  for (int k = 0; k < count; ++k) {
    StepPlan plan;
    plan.step = rig.next_step();
    for (const Sequence& s : seqs) {
      const auto prompt_size = static_cast<std::uint32_t>(s.prompt.size());
      if (k == 0) {
        plan.starts.push_back({s.id, params, s.prompt});
        plan.sequences.push_back({s.id, 0, s.prompt, table_for(s, prompt_size), true});
      } else {
        const std::uint32_t position = prompt_size + static_cast<std::uint32_t>(k) - 1;
        const std::int32_t last = out[&s - seqs.data()].back().token;
        plan.sequences.push_back({s.id, position, {last}, table_for(s, position + 1), true});
      }
    }
    StepResult result = rig.step(plan);
    if (result.error != 0) throw std::runtime_error("step " + std::to_string(plan.step) + ": " + result.message);
    if (result.tokens.size() != seqs.size()) throw std::runtime_error("a token per sequence was expected");
    for (std::size_t i = 0; i < seqs.size(); ++i) {
      if (result.tokens[i].sequence != seqs[i].id) throw std::runtime_error("tokens out of plan order");
      out[i].push_back(result.tokens[i]);
    }
  }
  return out;
}

std::vector<std::int32_t> tokens_of(const std::vector<OutputToken>& outputs) {
  std::vector<std::int32_t> tokens;
  for (const auto& o : outputs) tokens.push_back(o.token);
  return tokens;
}

// The same generation with GpuModel::forward_argmax called directly on the test's own device.
std::vector<std::int32_t> direct_greedy(const Sequence& s, int count) {
  auto opened = model::gguf::GgufFile::open(model_path());
  const auto& file = std::get<model::gguf::GgufFile>(opened);
  const auto config = std::get<model::LlamaConfig>(model::read_llama_config(file));
  auto& g = gpu::testing::shared_gpu();
  model::GpuContext ctx{g.queue, g.pool, g.kernels};
  model::GpuModel gpu_model(ctx, config, model::gguf_tensor_source(file), "weights:direct");
  model::GpuKvCache cache(ctx, config, kPages, kPageSize);
  const auto prompt_size = static_cast<std::uint32_t>(s.prompt.size());
  model::StepBatch batch;
  batch.block_tables = {table_for(s, prompt_size)};
  for (std::uint32_t i = 0; i < prompt_size; ++i) batch.tokens.push_back({0, i, s.prompt[i], i + 1 == prompt_size});
  std::vector<std::int32_t> tokens{gpu_model.forward_argmax(batch, cache).at(0)};
  for (int k = 1; k < count; ++k) {
    const std::uint32_t position = prompt_size + static_cast<std::uint32_t>(k) - 1;
    batch.block_tables = {table_for(s, position + 1)};
    batch.tokens = {{0, position, tokens.back(), true}};
    tokens.push_back(gpu_model.forward_argmax(batch, cache).at(0));
  }
  return tokens;
}

const Sequence kFirst{1, {3, 1, 4, 1, 5, 9}, {7, 2, 30, 11, 5, 63}};
const Sequence kSecond{2, {270, 8, 100, 0, 42, 42, 17, 250, 6}, {1, 40, 3, 22, 9, 50}};

TEST(ExecutorTest, QueryReportsTheModelsShapeAndThePool) {
  Rig rig;
  ExecutorReport report = rig.query(false);
  ASSERT_EQ(report.models.size(), 1u);
  const ModelInfo& m = report.models[0];
  EXPECT_EQ(m.name, model_name());  // the file name without .gguf
  EXPECT_EQ(m.kv_pages, kPages);
  EXPECT_EQ(m.page_size, kPageSize);
  EXPECT_EQ(m.n_ctx, kContext);
  EXPECT_EQ(m.n_vocab, kVocab);
  EXPECT_EQ(report.slots, 0u);
  EXPECT_FALSE(report.device.empty());

  auto opened = model::gguf::GgufFile::open(model_path());
  std::uint64_t weight_bytes = 0;
  for (const auto& t : std::get<model::gguf::GgufFile>(opened).tensors()) weight_bytes += t.bytes;
  const auto& owners = report.pool.active_by_owner;
  ASSERT_TRUE(owners.contains("weights:" + m.name));
  EXPECT_GE(owners.at("weights:" + m.name), weight_bytes);
  // K and V, per layer, F16, one row of kv_heads * head_dim per cache slot.
  const std::uint64_t kv_bytes = 2ull * tiny_shape().layers * kPages * kPageSize * 64 * 2;
  ASSERT_TRUE(owners.contains("kv"));
  EXPECT_GE(owners.at("kv"), kv_bytes);
  EXPECT_GE(report.pool.active_bytes, weight_bytes + kv_bytes);
  EXPECT_GE(report.pool.held_bytes, report.pool.active_bytes);
}

TEST(ExecutorTest, GreedyDecodingGivesWhatTheGpuModelGivesDirectly) {
  const auto expected = direct_greedy(kFirst, 12);
  Rig rig;
  auto outputs = generate(rig, {kFirst}, greedy(), 12);
  EXPECT_EQ(tokens_of(outputs[0]), expected);
  for (const auto& o : outputs[0]) EXPECT_FALSE(o.has_logprobs);
  EXPECT_EQ(rig.query(false).slots, 1u);
}

TEST(ExecutorTest, TwoSequencesInOneStepGiveWhatEachGivesAlone) {
  Rig rig;
  Sequence first = kFirst, second = kSecond;
  const auto first_alone = tokens_of(generate(rig, {first}, greedy(), 10)[0]);
  const auto second_alone = tokens_of(generate(rig, {second}, greedy(), 10)[0]);
  // New ids (a start replaces any sampler, but fresh ids are what a scheduler sends) over the
  // same pages, which the steps above wrote and these overwrite.
  first.id = 11;
  second.id = 12;
  auto together = generate(rig, {first, second}, greedy(), 10);
  EXPECT_EQ(tokens_of(together[0]), first_alone);
  EXPECT_EQ(tokens_of(together[1]), second_alone);
  EXPECT_NE(first_alone, second_alone);
}

TEST(ExecutorTest, SeededSamplingRepeatsAndReportsLogprobs) {
  Rig rig;
  model::SamplingParams params;
  params.temperature = 1.5f;
  params.seed = 1234;
  params.logprobs = true;
  params.top_logprobs = 3;
  Sequence again = kFirst;
  again.id = 5;
  again.pages = {12, 13, 14, 15, 16, 17};
  const auto first = generate(rig, {kFirst}, params, 10)[0];
  const auto repeat = generate(rig, {again}, params, 10)[0];
  EXPECT_EQ(tokens_of(repeat), tokens_of(first));

  for (const OutputToken& o : first) {
    ASSERT_TRUE(o.has_logprobs);
    EXPECT_EQ(o.logprobs.token, o.token);
    EXPECT_LE(o.logprobs.logprob, 0.0f);
    ASSERT_EQ(o.logprobs.top_tokens.size(), 3u);
    ASSERT_EQ(o.logprobs.top_logprobs.size(), 3u);
    EXPECT_TRUE(std::is_sorted(o.logprobs.top_logprobs.rbegin(), o.logprobs.top_logprobs.rend()));
    EXPECT_LE(o.logprobs.top_logprobs[0], 0.0f);
    EXPECT_LE(o.logprobs.logprob, o.logprobs.top_logprobs[0]);
  }

  // Another seed draws otherwise: at temperature 1.5 over 320 tokens, ten equal draws by chance
  // are out of the question.
  params.seed = 99;
  again.id = 6;
  EXPECT_NE(tokens_of(generate(rig, {again}, params, 10)[0]), tokens_of(first));
}

TEST(ExecutorTest, ReleasingEverySequenceAndTrimmingReturnsToTheLoadedBaseline) {
  Rig rig;
  const PoolStatsWire baseline = rig.query(true).pool;
  // A burst: six sequences of 24-token prompts prefilled in one step, then decoded together.
  std::vector<Sequence> burst;
  for (std::uint64_t i = 0; i < 6; ++i) {
    std::vector<std::int32_t> prompt(24);
    std::iota(prompt.begin(), prompt.end(), static_cast<std::int32_t>(10 * i));
    std::vector<std::uint32_t> pages(8);
    std::iota(pages.begin(), pages.end(), static_cast<std::uint32_t>(8 * i));
    burst.push_back({100 + i, prompt, pages});
  }
  generate(rig, burst, greedy(), 3);
  const ExecutorReport during = rig.query(false);
  EXPECT_EQ(during.slots, 6u);
  EXPECT_GT(during.pool.cached_bytes, 0u);  // the steps' scratch, kept for the next step

  StepPlan release;
  release.step = rig.next_step();
  for (const Sequence& s : burst) release.released.push_back(s.id);
  release.trim = true;
  const StepResult result = rig.step(release);
  EXPECT_EQ(result.error, 0u);
  EXPECT_TRUE(result.tokens.empty());
  EXPECT_EQ(result.slots, 0u);
  ASSERT_TRUE(result.has_pool);
  EXPECT_EQ(result.pool.cached_bytes, 0u);
  EXPECT_EQ(result.pool.active_bytes, baseline.active_bytes);
  EXPECT_EQ(result.pool.held_bytes, baseline.held_bytes);
}

// With one sequence the interval is 2 s: a release right after a trim leaves the memory cached,
// and the executor trims on its own once the interval is over.
TEST(ExecutorTest, ReleaseTrimsOnceTheIntervalIsOver) {
  Rig rig;
  const PoolStatsWire baseline = rig.query(true).pool;
  generate(rig, {kSecond}, greedy(), 2);
  StepPlan release;
  release.step = rig.next_step();
  release.released = {kSecond.id};
  const StepResult result = rig.step(release);
  EXPECT_EQ(result.slots, 0u);
  EXPECT_FALSE(result.has_pool);  // no trim yet
  EXPECT_GT(rig.query(false).pool.cached_bytes, 0u);
  std::this_thread::sleep_for(trim_interval(1) + std::chrono::milliseconds(300));
  const PoolStatsWire after = rig.query(false).pool;
  EXPECT_EQ(after.cached_bytes, 0u);
  EXPECT_EQ(after.held_bytes, baseline.held_bytes);
}

TEST(ExecutorTest, TrimIntervalShortensAsSequencesGrow) {
  using std::chrono::milliseconds;
  EXPECT_EQ(trim_interval(0), milliseconds(2000));
  EXPECT_EQ(trim_interval(1), milliseconds(2000));
  EXPECT_EQ(trim_interval(64), milliseconds(100));
  EXPECT_EQ(trim_interval(1000), milliseconds(100));
  for (std::size_t slots = 1; slots < 64; ++slots) EXPECT_GT(trim_interval(slots), trim_interval(slots + 1));
}

TEST(ExecutorTest, AFailedStepAnswersAnErrorAndTheNextStepWorks) {
  Rig rig(ActorOptions{{"fail_steps", "2"}});
  const auto first_token = generate(rig, {kFirst}, greedy(), 1)[0].at(0).token;

  StepPlan decode;
  decode.step = rig.next_step();
  const auto position = static_cast<std::uint32_t>(kFirst.prompt.size());
  decode.sequences.push_back({kFirst.id, position, {first_token}, table_for(kFirst, position + 1), true});
  StepResult failed = rig.step(decode);
  EXPECT_EQ(failed.error, static_cast<std::uint16_t>(RequestError::gpu));
  EXPECT_NE(failed.message.find("injected"), std::string::npos) << failed.message;
  EXPECT_TRUE(failed.tokens.empty());
  EXPECT_EQ(failed.slots, 0u);  // the failed step's sequences are gone
  EXPECT_FALSE(failed.kv_lost);
  EXPECT_TRUE(failed.has_pool);  // trimmed after the failure

  // The failed sequence has no state left: asking it for output again is a scheduler bug.
  decode.step = rig.next_step();
  StepResult orphan = rig.step(decode);
  EXPECT_EQ(orphan.error, static_cast<std::uint16_t>(RequestError::internal));
  EXPECT_NE(orphan.message.find("no sampler"), std::string::npos) << orphan.message;

  // A new sequence with the same prompt runs and gives the same first token.
  Sequence retry = kFirst;
  retry.id = 2;
  EXPECT_EQ(generate(rig, {retry}, greedy(), 3)[0].at(0).token, first_token);
}

TEST(ExecutorTest, BadPlansAreAnsweredWithAnInternalErrorAndServingGoesOn) {
  Rig rig;
  const auto prompt_size = static_cast<std::uint32_t>(kFirst.prompt.size());
  auto plan_with = [&](PlanSequence s, model::SamplingParams params = greedy()) {
    StepPlan plan;
    plan.step = rig.next_step();
    plan.starts.push_back({s.sequence, params, {}});
    plan.sequences.push_back(std::move(s));
    return plan;
  };
  const auto table = table_for(kFirst, prompt_size);
  std::vector<std::pair<StepPlan, std::string>> bad;
  bad.emplace_back(plan_with({1, 0, kFirst.prompt, {table[0], kPages}, true}), "names page 64");
  bad.emplace_back(plan_with({1, 0, {5, static_cast<std::int32_t>(kVocab)}, table, true}), "token id 320");
  bad.emplace_back(plan_with({1, 0, {-1}, table, true}), "token id -1");
  bad.emplace_back(plan_with({1, kContext - 2, {1, 2, 3}, std::vector<std::uint32_t>(kPages, 0), true}),
                   "past the model's context");
  bad.emplace_back(plan_with({1, 0, {1, 2, 3, 4, 5, 6, 7, 8, 9}, {0, 1}, true}), "block table has 2 pages");
  bad.emplace_back(plan_with({1, 0, {}, table, true}), "no tokens");
  model::SamplingParams hot = greedy();
  hot.temperature = -1.0f;
  bad.emplace_back(plan_with({1, 0, kFirst.prompt, table, true}, hot), "temperature");
  StepPlan no_sampler;
  no_sampler.step = rig.next_step();
  no_sampler.sequences.push_back({9, 0, kFirst.prompt, table, true});
  bad.emplace_back(no_sampler, "no sampler");
  StepPlan other_model = plan_with({1, 0, kFirst.prompt, table, true});
  other_model.model = "not-this-one";
  bad.emplace_back(other_model, "not-this-one");

  for (const auto& [plan, problem] : bad) {
    const StepResult result = rig.step(plan);
    EXPECT_EQ(result.error, static_cast<std::uint16_t>(RequestError::internal)) << problem;
    EXPECT_NE(result.message.find(problem), std::string::npos) << result.message;
    EXPECT_TRUE(result.tokens.empty());
    EXPECT_EQ(result.slots, 0u) << problem;  // the started sequence went with the step
  }
  EXPECT_EQ(tokens_of(generate(rig, {kFirst}, greedy(), 4)[0]), direct_greedy(kFirst, 4));
}

TEST(ExecutorTest, OptionsAreCheckedAndAMissingModelFailsTheStart) {
  EXPECT_THROW(make_executor({}), std::invalid_argument);
  EXPECT_THROW(make_executor({{"model", "m.gguf"}, {"kv_pages", "lots"}}), std::invalid_argument);
  EXPECT_THROW(make_executor({{"model", "m.gguf"}, {"page_size", "0"}}), std::invalid_argument);
  EXPECT_THROW(make_executor({{"model", "m.gguf"}, {"fail_steps", "1,x"}}), std::invalid_argument);
  EXPECT_THROW(make_executor({{"model", "m.gguf"}, {"scheduler", "s"}}), std::invalid_argument);
  try {
    Rig rig(ActorOptions{{"model", "/nonexistent/model.gguf"}});
    FAIL() << "the executor started without its model";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/model.gguf"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace mqlm::actors
