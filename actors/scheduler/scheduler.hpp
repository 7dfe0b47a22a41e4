// The scheduler actor: turns requests into steps. Its policy (scheduler_policy.hpp) holds the
// request table, the queues and the KV cache's page table and decides every plan; the actor hands
// it the inbox and sends what it makes. The executor owns the GPU and runs one StepPlan at a time.
//
// The scheduler follows the replay rule (docs/architecture.md): time from ctx.now_ns() only, no
// randomness, and the tokenizers it needs are read when it is built. A trace of it replays.
#pragma once

#include <memory>

#include "actors/runtime/actor.hpp"
#include "actors/runtime/actor_options.hpp"
#include "actors/scheduler/scheduler_policy.hpp"

namespace mqlm::actors {

// Options: model=PATH and name=ID (one model), or models=ID=PATH;ID2=PATH2, aliases=NAME=ID;... and default_model=ID;
// executor=, enforcer=, max_sequences=, token_budget=, max_waiting=, step_timeout_ms=,
// cache_writer=, lookup_timeout_ms=, stop_spill_bytes=, overlap=0|1, draft_max= and speculate_max_batch=
// (speculative decoding: SchedulerConfig). Throws
// std::invalid_argument naming a bad one.
SchedulerConfig scheduler_config(const ActorOptions& options);
std::unique_ptr<Actor> make_scheduler(const ActorOptions& options);

class Scheduler final : public Actor {
 public:
  explicit Scheduler(SchedulerConfig config) : policy_(std::move(config)) {}

  void on_start(Context& ctx) override;
  void on_message(Context& ctx, messages::Message& message) override;
  void on_stop(Context& ctx) override;

 private:
  SchedulerPolicy policy_;
};

}  // namespace mqlm::actors
