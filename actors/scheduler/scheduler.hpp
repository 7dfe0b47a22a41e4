// The scheduler actor: turns requests into steps. It owns the request table, the waiting and
// running queues and the KV cache's page table; the executor owns the GPU and runs one StepPlan
// at a time.
//
// Every step is one batch: first the running sequences (a decode token each, or the next chunk of
// a prompt still being prefilled), then waiting sequences admitted in arrival order while the
// token budget and the sequence limit allow (chunked prefill). When pages run out, the newest
// running sequence is preempted: its pages go back (full ones stay in the prefix cache) and it
// waits at the head of the queue to be recomputed; the executor keeps its sampler, so the
// recomputed sequence draws the same tokens.
//
// One function, end_request(), ends a request whatever ended it; it removes the request from
// every table, releases its pages, queues its executor slot for release and sends the final
// event. Aborts are messages applied at the next step boundary.
//
// The scheduler follows the replay rule (docs/architecture.md): time from ctx.now_ns() only, no
// randomness, and the tokenizers it needs are read when it is built. A trace of it replays.
#pragma once

#include <cstdint>
#include <deque>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "actors/runtime/actor.hpp"
#include "actors/runtime/actor_options.hpp"
#include "actors/scheduler/kv_page_table.hpp"
#include "model/chat/chat_template.hpp"
#include "model/sampling/stop_matcher.hpp"
#include "model/tokenizer/tokenizer.hpp"

namespace mqlm::actors {

struct SchedulerConfig {
  // The models it serves, by id: each GGUF's vocabulary, chat template and context length are
  // read when the scheduler is built. Which are loaded it learns from the executor's report at
  // start and from the ModelLoaded / ModelUnloaded messages the enforcer forwards.
  std::map<std::string, std::filesystem::path> models;
  std::map<std::string, std::string> aliases;  // other names for models: alias -> id
  std::string default_model;         // what a Submit with no model gets (default: the first id)
  std::string executor = "executor";
  std::string enforcer;              // asked to load a model a request needs; "": none (then only
                                     // the models loaded at start are served)
  std::uint32_t max_sequences = 64;  // running at once
  std::uint32_t token_budget = 512;  // tokens computed per step, decode and prefill together
  std::uint32_t max_waiting = 4096;  // queued requests; beyond, new ones are told busy
  std::uint32_t step_timeout_ms = 30000;  // a step unanswered this long fails its requests
  std::string cache_writer;          // the KV prefix cache beyond the GPU: pages the GPU gives up go
                                     // there (through the executor), and new prompts ask it for
                                     // their prefix; "": none
  std::uint32_t lookup_timeout_ms = 2000;  // a prefix lookup unanswered this long is a miss
  std::uint64_t stop_spill_bytes = 0;  // when stopping, the GPU's most recent prefix pages, up to
                                       // this many bytes, go to the cache-writer (to be kept on SSD)
  // Plan the next step while the executor runs this one (two plans in flight): the executor finds
  // it waiting when it answers, and the scheduler's work on the answer (tokens to the clients,
  // the plan after) overlaps the GPU's. A decode whose input is a token still being sampled goes
  // as a follower (PlanSequence::follows). false: one plan at a time, each made from the last
  // one's answer.
  bool overlap = true;
};

// Options: model=PATH and name=ID (one model), or models=ID=PATH;ID2=PATH2, aliases=NAME=ID;... and default_model=ID;
// executor=, enforcer=, max_sequences=, token_budget=, max_waiting=, step_timeout_ms=,
// cache_writer=, lookup_timeout_ms=, stop_spill_bytes=, overlap=0|1. Throws
// std::invalid_argument naming a bad one.
SchedulerConfig scheduler_config(const ActorOptions& options);
std::unique_ptr<Actor> make_scheduler(const ActorOptions& options);

class Scheduler final : public Actor {
 public:
  explicit Scheduler(SchedulerConfig config);
  ~Scheduler() override;

  void on_start(Context& ctx) override;
  void on_message(Context& ctx, messages::Message& message) override;
  void on_stop(Context& ctx) override;

  struct ServedModel;  // what it knows of one configured model (scheduler.cpp)

 private:
  struct Request;
  struct InFlight;

  void on_submit(Context& ctx, const messages::Message& message, const messages::Submit& submit);
  void on_abort(Context& ctx, const messages::Message& message, const messages::Abort& abort);
  void on_status(Context& ctx, const messages::Message& message, const messages::StatusQuery& query);
  void on_executor_report(Context& ctx, const messages::ExecutorReport& report);
  void on_step_result(Context& ctx, const messages::StepResult& result);
  void log_step_times(Context& ctx, const InFlight& step, const messages::StepResult& result);
  void on_timer(Context& ctx);
  // The model pool: the enforcer's answers and what it forwards from the executor.
  void on_model_loaded(Context& ctx, const messages::ModelLoaded& loaded);
  void on_model_unloaded(Context& ctx, const messages::ModelUnloaded& unloaded);
  void on_load_answer(Context& ctx, const messages::LoadAnswer& answer);
  void on_abort_model(Context& ctx, const messages::AbortModel& abort);
  // The prefix cache beyond the GPU.
  void start_lookup(Context& ctx, Request& request);
  void on_cached_prefix(Context& ctx, messages::Message& message, const messages::CachedPrefix& cached);
  std::uint32_t restore_prefix(Request& request, std::uint32_t reused, messages::StepPlan& plan,
                               messages::Frames& blobs);
  void collect_spills(ServedModel& model, messages::StepPlan& plan, messages::Frames& blobs);
  void serve_model(ServedModel& model, const messages::ModelInfo& info);
  void request_load(Context& ctx, ServedModel& model);
  void fail_waiting(Context& ctx, ServedModel& model, messages::RequestError error, const std::string& why);
  void usage_changed(Context& ctx, ServedModel& model, int delta);
  void answer_drained(Context& ctx);
  ServedModel* next_model_to_step();

  // Prompt tokens for a submit, or the error that rejects it.
  std::optional<std::string> prompt_for(const ServedModel& model, const messages::Submit& submit,
                                        std::vector<std::int32_t>& prompt) const;
  void schedule(Context& ctx);
  bool plan_step(Context& ctx);
  bool may_follow(const Request& request) const;
  bool plan_sequence(Request& request, std::uint32_t budget, bool may_preempt, messages::StepPlan& plan);
  void preempt(Request& request);
  void deliver_token(Context& ctx, Request& request, const messages::OutputToken& output);
  void end_request(Context& ctx, std::uint64_t sequence, messages::FinishReason finish,
                   messages::RequestError error = messages::RequestError::none, std::string message = {},
                   std::string stop = {});
  void apply_pending_aborts(Context& ctx);
  messages::StatusReport status() const;
  void answer_status(Context& ctx);

  SchedulerConfig config_;
  std::map<std::string, std::unique_ptr<ServedModel>> models_;  // every configured model, by id
  ServedModel* default_model_ = nullptr;
  std::string last_stepped_;  // the model of the last step: the next goes to another if it can
  std::map<std::string, std::uint32_t> drained_counts_;  // requests AbortModel ended, until ModelDrained
  bool executor_ready_ = false;

  std::map<std::uint64_t, std::unique_ptr<Request>> requests_;           // by sequence id
  std::map<std::pair<std::string, std::uint64_t>, std::uint64_t> by_client_;  // (front end, request id)
  std::deque<std::uint64_t> waiting_;
  std::vector<std::uint64_t> running_;  // in admission order: the newest is last
  std::vector<std::uint64_t> to_release_;  // executor slots to drop with the next plan
  std::vector<std::pair<std::uint64_t, messages::AbortReason>> pending_aborts_;
  std::uint64_t next_sequence_ = 1;

  // Plans sent and not yet answered, oldest first (at most two, with overlap).
  struct InFlight {
    messages::StepPlan plan;
    std::int64_t since_ns = 0;
    std::vector<std::uint32_t> epochs;  // each of its sequences' Request::epoch when planned
    bool void_ = false;                 // planned before the KV cache was lost: its answer is ignored
  };
  std::deque<InFlight> in_flight_;
  bool in_flight_for(const std::string& model) const;
  // Where a step's time goes, logged every 500 steps: a plan's round trip (sent to answered, by
  // ctx.now_ns) and the executor's share of it (StepResult::gpu_ns), the rest being the messages;
  // and the scheduler's own time on each result (delivering its tokens, planning the next step),
  // which adds to the round trip before the next step starts.
  struct StepTimes {
    std::uint64_t steps = 0, sequences = 0;
    std::int64_t round_ns = 0, executor_ns = 0, handling_ns = 0;
  } step_times_;
  std::uint64_t next_step_ = 1;

  struct StatusWaiter {
    std::string to;
    std::uint64_t correlation_id = 0;
  };
  std::vector<StatusWaiter> status_waiters_;  // answered when the executor's trim report comes
  messages::PoolStatsWire pool_;
  std::uint32_t executor_slots_ = 0;

  std::uint64_t steps_ = 0, finished_ = 0, preemptions_ = 0, computed_tokens_ = 0, prefix_hit_tokens_ = 0;
  std::uint64_t restored_hot_tokens_ = 0, restored_ssd_tokens_ = 0, spilled_pages_ = 0;
};

}  // namespace mqlm::actors
