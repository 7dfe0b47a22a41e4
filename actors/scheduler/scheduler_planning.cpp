#include <algorithm>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "actors/scheduler/scheduler_policy.hpp"
#include "actors/scheduler/scheduler_request.hpp"

namespace mqlm::actors {

using namespace messages;

// ---- the prefix cache beyond the GPU -----------------------------------------------------------

// Asks the cache-writer for the full pages of the prompt past those the GPU holds; the request
// waits for the answer (or lookup_timeout_ms) before its first admission.
void SchedulerPolicy::start_lookup(Turn& ctx, Request& r) {
  r.lookup = Request::Lookup::done;
  ServedModel& m = *r.model;
  if (config_.cache_writer.empty() || m.page_bytes == 0 || r.admitted_once || !m.pages) return;
  if (r.pooling == model::Pooling::mean) return;  // computes every position: no prefix is of use
  const std::vector<std::uint64_t> keys = m.pages->prefix_keys(m.key, r.history);
  const std::size_t held = m.pages->held_prefix(keys);
  if (held == keys.size()) return;
  PrefixLookup lookup{m.name, m.key, m.pages->page_size(), m.page_bytes, {}};
  const std::size_t asked = std::min<std::size_t>(keys.size() - held, kMaxPrefixPages);
  lookup.keys.assign(keys.begin() + static_cast<std::ptrdiff_t>(held),
                     keys.begin() + static_cast<std::ptrdiff_t>(held + asked));
  if (ctx.send(config_.cache_writer, std::move(lookup), {r.sequence, 0, {}}) != SendStatus::sent) return;
  r.lookup = Request::Lookup::pending;
  r.lookup_sent_ns = ctx.now_ns();
  r.restore_from = static_cast<std::uint32_t>(held);
}

void SchedulerPolicy::on_cached_prefix(Turn& ctx, Message& message, const CachedPrefix& cached) {
  auto it = requests_.find(message.envelope.correlation_id);
  if (it == requests_.end() || it->second->lookup != Request::Lookup::pending) return;  // ended, or given up on
  Request& r = *it->second;
  r.lookup = Request::Lookup::done;
  if (cached.pages.size() >= 64) {
    spdlog::info("{}: {} prefix pages came back from the cache-writer {:.1f} ms after the lookup", ctx.self(),
                 cached.pages.size(), static_cast<double>(ctx.now_ns() - r.lookup_sent_ns) / 1e6);
  }
  if (message.blobs.size() == cached.pages.size() && cached.model == r.model->name) {
    r.restore_ids = cached.pages;
    r.restore_tiers = cached.tiers;
    r.restore_blobs = std::move(message.blobs);
  } else {
    spdlog::warn("{}: a CachedPrefix for model {} with {} pages and {} blobs: ignored", ctx.self(), cached.model,
                 cached.pages.size(), message.blobs.size());
  }
  schedule(ctx);
}

// Adds to the sequence (just begun with `reused` tokens from the GPU's prefix cache) the pages the
// cache-writer sent that continue it, and to the plan their restores. Returns the tokens they hold.
std::uint32_t SchedulerPolicy::restore_prefix(Request& r, std::uint32_t reused, StepPlan& plan, Frames& blobs) {
  ServedModel& m = *r.model;
  const std::uint32_t page_size = m.pages->page_size();
  const std::uint32_t held = reused / page_size;
  std::uint32_t restored = 0;
  // The GPU may have gained pages since the lookup (another prompt computed them) or lost some
  // (then the answer no longer continues what it has, and is let go).
  for (std::size_t i = held >= r.restore_from ? held - r.restore_from : r.restore_ids.size(); i < r.restore_ids.size();
       ++i) {
    const std::size_t first = (r.restore_from + i) * page_size;
    if (first + page_size >= r.history.size() || r.restore_blobs[i].size() != m.page_bytes) break;
    std::optional<std::uint32_t> page =
        m.pages->adopt(r.sequence, r.restore_ids[i], std::span<const std::int32_t>(r.history).subspan(first, page_size));
    collect_spills(m, plan, blobs);  // what made room for it is copied out before it is written
    if (!page) break;
    plan.restore.push_back(*page);
    blobs.push_back(std::move(r.restore_blobs[i]));
    (static_cast<CacheTier>(r.restore_tiers[i]) == CacheTier::ssd ? restored_ssd_tokens_ : restored_hot_tokens_) +=
        page_size;
    restored += page_size;
  }
  r.restore_ids.clear();
  r.restore_blobs.clear();
  r.restore_tiers.clear();
  return restored;
}

// The prefix pages the plan's page needs gave to other contents go to the cache-writer, copied out
// by the executor before the step writes them. A page restored earlier in this same plan has not
// been written yet (and the cache-writer still has it): its restore is dropped instead.
void SchedulerPolicy::collect_spills(ServedModel& m, StepPlan& plan, Frames& blobs) {
  for (EvictedPage& evicted : m.pages->take_evicted()) {
    auto restore = std::find(plan.restore.begin(), plan.restore.end(), evicted.page);
    if (restore != plan.restore.end()) {
      blobs.erase(blobs.begin() + (restore - plan.restore.begin()));
      plan.restore.erase(restore);
      continue;
    }
    plan.spill.push_back({evicted.page, std::move(evicted.id)});
    ++spilled_pages_;
  }
}

// ---- planning -------------------------------------------------------------------------------

void SchedulerPolicy::preempt(Request& r) {
  r.model->pages->release(r.sequence);
  r.verifying = false;  // drafts in flight are answered for an earlier epoch: nothing of them is kept
  r.computed = 0;
  r.planned = 0;
  ++r.epoch;
  r.running = false;
  std::erase(running_, r.sequence);
  waiting_.push_front(r.sequence);
  ++preemptions_;
}

// Adds up to `budget` of the request's uncomputed tokens to the plan, taking the pages they need
// (when there are none and may_preempt, the newest running sequences give theirs). False when it
// could not.
bool SchedulerPolicy::plan_sequence(Request& r, std::uint32_t budget, bool may_preempt, StepPlan& plan) {
  const auto total = static_cast<std::uint32_t>(r.history.size());
  // Every known token planned: the next is the one a step in flight samples (see may_follow).
  const bool follows = r.planned == total;
  const std::uint32_t n = follows ? 1 : std::min(total - r.planned, budget);
  if (n == 0) return false;
  // A decode may carry drafts to verify after its token (scheduler_speculation.cpp).
  const bool decode = follows || total - r.planned == 1;
  std::vector<std::int32_t> drafts = decode ? draft_for(r, follows, budget - 1) : std::vector<std::int32_t>{};
  KvPageTable& pages = *r.model->pages;
  // Drafts take only free or evictable pages: no sequence gives way for them.
  if (!drafts.empty() && !pages.reserve(r.sequence, r.planned + n + static_cast<std::uint32_t>(drafts.size()))) {
    drafts.clear();
  }
  while (!pages.reserve(r.sequence, r.planned + n)) {
    // The newest running sequence gives way; if that is this one, it waits.
    if (!may_preempt || running_.empty()) return false;
    // Of this model: another model's pages are no use to it.
    auto newest_it = std::find_if(running_.rbegin(), running_.rend(),
                                  [&](std::uint64_t seq) { return requests_.at(seq)->model == r.model; });
    if (newest_it == running_.rend()) return false;
    Request& newest = *requests_.at(*newest_it);
    if (&newest == &r) return false;
    preempt(newest);
    // Its tokens may already be in this plan: take them out again.
    std::erase_if(plan.sequences, [&](const PlanSequence& s) { return s.sequence == newest.sequence; });
  }
  PlanSequence s;
  s.sequence = r.sequence;
  s.position = r.planned;
  if (follows) {
    s.tokens.assign(1, 0);
  } else {
    s.tokens.assign(r.history.begin() + r.planned, r.history.begin() + r.planned + n);
  }
  s.tokens.insert(s.tokens.end(), drafts.begin(), drafts.end());
  s.block_table = pages.block_table(r.sequence);
  s.output = follows || r.planned + n == total;
  s.follows = follows;
  s.drafted = static_cast<std::uint32_t>(drafts.size());
  r.verifying = !drafts.empty();
  r.planned += static_cast<std::uint32_t>(s.tokens.size());
  plan.sequences.push_back(std::move(s));
  return true;
}

// Whether a running request whose every known token is planned may decode the token a step in
// flight samples for it: not if that token may be its last (max_tokens, the model's context); a
// stop string or end token it brings is found only when it comes, and the follower's step is
// then wasted (its answer for an ended request is dropped).
bool SchedulerPolicy::may_follow(const Request& r) const {
  if (!config_.overlap || r.pending == 0 || r.planned != r.history.size() || r.embedding()) return false;
  if (speculates(r)) return false;  // it waits for the token, to draft what follows it
  if (r.generated() + r.pending >= static_cast<std::uint32_t>(std::max(r.sampling.max_tokens, 1))) return false;
  return r.model->n_ctx == 0 || r.history.size() + r.pending < r.model->n_ctx;
}

bool SchedulerPolicy::in_flight_for(const std::string& model) const {
  return std::any_of(in_flight_.begin(), in_flight_.end(), [&](const InFlight& f) { return f.plan.model == model; });
}

// The model the next step is for: of the servable models with work, the first after the last
// one stepped (so two busy models take turns, step by step); nullptr when none has work.
ServedModel* SchedulerPolicy::next_model_to_step() {
  std::vector<ServedModel*> busy;
  for (auto& [name, model] : models_) {
    if (!model->served()) continue;
    const bool has_work = std::any_of(running_.begin(), running_.end(),
                                      [&](std::uint64_t seq) { return requests_.at(seq)->model == model.get(); }) ||
                          std::any_of(waiting_.begin(), waiting_.end(),
                                      [&](std::uint64_t seq) { return requests_.at(seq)->model == model.get(); });
    if (has_work) busy.push_back(model.get());
  }
  if (busy.empty()) return nullptr;
  for (ServedModel* model : busy) {
    if (model->name > last_stepped_) return model;
  }
  return busy.front();
}

void SchedulerPolicy::schedule(Turn& ctx) {
  const std::size_t depth = config_.overlap ? 2 : 1;
  while (executor_ready_ && in_flight_.size() < depth) {
    std::optional<PlannedStep> step = plan_step(ctx);
    if (!step) return;
    send_step(ctx, std::move(*step));
  }
}

// The next step: running sequences first, then waiting ones, and the executor slots to release;
// nullopt when there is nothing to do.
std::optional<SchedulerPolicy::PlannedStep> SchedulerPolicy::plan_step(Turn& ctx) {
  PlannedStep step;
  StepPlan& plan = step.plan;
  std::uint32_t budget = config_.token_budget;
  if (ServedModel* chosen = next_model_to_step()) {
    plan.model = chosen->name;
    plan.model_key = chosen->key;
    open_drafting(*chosen);
    plan_running(*chosen, step, budget);
    admit_waiting(ctx, *chosen, step, budget);
  }
  const bool moves_pages = !plan.spill.empty() || !plan.restore.empty();
  if (plan.sequences.empty() && to_release_.empty() && !moves_pages) return std::nullopt;
  if (plan.sequences.empty() && !moves_pages) plan.model.clear();  // only releases: for no model in particular
  if (!plan.model.empty()) last_stepped_ = plan.model;
  plan.step = next_step_++;
  plan.released = std::move(to_release_);
  to_release_.clear();
  return step;
}

// Running sequences, oldest first: each decodes a token or continues its prompt.
void SchedulerPolicy::plan_running(ServedModel& m, PlannedStep& step, std::uint32_t& budget) {
  for (std::size_t i = 0; i < running_.size() && budget > 0; ++i) {
    Request& r = *requests_.at(running_[i]);
    if (r.model != &m) continue;
    if (!r.running) continue;  // preempted by an older one's page needs during this plan
    if (r.verifying) continue;  // its next tokens are the answer to the drafts in flight
    if (r.planned == r.history.size() && !may_follow(r)) continue;  // its next token is not planned yet
    const bool planned = plan_sequence(r, budget, true, step.plan);
    collect_spills(m, step.plan, step.restore_blobs);
    if (!planned) {
      if (!r.running) break;
      preempt(r);  // no pages even after every newer one gave way
      break;
    }
    budget -= static_cast<std::uint32_t>(step.plan.sequences.back().tokens.size());
  }
}

// Waiting sequences, first come first served, while budget and the sequence limit allow.
void SchedulerPolicy::admit_waiting(Turn& ctx, ServedModel& m, PlannedStep& step, std::uint32_t& budget) {
  for (auto it = waiting_.begin(); it != waiting_.end() && budget > 0 && running_.size() < config_.max_sequences;) {
    Request& r = *requests_.at(*it);
    if (r.model != &m || r.pending > 0) {  // (preempted while a step samples for it: it waits for the token)
      ++it;
      continue;
    }
    const auto longest = static_cast<std::uint64_t>(r.prompt_tokens) + r.generation_room();
    if (longest > m.kv_capacity_tokens) {
      it = waiting_.erase(it);
      end_request(ctx, r.sequence, FinishReason::error, RequestError::prompt_too_long,
                  fmt::format("{} prompt tokens and {} more do not fit in the KV cache's {} tokens", r.prompt_tokens,
                              r.generation_room(), m.kv_capacity_tokens));
      continue;
    }
    // Before its first admission, a prompt asks the cache-writer for the pages the GPU lacks;
    // the ones after it may go meanwhile.
    if (r.lookup == Request::Lookup::none) start_lookup(ctx, r);
    if (r.lookup == Request::Lookup::pending) {
      ++it;
      continue;
    }
    if (!admit(ctx, r, step, budget)) break;
    it = waiting_.erase(it);
    budget -= static_cast<std::uint32_t>(step.plan.sequences.back().tokens.size());
  }
}

// Plans a waiting request's prefix and as much of the rest as the budget takes, and makes it
// running. False, holding no pages, when the pages are not there: a waiting sequence never
// preempts a running one, it waits for pages instead.
bool SchedulerPolicy::admit(Turn& ctx, Request& r, PlannedStep& step, std::uint32_t budget) {
  ServedModel& m = *r.model;
  // Waiting sequences hold no pages (preemption and a failed admission release them), so each
  // admission starts from the prefix cache; but mean pooling needs every position's state, so
  // such an embedding computes all of them.
  const bool shares_prefix = r.pooling != model::Pooling::mean;
  const std::uint32_t reused =
      m.pages->begin(r.sequence, m.key, shares_prefix ? std::span<const std::int32_t>(r.history) : std::span<const std::int32_t>{});
  const std::uint32_t restored = restore_prefix(r, reused, step.plan, step.restore_blobs);
  r.computed = reused + restored;
  r.planned = r.computed;
  const bool planned = plan_sequence(r, budget, false, step.plan);
  collect_spills(m, step.plan, step.restore_blobs);
  if (!planned) {
    // Gives back the prefix pages it took, until its turn; restored ones stay in the GPU's
    // prefix cache (the plan still restores them).
    m.pages->release(r.sequence);
    r.computed = 0;
    r.planned = 0;
    return false;
  }
  prefix_hit_tokens_ += reused;
  r.running = true;
  running_.push_back(r.sequence);
  if (!r.admitted_once) {
    r.admitted_once = true;
    r.scheduled_ns = ctx.now_ns();
    r.cached_tokens = std::min(reused + restored, r.prompt_tokens);
  }
  if (!r.executor_has_it) {
    SequenceStart& start = step.plan.starts.emplace_back(SequenceStart{
        r.sequence, r.sampling, {r.history.begin(), r.history.begin() + r.prompt_tokens}, static_cast<std::uint8_t>(r.pooling), {}});
    if (r.sampling.response_format.constrained()) start.end_tokens = m.stop_tokens;
    r.executor_has_it = true;
  }
  return true;
}

// Sends the plan to the executor and keeps it in flight until its answer.
void SchedulerPolicy::send_step(Turn& ctx, PlannedStep step) {
  InFlight sent;
  for (const auto& s : step.plan.sequences) {
    computed_tokens_ += s.tokens.size();
    Request& r = *requests_.at(s.sequence);
    sent.epochs.push_back(r.epoch);
    if (s.output) ++r.pending;
  }
  ctx.send(config_.executor, step.plan, {0, 0, std::move(step.restore_blobs)});
  sent.plan = std::move(step.plan);
  sent.since_ns = ctx.now_ns();
  in_flight_.push_back(std::move(sent));
}

}  // namespace mqlm::actors
