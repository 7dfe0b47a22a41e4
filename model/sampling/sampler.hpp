// The per-sequence sampler, the reference the GPU sampler (shaders/sample.comp) must agree with
// token for token (docs/sampling.md), in brief:
//   1. the adjusted logits: NaN -> -inf, +inf -> the largest float; tokens outside the allowed
//      mask -> -inf; logit_bias added; then the penalties (llama.cpp's chain order: bias first):
//      repetition (CTRL / llama.cpp: over the last repetition_last_n tokens of prompt and output,
//      each distinct token once: positive logit * (1 / r), negative logit * r), then presence and
//      frequency (OpenAI: over the generated tokens, logit -= count * frequency + presence);
//   2. logprobs, when asked: log-softmax of the adjusted logits at temperature 1, before
//      temperature and the filters (what the sampler starts from; it does not collapse to 0 /
//      -inf under greedy or a narrow top-k);
//   3. temperature 0: argmax, ties to the lowest id. Otherwise every filter is a value threshold
//      on the adjusted logits, ties at a threshold kept together (as Hugging Face's warpers keep
//      them): top-k (the k-th largest value), top-p (the value where the descending mass reaches
//      p), min-p (the largest value plus temperature * log(min_p)); the kept tokens are those at
//      or above the highest threshold, and the draw walks them in id order.
//
// Determinism: the uniform number of the i-th generated token is Philox4x32-10 keyed by the seed
// with counter i (philox.hpp), so a request's tokens depend only on its seed, its logits and its
// own history, on the CPU and on the GPU alike, whatever the batching.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "model/sampling/sampling_params.hpp"

namespace mqlm::model {

struct TokenLogprob {
  std::int32_t token = -1;
  float logprob = 0.0f;
};

struct SampledToken {
  std::int32_t token = -1;
  std::optional<float> logprob;            // the chosen token's, when params.logprobs
  std::vector<TokenLogprob> top_logprobs;  // params.top_logprobs entries, most likely first
                                           // (ties: lowest id first)
};

// What the GPU sampler needs for one output row: the parameters and, for each distinct token the
// request touches, its bias and penalty inputs. The host keeps the history; this describes it.
struct SamplingEntry {
  std::int32_t token = 0;
  float bias = 0.0f;           // logit_bias for the token, 0 if none
  std::uint32_t in_window = 0; // 1: in the repetition window (and the repetition penalty is on)
  std::uint32_t count = 0;     // times generated so far
};

struct SamplingRow {
  float temperature = 1.0f;
  std::int32_t top_k = 0;
  float top_p = 1.0f;
  float min_p_offset = 0.0f;  // temperature * logf(min_p) in float; -inf when min_p is 0
  float repetition_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  std::uint64_t seed = 0;
  std::int32_t top_logprobs = 0;
  bool logprobs = false;
  std::uint32_t counter = 0;           // Philox counter of this draw: the generated-token index
  std::vector<SamplingEntry> entries;  // by token id, ascending
};

class Sampler {
 public:
  // params must have passed validate(); an invalid one here is a bug (std::invalid_argument).
  // prompt: the prompt's tokens, seen by the repetition penalty only.
  explicit Sampler(SamplingParams params, std::span<const std::int32_t> prompt = {});

  // Samples the next token and records it in the history the penalties read.
  // logits: (n) raw logits. NaN counts as -inf and +inf as the largest float.
  // allowed_bits: (ceil(n / 32)) bit i of word i / 32 set = token i may be chosen; empty: all may.
  // At least one allowed logit must be finite, else std::invalid_argument (a bug, not the request's).
  SampledToken sample(std::span<const float> logits, std::span<const std::uint32_t> allowed_bits = {});

  // The next draw for the GPU. one_pending: the step before sampled a token on the GPU that the
  // host has not accepted yet; the GPU counts it itself (window of repetition_last_n - 1 known
  // tokens, counter + 1).
  SamplingRow gpu_row(bool one_pending) const;
  // The draw after the history and then `drafts` (speculative decoding's verification rows): its
  // counter, window and counts as gpu_row's would be once the drafts were accepted.
  SamplingRow gpu_row_after(std::span<const std::int32_t> drafts) const;
  // Records a token the GPU chose, as sample() records its own.
  void accept(std::int32_t token) { record(token); }

  const SamplingParams& params() const { return params_; }
  std::int64_t generated_count() const { return generated_count_; }

 private:
  float adjust(std::span<const float> logits, std::span<const std::uint32_t> allowed_bits);  // the max
  float penalised(std::int32_t id, float logit) const;
  double report_top_logprobs(SampledToken& result, float max) const;
  std::int32_t argmax(float max) const;
  std::int32_t draw(float max);
  float top_k_threshold();
  float top_p_threshold(float top_k_threshold, float max, float inverse_temperature);
  void record(std::int32_t token);
  std::size_t repetition_window() const;
  SamplingRow row_after(bool one_pending, std::span<const std::int32_t> then) const;
  std::vector<std::int32_t> window_tokens(bool one_pending, std::span<const std::int32_t> then) const;

  SamplingParams params_;
  float min_p_offset_;                                            // -inf when min_p is 0
  std::unordered_map<std::int32_t, float> bias_;                  // token -> logit_bias
  std::deque<std::int32_t> recent_;                               // (<= repetition_last_n)
  std::unordered_map<std::int32_t, std::int32_t> recent_counts_;  // token -> count in recent_
  std::unordered_map<std::int32_t, std::int32_t> output_counts_;  // token -> times generated
  std::int64_t generated_count_ = 0;
  std::vector<float> adjusted_;  // (n) this step's adjusted logits, reused across steps
  std::vector<float> scratch_;   // (<= n) values the thresholds partially sort
  std::vector<std::int32_t> kept_;  // (<= n) the kept tokens, ascending
  std::vector<float> weights_;      // (<= n) their weights
};

}  // namespace mqlm::model
