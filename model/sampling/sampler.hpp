// The per-sequence sampler: penalties, temperature, top-k, top-p, min-p and a seeded draw, over
// either the full logits or a candidate set the GPU preselected.
//
// The pipeline, in order (that of Hugging Face's warpers and vLLM):
//   1. penalties: repetition (CTRL / llama.cpp: over the last repetition_last_n tokens of prompt
//      and output, each distinct token once: positive logit / r, negative logit * r), then
//      presence and frequency (OpenAI: over the generated tokens only,
//      logit -= count * frequency + (count > 0) * presence);
//   2. logprobs, when asked: log-softmax of the penalised logits at temperature 1, before
//      temperature and the filters. OpenAI reports the model's log-softmax; we report what the
//      model plus penalties assigns, which is what the sampler starts from, and which does not
//      collapse to 0 / -inf under greedy or a narrow top-k;
//   3. temperature 0: argmax, ties to the lowest id; otherwise logits / temperature, then top-k,
//      top-p (on what top-k kept, renormalised), min-p (relative to the most likely), and a draw.
//
// Determinism: std::mt19937_64's sequence is fixed by the standard; the uniform draw is built
// here from its 53 high bits (std::uniform_real_distribution is implementation-defined), and
// the candidates are drawn from in a canonical order (by id, or by logit then id once sorted),
// whatever std::sort or the GPU's output order did. Same seed and logits => same tokens, given
// the same libm (exp may differ in the last bit between libms, which moves a draw only when it
// falls within ~1e-16 of a boundary).
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <random>
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

// A candidate set preselected on the GPU (typically its top-K): the sampler treats it as the
// whole distribution, which equals sampling from the full logits whenever K covers what the
// filters would keep (K >= top_k, or the nucleus fits in K).
//
// Logprobs: with log_sum_exp (of the raw logits over the full vocabulary) they are exact log-
// softmax values; the sampler corrects it for the penalties it applies to the candidates.
// Without it, they are relative to the candidates only (an upper bound on the true value).
// Penalties apply to the candidates only: a penalised token outside the set stays outside.
struct CandidateLogits {
  std::span<const std::int32_t> ids;  // (K) token ids, distinct, in any order
  std::span<const float> logits;      // (K) their raw logits
  std::optional<float> log_sum_exp;   // over the full vocabulary's raw logits, when known
};

class Sampler {
 public:
  // params must have passed validate(); an invalid one here is a bug (std::invalid_argument).
  // prompt: the prompt's tokens, seen by the repetition penalty only.
  explicit Sampler(SamplingParams params, std::span<const std::int32_t> prompt = {});

  // Samples the next token and records it in the history the penalties read.
  // logits: (vocab) raw logits. NaN counts as -inf and +inf as the largest float; at least one
  // logit must be finite, else std::invalid_argument (the model's bug, not the request's).
  SampledToken sample(std::span<const float> logits);
  SampledToken sample(const CandidateLogits& candidates);

  const SamplingParams& params() const { return params_; }
  std::int64_t generated_count() const { return generated_count_; }

 private:
  struct Candidate {
    std::int32_t id;
    float logit;  // penalised, at temperature 1
  };

  void load_full(std::span<const float> logits);
  std::optional<double> load_candidates(const CandidateLogits& candidates);  // corrected log_sum_exp
  float penalised(std::int32_t id, float logit) const;
  SampledToken finish(std::optional<double> given_log_normaliser);
  std::int32_t choose();
  void keep_top_k();
  void keep_top_p();
  void keep_min_p();
  std::int32_t draw();
  double uniform01();
  void record(std::int32_t token);
  std::size_t repetition_window() const;

  SamplingParams params_;
  std::mt19937_64 rng_;
  std::deque<std::int32_t> recent_;                               // (<= repetition_last_n)
  std::unordered_map<std::int32_t, std::int32_t> recent_counts_;  // token -> count in recent_
  std::unordered_map<std::int32_t, std::int32_t> output_counts_;  // token -> times generated
  std::int64_t generated_count_ = 0;
  std::vector<Candidate> work_;  // this step's candidates, reused across steps
};

}  // namespace mqlm::model
