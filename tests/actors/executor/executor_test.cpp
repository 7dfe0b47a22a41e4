// The executor against real things: GGUF models written to disk, lavapipe's Vulkan device and
// ZeroMQ mailboxes. A test Mailbox named "scheduler" sends StepPlans and ExecutorQueries (and,
// as the memory enforcer will, LoadModel and UnloadModel) and reads the answers.
//
// Greedy tokens are checked against GpuModel::forward_argmax driven directly with the same
// batches (the same kernels on the same inputs: the same bits), so they must match exactly.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <thread>

#include <unistd.h>

#include "actors/runtime/actor_thread.hpp"
#include "actors/executor/executor.hpp"
#include "actors/executor/process_memory.hpp"
#include "actors/runtime/mailbox.hpp"
#include "gpu/kernel_library.hpp"
#include "model/gguf/gguf_file.hpp"
#include "model/gguf/synthetic_model.hpp"
#include "model/gguf/vocabulary_metadata.hpp"
#include "model/tokenizer/tokenizer.hpp"
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

// A second model, for the tests of several models: another vocabulary, context and weights.
constexpr std::uint32_t kVocabB = 300;
constexpr std::uint32_t kContextB = 128;

model::gguf::ModelShape tiny_shape_b() {
  model::gguf::ModelShape shape = tiny_shape();
  shape.vocab = kVocabB;
  shape.context = kContextB;
  return shape;
}

std::filesystem::path temp_file(const std::string& stem) {
  return std::filesystem::temp_directory_path() / (stem + "-" + std::to_string(getpid()) + ".gguf");
}

std::filesystem::path write_model(const model::gguf::ModelShape& shape, std::uint64_t seed, const std::string& stem) {
  const auto path = temp_file(stem);
  auto made = model::gguf::make_synthetic_model(shape, gpu::WeightType::f32, seed, stem);
  if (auto error = made.writer.write(path)) throw std::runtime_error("cannot write a test model: " + error->message());
  return path;
}

// The model file, written once for the whole binary; its name makes the executor's default
// model name.
const std::filesystem::path& model_path() {
  static const std::filesystem::path path = write_model(tiny_shape(), 21, "executor-test");
  return path;
}

const std::filesystem::path& model_b_path() {
  static const std::filesystem::path path = write_model(tiny_shape_b(), 22, "executor-test-b");
  return path;
}

// The first half of model A's file: a GGUF header whose tensors run past the end of the file.
const std::filesystem::path& truncated_model_path() {
  static const std::filesystem::path path = [] {
    const auto p = temp_file("executor-test-truncated");
    std::filesystem::copy_file(model_path(), p, std::filesystem::copy_options::overwrite_existing);
    std::filesystem::resize_file(p, std::filesystem::file_size(p) / 2);
    return p;
  }();
  return path;
}

// Not a GGUF file at all.
const std::filesystem::path& garbage_model_path() {
  static const std::filesystem::path path = [] {
    const auto p = temp_file("executor-test-garbage");
    std::ofstream(p) << "this is not a GGUF file";
    return p;
  }();
  return path;
}

std::string model_name() { return model_path().stem().string(); }

class RemoveModelFile : public ::testing::Environment {
 public:
  void TearDown() override {
    for (const auto& path : {model_path(), model_b_path(), truncated_model_path(), garbage_model_path()}) {
      std::filesystem::remove(path);
    }
  }
};
const auto* const remove_model_file = ::testing::AddGlobalTestEnvironment(new RemoveModelFile);

ActorOptions with_cache_shape(ActorOptions options) {
  options.try_emplace("kv_pages", std::to_string(kPages));
  options.try_emplace("page_size", std::to_string(kPageSize));
  return options;
}

// An executor in its own thread and the "scheduler" mailbox that talks to it.
class Rig {
 public:
  struct OptionsAsGiven {};
  // The executor of model_path() (model=PATH), with `extra` added or replacing options.
  explicit Rig(ActorOptions extra = {}) : Rig(OptionsAsGiven{}, with_model(std::move(extra))) {}
  // An executor with these options, and the test's KV cache shape unless they give another.
  Rig(OptionsAsGiven, ActorOptions given) {
    const ActorOptions options = with_cache_shape(std::move(given));
    topology_.add("executor");
    topology_.add("scheduler");
    auto frozen = std::make_shared<const Topology>(topology_);
    mailbox_ = std::make_unique<Mailbox>(context_, frozen, "scheduler");
    executor_ = std::make_unique<ActorThread>(context_, frozen, "executor", make_executor(options));
    executor_->start();
  }
  ~Rig() { executor_->stop(); }

  std::uint64_t next_step() { return ++steps_; }

  StepResult step(const StepPlan& plan) {
    send(plan);
    auto result = receive<StepResult>();
    if (result.step != plan.step) throw std::runtime_error("the answer is for another step");
    return result;
  }
  // A plan sent without waiting for its answer (a scheduler planning ahead), and the next answer.
  void send(const StepPlan& plan) { mailbox_->send("executor", plan, SendOptions{plan.step, 0, {}}); }
  StepResult next_result() { return receive<StepResult>(); }
  ExecutorReport query(bool trim) {
    mailbox_->send("executor", ExecutorQuery{trim});
    return receive<ExecutorReport>();
  }
  ModelLoaded load(const std::string& model) {
    mailbox_->send("executor", LoadModel{model});
    return receive<ModelLoaded>();
  }
  ModelUnloaded unload(const std::string& model) {
    send_unload(model);
    return next_unloaded();
  }
  // An unload sent without waiting for its answer, and the next answer, which must be an unload's.
  void send_unload(const std::string& model) { mailbox_->send("executor", UnloadModel{model}); }
  ModelUnloaded next_unloaded() { return receive<ModelUnloaded>(); }

 private:
  static ActorOptions with_model(ActorOptions extra) {
    extra.try_emplace("model", model_path().string());
    return extra;
  }

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

// Starts `s` on `model` and prefills its prompt, asking for its first token.
StepPlan prefill(Rig& rig, const Sequence& s, const std::string& model) {
  StepPlan plan;
  plan.step = rig.next_step();
  plan.model = model;
  plan.starts.push_back({s.id, greedy(), s.prompt, 0, {}});
  plan.sequences.push_back({s.id, 0, s.prompt, table_for(s, s.prompt.size()), true});
  return plan;
}

// A decode of `seq` at `position` whose token is the one its sequence's previous step samples.
PlanSequence follower(const Sequence& seq, std::uint32_t position) {
  PlanSequence s{seq.id, position, {0}, table_for(seq, position + 1), true};
  s.follows = true;
  return s;
}

// A greedy prefill of `seq` and `decodes` decodes following it, every plan sent before any answer
// is read, as a scheduler planning ahead sends them: each decode's token is the one the step
// before it samples.
void send_prefill_and_followers(Rig& rig, const Sequence& seq, std::uint32_t decodes) {
  rig.send(prefill(rig, seq, ""));
  const auto prompt_size = static_cast<std::uint32_t>(seq.prompt.size());
  for (std::uint32_t k = 1; k <= decodes; ++k) {
    StepPlan decode;
    decode.step = rig.next_step();
    decode.sequences.push_back(follower(seq, prompt_size + k - 1));
    rig.send(decode);
  }
}

// Starts the sequences and prefills their prompts in one plan, then decodes them together one
// token per plan, feeding back what was sampled; every output is kept, per sequence.
// model: the plan's model ("" : the executor's only one).
// Each sequence with its own sampling parameters.
std::vector<std::vector<OutputToken>> generate(Rig& rig, const std::vector<Sequence>& seqs,
                                               const std::vector<model::SamplingParams>& params, int count,
                                               const std::string& model = "") {
  std::vector<std::vector<OutputToken>> out(seqs.size());
  for (int k = 0; k < count; ++k) {
    StepPlan plan;
    plan.step = rig.next_step();
    plan.model = model;
    for (const Sequence& s : seqs) {
      const auto prompt_size = static_cast<std::uint32_t>(s.prompt.size());
      if (k == 0) {
        plan.starts.push_back({s.id, params[&s - seqs.data()], s.prompt, 0, {}});
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

std::vector<std::vector<OutputToken>> generate(Rig& rig, const std::vector<Sequence>& seqs,
                                               const model::SamplingParams& params, int count,
                                               const std::string& model = "") {
  return generate(rig, seqs, std::vector<model::SamplingParams>(seqs.size(), params), count, model);
}

std::vector<std::int32_t> tokens_of(const std::vector<OutputToken>& outputs) {
  std::vector<std::int32_t> tokens;
  for (const auto& o : outputs) tokens.push_back(o.token);
  return tokens;
}

// The same generation with GpuModel::forward_argmax called directly on the test's own device.
std::vector<std::int32_t> direct_greedy(const Sequence& s, int count,
                                        const std::filesystem::path& path = model_path()) {
  auto opened = model::gguf::GgufFile::open(path);
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

// What the pool holds of a model: its tensors as the file stores them, and its KV cache (K and V,
// per layer, F16, one row of kv_heads * head_dim per cache slot).
std::uint64_t weight_bytes(const std::filesystem::path& path) {
  auto opened = model::gguf::GgufFile::open(path);
  std::uint64_t bytes = 0;
  for (const auto& t : std::get<model::gguf::GgufFile>(opened).tensors()) bytes += t.bytes;
  return bytes;
}

std::uint64_t kv_bytes(const model::gguf::ModelShape& shape) {
  return 2ull * shape.layers * kPages * kPageSize * shape.kv_heads * shape.head_dim * 2;
}

const Sequence kFirst{1, {3, 1, 4, 1, 5, 9}, {7, 2, 30, 11, 5, 63}};

// `count` sequences with ids from first_id: sequence i a 24-token prompt counting up from
// token_step * i, on pages 8i .. 8i + 7.
std::vector<Sequence> counting_sequences(std::uint64_t count, std::uint64_t first_id, std::int32_t token_step) {
  std::vector<Sequence> seqs;
  for (std::uint64_t i = 0; i < count; ++i) {
    std::vector<std::int32_t> prompt(24);
    std::iota(prompt.begin(), prompt.end(), token_step * static_cast<std::int32_t>(i));
    std::vector<std::uint32_t> pages(8);
    std::iota(pages.begin(), pages.end(), static_cast<std::uint32_t>(8 * i));
    seqs.push_back({first_id + i, prompt, pages});
  }
  return seqs;
}
const Sequence kSecond{2, {270, 8, 100, 0, 42, 42, 17, 250, 6}, {1, 40, 3, 22, 9, 50}};

TEST(ExecutorTest, QueryReportsTheDeviceMemoryAndTheResidentSet) {
  Rig rig;
  const ExecutorReport report = rig.query(false);
  const DeviceMemoryWire& memory = report.memory;
  EXPECT_GT(memory.total_bytes, 0u);
  EXPECT_GT(memory.process_rss_bytes, 0u);
  if (memory.has_budget) {
    EXPECT_GT(memory.budget_bytes, 0u);
    EXPECT_LE(memory.budget_bytes, memory.total_bytes);
  } else {  // lavapipe (Mesa 22) has no VK_EXT_memory_budget
    EXPECT_EQ(memory.budget_bytes, memory.total_bytes);
    EXPECT_EQ(memory.usage_bytes, 0u);
  }
}

TEST(ProcessMemory, ResidentSetGrowsWithTouchedMemory) {
  constexpr std::size_t kBytes = std::size_t{64} << 20;
  const std::uint64_t before = resident_set_bytes();
  ASSERT_GT(before, 0u);
  // Pages count as resident only once written; one byte in each is enough.
  auto block = std::make_unique<unsigned char[]>(kBytes);
  for (std::size_t i = 0; i < kBytes; i += 4096) block[i] = 1;
  const std::uint64_t after = resident_set_bytes();
  EXPECT_GE(after, before + (std::uint64_t{48} << 20)) << "resident " << before << " -> " << after;
  EXPECT_NE(block[kBytes - 4096], 0);  // keeps the writes from being optimised away
}

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

  const auto& owners = report.pool.active_by_owner;
  ASSERT_TRUE(owners.contains("weights:" + m.name));
  EXPECT_GE(owners.at("weights:" + m.name), weight_bytes(model_path()));
  ASSERT_TRUE(owners.contains("kv:" + m.name));
  EXPECT_GE(owners.at("kv:" + m.name), kv_bytes(tiny_shape()));
  EXPECT_GE(report.pool.active_bytes, weight_bytes(model_path()) + kv_bytes(tiny_shape()));
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

TEST(ExecutorTest, FollowersTakeTheTokenTheirSequencesLastStepSampled) {
  const auto expected = direct_greedy(kFirst, 7);
  Rig rig;
  const auto prompt_size = static_cast<std::uint32_t>(kFirst.prompt.size());
  send_prefill_and_followers(rig, kFirst, 5);
  std::vector<std::int32_t> tokens;
  for (int k = 0; k < 6; ++k) {
    const StepResult result = rig.next_result();
    ASSERT_EQ(result.error, 0u) << result.message;
    ASSERT_EQ(result.tokens.size(), 1u);
    tokens.push_back(result.tokens[0].token);
  }
  EXPECT_EQ(tokens, std::vector<std::int32_t>(expected.begin(), expected.begin() + 6));
  // The prefill went to the GPU without waiting (its sequence started on the host); each of the
  // five decodes after it went behind the one before, before that one was answered, its token taken
  // on the GPU.
  EXPECT_EQ(rig.query(false).steps_chained, 5u);

  // A follower of a sequence that has sampled nothing is left out; the rest of its step runs.
  const auto second_size = static_cast<std::uint32_t>(kSecond.prompt.size());
  StepPlan quiet;
  quiet.step = rig.next_step();
  quiet.starts.push_back({kSecond.id, greedy(), kSecond.prompt, 0, {}});
  quiet.sequences.push_back({kSecond.id, 0, kSecond.prompt, table_for(kSecond, second_size), false});
  EXPECT_EQ(rig.step(quiet).error, 0u);
  StepPlan both;
  both.step = rig.next_step();
  both.sequences.push_back(follower(kFirst, prompt_size + 5));
  both.sequences.push_back(follower(kSecond, second_size));
  const StepResult result = rig.step(both);
  ASSERT_EQ(result.error, 0u) << result.message;
  ASSERT_EQ(result.tokens.size(), 1u);
  EXPECT_EQ(result.tokens[0].sequence, kFirst.id);
  EXPECT_EQ(result.tokens[0].token, expected[6]);
}

// A step that fails as it is sent behind a step in flight: that step is answered with its token,
// the failed one with the error, and the plans after it, sent before the failure was known, run
// without the failed sequence.
TEST(ExecutorTest, AStepThatFailsBehindAStepInFlightLeavesThatStepsAnswer) {
  const auto expected = direct_greedy(kFirst, 3);
  Rig rig(ActorOptions{{"fail_steps", "4"}});  // GPU steps: the prefill 1, the decodes 2, 3, 4, ...
  send_prefill_and_followers(rig, kFirst, 5);
  std::vector<StepResult> results;
  for (int k = 0; k < 6; ++k) results.push_back(rig.next_result());
  for (int k = 0; k < 3; ++k) {
    ASSERT_EQ(results[k].error, 0u) << k << ": " << results[k].message;
    ASSERT_EQ(results[k].tokens.size(), 1u) << k;
    EXPECT_EQ(results[k].tokens[0].token, expected[k]) << k;
  }
  EXPECT_EQ(results[3].error, static_cast<std::uint16_t>(RequestError::gpu));
  EXPECT_NE(results[3].message.find("injected"), std::string::npos) << results[3].message;
  EXPECT_FALSE(results[3].kv_lost);
  for (int k = 4; k < 6; ++k) {
    EXPECT_EQ(results[k].error, 0u) << k << ": " << results[k].message;
    EXPECT_TRUE(results[k].tokens.empty()) << k;
  }
  EXPECT_EQ(rig.query(false).slots, 0u);
  // The next sequence runs as before.
  Sequence retry = kFirst;
  retry.id = 2;
  EXPECT_EQ(tokens_of(generate(rig, {retry}, greedy(), 3)[0]), expected);
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

// A decode with drafts (speculative decoding): the executor keeps the drafts the argmax agrees
// with, returns the argmax after the last kept one, and the K and V it wrote for the rest is
// written over by the next step, which sees only the kept positions.
TEST(ExecutorTest, DraftsAreKeptWhereTheArgmaxAgreesAndTheRestIsWrittenOver) {
  const auto expected = direct_greedy(kFirst, 10);
  const auto second_expected = direct_greedy(kSecond, 1);
  Rig rig;
  const auto prompt_size = static_cast<std::uint32_t>(kFirst.prompt.size());
  ASSERT_EQ(rig.step(prefill(rig, kFirst, "")).tokens.at(0).token, expected[0]);
  auto verify = [&](std::uint32_t position, std::vector<std::int32_t> tokens) {
    StepPlan plan;
    plan.step = rig.next_step();
    PlanSequence seq{kFirst.id, position, tokens, table_for(kFirst, position + tokens.size()), true};
    seq.drafted = static_cast<std::uint32_t>(tokens.size() - 1);
    plan.sequences.push_back(seq);
    return plan;
  };
  // Two right, then a wrong one: the one after it is not kept even though it is right.
  const std::int32_t wrong = (expected[3] + 1) % static_cast<std::int32_t>(kVocab);
  StepResult first = rig.step(verify(prompt_size, {expected[0], expected[1], expected[2], wrong, expected[4]}));
  ASSERT_EQ(first.error, 0u) << first.message;
  ASSERT_EQ(first.tokens.size(), 1u);
  EXPECT_EQ(first.tokens[0].accepted, (std::vector<std::int32_t>{expected[1], expected[2]}));
  EXPECT_EQ(first.tokens[0].token, expected[3]);
  // From the position after the kept drafts, over what the rejected ones wrote: all kept, and in
  // the same step a sequence drawn by the sampler (logprobs), whose row comes after these three.
  StepPlan next = verify(prompt_size + 3, {expected[3], expected[4], expected[5]});
  model::SamplingParams with_logprobs = greedy();
  with_logprobs.logprobs = true;
  next.starts.push_back({kSecond.id, with_logprobs, kSecond.prompt, 0, {}});
  next.sequences.push_back({kSecond.id, 0, kSecond.prompt, table_for(kSecond, kSecond.prompt.size()), true});
  StepResult second = rig.step(next);
  ASSERT_EQ(second.error, 0u) << second.message;
  ASSERT_EQ(second.tokens.size(), 2u);
  EXPECT_EQ(second.tokens[0].accepted, (std::vector<std::int32_t>{expected[4], expected[5]}));
  EXPECT_EQ(second.tokens[0].token, expected[6]);
  EXPECT_EQ(second.tokens[1].token, second_expected[0]);
  EXPECT_TRUE(second.tokens[1].has_logprobs);
  // A follower of it takes the argmax after the kept drafts.
  StepPlan follow;
  follow.step = rig.next_step();
  follow.sequences.push_back(follower(kFirst, prompt_size + 6));
  StepResult followed = rig.step(follow);
  ASSERT_EQ(followed.tokens.size(), 1u);
  EXPECT_EQ(followed.tokens[0].token, expected[7]);
  // Drafts for a sequence that reports logprobs are a scheduler's bug (a kept draft has none).
  StepPlan bad;
  bad.step = rig.next_step();
  PlanSequence drafted{kSecond.id, static_cast<std::uint32_t>(kSecond.prompt.size()), {second_expected[0], 5},
                       table_for(kSecond, kSecond.prompt.size() + 2), true};
  drafted.drafted = 1;
  bad.sequences.push_back(drafted);
  StepResult refused = rig.step(bad);
  EXPECT_EQ(refused.error, static_cast<std::uint16_t>(RequestError::internal));
  EXPECT_NE(refused.message.find("logprobs"), std::string::npos) << refused.message;
}

// A sampled draw with every filter and penalty on.
model::SamplingParams filtered_and_penalised(std::uint64_t seed, std::int32_t top_k) {
  model::SamplingParams p;
  p.temperature = 0.9f;
  p.top_k = top_k;
  p.top_p = 0.95f;
  p.min_p = 0.02f;
  p.repetition_penalty = 1.3f;
  p.presence_penalty = 0.4f;
  p.frequency_penalty = 0.2f;
  p.seed = seed;
  return p;
}

// A decode of `seq` at `position`: its token, then drafts.
PlanSequence verifying(const Sequence& seq, std::uint32_t position, std::vector<std::int32_t> tokens) {
  PlanSequence s{seq.id, position, tokens, table_for(seq, position + tokens.size()), true};
  s.drafted = static_cast<std::uint32_t>(tokens.size() - 1);
  return s;
}

// Sampled drafts are verified by the rows' draws, each with its place's counter and penalties: a
// draft is kept where the draw is the draft, and the draw after the last kept one is the next
// token. So whatever was drafted, right or wrong, the tokens are those plain sampling draws with
// the seed, token for token.
TEST(ExecutorTest, SampledDraftsKeepTheTokensPlainSamplingDraws) {
  Rig rig;
  const model::SamplingParams params = filtered_and_penalised(4321, 40);
  const auto plain = tokens_of(generate(rig, {kFirst}, params, 10)[0]);
  Sequence s = kFirst;
  s.id = 7;
  const auto prompt_size = static_cast<std::uint32_t>(s.prompt.size());
  StepPlan first = prefill(rig, s, "");
  first.starts[0].sampling = params;
  std::vector<std::int32_t> drawn{rig.step(first).tokens.at(0).token};
  auto verify = [&](std::vector<std::int32_t> tokens) {
    StepPlan plan;
    plan.step = rig.next_step();
    plan.sequences.push_back(verifying(s, prompt_size + static_cast<std::uint32_t>(drawn.size()) - 1, tokens));
    const StepResult result = rig.step(plan);
    if (result.error != 0 || result.tokens.size() != 1) throw std::runtime_error("verify: " + result.message);
    drawn.insert(drawn.end(), result.tokens[0].accepted.begin(), result.tokens[0].accepted.end());
    drawn.push_back(result.tokens[0].token);
    return result.tokens[0].accepted.size();
  };
  auto wrong = [](std::int32_t token) { return (token + 1) % static_cast<std::int32_t>(kVocab); };
  EXPECT_EQ(verify({plain[0], plain[1], plain[2], wrong(plain[3]), plain[4]}), 2u);  // then the draw at 3
  EXPECT_EQ(verify({plain[3], plain[4], plain[5], plain[6]}), 3u);                    // all, and the one after
  EXPECT_EQ(verify({plain[7], wrong(plain[8])}), 0u);
  EXPECT_EQ(verify({plain[8]}), 0u);  // no drafts: a plain decode
  EXPECT_EQ(drawn, plain);
}

// The distribution speculation samples from is plain sampling's: the second and third tokens
// after a prompt, over many seeds, drawn one step at a time and drawn with both drafted (the
// likeliest pair, so that drafts are often kept, often not) agree by a two-sample chi-square test
// (with fixed seeds, so the test is deterministic; disjoint seeds, so the two samples are
// independent draws, as the previous test's token-for-token identity would make them otherwise).
class DrawnPairs {
 public:
  static constexpr std::uint32_t kRound = 32;  // sequences a step
  explicit DrawnPairs(Rig& rig) : rig_(rig) {}
  // The (second, third) token of each seed from first_seed on, `rounds` of kRound seeds, with
  // `guess` drafted after the first, or not.
  std::map<std::pair<std::int32_t, std::int32_t>, int> draw(std::uint64_t first_seed, int rounds,
                                                           std::optional<std::pair<std::int32_t, std::int32_t>> guess) {
    std::map<std::pair<std::int32_t, std::int32_t>, int> pairs;
    for (int round = 0; round < rounds; ++round) {
      const std::uint64_t seed = first_seed + static_cast<std::uint64_t>(round) * kRound;
      for (const auto& drawn : draw_round(seed, guess)) ++pairs[{drawn.at(1), drawn.at(2)}];
    }
    return pairs;
  }

 std::size_t kept = 0;  // drafts kept, over every draw

 private:
  // kRound sequences (pages 3i to 3i + 2 each) from the prompt to their third token: a step for
  // the first, then one with each sequence's last token (and the guess after the first), then
  // one for those whose second step kept no draft.
  std::vector<std::vector<std::int32_t>> draw_round(std::uint64_t seed,
                                                    std::optional<std::pair<std::int32_t, std::int32_t>> guess) {
    std::vector<Sequence> seqs;
    StepPlan plan;
    plan.step = rig_.next_step();
    plan.released = std::exchange(last_ids_, {});
    std::vector<std::size_t> in_plan;
    for (std::uint32_t i = 0; i < kRound; ++i) {
      seqs.push_back({next_id_++, kFirst.prompt, {3 * i, 3 * i + 1, 3 * i + 2}});
      last_ids_.push_back(seqs.back().id);
      plan.starts.push_back({seqs.back().id, filtered_and_penalised(seed + i, 2), kFirst.prompt, 0, {}});
      plan.sequences.push_back({seqs.back().id, 0, kFirst.prompt, table_for(seqs.back(), kFirst.prompt.size()), true});
      in_plan.push_back(i);
    }
    std::vector<std::vector<std::int32_t>> drawn(kRound);
    while (!in_plan.empty()) {
      const StepResult result = rig_.step(plan);
      if (result.error != 0 || result.tokens.size() != in_plan.size()) throw std::runtime_error("draw: " + result.message);
      for (std::size_t k = 0; k < in_plan.size(); ++k) {
        const OutputToken& out = result.tokens[k];
        drawn[in_plan[k]].insert(drawn[in_plan[k]].end(), out.accepted.begin(), out.accepted.end());
        drawn[in_plan[k]].push_back(out.token);
        kept += out.accepted.size();
      }
      plan = StepPlan{};
      plan.step = rig_.next_step();
      in_plan.clear();
      for (std::size_t i = 0; i < kRound; ++i) {
        if (drawn[i].size() >= 3) continue;
        const auto position = static_cast<std::uint32_t>(kFirst.prompt.size() + drawn[i].size() - 1);
        std::vector<std::int32_t> tokens{drawn[i].back()};
        if (guess && drawn[i].size() == 1) tokens.insert(tokens.end(), {guess->first, guess->second});
        plan.sequences.push_back(verifying(seqs[i], position, tokens));
        in_plan.push_back(i);
      }
    }
    return drawn;
  }

  Rig& rig_;
  std::uint64_t next_id_ = 1000;
  std::vector<std::uint64_t> last_ids_;
};

// Pearson's two-sample statistic over the pairs both samples drew (equal sizes), the pairs drawn
// fewer than 10 times in all pooled into one; and its degrees of freedom.
std::pair<double, int> chi_square(const std::map<std::pair<std::int32_t, std::int32_t>, int>& a,
                                  const std::map<std::pair<std::int32_t, std::int32_t>, int>& b) {
  std::map<std::pair<std::int32_t, std::int32_t>, std::pair<int, int>> both;
  for (const auto& [pair, count] : a) both[pair].first += count;
  for (const auto& [pair, count] : b) both[pair].second += count;
  double statistic = 0;
  int bins = 0, pooled_a = 0, pooled_b = 0;
  auto add = [&](int x, int y) {
    statistic += static_cast<double>(x - y) * (x - y) / (x + y);
    ++bins;
  };
  for (const auto& [pair, counts] : both) {
    if (counts.first + counts.second >= 10) {
      add(counts.first, counts.second);
    } else {
      pooled_a += counts.first;
      pooled_b += counts.second;
    }
  }
  if (pooled_a + pooled_b > 0) add(pooled_a, pooled_b);
  return {statistic, bins - 1};
}

// The chi-square distribution's 0.999 quantile (Wilson and Hilferty's approximation).
double chi_square_999(int df) {
  const double z = 3.0902, k = 2.0 / (9.0 * df);
  return df * std::pow(1.0 - k + z * std::sqrt(k), 3.0);
}

TEST(ExecutorTest, SampledSpeculationKeepsTheDistributionOfTheNextTokens) {
  Rig rig({{"kv_pages", std::to_string(3 * DrawnPairs::kRound)}});
  DrawnPairs pairs(rig);
  constexpr int kRounds = 12;  // 384 seeds a sample
  const auto plain = pairs.draw(1, kRounds, std::nullopt);
  ASSERT_EQ(pairs.kept, 0u);
  const auto likeliest = std::max_element(plain.begin(), plain.end(),
                                          [](const auto& x, const auto& y) { return x.second < y.second; });
  const auto drafted = pairs.draw(1'000'001, kRounds, likeliest->first);
  // Both drafts kept for some seeds, not for others.
  const std::size_t seeds = kRounds * DrawnPairs::kRound;
  EXPECT_GT(pairs.kept, seeds / 10);
  EXPECT_LT(pairs.kept, 2 * seeds * 9 / 10);
  const auto [statistic, df] = chi_square(plain, drafted);
  ASSERT_GT(df, 1);
  EXPECT_LT(statistic, chi_square_999(df)) << df << " degrees of freedom";
  // The test tells distributions apart: a rule that kept the likeliest pair too often (a third of
  // every other pair's draws moved to it) does not pass.
  auto biased = plain;
  for (auto& [pair, count] : biased) {
    if (pair == likeliest->first) continue;
    biased[likeliest->first] += count / 3;
    count -= count / 3;
  }
  const auto [biased_statistic, biased_df] = chi_square(plain, biased);
  EXPECT_GT(biased_statistic, chi_square_999(biased_df));
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

// A sequence that a response_format constrains draws only what its grammar allows and, once the
// JSON is complete, the end token. Its steps, sent one ahead as a scheduler sends followers, are
// chained behind the step in flight with their output part held until that step's token gives
// the mask; they draw what the same steps draw sent one at a time.
TEST(ExecutorTest, AConstrainedSequenceWritesItsSchemasJsonAndThenTheEndToken) {
  Rig rig;
  auto opened = model::gguf::GgufFile::open(model_path());
  auto vocabulary = model::gguf::read_vocabulary(std::get<model::gguf::GgufFile>(opened));
  const auto tokenizer = std::get<model::Tokenizer>(model::Tokenizer::create(std::get<model::Vocabulary>(vocabulary)));
  const std::int32_t end = tokenizer.eos();
  const std::string schema = R"({"type":"object","properties":{"ok":{"type":"boolean"},"n":{"enum":[1,2,3]},)"
                             R"("tag":{"type":"string","maxLength":6}},"required":["ok","n","tag"]})";
  // The tokens up to the end token; `ahead`: each decode sent before the step it follows is answered.
  auto draw = [&](std::uint64_t id, const model::SamplingParams& params, bool ahead) {
    Sequence s{id, {3, 1, 4, 1, 5, 9}, std::vector<std::uint32_t>(48)};  // 192 positions on pages 16..63
    std::iota(s.pages.begin(), s.pages.end(), 16u);
    StepPlan first = prefill(rig, s, "");
    first.starts[0].sampling = params;
    first.starts[0].end_tokens = {end};
    rig.send(first);
    std::vector<std::int32_t> tokens;
    for (auto position = static_cast<std::uint32_t>(s.prompt.size()); position + 1 < s.pages.size() * kPageSize;
         ++position) {
      StepPlan decode;
      decode.step = rig.next_step();
      decode.sequences.push_back(follower(s, position));
      if (ahead) rig.send(decode);
      const StepResult result = rig.next_result();
      EXPECT_EQ(result.error, 0) << result.message;
      if (result.tokens.empty()) break;
      tokens.push_back(result.tokens.at(0).token);
      if (tokens.back() == end) break;
      if (!ahead) rig.send(decode);
    }
    if (ahead) {
      EXPECT_EQ(rig.next_result().tokens.at(0).token, end);  // the step sent ahead: the end token again
    }
    StepPlan release;
    release.step = rig.next_step();
    release.released = {s.id};
    EXPECT_EQ(rig.step(release).slots, 0u);
    return tokens;
  };
  for (std::uint64_t seed : {1, 2, 3}) {
    model::SamplingParams params;
    params.seed = seed;
    params.temperature = seed == 1 ? 0.0f : 1.0f;
    params.response_format = {static_cast<std::uint8_t>(model::ResponseKind::json_schema), schema, true};
    const std::uint64_t chained_before = rig.query(false).steps_chained;
    std::vector<std::int32_t> tokens = draw(10 + seed, params, true);
    // Most of its decodes went behind the one in flight (the collect timer answers a step in flight
    // that no plan follows within a millisecond, so on a busy machine not every one).
    EXPECT_GT(rig.query(false).steps_chained, chained_before);
    EXPECT_EQ(draw(20 + seed, params, false), tokens) << "seed " << seed;
    ASSERT_EQ(tokens.back(), end) << "no end token within " << tokens.size() << " tokens";
    tokens.pop_back();
    const std::string text = tokenizer.decode(tokens, {.sequence_start = false});
    const auto value = nlohmann::json::parse(text, nullptr, false);
    ASSERT_TRUE(value.is_object()) << text;
    EXPECT_TRUE(value.at("ok").is_boolean()) << text;
    EXPECT_TRUE(value.at("n") == 1 || value.at("n") == 2 || value.at("n") == 3) << text;
    const std::string tag = value.at("tag").get<std::string>();
    EXPECT_LE(std::count_if(tag.begin(), tag.end(), [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; }),
              6) << text;  // characters, not bytes
  }
}

// A request's tokens depend on its seed, logits and history only (counter-based random numbers on
// the GPU, per-row sums in a fixed order): alone or as one of sixteen rows, each of the others
// with parameters, penalties and seeds of its own, it draws the same tokens.
TEST(ExecutorTest, ASeedDrawsTheSameTokensAloneAndBatchedWithFifteenOthers) {
  Rig rig;
  model::SamplingParams mine;
  mine.temperature = 0.9f;
  mine.top_p = 0.9f;
  mine.repetition_penalty = 1.2f;
  mine.logprobs = true;
  mine.top_logprobs = 2;
  mine.seed = 4242;
  // Sixteen sequences of 6 prompt tokens and 10 generated: 4 pages each fill the 64-page cache.
  std::vector<Sequence> batch;
  for (std::uint32_t i = 0; i < 16; ++i) {
    Sequence s{300 + i, {}, {4 * i, 4 * i + 1, 4 * i + 2, 4 * i + 3}};
    for (std::int32_t j = 0; j < 6; ++j) s.prompt.push_back((static_cast<std::int32_t>(i) * 37 + j * 11) % 300);
    batch.push_back(s);
  }
  const Sequence alone{400, batch[5].prompt, batch[5].pages};
  const auto by_itself = generate(rig, {alone}, mine, 10)[0];

  std::vector<model::SamplingParams> params(batch.size(), mine);
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (i == 5) continue;
    params[i].seed = 7 + i;
    params[i].temperature = 0.3f + 0.1f * static_cast<float>(i);
    params[i].top_k = static_cast<std::int32_t>(i % 3) * 20;
    params[i].min_p = i % 4 == 0 ? 0.05f : 0.0f;
    params[i].frequency_penalty = i % 2 == 0 ? 0.5f : 0.0f;
    params[i].logit_bias = {{static_cast<std::int32_t>(i), 5.0f}};
  }
  const auto together = generate(rig, batch, params, 10);
  EXPECT_EQ(tokens_of(together[5]), tokens_of(by_itself));
  for (std::size_t k = 0; k < by_itself.size(); ++k) {
    EXPECT_FLOAT_EQ(together[5][k].logprobs.logprob, by_itself[k].logprobs.logprob) << "token " << k;
  }
  // And another seed draws otherwise (at temperature 0.9 over 10 tokens, equal by chance is out of
  // the question): the seed is what decides.
  mine.seed = 4343;
  const Sequence again{401, batch[5].prompt, batch[0].pages};
  EXPECT_NE(tokens_of(generate(rig, {again}, mine, 10)[0]), tokens_of(by_itself));
}

TEST(ExecutorTest, ReleasingEverySequenceAndTrimmingReturnsToTheLoadedBaseline) {
  Rig rig;
  const PoolStatsWire baseline = rig.query(true).pool;
  // A burst: six sequences of 24-token prompts prefilled in one step, then decoded together.
  const std::vector<Sequence> burst = counting_sequences(6, 100, 10);
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

// While sequences are still running, a trim (after a release, once the interval is over) keeps
// the memory the recent steps needed, so the next step allocates nothing from the driver; the
// release of the last sequence returns everything. Blocks of 1 MiB, so that scratch has blocks
// of its own to keep or return.
TEST(ExecutorTest, TrimsWhileSequencesRunKeepTheirWorkingSet) {
  Rig rig(ActorOptions{{"block_mib", "1"}});
  const PoolStatsWire baseline = rig.query(true).pool;
  const std::vector<Sequence> three = counting_sequences(3, 200, 7);
  const auto out = generate(rig, three, greedy(), 3);
  const PoolStatsWire after_steps = rig.query(false).pool;
  ASSERT_GT(after_steps.held_bytes, baseline.held_bytes);  // the steps' scratch took blocks

  std::this_thread::sleep_for(trim_interval(3) + std::chrono::milliseconds(200));
  StepPlan release;
  release.step = rig.next_step();
  release.released = {three[0].id};
  const StepResult trimmed = rig.step(release);
  ASSERT_TRUE(trimmed.has_pool);  // the interval was over: it trimmed
  EXPECT_EQ(trimmed.slots, 2u);
  EXPECT_EQ(trimmed.pool.cached_bytes, 0u);
  EXPECT_GT(trimmed.pool.held_bytes, baseline.held_bytes);  // the working set stayed

  // The two left decode a token: their scratch is found in the pool, no block is added.
  StepPlan decode;
  decode.step = rig.next_step();
  for (std::size_t i = 1; i < 3; ++i) {
    const auto position = static_cast<std::uint32_t>(three[i].prompt.size() + 2);
    decode.sequences.push_back({three[i].id, position, {out[i].back().token}, table_for(three[i], position + 1), true});
  }
  const StepResult decoded = rig.step(decode);
  ASSERT_EQ(decoded.error, 0u) << decoded.message;
  EXPECT_EQ(decoded.tokens.size(), 2u);
  EXPECT_EQ(rig.query(false).pool.held_bytes, trimmed.pool.held_bytes);

  // The last release, once the interval is over: nothing runs, everything goes back.
  std::this_thread::sleep_for(trim_interval(2) + std::chrono::milliseconds(200));
  release.step = rig.next_step();
  release.released = {three[1].id, three[2].id};
  const StepResult emptied = rig.step(release);
  ASSERT_TRUE(emptied.has_pool);
  EXPECT_EQ(emptied.slots, 0u);
  EXPECT_EQ(emptied.pool.held_bytes, baseline.held_bytes);
}

// Warming up at load (every batch shape run once, on KV pages no sequence holds) leaves nothing
// behind that a request could see: the same tokens as without it, and the same held memory.
TEST(ExecutorTest, WarmingUpAtLoadChangesNoResultNorTheBaseline) {
  // (held bytes after load, both sequences' tokens) with warm_up = `warm`.
  auto run = [](const char* warm) {
    Rig rig(ActorOptions{{"warm_up", warm}});
    const std::uint64_t held = rig.query(false).pool.held_bytes;
    const auto out = generate(rig, {kFirst, kSecond}, greedy(), 6);
    std::vector<std::int32_t> tokens = tokens_of(out[0]);
    const auto second = tokens_of(out[1]);
    tokens.insert(tokens.end(), second.begin(), second.end());
    return std::make_pair(held, tokens);
  };
  const auto [plain_held, plain] = run("0");
  const auto [warmed_held, warmed] = run("1");
  EXPECT_EQ(warmed, plain);
  EXPECT_EQ(warmed_held, plain_held);  // the warm-up's scratch went back before the baseline
}

// With pipeline_cache=FILE the executor writes the device's pipeline cache after loading, and a
// file that is not one (garbage, or another device's) is passed over with a warning and replaced.
TEST(ExecutorTest, KeepsItsPipelineCacheInAFile) {
  const auto path = std::filesystem::path(::testing::TempDir()) / ("pipelines-" + std::to_string(::getpid()) + ".cache");
  std::filesystem::remove(path);
  auto read = [&] {
    std::ifstream in(path, std::ios::binary);
    return std::vector<std::uint8_t>(std::istreambuf_iterator<char>(in), {});
  };
  std::vector<std::int32_t> first;
  {
    Rig rig(ActorOptions{{"pipeline_cache", path.string()}});
    first = tokens_of(generate(rig, {kFirst}, greedy(), 4)[0]);
  }
  auto& gpu = gpu::testing::shared_gpu();
  ASSERT_TRUE(std::filesystem::exists(path));
  EXPECT_EQ(gpu::KernelLibrary::cache_data_problem(gpu.device, read()), "");

  {
    std::ofstream garbage(path, std::ios::binary | std::ios::trunc);
    garbage << "not a pipeline cache, but long enough to have a header's worth of bytes";
  }
  {
    Rig rig(ActorOptions{{"pipeline_cache", path.string()}});
    EXPECT_EQ(tokens_of(generate(rig, {kFirst}, greedy(), 4)[0]), first);
  }
  EXPECT_EQ(gpu::KernelLibrary::cache_data_problem(gpu.device, read()), "");
  EXPECT_FALSE(std::filesystem::exists(path.string() + ".partial"));
  std::filesystem::remove(path);
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

  // The failed sequence has no state left. The plan after the failed one, which a scheduler that
  // plans ahead sent before it learnt of the failure, runs without it; asking it for output after
  // that is a scheduler bug.
  decode.step = rig.next_step();
  StepResult next = rig.step(decode);
  EXPECT_EQ(next.error, 0u) << next.message;
  EXPECT_TRUE(next.tokens.empty());
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
    plan.starts.push_back({s.sequence, params, {}, 0, {}});
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


// ---- several models, loaded and unloaded by message ----------------------------------------

// Models a (model_path()) and b (model_b_path()), neither loaded at start, in a pool of 1 MiB
// blocks: small enough that each model has whole blocks of its own to give back when it goes
// (in 256 MiB blocks both tiny models would share one, and unloading either would free nothing).
ActorOptions two_models() {
  return {{"models", "a=" + model_path().string() + ";b=" + model_b_path().string()}, {"block_mib", "1"}};
}

std::vector<std::string> names_of(const ExecutorReport& report) {
  std::vector<std::string> names;
  for (const ModelInfo& m : report.models) names.push_back(m.name);
  return names;
}

std::uint64_t owned(const PoolStatsWire& pool, const std::string& owner) {
  auto it = pool.active_by_owner.find(owner);
  return it == pool.active_by_owner.end() ? 0 : it->second;
}

Sequence renamed(Sequence s, std::uint64_t id) {
  s.id = id;
  return s;
}

// Any message but a plan answers the step in flight first: an unload sent right behind a greedy
// decode (which goes to the GPU without waiting) comes after that decode's answer, with its token,
// and the model goes with nothing of the step left behind.
TEST(ExecutorModelsTest, AnUnloadBehindAStepInFlightComesAfterItsAnswer) {
  Rig rig(Rig::OptionsAsGiven{}, two_models());
  const ModelLoaded a = rig.load("a");
  ASSERT_TRUE(a.ok) << a.error;
  const auto expected = direct_greedy(kFirst, 2);
  const StepResult first = rig.step(prefill(rig, kFirst, "a"));
  ASSERT_EQ(first.error, 0u) << first.message;
  ASSERT_EQ(first.tokens.at(0).token, expected[0]);
  StepPlan decode;
  decode.step = rig.next_step();
  decode.model = "a";
  const auto position = static_cast<std::uint32_t>(kFirst.prompt.size());
  decode.sequences.push_back({kFirst.id, position, {expected[0]}, table_for(kFirst, position + 1), true});
  rig.send(decode);
  rig.send_unload("a");
  const StepResult second = rig.next_result();
  EXPECT_EQ(second.step, decode.step);
  ASSERT_EQ(second.error, 0u) << second.message;
  ASSERT_EQ(second.tokens.size(), 1u);
  EXPECT_EQ(second.tokens[0].token, expected[1]);
  const ModelUnloaded unloaded = rig.next_unloaded();
  EXPECT_TRUE(unloaded.was_loaded);
  EXPECT_EQ(unloaded.model_bytes, a.bytes);
  EXPECT_EQ(unloaded.pool.active_bytes, 0u);
  EXPECT_EQ(rig.query(false).slots, 0u);
}

TEST(ExecutorModelsTest, ModelsAreLoadedServedAndUnloadedByMessage) {
  Rig rig(Rig::OptionsAsGiven{}, two_models());
  const ExecutorReport empty = rig.query(true);
  EXPECT_TRUE(empty.models.empty());
  EXPECT_FALSE(empty.device.empty());

  const ModelLoaded a = rig.load("a");
  ASSERT_TRUE(a.ok) << a.error;
  EXPECT_EQ(a.model, "a");
  EXPECT_EQ(a.info.name, "a");
  EXPECT_EQ(a.info.kv_pages, kPages);
  EXPECT_EQ(a.info.page_size, kPageSize);
  EXPECT_EQ(a.info.n_ctx, kContext);
  EXPECT_EQ(a.info.n_vocab, kVocab);
  EXPECT_GE(a.bytes, weight_bytes(model_path()) + kv_bytes(tiny_shape()));
  EXPECT_EQ(a.bytes, owned(a.pool, "weights:a") + owned(a.pool, "kv:a"));
  EXPECT_EQ(a.pool.active_bytes, a.bytes);  // nothing else is allocated
  EXPECT_EQ(a.pool.cached_bytes, 0u);       // the upload's staging memory was trimmed
  EXPECT_GT(a.pool.held_bytes, empty.pool.held_bytes);
  EXPECT_GT(a.load_ns, 0);

  const auto expected_a = direct_greedy(kFirst, 8);
  EXPECT_EQ(tokens_of(generate(rig, {kFirst}, greedy(), 8, "a")[0]), expected_a);

  const ModelLoaded again = rig.load("a");  // already loaded: the same figures, nothing uploaded
  ASSERT_TRUE(again.ok) << again.error;
  EXPECT_EQ(again.bytes, a.bytes);
  EXPECT_EQ(again.info.n_vocab, kVocab);
  EXPECT_EQ(again.load_ns, 0);
  EXPECT_EQ(again.pool.active_bytes, a.pool.active_bytes);  // the steps' scratch is cached, not active

  const ModelLoaded b = rig.load("b");
  ASSERT_TRUE(b.ok) << b.error;
  EXPECT_EQ(b.info.name, "b");
  EXPECT_EQ(b.info.n_ctx, kContextB);
  EXPECT_EQ(b.info.n_vocab, kVocabB);
  EXPECT_GE(b.bytes, weight_bytes(model_b_path()) + kv_bytes(tiny_shape_b()));
  EXPECT_EQ(owned(b.pool, "weights:a") + owned(b.pool, "kv:a"), a.bytes);  // a is untouched
  EXPECT_EQ(names_of(rig.query(false)), (std::vector<std::string>{"a", "b"}));

  // The same prompt on b: b's own tokens, as its GpuModel gives them directly.
  const auto expected_b = direct_greedy(kFirst, 8, model_b_path());
  EXPECT_NE(expected_b, expected_a);
  EXPECT_EQ(tokens_of(generate(rig, {renamed(kFirst, 2)}, greedy(), 8, "b")[0]), expected_b);

  // With two loaded, a plan must name its model; and a sequence stays on the model it began on.
  const StepResult unnamed = rig.step(prefill(rig, renamed(kFirst, 3), ""));
  EXPECT_EQ(unnamed.error, static_cast<std::uint16_t>(RequestError::internal));
  EXPECT_NE(unnamed.message.find("names no model"), std::string::npos) << unnamed.message;
  const Sequence crossing = renamed(kSecond, 6);
  ASSERT_EQ(rig.step(prefill(rig, crossing, "a")).error, 0u);
  StepPlan on_other_model;
  on_other_model.step = rig.next_step();
  on_other_model.model = "b";
  on_other_model.sequences.push_back({crossing.id, 0, crossing.prompt, table_for(crossing, 9), false});
  const StepResult crossed = rig.step(on_other_model);
  EXPECT_EQ(crossed.error, static_cast<std::uint16_t>(RequestError::internal));
  EXPECT_NE(crossed.message.find("started on model 'a'"), std::string::npos) << crossed.message;
  EXPECT_EQ(rig.query(false).slots, 2u);  // sequence 1 on a and 2 on b

  const ModelUnloaded unloaded = rig.unload("a");
  EXPECT_EQ(unloaded.model, "a");
  EXPECT_TRUE(unloaded.was_loaded);
  EXPECT_TRUE(unloaded.problems.empty()) << ::testing::PrintToString(unloaded.problems);
  EXPECT_EQ(unloaded.model_bytes, a.bytes);
  EXPECT_GT(unloaded.freed_bytes, 0u);
  EXPECT_LT(unloaded.held_after, unloaded.held_before);
  EXPECT_EQ(unloaded.freed_bytes, unloaded.held_before - unloaded.held_after);
  EXPECT_EQ(unloaded.pool.held_bytes, unloaded.held_after);
  EXPECT_EQ(owned(unloaded.pool, "weights:a"), 0u);
  EXPECT_EQ(owned(unloaded.pool, "kv:a"), 0u);
  EXPECT_EQ(unloaded.pool.active_bytes, b.bytes);
  EXPECT_EQ(unloaded.pool.cached_bytes, 0u);
  EXPECT_GT(unloaded.unload_ns, 0);
  const ExecutorReport after = rig.query(false);
  EXPECT_EQ(names_of(after), std::vector<std::string>{"b"});
  EXPECT_EQ(after.slots, 1u);  // a's sequence went with it, b's stays

  const StepResult refused = rig.step(prefill(rig, renamed(kFirst, 4), "a"));
  EXPECT_EQ(refused.error, static_cast<std::uint16_t>(RequestError::internal));
  EXPECT_NE(refused.message.find("model 'a' is not loaded"), std::string::npos) << refused.message;
  EXPECT_TRUE(refused.tokens.empty());
  EXPECT_EQ(refused.slots, 1u);

  // b serves on as before; the only model loaded, it is the one a plan naming none is for.
  EXPECT_EQ(tokens_of(generate(rig, {renamed(kFirst, 5)}, greedy(), 8)[0]), expected_b);

  const ModelUnloaded twice = rig.unload("a");
  EXPECT_EQ(twice.model, "a");
  EXPECT_FALSE(twice.was_loaded);
  EXPECT_TRUE(twice.problems.empty());
  EXPECT_EQ(twice.model_bytes, 0u);
  EXPECT_EQ(twice.freed_bytes, 0u);
  EXPECT_EQ(names_of(rig.query(false)), std::vector<std::string>{"b"});
}

// Nothing but the model holds memory here, so each unload must give back exactly what was held
// before the first load: a tolerance of a block (256 MiB) would hide a whole leaked tiny model.
TEST(ExecutorModelsTest, LoadingAndUnloadingTwentyTimesHoldsNoMoreThanBefore) {
  Rig rig(Rig::OptionsAsGiven{}, {{"models", "a=" + model_path().string()}});
  const PoolStatsWire baseline = rig.query(true).pool;
  const auto expected = direct_greedy(kFirst, 3);
  for (std::uint64_t round = 0; round < 20; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    const ModelLoaded loaded = rig.load("a");
    ASSERT_TRUE(loaded.ok) << loaded.error;
    EXPECT_GT(loaded.pool.held_bytes, baseline.held_bytes);
    // A sequence left running: the unload drops it with the model.
    EXPECT_EQ(tokens_of(generate(rig, {renamed(kFirst, 100 + round)}, greedy(), 3)[0]), expected);
    const ModelUnloaded unloaded = rig.unload("a");
    EXPECT_TRUE(unloaded.was_loaded);
    EXPECT_TRUE(unloaded.problems.empty()) << ::testing::PrintToString(unloaded.problems);
    EXPECT_EQ(unloaded.held_after, baseline.held_bytes);
    EXPECT_GE(unloaded.freed_bytes, loaded.bytes);
    EXPECT_EQ(unloaded.pool.active_bytes, baseline.active_bytes);
    EXPECT_EQ(unloaded.pool.cached_bytes, 0u);
  }
  const ExecutorReport report = rig.query(false);
  EXPECT_TRUE(report.models.empty());
  EXPECT_EQ(report.slots, 0u);
  EXPECT_EQ(report.pool.held_bytes, baseline.held_bytes);
}

TEST(ExecutorModelsTest, AReleaseThatFailsStillFreesTheWeights) {
  Rig rig(Rig::OptionsAsGiven{}, {{"models", "a=" + model_path().string()}, {"fail_release", "a"}});
  const PoolStatsWire baseline = rig.query(true).pool;
  for (std::uint64_t round = 0; round < 2; ++round) {  // and the model loads again after it
    SCOPED_TRACE("round " + std::to_string(round));
    const ModelLoaded loaded = rig.load("a");
    ASSERT_TRUE(loaded.ok) << loaded.error;
    generate(rig, {renamed(kFirst, 1 + round)}, greedy(), 2);
    const ModelUnloaded unloaded = rig.unload("a");
    EXPECT_TRUE(unloaded.was_loaded);
    ASSERT_EQ(unloaded.problems.size(), 1u) << ::testing::PrintToString(unloaded.problems);
    EXPECT_NE(unloaded.problems[0].find("weights"), std::string::npos) << unloaded.problems[0];
    EXPECT_NE(unloaded.problems[0].find("injected"), std::string::npos) << unloaded.problems[0];
    EXPECT_EQ(unloaded.model_bytes, loaded.bytes);
    EXPECT_EQ(unloaded.held_after, baseline.held_bytes);
    EXPECT_GE(unloaded.freed_bytes, loaded.bytes);
    EXPECT_EQ(owned(unloaded.pool, "weights:a"), 0u);
    EXPECT_EQ(unloaded.pool.active_bytes, baseline.active_bytes);
    const ExecutorReport report = rig.query(false);
    EXPECT_TRUE(report.models.empty());
    EXPECT_EQ(report.slots, 0u);
  }
}

TEST(ExecutorModelsTest, UnknownMissingAndBrokenModelsAreRefusedAndTheLoadedOneServesOn) {
  const std::string missing = "/nonexistent/missing.gguf";
  Rig rig(Rig::OptionsAsGiven{},
          {{"models", "a=" + model_path().string() + ";truncated=" + truncated_model_path().string() +
                          ";garbage=" + garbage_model_path().string() + ";missing=" + missing},
           {"preload", "a"}});
  const PoolStatsWire before = rig.query(true).pool;
  ASSERT_EQ(names_of(rig.query(false)), std::vector<std::string>{"a"});

  const ModelLoaded unknown = rig.load("nope");
  EXPECT_FALSE(unknown.ok);
  EXPECT_EQ(unknown.model, "nope");
  for (const char* id : {"'nope'", "a", "truncated", "garbage", "missing"}) {
    EXPECT_NE(unknown.error.find(id), std::string::npos) << id << " is not in: " << unknown.error;
  }

  const std::vector<std::pair<std::string, std::string>> broken{
      {"truncated", truncated_model_path().string()}, {"garbage", garbage_model_path().string()}, {"missing", missing}};
  for (const auto& [id, path] : broken) {
    const ModelLoaded refused = rig.load(id);
    EXPECT_FALSE(refused.ok) << id;
    EXPECT_NE(refused.error.find("'" + id + "'"), std::string::npos) << refused.error;
    EXPECT_NE(refused.error.find(path), std::string::npos) << refused.error;
    EXPECT_EQ(refused.bytes, 0u);
    EXPECT_EQ(refused.pool.active_bytes, before.active_bytes) << id;  // nothing of it stays
    EXPECT_EQ(refused.pool.held_bytes, before.held_bytes) << id;
  }
  EXPECT_EQ(names_of(rig.query(false)), std::vector<std::string>{"a"});
  EXPECT_EQ(tokens_of(generate(rig, {kFirst}, greedy(), 4)[0]), direct_greedy(kFirst, 4));
}

TEST(ExecutorModelsTest, ModelOptionsAreChecked) {
  const std::string models = "a=" + model_path().string() + ";b=" + model_b_path().string();
  const std::vector<ActorOptions> bad{
      {{"models", ""}},
      {{"models", "a"}},
      {{"models", "=x.gguf"}},
      {{"models", "a="}},
      {{"models", "a=x.gguf;;b=y.gguf"}},
      {{"models", "a=x.gguf;a=y.gguf"}},
      {{"models", models}, {"model", "m.gguf"}},
      {{"models", models}, {"name", "a"}},
      {{"models", models}, {"preload", "c"}},
      {{"models", models}, {"preload", "a,,b"}},
      {{"models", models}, {"fail_release", "c"}},
      {{"model", "m.gguf"}, {"preload", "other"}},
      {{"models", models}, {"block_mib", "0"}},
  };
  for (const ActorOptions& options : bad) {
    EXPECT_THROW(make_executor(options), std::invalid_argument) << ::testing::PrintToString(options);
  }
  EXPECT_NO_THROW(make_executor({{"models", models}, {"preload", "b,a,b"}, {"fail_release", "a"}}));
  EXPECT_NO_THROW(make_executor({{"model", "m.gguf"}, {"preload", ""}}));
  EXPECT_NO_THROW(make_executor({{"model", "m.gguf"}, {"name", "x"}, {"preload", "x"}}));

  // Models that are only configured are not opened at start: a missing file fails its load.
  Rig rig(Rig::OptionsAsGiven{}, {{"models", "gone=/nonexistent/gone.gguf"}});
  EXPECT_TRUE(rig.query(false).models.empty());
  const ModelLoaded gone = rig.load("gone");
  EXPECT_FALSE(gone.ok);
  EXPECT_NE(gone.error.find("/nonexistent/gone.gguf"), std::string::npos) << gone.error;
}

}  // namespace
}  // namespace mqlm::actors
