// One request as the scheduler's policy holds it (scheduler_policy.cpp and scheduler_planning.cpp
// share it; nothing else sees it).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "actors/scheduler/scheduler_policy.hpp"
#include "model/chat/output_parser.hpp"
#include "model/llama/embedding_pool.hpp"
#include "model/sampling/stop_matcher.hpp"
#include "model/tokenizer/tokenizer.hpp"

namespace mqlm::actors {

struct SchedulerPolicy::Request {
  ServedModel* model = nullptr;
  std::string front;             // the front end that submitted it (gateway, http)
  std::uint64_t client_request = 0;  // its request id there
  std::uint64_t sequence = 0;
  std::vector<std::int32_t> history;  // prompt, then generated tokens
  std::uint32_t prompt_tokens = 0;
  std::uint32_t computed = 0;         // tokens of history whose K and V are in the cache
  std::uint32_t planned = 0;          // positions given to plans (computed, or in a plan in flight)
  std::uint32_t pending = 0;          // plans in flight that sample a token for it
  std::uint32_t epoch = 0;            // preemptions: answers to plans of an earlier epoch compute nothing of it
  std::uint32_t cached_tokens = 0;    // prompt tokens the prefix cache gave at first admission
  // Its prefix beyond the GPU: asked of the cache-writer once, before its first admission.
  enum class Lookup : std::uint8_t { none, pending, done } lookup = Lookup::none;
  std::int64_t lookup_sent_ns = 0;
  std::uint32_t restore_from = 0;     // the page index the answer's first page is for
  std::vector<messages::KvPageId> restore_ids;  // the answer's pages, and their blobs and tiers
  messages::Frames restore_blobs;
  std::vector<std::uint8_t> restore_tiers;
  bool admitted_once = false;
  bool running = false;
  bool executor_has_it = false;       // the executor holds its sampler
  model::SamplingParams sampling;
  model::Pooling pooling = model::Pooling::none;  // an embedding: its prompt's output is a vector
  std::optional<model::StreamDecoder> decoder;
  std::optional<model::StopMatcher> stops;
  // A chat's output split into content, reasoning and tool calls, after the stop strings.
  std::optional<model::OutputParser> output;
  std::int64_t submitted_ns = 0, scheduled_ns = 0, first_token_ns = 0;
  // Speculative decoding: drafts a step at most (0 for a request whose draw is not the argmax),
  // whether a plan in flight verifies drafts of it (nothing more is planned for it until that
  // answer), the back-off after misses: decode steps left without drafts, and the next wait, and
  // the estimated chance that a draft is kept (scheduler_speculation.cpp's note_drafts), which sets
  // how many are drafted; its start drafts 4.
  std::uint32_t draft_max = 0;
  bool verifying = false;
  std::uint32_t draft_skip = 0;
  std::uint32_t draft_backoff = 0;
  float draft_acceptance = 0.7f;

  std::uint32_t generated() const { return static_cast<std::uint32_t>(history.size()) - prompt_tokens; }
  bool embedding() const { return pooling != model::Pooling::none; }
  // The positions it may take beyond its prompt: an embedding generates nothing.
  std::uint32_t generation_room() const {
    return embedding() ? 0 : static_cast<std::uint32_t>(std::max(sampling.max_tokens, 0));
  }
};

}  // namespace mqlm::actors
