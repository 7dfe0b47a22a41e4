// Speculative decoding by prompt lookup, the scheduler's part: which decode steps carry drafts,
// and what a verified step leaves of the sequence. The executor verifies (executor.cpp's
// take_outputs): it returns the drafts the argmax agreed with and the argmax after them.
//
// A sequence with drafts in flight is planned nothing more until their answer (Request::verifying):
// its next token is not known, and a follower could not be given one. Its length after the answer
// is the position of its last token plus the drafts kept; the pages reserved only for drafts that
// were not kept go back (KvPageTable::truncate), and their K and V, and that of rejected positions
// in the pages kept, is written over by the next step before anything reads it: attention reads a
// token's past, positions up to its own.
#include <algorithm>
#include <cmath>

#include "actors/scheduler/scheduler_policy.hpp"
#include "actors/scheduler/scheduler_request.hpp"
#include "model/sampling/prompt_lookup.hpp"

namespace mqlm::actors {

using namespace messages;

namespace {

constexpr std::uint32_t kDraftNgram = 3;        // the longest n-gram looked up
constexpr std::uint32_t kMinDraftMatch = 2;     // the shortest match that is drafted from
constexpr std::uint32_t kDraftWindow = 4096;    // how far back it is looked for
constexpr std::uint32_t kMinDraftBackoff = 2;   // decode steps without drafts after a miss, at first
constexpr std::uint32_t kMaxDraftBackoff = 32;  // and at most
// A draft is proposed only while the chance that it is kept (the acceptance estimate to the power
// of its place) is at least this: the GPU's cost of a draft row is small, a kept one saves a step.
constexpr float kMinDraftChance = 0.2f;
constexpr float kAcceptanceWeight = 0.3f;  // of the latest step in the acceptance estimate

model::PromptLookup lookup(std::uint32_t draft_max) { return {kDraftNgram, draft_max, kDraftWindow, kMinDraftMatch}; }

// The drafts worth proposing at a per-draft acceptance `rate`: the j-th is kept with chance rate^j.
std::uint32_t draft_length(float rate, std::uint32_t draft_max) {
  if (rate >= 1.0f) return draft_max;
  if (rate <= kMinDraftChance) return 1;
  const auto length = static_cast<std::uint32_t>(std::log(kMinDraftChance) / std::log(rate));
  return std::clamp(length, 1u, draft_max);
}

}  // namespace

// Whether the plan's model runs few enough sequences to draft (once a plan: speculates() asks it
// for every sequence).
void SchedulerPolicy::open_drafting(const ServedModel& model) {
  const auto running = std::count_if(running_.begin(), running_.end(),
                                     [&](std::uint64_t seq) { return requests_.at(seq)->model == &model; });
  drafting_open_ = static_cast<std::uint32_t>(running) <= config_.speculate_max_batch;
}

// Whether the request will draft after its token in flight, so that it waits for that token rather
// than follow the step: not in a back-off, and its known tokens already match an earlier n-gram
// (the guess then runs past that token; a request whose lookup finds nothing follows, as without
// speculation).
bool SchedulerPolicy::speculates(const Request& r) const {
  if (r.draft_max == 0 || r.draft_skip > 0 || r.embedding() || !drafting_open_) return false;
  return !model::find_draft(r.history, lookup(1)).tokens.empty();
}

// The drafts of a decode step (room: the budget left after its token), none where it should not
// speculate now; a decode in the back-off counts it down. As many as the request's acceptance
// estimate makes worth it, and no more than the match that guessed them is long.
std::vector<std::int32_t> SchedulerPolicy::draft_for(Request& r, bool follows, std::uint32_t room) {
  if (r.draft_max == 0) return {};
  if (r.draft_skip > 0) {
    --r.draft_skip;
    return {};
  }
  if (follows || r.embedding() || !drafting_open_) return {};
  // Past max_tokens or the context nothing drafted could be kept.
  const auto max_tokens = static_cast<std::uint32_t>(std::max(r.sampling.max_tokens, 1));
  const std::uint32_t left = max_tokens > r.generated() ? max_tokens - r.generated() : 1;
  std::uint32_t k = std::min({draft_length(r.draft_acceptance, r.draft_max), room, left - 1});
  const auto length = static_cast<std::uint32_t>(r.history.size());
  if (r.model->n_ctx > 0) k = std::min(k, r.model->n_ctx > length ? r.model->n_ctx - length : 0);
  if (k == 0) return {};
  model::PromptDraft draft = model::find_draft(r.history, lookup(k));
  if (draft.tokens.empty()) note_drafts(r, 0, 0);
  if (draft.tokens.size() > draft.matched) draft.tokens.resize(draft.matched);
  return std::move(draft.tokens);
}

// Each verified step moves the request's acceptance estimate (an exponential average of the drafts
// kept per draft tried: a rejection ends the trial, so k drafts of which a were kept are a + 1
// tries, or a when all were kept). A step that kept none, or where the guess found nothing, backs
// the request off for twice as many decodes as the last time (2, 4 ... kMaxDraftBackoff); one that
// kept a draft ends the back-off.
void SchedulerPolicy::note_drafts(Request& r, std::uint32_t drafted, std::size_t accepted) {
  if (drafted > 0) {
    const auto kept = static_cast<float>(accepted);
    const float tries = kept + (accepted < drafted ? 1.0f : 0.0f);
    r.draft_acceptance += kAcceptanceWeight * (kept / tries - r.draft_acceptance);
  }
  if (drafted > 0 && accepted > 0) {
    r.draft_backoff = 0;
    return;
  }
  r.draft_backoff = std::clamp(r.draft_backoff * 2, kMinDraftBackoff, kMaxDraftBackoff);
  r.draft_skip = r.draft_backoff;
}

// The answer to a sequence's drafts (plan sequence `index` of the step): the drafts kept and the
// argmax after them go to the request in order, until one ends it (a stop string or token,
// max_tokens, the context); then its length is what the step kept.
void SchedulerPolicy::deliver_verified(Turn& ctx, const InFlight& step, std::size_t index, const OutputToken& output) {
  const PlanSequence& s = step.plan.sequences[index];
  const auto drafts = std::span<const std::int32_t>(s.tokens).subspan(1);
  // The executor's kept drafts are a prefix of what was drafted; anything else keeps none of them.
  const bool prefix = output.accepted.size() <= drafts.size() &&
                      std::equal(output.accepted.begin(), output.accepted.end(), drafts.begin());
  const std::size_t accepted = prefix ? output.accepted.size() : 0;
  drafted_tokens_ += drafts.size();
  accepted_tokens_ += accepted;
  note_drafts(*requests_.at(s.sequence), s.drafted, accepted);
  for (std::size_t i = 0; i <= accepted; ++i) {
    auto it = requests_.find(s.sequence);
    if (it == requests_.end()) return;
    deliver_token(ctx, *it->second, OutputToken{s.sequence, i < accepted ? drafts[i] : output.token, false, {}, {}});
  }
  auto it = requests_.find(s.sequence);
  if (it == requests_.end() || it->second->epoch != step.epochs[index]) return;  // ended, or preempted since
  Request& r = *it->second;
  r.computed = s.position + 1 + static_cast<std::uint32_t>(accepted);
  r.model->pages->computed(r.sequence, std::span<const std::int32_t>(r.history.data(), r.computed));
  r.model->pages->truncate(r.sequence, r.computed);
  r.planned = r.computed;
}

}  // namespace mqlm::actors
