// The demo model against the outputs its training script computed (tools/demo_model/train.py,
// PyTorch in float64): mqlm's tokenizer gives the ids the Python tokenizer gave, and the CPU
// reference forward pass gives the same greedy tokens and logprobs. The GPU paths (`mqlm
// generate`, `mqlm serve`) are checked by golden_test.py in this folder.
//
// The model and golden.json come from CMake (MQLM_DEMO_MODEL, MQLM_DEMO_GOLDEN); both are
// committed, and a missing one fails.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "model/gguf/gguf_file.hpp"
#include "model/gguf/vocabulary_metadata.hpp"
#include "model/llama/gguf_model.hpp"
#include "model/llama/reference_model.hpp"
#include "model/tokenizer/tokenizer.hpp"

namespace mqlm::model {
namespace {

// float32 activations between ops (mqlm's reference) against float64 throughout (the golden):
// measured differences are around 1e-5 on the demo model.
constexpr double kReferenceTolerance = 2e-4;

class GoldenTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(MQLM_DEMO_MODEL) || !std::filesystem::exists(MQLM_DEMO_GOLDEN)) {
      FAIL() << "the demo model is missing: " << MQLM_DEMO_MODEL << " and " << MQLM_DEMO_GOLDEN
             << " are committed (tools/demo_model/train.py writes them)";
    }
    auto opened = gguf::GgufFile::open(MQLM_DEMO_MODEL);
    ASSERT_TRUE(std::holds_alternative<gguf::GgufFile>(opened)) << std::get<gguf::GgufError>(opened).message();
    file_.emplace(std::move(std::get<gguf::GgufFile>(opened)));
    std::ifstream in(MQLM_DEMO_GOLDEN);
    golden_ = nlohmann::json::parse(in);
  }

  Tokenizer tokenizer() const {
    auto vocabulary = gguf::read_vocabulary(*file_);
    EXPECT_TRUE(std::holds_alternative<Vocabulary>(vocabulary));
    auto created = Tokenizer::create(std::get<Vocabulary>(vocabulary));
    EXPECT_TRUE(std::holds_alternative<Tokenizer>(created)) << std::get<TokenizerError>(created).message;
    return std::get<Tokenizer>(std::move(created));
  }

  std::optional<gguf::GgufFile> file_;
  nlohmann::json golden_;
};

TEST_F(GoldenTest, TokenizerGivesThePythonIds) {
  const Tokenizer t = tokenizer();
  for (const auto* list : {"prompts", "tokenizer_cases"}) {
    for (const auto& c : golden_[list]) {
      const std::string text = c["text"];
      const auto want = c["ids"].get<std::vector<TokenId>>();
      EXPECT_EQ(t.encode(text), want) << list << ": " << nlohmann::json(text).dump();
      EXPECT_EQ(t.decode(want), text);
    }
  }
}

// log-softmax of one row of logits, in double.
std::vector<double> log_softmax(std::span<const float> logits) {
  const double top = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float l : logits) sum += std::exp(l - top);
  std::vector<double> out(logits.size());
  for (std::size_t i = 0; i < logits.size(); ++i) out[i] = logits[i] - top - std::log(sum);
  return out;
}

TEST_F(GoldenTest, CpuReferenceGivesTheGreedyTokensAndLogprobs) {
  auto config = read_llama_config(*file_);
  ASSERT_TRUE(std::holds_alternative<LlamaConfig>(config)) << std::get<std::string>(config);
  const ReferenceModel model = ReferenceModel::load(std::get<LlamaConfig>(config), gguf_tensor_source(*file_));
  const std::size_t vocab = model.config.n_vocab;
  double worst = 0;
  for (const auto& prompt : golden_["prompts"]) {
    SCOPED_TRACE(prompt["text"].get<std::string>());
    ReferenceSequence sequence(model);
    std::vector<float> logits = sequence.forward(prompt["ids"].get<std::vector<std::int32_t>>());
    std::span<const float> last(logits.data() + logits.size() - vocab, vocab);
    const auto& steps = prompt["steps"];
    for (std::size_t s = 0; s < steps.size(); ++s) {
      const auto& step = steps[s];
      const std::vector<double> logprobs = log_softmax(last);
      const auto chosen = static_cast<std::int32_t>(std::max_element(logprobs.begin(), logprobs.end()) - logprobs.begin());
      ASSERT_EQ(chosen, step["token"].get<std::int32_t>()) << "the greedy tokens part at step " << s;
      for (const auto& [id, logprob] : step["top"].get<std::vector<std::pair<std::int32_t, double>>>()) {
        const double difference = std::abs(logprobs.at(static_cast<std::size_t>(id)) - logprob);
        worst = std::max(worst, difference);
        EXPECT_LT(difference, kReferenceTolerance) << "token " << id;
      }
      if (s + 1 == steps.size()) break;
      logits = sequence.forward(std::vector<std::int32_t>{chosen});
      last = std::span<const float>(logits.data(), vocab);
    }
  }
  RecordProperty("max_logprob_difference", std::to_string(worst));
  std::cout << "largest logprob difference from the golden: " << worst << "\n";
}

}  // namespace
}  // namespace mqlm::model
