// qwen35, the hybrid of Gated DeltaNet and attention layers: make-model's tiny-qwen35 file (8
// layers, the 4th and 8th attending) in F32 and F16, its next-token distribution by mqlm's CPU
// reference against llama.cpp's llama_decode (the oracle) on prompts of 64 and 100 tokens, long
// enough that each DeltaNet layer's state carries many tokens: the same top-1 where llama.cpp's
// first two stand apart, and |delta logprob| <= 0.01 over llama.cpp's top 5. The reference carries
// the recurrent and convolution state across calls: a prompt given as a prefill and then its last
// token as a decode step has the logits of one prefill.
//
// Not compared yet: make-model's Q8_0 file (it loads in llama.cpp; with the products' activations
// rounded to int8 blocks as ggml's are, the reference was 0.044 from llama.cpp, 0.072 without, top-1
// still equal: something of llama.cpp's quantized path is not modelled here).
//
// No GPU computes here: mqlm refuses to load qwen35 on the GPU until the kernels of its DeltaNet
// layers are there, and the last test checks that refusal (on lavapipe, before any upload).
#include <gtest/gtest.h>

#include <llama-cpp.h>
#include <llama.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <numeric>
#include <span>
#include <vector>

#include <fmt/format.h>

#include "model/gguf/synthetic_model.hpp"
#include "model/llama/gguf_model.hpp"
#include "model/llama/gpu_model.hpp"
#include "model/llama/reference_model.hpp"
#include "tests/gpu/gpu_fixture.hpp"
#include "tests/oracle/llamacpp.hpp"

namespace mqlm::model {
namespace {

constexpr double kBound = 0.01;
constexpr double kTopGap = 0.05;  // a top-1 is compared only where llama.cpp's first two lie further apart
constexpr int kThreads = 1;

using Tokens = std::vector<llama_token>;

gguf::GgufFile open_file(const std::filesystem::path& path) {
  auto opened = gguf::GgufFile::open(path);
  if (auto* error = std::get_if<gguf::GgufError>(&opened)) throw std::runtime_error(error->message());
  return std::get<gguf::GgufFile>(std::move(opened));
}

std::filesystem::path write_tiny_qwen35(const testing::ScratchFolder& folder, gpu::WeightType type) {
  const auto path = folder / fmt::format("tiny_qwen35_{}.gguf", gpu::weight_type_name(type));
  if (auto error = gguf::make_synthetic_model(*gguf::model_preset("tiny-qwen35"), type, 35, "tiny-qwen35").writer.write(path)) {
    throw std::runtime_error(error->message());
  }
  return path;
}

// The last token's logits of each prompt by llama.cpp (CPU), each from an empty memory.
std::vector<std::vector<float>> llamacpp_logits(const std::filesystem::path& path, const std::vector<Tokens>& prompts) {
  auto model_params = llama_model_default_params();
  model_params.n_gpu_layers = 0;
  llama_model_ptr model(llama_model_load_from_file(path.c_str(), model_params));
  if (!model) throw std::runtime_error("llama.cpp cannot load " + path.string());
  auto context_params = llama_context_default_params();
  context_params.n_ctx = context_params.n_batch = context_params.n_ubatch = 128;
  context_params.n_threads = context_params.n_threads_batch = kThreads;
  llama_context_ptr context(llama_init_from_model(model.get(), context_params));
  if (!context) throw std::runtime_error("llama.cpp cannot make a context for " + path.string());
  const auto vocab = static_cast<std::size_t>(llama_vocab_n_tokens(llama_model_get_vocab(model.get())));
  std::vector<std::vector<float>> out;
  for (Tokens prompt : prompts) {
    llama_memory_clear(llama_get_memory(context.get()), true);
    if (llama_decode(context.get(), llama_batch_get_one(prompt.data(), static_cast<std::int32_t>(prompt.size()))) != 0) {
      throw std::runtime_error("llama_decode failed");
    }
    const float* logits = llama_get_logits_ith(context.get(), -1);
    out.emplace_back(logits, logits + vocab);
  }
  return out;
}

std::vector<double> log_probs(std::span<const float> logits) {
  double top = *std::ranges::max_element(logits), sum = 0;
  for (float v : logits) sum += std::exp(v - top);
  std::vector<double> out(logits.size());
  for (std::size_t i = 0; i < logits.size(); ++i) out[i] = logits[i] - top - std::log(sum);
  return out;
}

std::vector<std::size_t> best(const std::vector<double>& logprobs, std::size_t count) {
  std::vector<std::size_t> order(logprobs.size());
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(count), order.end(),
                    [&](std::size_t a, std::size_t b) { return logprobs[a] > logprobs[b]; });
  order.resize(count);
  return order;
}

// Prompts of `length` tokens from a fixed sequence of candidates.
std::vector<Tokens> prompts_of(std::uint32_t length, std::uint32_t count, std::uint32_t vocab) {
  std::vector<Tokens> out;
  for (std::uint32_t p = 0; p < count; ++p) {
    Tokens prompt(length);
    for (std::uint32_t i = 0; i < length; ++i) prompt[i] = static_cast<llama_token>((i * 389 + p * 997 + length * 71 + 5) % vocab);
    out.push_back(std::move(prompt));
  }
  return out;
}

ReferenceModel load_reference(const gguf::GgufFile& file) {
  auto config = read_llama_config(file);
  if (auto* problem = std::get_if<std::string>(&config)) throw std::runtime_error(*problem);
  return ReferenceModel::load(std::get<LlamaConfig>(config), gguf_tensor_source(file));
}

std::vector<float> last_row(const std::vector<float>& logits, std::size_t vocab) {
  return {logits.end() - static_cast<std::ptrdiff_t>(vocab), logits.end()};
}

class HybridFile : public ::testing::TestWithParam<gpu::WeightType> {};

TEST_P(HybridFile, NextTokenAgreesWithLlamaCpp) {
  testing::start_llamacpp();
  testing::ScratchFolder folder("mqlm_llamacpp_hybrid");
  const auto path = write_tiny_qwen35(folder, GetParam());
  const gguf::GgufFile file = open_file(path);
  const ReferenceModel model = load_reference(file);
  const std::uint32_t vocab = model.config.n_vocab;
  std::vector<Tokens> prompts = prompts_of(64, 4, vocab);
  for (Tokens& p : prompts_of(100, 4, vocab)) prompts.push_back(std::move(p));
  const auto theirs = llamacpp_logits(path, prompts);
  double worst = 0;
  std::size_t compared = 0;
  for (std::size_t p = 0; p < prompts.size(); ++p) {
    ReferenceSequence sequence(model);
    const auto ours = log_probs(last_row(sequence.forward(prompts[p]), vocab));
    const auto want = log_probs(theirs[p]);
    const auto top = best(want, 5);
    for (std::size_t token : top) worst = std::max(worst, std::abs(ours[token] - want[token]));
    if (want[top[0]] - want[top[1]] <= kTopGap) continue;
    ++compared;
    EXPECT_EQ(best(ours, 1)[0], top[0]) << "prompt " << p << " of " << prompts[p].size() << " tokens";
  }
  EXPECT_LE(worst, kBound);
  EXPECT_GE(compared, 2u) << "too few prompts with a clear next token to compare top-1";
  fmt::print("oracle | reference {} tiny-qwen35 | top-1 compared {} of {} | max |delta logprob| {:.5f}\n",
             gpu::weight_type_name(GetParam()), compared, prompts.size(), worst);
}

INSTANTIATE_TEST_SUITE_P(Types, HybridFile, ::testing::Values(gpu::WeightType::f32, gpu::WeightType::f16),
                         [](const auto& info) { return std::string(gpu::weight_type_name(info.param)); });

// The state carried across calls: a prompt's last token's logits, the prompt given as one prefill
// and as a prefill of all but 9 tokens, then 8 single tokens, then the last.
TEST(HybridReference, PrefillThenDecodeStepsGiveTheLogitsOfOnePrefill) {
  testing::ScratchFolder folder("mqlm_hybrid_split");
  const gguf::GgufFile file = open_file(write_tiny_qwen35(folder, gpu::WeightType::f32));
  const ReferenceModel model = load_reference(file);
  const std::uint32_t vocab = model.config.n_vocab;
  const Tokens prompt = prompts_of(72, 1, vocab)[0];
  ReferenceSequence whole(model), split(model);
  const auto want = last_row(whole.forward(prompt), vocab);
  std::vector<float> got = split.forward(std::span(prompt).first(prompt.size() - 9));
  for (std::size_t i = prompt.size() - 9; i < prompt.size(); ++i) got = split.forward(std::span(prompt).subspan(i, 1));
  ASSERT_EQ(got.size(), want.size());
  ASSERT_EQ(split.length(), prompt.size());
  for (std::size_t i = 0; i < vocab; ++i) ASSERT_NEAR(got[i], want[i], 1e-4) << "logit " << i;
  // The first 63 tokens still count after the 9 steps: changed, they change the last logits.
  Tokens other = prompt;
  for (std::size_t i = 0; i + 9 < other.size(); ++i) other[i] = (other[i] + 1) % static_cast<llama_token>(vocab);
  ReferenceSequence changed(model);
  const auto moved = last_row(changed.forward(other), vocab);
  double largest = 0;
  for (std::size_t i = 0; i < vocab; ++i) largest = std::max(largest, double{std::abs(moved[i] - want[i])});
  EXPECT_GT(largest, 1e-3);
}

// qwen35's keys as read: the DeltaNet heads, the attention layers every 4th, the partial rotary turn;
// M-RoPE sections that leave a rotary pair to the 4th section (position 0 for text) are refused.
TEST(HybridConfig, ReadsTheDeltaNetKeysAndRefusesSectionsItCannotTurn) {
  gguf::ModelShape shape = *gguf::model_preset("tiny-qwen35");
  const auto bytes = gguf::make_synthetic_model(shape, gpu::WeightType::f16, 1, "h").writer.to_bytes();
  auto parsed = gguf::GgufFile::parse(bytes);
  ASSERT_TRUE(std::holds_alternative<gguf::GgufFile>(parsed));
  auto config = read_llama_config(std::get<gguf::GgufFile>(parsed));
  ASSERT_TRUE(std::holds_alternative<LlamaConfig>(config)) << std::get<std::string>(config);
  const LlamaConfig& c = std::get<LlamaConfig>(config);
  EXPECT_EQ(c.ssm_k_heads, 4u);
  EXPECT_EQ(c.ssm_v_heads, 8u);
  EXPECT_EQ(c.ssm_head_dim, 32u);
  EXPECT_EQ(c.ssm_conv_kernel, 4u);
  EXPECT_EQ(c.rotary_dims(), 16u);
  for (std::uint32_t l = 0; l < 8; ++l) EXPECT_EQ(c.recurrent_layer(l), l != 3 && l != 7) << l;
  shape.rope_sections = {4, 2, 2, 0};  // pair 7 is section 1's (7 % 3) but past its 3 x 2
  auto refused = gguf::GgufFile::parse(gguf::make_synthetic_model(shape, gpu::WeightType::f16, 1, "h").writer.to_bytes());
  auto why = read_llama_config(std::get<gguf::GgufFile>(refused));
  ASSERT_TRUE(std::holds_alternative<std::string>(why));
  EXPECT_NE(std::get<std::string>(why).find("rope.dimension_sections"), std::string::npos) << std::get<std::string>(why);
}

// Until the GPU forward pass runs its DeltaNet layers, a qwen35 file is refused at load, naming them.
TEST(HybridReference, TheGpuModelRefusesQwen35NamingWhatIsMissing) {
  testing::ScratchFolder folder("mqlm_hybrid_refused");
  const gguf::GgufFile file = open_file(write_tiny_qwen35(folder, gpu::WeightType::f16));
  auto config = read_llama_config(file);
  ASSERT_TRUE(std::holds_alternative<LlamaConfig>(config)) << std::get<std::string>(config);
  try {
    auto& gpu = gpu::testing::shared_gpu();
    GpuModel model(GpuContext{gpu.queue, gpu.pool, gpu.kernels}, std::get<LlamaConfig>(config), gguf_tensor_source(file),
                   "weights:qwen35");
    FAIL() << "a qwen35 model was loaded on the GPU";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("Gated DeltaNet"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace mqlm::model
