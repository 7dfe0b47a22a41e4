// The scheduler's policy as a plain object (after vLLM v1's scheduler): the request table, the
// waiting and running queues, the plans in flight and each model's KV page table, changed only
// by the messages it is handed, each with the moment it was taken from the inbox. No Context, no
// sockets, no clock: what it sends goes, as message values in the order it makes them, to a
// PolicyOutput. The Scheduler actor (scheduler.hpp) hands it its inbox and sends what it makes;
// tests/actors/scheduler/ hands it cases and reads what it made.
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
#include "actors/scheduler/served_model.hpp"

namespace mqlm::actors {

struct SchedulerConfig {
  // The models it serves, by id: each GGUF's vocabulary, chat template and context length are
  // read when the scheduler is built. Which are loaded it learns from the executor's report at
  // start and from the ModelLoaded / ModelUnloaded messages the enforcer forwards.
  std::map<std::string, std::filesystem::path> models;
  std::string chat_template;  // a Jinja chat template for every model, in place of their own; "": theirs
  // Unix time minus the steady clock (ns): what the chat templates' strftime_now formats is
  // now_ns plus this. Measured when the config is read, unless given (a replay gives the recorded one).
  std::int64_t unix_clock_offset_ns = 0;
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
  // Speculative decoding by prompt lookup (model/sampling/prompt_lookup.hpp): each decode step of
  // a request without logprobs or a response_format proposes up to this many tokens from an
  // earlier occurrence of its last n-gram, all verified in that step by its own draw
  // (PlanSequence::drafted); 0: none, unless a request asks (Submit::draft_max). How many it
  // drafts follows its estimated acceptance (scheduler_speculation.cpp). A speculating sequence
  // never follows a step in flight (the host must check its drafts first), so it drafts only while
  // at most speculate_max_batch sequences of its model run (past that the batch keeps the GPU
  // busy, and overlap is worth more), and backs off (2, 4 ... 32 decode steps without) after a
  // step where no draft was found or kept.
  std::uint32_t draft_max = 0;
  std::uint32_t speculate_max_batch = 4;
};

// Where the policy's messages go, in the order it makes them. The actor sends each at once, so the
// wire order is the policy's; a test keeps them. The send's status comes back because the policy
// acts on a refusal at once: a LoadRequest the enforcer cannot take fails the model's waiting
// requests there and then, and a prompt whose PrefixLookup did not go is admitted without it in
// the same plan.
class PolicyOutput {
 public:
  virtual ~PolicyOutput() = default;
  virtual SendStatus send(const std::string& to, messages::Payload payload, SendOptions options) = 0;
};

class SchedulerPolicy {
 public:
  // Reads every configured model's file (std::invalid_argument when one cannot be served).
  explicit SchedulerPolicy(SchedulerConfig config);
  ~SchedulerPolicy();

  // Its first act: asks the executor which models it has (nothing is planned before it answers).
  void start(PolicyOutput& out);
  // One message of the inbox, taken at now_ns (the only clock it reads); `self` names it in logs.
  void handle(PolicyOutput& out, messages::Message& message, std::int64_t now_ns, const std::string& self);
  // Stopping: every open request ends, and the GPU's recent prefix pages go to the cache-writer.
  void stop(PolicyOutput& out, std::int64_t now_ns, const std::string& self);

  // The actor's own time on a step's result (its tokens and the plan after), for the step log.
  void add_handling_time(std::int64_t ns) { step_times_.handling_ns += ns; }
  messages::StatusReport status() const;

 private:
  struct Request;
  struct InFlight;
  // A plan made and not yet sent, with the restored pages' blobs (one per plan.restore page).
  struct PlannedStep {
    messages::StepPlan plan;
    messages::Frames restore_blobs;
  };
  // The message being handled: when it came, who the policy is in logs, and where sends go.
  class Turn {
   public:
    Turn(PolicyOutput& out, std::int64_t now_ns, const std::string& self) : out_(out), now_ns_(now_ns), self_(self) {}
    SendStatus send(const std::string& to, messages::Payload payload, SendOptions options = {}) {
      return out_.send(to, std::move(payload), std::move(options));
    }
    std::int64_t now_ns() const { return now_ns_; }
    const std::string& self() const { return self_; }

   private:
    PolicyOutput& out_;
    std::int64_t now_ns_;
    const std::string& self_;
  };

  void on_submit(Turn& ctx, const messages::Message& message, const messages::Submit& submit);
  void on_abort(Turn& ctx, const messages::Message& message, const messages::Abort& abort);
  void on_status(Turn& ctx, const messages::Message& message, const messages::StatusQuery& query);
  void on_tokenize(Turn& ctx, const messages::Message& message, const messages::Tokenize& question) const;
  messages::Tokenized tokenized(const messages::Tokenize& question) const;
  void on_executor_report(Turn& ctx, const messages::ExecutorReport& report);
  void on_step_result(Turn& ctx, const messages::StepResult& result, const messages::Frames& blobs);
  void fail_step(Turn& ctx, const messages::StepPlan& plan, const messages::StepResult& result);
  void forget_kv_cache();
  void apply_answer(Turn& ctx, const InFlight& step, const messages::StepResult& result);
  void log_step_times(Turn& ctx, const InFlight& step, const messages::StepResult& result);
  void on_timer(Turn& ctx);
  // The model pool: the enforcer's answers and what it forwards from the executor.
  void on_model_loaded(Turn& ctx, const messages::ModelLoaded& loaded);
  void on_model_unloaded(Turn& ctx, const messages::ModelUnloaded& unloaded);
  void on_load_answer(Turn& ctx, const messages::LoadAnswer& answer);
  void on_abort_model(Turn& ctx, const messages::AbortModel& abort);
  // The prefix cache beyond the GPU.
  void start_lookup(Turn& ctx, Request& request);
  void on_cached_prefix(Turn& ctx, messages::Message& message, const messages::CachedPrefix& cached);
  std::uint32_t restore_prefix(Request& request, std::uint32_t reused, messages::StepPlan& plan,
                               messages::Frames& blobs);
  void collect_spills(ServedModel& model, messages::StepPlan& plan, messages::Frames& blobs);
  void spill_on_stop(Turn& ctx);
  void serve_model(ServedModel& model, const messages::ModelInfo& info);
  void request_load(Turn& ctx, ServedModel& model);
  void fail_waiting(Turn& ctx, ServedModel& model, messages::RequestError error, const std::string& why);
  void usage_changed(Turn& ctx, ServedModel& model, int delta);
  void answer_drained(Turn& ctx);
  ServedModel* next_model_to_step();

  ServedModel* model_named(const std::string& name) const;
  std::string unknown_model_message(const std::string& name) const;
  // Prompt tokens for a submit, or the error that rejects it.
  std::optional<std::string> prompt_for(const ServedModel& model, const messages::Submit& submit, std::int64_t now_ns,
                                        std::vector<std::int32_t>& prompt) const;
  // Why a submit for `model` with this prompt cannot be served, or nullopt.
  std::optional<std::pair<messages::RequestError, std::string>> refusal(const ServedModel& model,
                                                                        const messages::Submit& submit, std::int64_t now_ns,
                                                                        std::vector<std::int32_t>& prompt) const;
  void schedule(Turn& ctx);
  std::optional<PlannedStep> plan_step(Turn& ctx);
  void plan_running(ServedModel& model, PlannedStep& step, std::uint32_t& budget);
  void admit_waiting(Turn& ctx, ServedModel& model, PlannedStep& step, std::uint32_t& budget);
  bool admit(Turn& ctx, Request& request, PlannedStep& step, std::uint32_t budget);
  void send_step(Turn& ctx, PlannedStep step);
  bool may_follow(const Request& request) const;
  bool plan_sequence(Request& request, std::uint32_t budget, bool may_preempt, messages::StepPlan& plan);
  void preempt(Request& request);
  void deliver_token(Turn& ctx, Request& request, const messages::OutputToken& output);
  // Speculative decoding (scheduler_speculation.cpp).
  void open_drafting(const ServedModel& model);
  bool speculates(const Request& request) const;
  std::vector<std::int32_t> draft_for(Request& request, bool follows, std::uint32_t room);
  void deliver_verified(Turn& ctx, const InFlight& step, std::size_t index, const messages::OutputToken& output);
  void note_drafts(Request& request, std::uint32_t drafted, std::size_t accepted);
  void finish_embeddings(Turn& ctx, const messages::StepPlan& plan, const messages::StepResult& result,
                         const messages::Frames& blobs);
  void end_request(Turn& ctx, std::uint64_t sequence, messages::FinishReason finish,
                   messages::RequestError error = messages::RequestError::none, std::string message = {},
                   std::string stop = {}, std::vector<float> embedding = {});
  void apply_pending_aborts(Turn& ctx);
  // The Unix time a request came (ns), from which its tool calls' ids are made.
  std::int64_t submit_unix_ns(const Request& request) const;
  void answer_status(Turn& ctx);
  bool in_flight_for(const std::string& model) const;

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
  messages::GpuTimeWire gpu_time_;  // the executor's, from its last report
  std::uint32_t executor_slots_ = 0;

  std::uint64_t steps_ = 0, finished_ = 0, preemptions_ = 0, computed_tokens_ = 0, prefix_hit_tokens_ = 0;
  std::uint64_t restored_hot_tokens_ = 0, restored_ssd_tokens_ = 0, spilled_pages_ = 0, generated_tokens_ = 0;
  std::uint64_t drafted_tokens_ = 0, accepted_tokens_ = 0;
  bool drafting_open_ = false;  // the plan being made may draft (open_drafting)
};

}  // namespace mqlm::actors
