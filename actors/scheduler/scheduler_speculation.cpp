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

#include "actors/scheduler/scheduler_policy.hpp"
#include "actors/scheduler/scheduler_request.hpp"
#include "model/sampling/prompt_lookup.hpp"

namespace mqlm::actors {

using namespace messages;

namespace {

constexpr std::uint32_t kDraftNgram = 3;       // the longest n-gram looked up
constexpr std::uint32_t kDraftWindow = 4096;   // how far back it is looked for
constexpr std::uint32_t kMaxDraftBackoff = 16;  // decode steps without drafts after misses, at most

}  // namespace

// Whether the request drafts at its next decode (and so does not follow a step in flight).
bool SchedulerPolicy::speculates(const Request& r) const {
  if (r.draft_max == 0 || r.draft_skip > 0 || r.embedding()) return false;
  const auto running = std::count_if(running_.begin(), running_.end(),
                                     [&](std::uint64_t seq) { return requests_.at(seq)->model == r.model; });
  return static_cast<std::uint32_t>(running) <= config_.speculate_max_batch;
}

// The drafts of a decode step (room: the budget left after its token), none where it should not
// speculate now; a decode in the back-off counts it down.
std::vector<std::int32_t> SchedulerPolicy::draft_for(Request& r, bool follows, std::uint32_t room) {
  if (r.draft_max == 0) return {};
  if (r.draft_skip > 0) {
    --r.draft_skip;
    return {};
  }
  if (follows || !speculates(r)) return {};
  // Past max_tokens or the context nothing drafted could be kept.
  const auto max_tokens = static_cast<std::uint32_t>(std::max(r.sampling.max_tokens, 1));
  const std::uint32_t left = max_tokens > r.generated() ? max_tokens - r.generated() : 1;
  std::uint32_t k = std::min({r.draft_max, room, left - 1});
  const auto length = static_cast<std::uint32_t>(r.history.size());
  if (r.model->n_ctx > 0) k = std::min(k, r.model->n_ctx > length ? r.model->n_ctx - length : 0);
  if (k == 0) return {};
  std::vector<std::int32_t> drafts = model::find_draft(r.history, {kDraftNgram, k, kDraftWindow});
  if (drafts.empty()) note_drafts(r, 0, 0);
  return drafts;
}

// A step with nothing drafted or nothing kept backs the request off for twice as many decodes as
// the last time (1, 2, 4 ... kMaxDraftBackoff); one that kept a draft ends the back-off.
void SchedulerPolicy::note_drafts(Request& r, std::uint32_t drafted, std::size_t accepted) {
  if (drafted > 0 && accepted > 0) {
    r.draft_backoff = 0;
    return;
  }
  r.draft_backoff = std::clamp(r.draft_backoff * 2, 1u, kMaxDraftBackoff);
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
