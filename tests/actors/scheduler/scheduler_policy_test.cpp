// The scheduler's policy case by case, as ggml's test-backend-ops lists its ops: each case is a
// configuration, the messages handed to the policy in order, and the sends it must have made, in
// that order (others may come between). Every case ends with no request open and no KV page
// referenced: the page table is back to its free count, whatever ended the requests.
#include <gtest/gtest.h>

#include <unistd.h>

#include <deque>
#include <filesystem>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "actors/scheduler/scheduler_policy.hpp"
#include "model/llama/embedding_pool.hpp"
#include "model/gguf/synthetic_model.hpp"

namespace mqlm::actors {
namespace {

using namespace messages;

constexpr std::uint32_t kPages = 16;    // the executor's KV cache in these cases: 16 pages
constexpr std::uint32_t kPageSize = 4;  // of 4 tokens
constexpr std::int32_t kToken = 500;    // what the executor samples, unless a case says otherwise
constexpr std::int32_t kStopToken = 777;
constexpr std::int32_t kTokenX = 'x' - '!';  // the byte-level vocabulary's first ids are the bytes from '!'

// A small model with the synthetic byte-level vocabulary (1024 ids); its weights are never read.
const std::filesystem::path& model_path() {
  static const std::filesystem::path path = [] {
    auto dir = std::filesystem::temp_directory_path() / ("mqlm-scheduler-test-" + std::to_string(getpid()));
    std::filesystem::create_directories(dir);
    model::gguf::ModelShape shape;
    shape.layers = 1, shape.hidden = 64, shape.heads = 2, shape.kv_heads = 1, shape.head_dim = 32, shape.ffn = 64;
    auto model = model::gguf::make_synthetic_model(shape, gpu::WeightType::f32, 7, "tiny");
    auto file = dir / "tiny.gguf";
    if (auto error = model.writer.write(file)) throw std::runtime_error(error->message());
    return file;
  }();
  return path;
}

// ---- what the policy sent, one line each ------------------------------------------------------

std::string error_name(std::uint16_t error) {
  static const char* names[] = {"none", "invalid_request", "unknown_model", "prompt_too_long", "busy",
                                "unavailable", "gpu", "internal", "shutting_down", "malformed",
                                "insufficient_memory", "model_failed"};
  return error < std::size(names) ? names[error] : std::to_string(error);
}

std::string finish_name(std::uint8_t finish) {
  static const char* names[] = {"?", "stop", "length", "abort", "error", "tool_calls"};
  return finish < std::size(names) ? names[finish] : std::to_string(finish);
}

// "plan 3 1@0+4o 2@5f start:1 release:4 restore:2 spill:1": step 3 computes 4 tokens of sequence 1
// from position 0 with output, and sequence 2's token at 5 as a follower.
std::string render_plan(const StepPlan& plan) {
  std::string line = fmt::format("plan {}", plan.step);
  for (const auto& s : plan.sequences) {
    line += fmt::format(" {}@{}+{}{}{}", s.sequence, s.position, s.tokens.size(), s.output ? "o" : "",
                        s.follows ? "f" : "");
    if (s.drafted > 0) line += fmt::format("d{}", s.drafted);
  }
  for (const auto& s : plan.starts) line += fmt::format(" start:{}{}", s.sequence, s.end_tokens.empty() ? "" : "+ends");
  for (auto s : plan.released) line += fmt::format(" release:{}", s);
  if (!plan.restore.empty()) line += fmt::format(" restore:{}", plan.restore.size());
  if (!plan.spill.empty()) line += fmt::format(" spill:{}", plan.spill.size());
  return line;
}

std::string render(const std::string& to, const Payload& payload, const SendOptions& options) {
  if (const auto* plan = std::get_if<StepPlan>(&payload)) return render_plan(*plan);
  if (const auto* token = std::get_if<TokenEvent>(&payload)) {
    return fmt::format("{} token #{} {}", to, options.request_id, token->tokens.at(0));
  }
  if (const auto* final = std::get_if<FinalEvent>(&payload)) {
    std::string line = fmt::format("{} final #{} {}", to, options.request_id, finish_name(final->finish));
    if (final->error != 0) line += " " + error_name(final->error);
    if (final->finish != static_cast<std::uint8_t>(FinishReason::error)) {
      line += fmt::format(" {}+{}", final->prompt_tokens, final->completion_tokens);
    }
    if (!final->stop.empty()) line += " on \"" + final->stop + "\"";
    if (!final->embedding.empty()) line += fmt::format(" vector:{}", final->embedding.size());
    return line;
  }
  if (std::holds_alternative<ExecutorQuery>(payload)) return to + " query";
  if (const auto* load = std::get_if<LoadRequest>(&payload)) return to + " load " + load->model;
  if (const auto* usage = std::get_if<ModelUsage>(&payload)) {
    return fmt::format("{} usage {} {}", to, usage->model, usage->requests);
  }
  if (const auto* drained = std::get_if<ModelDrained>(&payload)) {
    return fmt::format("{} drained {} {}", to, drained->model, drained->aborted);
  }
  if (const auto* lookup = std::get_if<PrefixLookup>(&payload)) {
    return fmt::format("{} lookup #{} {} pages", to, options.correlation_id, lookup->keys.size());
  }
  if (const auto* status = std::get_if<StatusReport>(&payload)) {
    return fmt::format("{} status requests={} waiting={} running={}", to, status->requests, status->waiting,
                       status->running);
  }
  return to + " ?";
}

// Keeps what the policy sends; a peer named in `refuse` answers with that status.
class Recorder final : public PolicyOutput {
 public:
  SendStatus send(const std::string& to, Payload payload, SendOptions options) override {
    lines.push_back(render(to, payload, options));
    if (auto* plan = std::get_if<StepPlan>(&payload)) plans.push_back(std::move(*plan));
    if (auto* token = std::get_if<TokenEvent>(&payload)) tokens.push_back(std::move(*token));
    if (auto* final = std::get_if<FinalEvent>(&payload)) finals.push_back(std::move(*final));
    auto refused = refuse.find(to);
    return refused == refuse.end() ? SendStatus::sent : refused->second;
  }
  std::vector<std::string> lines;
  std::deque<StepPlan> plans;  // sent to the executor and not answered yet, oldest first
  std::map<std::string, SendStatus> refuse;
  std::vector<TokenEvent> tokens;  // to the front ends, in order
  std::vector<FinalEvent> finals;
};

// ---- the inputs of a case ---------------------------------------------------------------------

class Harness {
 public:
  explicit Harness(const SchedulerConfig& config) : policy(config) { policy.start(out); }

  void hand(const std::string& from, Payload payload, std::uint64_t request_id = 0, std::uint64_t correlation = 0,
            Frames blobs = {}) {
    now_ns += 1'000'000;
    Message message{{kind_of(payload), 1, from, "scheduler", correlation, request_id, 0}, std::move(payload),
                    std::move(blobs)};
    policy.handle(out, message, now_ns, self);
  }
  // Answers the oldest plan in flight: every sequence it asks output of samples `token_for`, or
  // for an embedding, pools a vector of two (unless `vectors` is false: then it answers nothing).
  void answer(const std::function<std::int32_t(std::uint64_t)>& token_for, bool vectors = true) {
    ASSERT_FALSE(out.plans.empty()) << "no plan in flight to answer";
    StepPlan plan = std::move(out.plans.front());
    out.plans.pop_front();
    for (const auto& start : plan.starts) {
      if (start.pooling != 0) embeddings.insert(start.sequence);
    }
    StepResult result;
    result.step = plan.step;
    Frames blobs;
    for (const auto& s : plan.sequences) {
      if (!s.output) continue;
      if (!embeddings.contains(s.sequence)) {
        result.tokens.push_back({s.sequence, token_for(s.sequence), false, {}});
      } else if (vectors) {
        const float vector[] = {0.6f, 0.8f};
        result.pooled.push_back(s.sequence);
        blobs.emplace_back(vector, sizeof(vector));
      }
    }
    hand("executor", std::move(result), 0, 0, std::move(blobs));
  }

  SchedulerPolicy policy;
  Recorder out;
  std::set<std::uint64_t> embeddings;  // sequences started with pooling
  std::int64_t now_ns = 1'000'000'000;
  std::string self = "scheduler";
};

using Input = std::function<void(Harness&)>;

ModelInfo tiny_info(std::uint32_t pages = kPages) {
  ModelInfo info;
  info.name = "tiny";
  info.kv_pages = pages;
  info.page_size = kPageSize;
  info.n_vocab = 1024;
  info.page_bytes = 4096;
  return info;
}

// The executor's first report: it has the tiny model with `pages` KV pages.
Input ready(std::uint32_t pages = kPages) {
  return [=](Harness& h) {
    ExecutorReport report;
    report.models = {tiny_info(pages)};
    h.hand("executor", std::move(report));
  };
}
Input ready_without_models() {
  return [](Harness& h) { h.hand("executor", ExecutorReport{}); };
}

struct Options {
  std::int32_t max_tokens = 2;
  std::uint32_t first_token = 300;  // the prompt is first_token, first_token + 1, ...
  std::vector<std::int32_t> stop_tokens = {};
  std::vector<std::string> stop_strings = {};
  std::string model = {};
  std::string from = "gateway";
  model::Pooling pooling = model::Pooling::none;
  bool json = false;  // response_format json_object
};

// A greedy request with a prompt of `length` token ids.
Input submit(std::uint64_t id, std::uint32_t length, Options o = {}) {
  return [=](Harness& h) {
    Submit s;
    s.model = o.model;
    s.prompt_kind = static_cast<std::uint8_t>(PromptKind::tokens);
    for (std::uint32_t i = 0; i < length; ++i) s.tokens.push_back(static_cast<std::int32_t>(o.first_token + i));
    s.sampling.temperature = 0;
    s.sampling.max_tokens = o.max_tokens;
    s.sampling.stop_token_ids = o.stop_tokens;
    s.sampling.stop = o.stop_strings;
    s.pooling = static_cast<std::uint8_t>(o.pooling);
    if (o.json) s.sampling.response_format.kind = static_cast<std::uint8_t>(model::ResponseKind::json_object);
    h.hand(o.from, std::move(s), id);
  };
}
Input submit_tokens(std::uint64_t id, std::vector<std::int32_t> tokens) {
  return [=](Harness& h) {
    Submit s;
    s.prompt_kind = static_cast<std::uint8_t>(PromptKind::tokens);
    s.tokens = tokens;
    s.sampling.max_tokens = 2;
    h.hand("gateway", std::move(s), id);
  };
}
// A greedy chat request of one user message, for one token.
Input submit_chat(std::uint64_t id, std::string content) {
  return [=](Harness& h) {
    Submit s;
    s.prompt_kind = static_cast<std::uint8_t>(PromptKind::chat);
    s.chat = {ChatTurn{"user", content}};
    s.sampling.temperature = 0;
    s.sampling.max_tokens = 1;
    h.hand("gateway", std::move(s), id);
  };
}
// A chat with a tool call and its result, the tools and a template argument.
Input submit_chat_with_tools(std::uint64_t id) {
  return [=](Harness& h) {
    Submit s;
    s.prompt_kind = static_cast<std::uint8_t>(PromptKind::chat);
    ChatTurn call{"assistant", ""};
    call.has_content = false;
    call.tool_calls = {{"c1", "f", R"({"a": 1})"}};
    ChatTurn result{"tool", "2"};
    result.tool_call_id = "c1";
    s.chat = {ChatTurn{"user", "x"}, call, result};
    s.tools = R"([{"type": "function", "function": {"name": "f"}}])";
    s.chat_template_kwargs = R"({"flag": true})";
    s.sampling.temperature = 0;
    s.sampling.max_tokens = 1;
    h.hand("gateway", std::move(s), id);
  };
}
Input abort(std::uint64_t id, AbortReason reason = AbortReason::client) {
  return [=](Harness& h) { h.hand("gateway", Abort{static_cast<std::uint8_t>(reason)}, id); };
}
// Answers the oldest plan in flight, `times` times; every output is kToken.
Input answer(int times = 1) {
  return [=](Harness& h) {
    for (int i = 0; i < times; ++i) h.answer([](std::uint64_t) { return kToken; });
  };
}
Input answer_with(std::uint64_t sequence, std::int32_t token) {
  return [=](Harness& h) { h.answer([=](std::uint64_t s) { return s == sequence ? token : kToken; }); };
}
// Answers every plan until none is in flight.
Input run_to_end() {
  return [](Harness& h) {
    for (int i = 0; i < 1000 && !h.out.plans.empty(); ++i) h.answer([](std::uint64_t) { return kToken; });
  };
}
// The oldest plan in flight fails (the GPU), losing the KV cache when kv_lost.
Input fail_step(bool kv_lost = false) {
  return [=](Harness& h) {
    ASSERT_FALSE(h.out.plans.empty());
    StepResult result;
    result.step = h.out.plans.front().step;
    result.error = static_cast<std::uint16_t>(RequestError::gpu);
    result.message = "device lost";
    result.kv_lost = kv_lost;
    h.out.plans.pop_front();
    h.hand("executor", std::move(result));
  };
}
// The watchdog's timer, `ms` later.
Input wait_ms(std::int64_t ms) {
  return [=](Harness& h) {
    h.now_ns += ms * 1'000'000;
    h.hand("scheduler", Timer{1, 1});
  };
}
Input from_enforcer(Payload payload) {
  return [=](Harness& h) { h.hand("enforcer", payload); };
}
Input model_loaded() {
  ModelLoaded loaded;
  loaded.model = "tiny";
  loaded.ok = true;
  loaded.info = tiny_info();
  return from_enforcer(loaded);
}
Input load_answer(LoadOutcome outcome) {
  LoadAnswer answer;
  answer.model = "tiny";
  answer.outcome = static_cast<std::uint8_t>(outcome);
  answer.message = "no";
  return from_enforcer(answer);
}
Input model_failed_to_load() {
  ModelLoaded loaded;
  loaded.model = "tiny";
  loaded.error = "a bad file";
  return from_enforcer(loaded);
}
Input status_query() {
  return [](Harness& h) { h.hand("gateway", StatusQuery{false}, 0, 42); };
}
// The cache-writer's answer to sequence's lookup: no pages.
Input no_cached_prefix(std::uint64_t sequence) {
  return [=](Harness& h) { h.hand("cache-writer", CachedPrefix{"tiny", {}, {}}, 0, sequence); };
}
Input stop() {
  return [](Harness& h) { h.policy.stop(h.out, h.now_ns += 1'000'000, h.self); };
}
// Asserts, at this point of the case, that no page is referenced: every ended request gave its
// pages back (full ones may stay cached, unreferenced).
Input pages_free() {
  return [](Harness& h) {
    const StatusReport s = h.policy.status();
    EXPECT_EQ(s.kv_pages_in_use, 0u);
    EXPECT_EQ(s.kv_references, 0u);
  };
}
// Asserts how many requests run and wait now.
Input queues(std::uint32_t running, std::uint32_t waiting) {
  return [=](Harness& h) {
    EXPECT_EQ(h.policy.status().running, running);
    EXPECT_EQ(h.policy.status().waiting, waiting);
  };
}
Input preemptions(std::uint64_t count) {
  return [=](Harness& h) { EXPECT_EQ(h.policy.status().preemptions, count); };
}
// Asserts how many pages are referenced now (by running sequences).
Input pages_in_use(std::uint32_t pages) {
  return [=](Harness& h) { EXPECT_EQ(h.policy.status().kv_pages_in_use, pages); };
}

// ---- the cases --------------------------------------------------------------------------------

struct Case {
  std::string name;
  std::vector<Input> inputs;
  std::vector<std::string> expected;  // rendered sends, in this order; other sends may come between
  std::vector<std::string> never = {};  // rendered sends that must not be among them
  std::function<void(SchedulerConfig&)> configure = [](SchedulerConfig&) {};
};

// Every way a request ends.
std::vector<Case> ending_cases() {
  return {
      {"ends_at_max_tokens",
       {ready(), submit(1, 6, {.max_tokens = 2}), answer(), pages_in_use(2), answer(), pages_free()},
       {"executor query", "plan 1 1@0+6o start:1", "plan 2 1@6+1of", "gateway token #1 500", "gateway token #1 500",
        "gateway final #1 length 6+2", "plan 3 release:1"}},
      {"ends_at_a_stop_token",
       {ready(), submit(1, 5, {.max_tokens = 8, .stop_tokens = {kStopToken}}), answer_with(1, kStopToken), pages_free(),
        run_to_end()},
       {"plan 1 1@0+5o start:1", "plan 2 1@5+1of", "gateway token #1 777", "gateway final #1 stop 5+1",
        "plan 3 release:1"},
       {"gateway token #1 500"}},
      {"ends_at_a_stop_string",
       {ready(), submit(1, 5, {.max_tokens = 8, .stop_strings = {"x"}}), answer(), answer_with(1, kTokenX), pages_free(),
        run_to_end()},
       {"gateway token #1 500", "gateway token #1 87", "gateway final #1 stop 5+2 on \"x\"", "release:1"}},
      {"client_abort_while_waiting",
       {ready(), submit(1, 5, {.max_tokens = 20}), submit(2, 5), queues(1, 1), abort(2), answer(), abort(1),
        run_to_end(), pages_free()},
       {"plan 1 1@0+5o start:1", "gateway final #2 abort 5+0", "gateway final #1 abort 5+"},
       {"start:2"},
       [](SchedulerConfig& c) { c.max_sequences = 1; }},
      {"client_abort_while_running_applies_at_the_step_boundary",
       {ready(), submit(1, 5, {.max_tokens = 20}), abort(1), pages_in_use(2), answer(), pages_free(), run_to_end()},
       {"plan 1 1@0+5o start:1", "plan 2 1@5+1of", "gateway final #1 abort 5+0", "plan 3 release:1"},
       {"gateway token #1 500"}},
      {"client_gone",
       {ready(), submit(1, 5, {.max_tokens = 20}), answer(), abort(1, AbortReason::client_gone), answer(), pages_free(),
        run_to_end()},
       {"gateway token #1 500", "gateway final #1 abort 5+1", "release:1"}},
      {"shutdown_abort",
       {ready(), submit(1, 5, {.max_tokens = 20}), abort(1, AbortReason::shutdown), answer(), pages_free(), run_to_end()},
       {"gateway final #1 abort 5+0"}},
      {"failed_step_ends_its_requests_with_the_gpu_error",
       {ready(), submit(1, 5, {.max_tokens = 20}), fail_step(), pages_free(), run_to_end()},
       {"plan 1 1@0+5o start:1", "gateway final #1 error gpu"},
       {"release:1"}},  // the executor dropped the failed step's sequences itself
      {"executor_silent_fails_requests_in_flight",
       {ready(), submit(1, 5, {.max_tokens = 20}), wait_ms(100), wait_ms(30'000), pages_free()},
       {"plan 1 1@0+5o start:1", "gateway final #1 error unavailable", "executor query"}},
      {"model_unloaded_ends_its_requests_and_drains_after_the_step",
       {ready(), submit(1, 5, {.max_tokens = 20}), submit(2, 5, {.max_tokens = 20, .first_token = 600}),
        from_enforcer(AbortModel{"tiny", ""}), pages_free(), run_to_end()},
       {"plan 1 1@0+5o start:1", "gateway final #1 abort 5+0", "gateway final #2 abort 5+0", "plan 3 release:1",
        "enforcer drained tiny 2"},
       {},
       [](SchedulerConfig& c) { c.enforcer = "enforcer"; }},
      {"scheduler_stopping_ends_everything",
       {ready(), submit(1, 5, {.max_tokens = 20}), submit(2, 5), stop(), pages_free()},
       {"gateway final #1 abort 5+0", "gateway final #2 abort 5+0"},
       {},
       [](SchedulerConfig& c) { c.max_sequences = 1; }},
      {"unknown_model",
       {ready(), submit(1, 5, {.model = "giant"})},
       {"gateway final #1 error unknown_model"}},
      {"busy_when_the_queue_is_full",
       {ready(), submit(1, 5), submit(2, 5), submit(3, 5), submit(4, 5), abort(2), abort(3), run_to_end()},
       {"gateway final #4 error busy", "gateway final #2 abort 5+0", "gateway final #3 abort 5+0",
        "gateway final #1 length 5+2"},
       {},
       [](SchedulerConfig& c) {
         c.max_sequences = 1;
         c.max_waiting = 2;
       }},
      {"empty_prompt", {ready(), submit(1, 0)}, {"gateway final #1 error invalid_request"}},
      {"token_outside_the_vocabulary",
       {ready(), submit_tokens(1, {300, 5000})},
       {"gateway final #1 error invalid_request"}},
      {"prompt_longer_than_the_kv_cache_at_submit",
       {ready(), submit(1, 62, {.max_tokens = 3})},
       {"gateway final #1 error prompt_too_long"}},
      {"prompt_longer_than_the_kv_cache_found_at_admission",
       // Accepted before the model's KV cache is known (it is loading); refused when it is.
       {ready_without_models(), submit(1, 62, {.max_tokens = 3}), model_loaded(), pages_free()},
       {"enforcer load tiny", "gateway final #1 error prompt_too_long"},
       {"start:1"},
       [](SchedulerConfig& c) { c.enforcer = "enforcer"; }},
      {"duplicate_request_id_is_refused_and_the_open_one_goes_on",
       {ready(), submit(1, 5), submit(1, 5), run_to_end()},
       {"gateway final #1 error invalid_request", "gateway final #1 length 5+2"}},
      {"model_not_loaded_and_nothing_loads_it",
       {ready_without_models(), submit(1, 5), pages_free()},
       {"gateway final #1 error unavailable"}},
      {"model_loaded_on_demand",
       {ready_without_models(), submit(1, 5), model_loaded(), load_answer(LoadOutcome::loaded), run_to_end()},
       {"enforcer usage tiny 1", "enforcer load tiny", "plan 1 1@0+5o start:1", "enforcer usage tiny 0",
        "gateway final #1 length 5+2"},
       {},
       [](SchedulerConfig& c) { c.enforcer = "enforcer"; }},
      {"model_does_not_fit_in_memory",
       {ready_without_models(), submit(1, 5), load_answer(LoadOutcome::insufficient_memory)},
       {"enforcer load tiny", "gateway final #1 error insufficient_memory"},
       {},
       [](SchedulerConfig& c) { c.enforcer = "enforcer"; }},
      {"model_failed_to_load",
       {ready_without_models(), submit(1, 5), model_failed_to_load()},
       {"enforcer load tiny", "gateway final #1 error model_failed"},
       {},
       [](SchedulerConfig& c) { c.enforcer = "enforcer"; }},
      {"model_load_refused",
       {ready_without_models(), submit(1, 5), load_answer(LoadOutcome::failed)},
       {"enforcer load tiny", "gateway final #1 error model_failed"},
       {},
       [](SchedulerConfig& c) { c.enforcer = "enforcer"; }},
      {"load_request_refused_by_a_full_enforcer",
       {[](Harness& h) { h.out.refuse["enforcer"] = SendStatus::full; }, ready_without_models(), submit(1, 5)},
       {"enforcer load tiny", "gateway final #1 error busy"},
       {},
       [](SchedulerConfig& c) { c.enforcer = "enforcer"; }},
      {"kv_cache_lost_recomputes_the_running_requests",
       // Plan 2 (sequence 1's follower) fails, losing the cache: sequence 1 fails with it; plan 3,
       // planned before, computed on the lost cache and counts for nothing, and sequence 2 is
       // recomputed from its first token.
       {ready(), submit(1, 5, {.max_tokens = 3}), submit(2, 5, {.max_tokens = 3, .first_token = 600}), answer(),
        fail_step(true), pages_free(), run_to_end(), pages_free()},
       {"plan 2 1@5+1of", "plan 3 1@6+1of 2@0+5o start:2", "gateway final #1 error gpu", "plan 4 2@0+5o",
        "gateway final #2 length 5+3"},
       {"final #2 error"}},
  };
}

// Budget, chunked prefill, followers, the sequence limit, preemption and the prefix cache.
std::vector<Case> planning_cases() {
  auto budget = [](std::uint32_t tokens) { return [=](SchedulerConfig& c) { c.token_budget = tokens; }; };
  auto no_overlap = [](SchedulerConfig& c) { c.overlap = false; };
  auto with_enforcer = [](SchedulerConfig& c) { c.enforcer = "enforcer"; };
  return {
      // A constrained response_format's start carries the model's end tokens (the grammar
      // allows them once the JSON is complete); an unconstrained one's carries none.
      {"a_json_request_starts_with_the_models_end_tokens",
       {ready(), submit(1, 6, {.json = true}), submit(2, 6), run_to_end(), pages_free()},
       {"start:1+ends"},
       {"start:2+ends"}},
      // The executor loads its models at its start, but its report may come after the first
      // request: that request waits for it, and no load is asked of anyone.
      {"a_request_before_the_executors_first_report_waits_for_it",
       {submit(1, 6), queues(0, 1), ready(), run_to_end(), pages_free()},
       {"executor query", "plan 1 1@0+6o start:1", "gateway final #1 length 6+2"},
       {"gateway final #1 error unavailable"}},
      {"a_request_before_the_first_report_asks_no_load_of_the_enforcer",
       {submit(1, 6), ready(), run_to_end(), pages_free()},
       {"executor query", "plan 1 1@0+6o start:1", "gateway final #1 length 6+2"},
       {"enforcer load tiny"},
       with_enforcer},
      {"chunked_prefill_under_the_token_budget",
       {ready(), submit(1, 10), run_to_end()},
       {"plan 1 1@0+4 start:1", "plan 2 1@4+4", "plan 3 1@8+2o", "plan 4 1@10+1of", "gateway final #1 length 10+2"},
       {},
       budget(4)},
      {"decode_joins_a_later_prefill_under_the_budget",
       {ready(), submit(1, 3, {.max_tokens = 4}), answer(), submit(2, 6, {.first_token = 600}), run_to_end()},
       // The second prompt comes with two plans in flight; then each step is one decode and as
       // much of the prompt as the budget leaves, and the first stops following short of max_tokens.
       {"plan 1 1@0+3o start:1", "plan 2 1@3+1of", "plan 3 1@4+1of", "plan 4 1@5+1of 2@0+3 start:2",
        "plan 5 2@3+3o", "gateway final #1 length 3+4"},
       {},
       budget(4)},
      {"one_plan_at_a_time_without_overlap",
       {ready(), submit(1, 5, {.max_tokens = 3}), answer(), answer(), answer(), pages_free()},
       {"plan 1 1@0+5o start:1", "gateway token #1 500", "plan 2 1@5+1o", "gateway token #1 500", "plan 3 1@6+1o",
        "gateway final #1 length 5+3", "plan 4 release:1"},
       {"f "},
       no_overlap},
      {"sequence_limit_keeps_the_third_waiting",
       {ready(), submit(1, 5), submit(2, 5, {.first_token = 600}), submit(3, 5, {.first_token = 700}), queues(1, 2),
        answer(), queues(2, 1), run_to_end(), pages_free()},
       {"plan 1 1@0+5o start:1", "plan 3 2@0+5o start:2", "gateway final #1 length 5+2",
        "plan 4 2@5+1of 3@0+5o start:3 release:1"},
       {},
       [](SchedulerConfig& c) { c.max_sequences = 2; }},
      {"newest_running_sequence_is_preempted_when_pages_run_out",
       // 3 pages: each prompt of 5 takes 2; the second's decode needs a third page of its own only
       // after the first took it, so the second gives way and is recomputed when the first ends.
       {ready(3), submit(1, 7, {.max_tokens = 3}), submit(2, 2, {.max_tokens = 3, .first_token = 600}), answer(),
        answer(), preemptions(1), run_to_end(), pages_free()},
       {"plan 2 1@7+1o 2@0+2o start:2", "plan 3 1@8+1o", "gateway final #1 length 7+3", "plan 4 2@0+3o release:1",
        "gateway final #2 length 2+3"},
       {},
       no_overlap},
      {"shared_prefix_comes_from_the_prefix_cache",
       {ready(), submit(1, 9), run_to_end(), submit(2, 9), run_to_end(), pages_free()},
       {"plan 1 1@0+9o start:1", "gateway final #1 length 9+2", "2@8+1o start:2", "gateway final #2 length 9+2"}},
      {"status_counts_the_queues",
       {ready(), submit(1, 5), submit(2, 5, {.first_token = 600}), status_query(), run_to_end()},
       {"gateway status requests=2 waiting=1 running=1"},
       {},
       [](SchedulerConfig& c) { c.max_sequences = 1; }},
      {"prefix_lookup_holds_admission_until_the_cache_writer_answers",
       {ready(), submit(1, 9), pages_in_use(0), no_cached_prefix(1), run_to_end()},
       {"cache-writer lookup #1 2 pages", "plan 1 1@0+9o start:1", "gateway final #1 length 9+2"},
       {},
       [](SchedulerConfig& c) { c.cache_writer = "cache-writer"; }},
      {"prefix_lookup_unanswered_is_a_miss_after_its_timeout",
       {ready(), submit(1, 9), wait_ms(10), queues(0, 1), wait_ms(2'000), queues(1, 0), run_to_end()},
       {"cache-writer lookup #1 2 pages", "plan 1 1@0+9o start:1", "gateway final #1 length 9+2"},
       {},
       [](SchedulerConfig& c) { c.cache_writer = "cache-writer"; }},
  };
}

// Embeddings: a prefill that samples nothing and ends with its vector, whatever way it ends.
std::vector<Case> embedding_cases() {
  constexpr auto mean = model::Pooling::mean;
  constexpr auto last = model::Pooling::last;
  auto budget = [](std::uint32_t tokens) { return [=](SchedulerConfig& c) { c.token_budget = tokens; }; };
  auto answer_without_vectors = [](Harness& h) { h.answer([](std::uint64_t) { return kToken; }, false); };
  return {
      {"an_embedding_is_a_prefill_that_ends_with_its_vector",
       {ready(), submit(1, 6, {.pooling = mean}), answer(), pages_free(), run_to_end()},
       {"plan 1 1@0+6o start:1", "gateway final #1 stop 6+0 vector:2", "plan 2 release:1"},
       {"gateway token", "1@6"}},
      {"a_long_embedding_is_computed_in_chunks_under_the_budget",
       {ready(), submit(1, 10, {.pooling = last}), run_to_end(), pages_free()},
       {"plan 1 1@0+4 start:1", "plan 2 1@4+4", "plan 3 1@8+2o", "gateway final #1 stop 10+0 vector:2"},
       {"gateway token", "1@10"},
       budget(4)},
      {"mean_pooling_computes_every_position_and_last_shares_the_prefix",
       {ready(), submit(1, 9), run_to_end(), submit(2, 9, {.pooling = mean}), run_to_end(),
        submit(3, 9, {.pooling = last}), run_to_end(), pages_free()},
       {"gateway final #1 length 9+2", "2@0+9o start:2", "gateway final #2 stop 9+0 vector:2", "3@8+1o start:3",
        "gateway final #3 stop 9+0 vector:2"}},
      {"mean_pooling_asks_the_cache_writer_for_nothing",
       {ready(), submit(1, 9, {.pooling = mean}), run_to_end(), pages_free()},
       {"plan 1 1@0+9o start:1", "gateway final #1 stop 9+0 vector:2"},
       {"lookup"},
       [](SchedulerConfig& c) { c.cache_writer = "cache-writer"; }},
      {"an_embedding_aborted_between_chunks_gives_its_pages_back",
       {ready(), submit(1, 10, {.pooling = mean}), abort(1), pages_in_use(2), answer(), pages_free(), run_to_end()},
       {"plan 1 1@0+4 start:1", "gateway final #1 abort 10+0", "release:1"},
       {"vector"},
       budget(4)},
      {"an_embedding_longer_than_the_cache_is_refused",
       {ready(), submit(1, 65, {.pooling = mean}), run_to_end()},
       {"gateway final #1 error prompt_too_long"}},
      {"an_embedding_as_long_as_the_cache_is_computed",
       {ready(), submit(1, 64, {.pooling = mean}), run_to_end(), pages_free()},
       {"gateway final #1 stop 64+0 vector:2"}},
      {"an_output_step_without_the_vector_is_an_internal_error",
       {ready(), submit(1, 6, {.pooling = mean}), answer_without_vectors, pages_free(), run_to_end()},
       {"plan 1 1@0+6o start:1", "gateway final #1 error internal", "release:1"}},
      {"a_failed_step_ends_the_embedding",
       {ready(), submit(1, 6, {.pooling = last}), fail_step(), pages_free(), run_to_end()},
       {"gateway final #1 error gpu"}},
  };
}

// Chat requests: the messages rendered by the model's chat template, or by the one configured in
// its place; a template that refuses the conversation or does not parse fails the request only.
std::vector<Case> chat_cases() {
  return {
      {"chat_rendered_by_the_models_own_template",
       {ready(), submit_chat(1, "x"), run_to_end(), pages_free()},
       {"start:1", "gateway final #1 length"}},
      {"chat_rendered_by_the_configured_template",
       {ready(), submit_chat(1, "x"), run_to_end(), pages_free()},
       {"plan 1 1@0+2o start:1", "gateway final #1 length 2+1"},  // the vocabulary's BOS, then "x"
       {},
       [](SchedulerConfig& c) { c.chat_template = "{{ messages[0].content }}"; }},
      {"chat_gives_the_template_tools_tool_calls_and_kwargs",
       {ready(), submit_chat_with_tools(1), run_to_end(), pages_free()},
       {"plan 1 1@0+2o start:1", "gateway final #1 length 2+1"},
       {"invalid_request"},
       [](SchedulerConfig& c) {
         c.chat_template =
             "{% if tools[0].function.name != 'f' or not flag or messages[1].content is not none or "
             "messages[1].tool_calls[0].function.arguments.a != 1 or messages[2].tool_call_id != 'c1' %}"
             "{{ raise_exception('not as sent') }}{% endif %}{{ messages[0].content }}";
       }},
      {"chat_refused_by_the_template",
       {ready(), submit_chat(1, "x"), submit(2, 3, {.max_tokens = 1}), run_to_end(), pages_free()},
       {"gateway final #1 error invalid_request", "gateway final #2 length 3+1"},
       {"start:1"},
       [](SchedulerConfig& c) { c.chat_template = "{{ raise_exception('no') }}"; }},
      {"chat_with_a_template_that_does_not_parse",
       {ready(), submit_chat(1, "x"), submit(2, 3, {.max_tokens = 1}), run_to_end(), pages_free()},
       {"gateway final #1 error invalid_request", "gateway final #2 length 3+1"},
       {"start:1"},
       [](SchedulerConfig& c) { c.chat_template = "{% for %}"; }},
  };
}

std::vector<Case> cases() {
  std::vector<Case> all = ending_cases();
  for (auto more : {planning_cases(), embedding_cases(), chat_cases()}) all.insert(all.end(), more.begin(), more.end());
  return all;
}

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class SchedulerPolicyCase : public testing::TestWithParam<Case> {};

TEST_P(SchedulerPolicyCase, SendsWhatItShouldAndReleasesEveryPage) {
  const Case& c = GetParam();
  SchedulerConfig config;
  config.models = {{"tiny", model_path()}};
  config.default_model = "tiny";
  c.configure(config);
  Harness h(config);
  for (const Input& input : c.inputs) {
    input(h);
    if (HasFatalFailure()) return;
  }
  const std::string sent = fmt::format("{}", fmt::join(h.out.lines, "\n  "));
  std::size_t at = 0;
  for (const std::string& want : c.expected) {
    auto found = std::find_if(h.out.lines.begin() + static_cast<std::ptrdiff_t>(at), h.out.lines.end(),
                              [&](const std::string& line) { return line.find(want) != std::string::npos; });
    ASSERT_NE(found, h.out.lines.end()) << "expected \"" << want << "\" (in order) among:\n  " << sent;
    at = static_cast<std::size_t>(found - h.out.lines.begin()) + 1;
  }
  for (const std::string& unwanted : c.never) {
    for (const std::string& line : h.out.lines) {
      EXPECT_EQ(line.find(unwanted), std::string::npos) << "sent \"" << line << "\" among:\n  " << sent;
    }
  }
  const StatusReport s = h.policy.status();
  EXPECT_EQ(s.requests, 0u) << "requests still open after:\n  " << sent;
  EXPECT_EQ(s.kv_pages_in_use, 0u);
  EXPECT_EQ(s.kv_references, 0u);
}

INSTANTIATE_TEST_SUITE_P(Cases, SchedulerPolicyCase, testing::ValuesIn(cases()),
                         [](const testing::TestParamInfo<Case>& info) { return info.param.name; });

// ---- a chat's output split: tool calls and reasoning --------------------------------------------

// What a chat request's events brought, joined, and the response_format its start carried.
struct ChatOutcome {
  std::string text, reasoning;
  std::vector<ToolCall> calls;
  std::string finish;
  std::string schema;  // the sampling's json_schema (a forced call's)
  std::string error;   // the final's message when it failed
};

constexpr std::string_view kTools =
    R"([{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
        "properties": {"a": {"type": "integer"}}, "required": ["a"]}}}])";

// A chat of one user message to the tiny model with `chat_template`, whose executor samples the
// bytes of `output` one a step (the byte-level vocabulary), then the stop token.
ChatOutcome run_chat(const std::string& chat_template, Submit submit, const std::string& output) {
  SchedulerConfig config;
  config.models = {{"tiny", model_path()}};
  config.default_model = "tiny";
  config.chat_template = chat_template;
  Harness h(config);
  ready(128)(h);  // room for the longest output here
  submit.prompt_kind = static_cast<std::uint8_t>(PromptKind::chat);
  submit.chat = {ChatTurn{"user", "x"}};
  submit.sampling.temperature = 0;
  submit.sampling.max_tokens = static_cast<std::int32_t>(output.size()) + 1;
  submit.sampling.stop_token_ids = {kStopToken};
  h.hand("gateway", std::move(submit), 1);
  ChatOutcome o;
  std::size_t next = 0;
  for (int i = 0; i < 1000 && !h.out.plans.empty(); ++i) {
    for (const auto& start : h.out.plans.front().starts) o.schema = start.sampling.response_format.schema;
    h.answer([&](std::uint64_t) { return next < output.size() ? std::int32_t{output[next++] - '!'} : kStopToken; });
  }
  EXPECT_EQ(h.out.finals.size(), 1u);
  if (h.out.finals.empty()) return o;
  const FinalEvent& final = h.out.finals.back();
  o.finish = finish_name(final.finish);
  o.error = final.message;
  std::vector<ToolCallDelta> pieces;
  for (const auto& event : h.out.tokens) {
    o.text += event.text;
    o.reasoning += event.reasoning;
    pieces.insert(pieces.end(), event.tool_calls.begin(), event.tool_calls.end());
  }
  o.text += final.text;
  o.reasoning += final.reasoning;
  pieces.insert(pieces.end(), final.tool_calls.begin(), final.tool_calls.end());
  for (const auto& piece : pieces) {
    if (piece.index == o.calls.size()) {
      o.calls.push_back({piece.id, piece.name, piece.arguments});
    } else {
      EXPECT_TRUE(piece.id.empty() && piece.name.empty()) << "a later piece of call " << piece.index;
      o.calls.at(piece.index).arguments += piece.arguments;
    }
  }
  return o;
}

Submit with_tools(ToolChoice choice, std::string name = {}) {
  Submit s;
  s.tools = std::string(kTools);
  s.tool_choice = static_cast<std::uint8_t>(choice);
  s.tool_choice_name = std::move(name);
  return s;
}

// A Hermes-style template (it writes <tool_call>) and a thinking one whose generation prompt opens
// <think>; the parser's setup comes from these sources.
const std::string kHermesTemplate = "{{ messages[0].content }}{# <tool_call> #}";
const std::string kThinkingTemplate = "{{ messages[0].content }}<think>{# </think> #}";

TEST(SchedulerToolCalls, NativeCallsEndTheTurnWithThem) {
  const ChatOutcome o = run_chat(kHermesTemplate, with_tools(ToolChoice::automatic),
                                 R"(ok<tool_call>{"name":"f","arguments":{"a":1}}</tool_call>)"
                                 R"(<tool_call>{"name":"f","arguments":{"a":2}}</tool_call>)");
  EXPECT_EQ(o.finish, "tool_calls") << o.error;
  EXPECT_EQ(o.text, "ok");
  ASSERT_EQ(o.calls.size(), 2u);
  EXPECT_EQ(o.calls[0].name, "f");
  EXPECT_EQ(o.calls[0].arguments, R"({"a":1})");
  EXPECT_EQ(o.calls[1].arguments, R"({"a":2})");
  EXPECT_TRUE(o.calls[0].id.starts_with("call_")) << o.calls[0].id;
  EXPECT_NE(o.calls[0].id, o.calls[1].id);
  EXPECT_EQ(o.schema, "");  // auto constrains nothing
  // parallel_tool_calls false: the first call only.
  Submit single = with_tools(ToolChoice::automatic);
  single.parallel_tool_calls = false;
  const ChatOutcome one = run_chat(kHermesTemplate, single,
                                   R"(<tool_call>{"name":"f","arguments":{"a":1}}</tool_call>)"
                                   R"(<tool_call>{"name":"f","arguments":{"a":2}}</tool_call>)");
  ASSERT_EQ(one.calls.size(), 1u);
  EXPECT_EQ(one.calls[0].arguments, R"({"a":1})");
  // tool_choice none, or no tools: the same output is all content.
  const std::string text = R"(<tool_call>{"name":"f","arguments":{}}</tool_call>)";
  for (const Submit& submit : {with_tools(ToolChoice::none), Submit{}}) {
    const ChatOutcome plain = run_chat(kHermesTemplate, submit, text);
    EXPECT_EQ(plain.finish, "stop");
    EXPECT_EQ(plain.text, text);
    EXPECT_TRUE(plain.calls.empty());
  }
}

TEST(SchedulerToolCalls, ForcedCallsConstrainTheSampling) {
  const ChatOutcome function = run_chat(kHermesTemplate, with_tools(ToolChoice::function, "f"), R"({"a":7})");
  EXPECT_EQ(function.finish, "tool_calls");
  EXPECT_EQ(nlohmann::json::parse(function.schema)["required"], nlohmann::json::array({"a"}));
  ASSERT_EQ(function.calls.size(), 1u);
  EXPECT_EQ(function.calls[0].name, "f");
  EXPECT_EQ(function.calls[0].arguments, R"({"a":7})");
  EXPECT_EQ(function.text, "");

  const ChatOutcome required = run_chat("{{ messages[0].content }}", with_tools(ToolChoice::required),
                                        R"([{"name":"f","arguments":{"a":1}},{"name":"f","arguments":{"a":2}}])");
  EXPECT_EQ(required.finish, "tool_calls") << required.error;
  EXPECT_EQ(nlohmann::json::parse(required.schema)["type"], "array");
  ASSERT_EQ(required.calls.size(), 2u);
  EXPECT_EQ(required.calls[1].arguments, R"({"a":2})");
}

TEST(SchedulerToolCalls, BadToolChoicesAreRefused) {
  const ChatOutcome unknown = run_chat(kHermesTemplate, with_tools(ToolChoice::function, "g"), "");
  EXPECT_EQ(unknown.finish, "error");
  EXPECT_NE(unknown.error.find("'g'"), std::string::npos) << unknown.error;
  Submit no_tools;
  no_tools.tool_choice = static_cast<std::uint8_t>(ToolChoice::required);
  EXPECT_EQ(run_chat(kHermesTemplate, no_tools, "").finish, "error");
  Submit both = with_tools(ToolChoice::required);
  both.sampling.response_format.kind = static_cast<std::uint8_t>(model::ResponseKind::json_object);
  EXPECT_EQ(run_chat(kHermesTemplate, both, "").finish, "error");
}

TEST(SchedulerReasoning, APromptThatOpensThinkingStartsInReasoning) {
  const ChatOutcome o = run_chat(kThinkingTemplate, Submit{}, "hmm</think>yes");
  EXPECT_EQ(o.finish, "stop");
  EXPECT_EQ(o.reasoning, "hmm");
  EXPECT_EQ(o.text, "yes");
  // A model that never closes the block: everything is reasoning.
  const ChatOutcome open = run_chat(kThinkingTemplate, Submit{}, "hmm...");
  EXPECT_EQ(open.reasoning, "hmm...");
  EXPECT_EQ(open.text, "");
  // A template that does not open it: the model's own <think> does.
  const ChatOutcome own = run_chat("{{ messages[0].content }}{# </think> #}", Submit{}, "<think>a</think>b");
  EXPECT_EQ(own.reasoning, "a");
  EXPECT_EQ(own.text, "b");
}

// ---- speculative decoding: prompt-lookup drafts ------------------------------------------------

// A policy that drafts up to 4 tokens a step, and the tiny model's executor ready.
struct Speculating {
  explicit Speculating(std::uint32_t max_batch = 4) : h(config(max_batch)) { ready()(h); }
  static SchedulerConfig config(std::uint32_t max_batch) {
    SchedulerConfig c;
    c.models = {{"tiny", model_path()}};
    c.default_model = "tiny";
    c.draft_max = 4;
    c.speculate_max_batch = max_batch;
    return c;
  }
  // A greedy request whose prompt says 300 301 302 303 twice, but for the last 303.
  void submit_repeating(std::uint64_t id, std::int32_t max_tokens, std::vector<std::int32_t> stop_tokens = {},
                        std::int32_t draft_max = -1) {
    submit(id, {300, 301, 302, 303, 300, 301, 302}, max_tokens, std::move(stop_tokens), draft_max);
  }
  void submit(std::uint64_t id, std::vector<std::int32_t> prompt, std::int32_t max_tokens,
              std::vector<std::int32_t> stop_tokens = {}, std::int32_t draft_max = -1) {
    Submit s;
    s.prompt_kind = static_cast<std::uint8_t>(PromptKind::tokens);
    s.tokens = std::move(prompt);
    s.sampling.temperature = 0;
    s.sampling.max_tokens = max_tokens;
    s.sampling.stop_token_ids = std::move(stop_tokens);
    s.draft_max = draft_max;
    h.hand("gateway", std::move(s), id);
  }
  // Answers the oldest plan: every sequence that asks for output samples `token`, after keeping
  // `accepted` of its drafts where it has some.
  void answer_drafts(std::size_t accepted, std::int32_t token) {
    ASSERT_FALSE(h.out.plans.empty());
    const StepPlan plan = std::move(h.out.plans.front());
    h.out.plans.pop_front();
    StepResult result;
    result.step = plan.step;
    for (const PlanSequence& seq : plan.sequences) {
      if (!seq.output) continue;
      OutputToken out{seq.sequence, token, false, {}, {}};
      if (seq.drafted > 0) out.accepted.assign(seq.tokens.begin() + 1, seq.tokens.begin() + 1 + accepted);
      result.tokens.push_back(out);
    }
    h.hand("executor", std::move(result));
  }
  std::vector<std::int32_t> delivered() const {
    std::vector<std::int32_t> tokens;
    for (const TokenEvent& event : h.out.tokens) tokens.insert(tokens.end(), event.tokens.begin(), event.tokens.end());
    return tokens;
  }
  Harness h;
};

TEST(SchedulerSpeculation, DraftsFollowTheLastNgramAndTheKeptOnesAreDeliveredInOrder) {
  Speculating s;
  s.submit_repeating(1, 8);
  ASSERT_EQ(s.h.out.plans.size(), 1u);
  EXPECT_EQ(render_plan(s.h.out.plans.front()), "plan 1 1@0+7o start:1");
  // No follower while the prompt's step runs: the request waits for its token to draft after it.
  s.answer_drafts(0, 303);
  ASSERT_EQ(s.h.out.plans.size(), 1u);
  // "301 302 303" was followed by "300 301 302 303": the token, then those four as drafts.
  EXPECT_EQ(render_plan(s.h.out.plans.front()), "plan 2 1@7+5od4");
  EXPECT_EQ(s.h.out.plans.front().sequences[0].tokens, (std::vector<std::int32_t>{303, 300, 301, 302, 303}));
  EXPECT_EQ(s.h.out.plans.front().sequences[0].block_table.size(), 3u);  // positions 0 to 11
  s.answer_drafts(2, 555);
  EXPECT_EQ(s.delivered(), (std::vector<std::int32_t>{303, 300, 301, 555}));
  // Its length is 10 (the token at 7 and two drafts kept): 3 pages, the third partly rejected.
  StatusReport status = s.h.policy.status();
  EXPECT_EQ(status.drafted_tokens, 4u);
  EXPECT_EQ(status.accepted_tokens, 2u);
  EXPECT_EQ(status.kv_pages_in_use, 3u);
  // "555" never came before: a plain decode from position 10, over what the rejected drafts wrote;
  // that is a miss, so the decode after it follows it without drafts.
  ASSERT_EQ(s.h.out.plans.size(), 2u);
  EXPECT_EQ(render_plan(s.h.out.plans.front()), "plan 3 1@10+1o");
  EXPECT_EQ(render_plan(s.h.out.plans.back()), "plan 4 1@11+1of");
  for (int i = 0; i < 100 && !s.h.out.plans.empty(); ++i) s.answer_drafts(0, kToken);
  ASSERT_EQ(s.h.out.finals.size(), 1u);
  EXPECT_EQ(s.h.out.finals[0].completion_tokens, 8u);
  EXPECT_EQ(s.delivered().size(), 8u);
  EXPECT_EQ(s.h.policy.status().kv_references, 0u);
}

TEST(SchedulerSpeculation, RejectedDraftsGiveBackThePagesOnlyTheyTook) {
  Speculating s;
  s.submit(1, {300, 301, 302, 303, 300, 301}, 8);
  s.answer_drafts(0, 302);
  // "300 301 302" guesses "303 300 301 302", but a match of three tokens backs three drafts at most:
  // positions 6 to 9, three pages.
  EXPECT_EQ(render_plan(s.h.out.plans.front()), "plan 2 1@6+4od3");
  s.answer_drafts(0, 555);  // none kept: its length is 7, and the next decode (at 7) needs two pages
  EXPECT_EQ(s.delivered(), (std::vector<std::int32_t>{302, 555}));
  EXPECT_EQ(render_plan(s.h.out.plans.front()), "plan 3 1@7+1o");
  // Backing off, it follows that step; the follower at 8 takes the third page again.
  EXPECT_EQ(render_plan(s.h.out.plans.back()), "plan 4 1@8+1of");
  EXPECT_EQ(s.h.policy.status().kv_pages_in_use, 3u);
  EXPECT_EQ(s.h.policy.status().accepted_tokens, 0u);
  for (int i = 0; i < 100 && !s.h.out.plans.empty(); ++i) s.answer_drafts(0, kToken);
  EXPECT_EQ(s.delivered().size(), 8u);
  EXPECT_EQ(s.h.policy.status().kv_references, 0u);
}

TEST(SchedulerSpeculation, AStopTokenAmongTheKeptDraftsEndsTheRequestThere) {
  Speculating s;
  s.submit_repeating(1, 8, {301});
  s.answer_drafts(0, 303);
  s.answer_drafts(3, 555);  // 300 301 302 kept, 555 after: 301 stops it
  EXPECT_EQ(s.delivered(), (std::vector<std::int32_t>{303, 300, 301}));
  ASSERT_EQ(s.h.out.finals.size(), 1u);
  EXPECT_EQ(finish_name(s.h.out.finals[0].finish), "stop");
  ASSERT_EQ(s.h.out.plans.size(), 1u);
  EXPECT_EQ(render_plan(s.h.out.plans.front()), "plan 3 release:1");
  EXPECT_EQ(s.h.policy.status().kv_references, 0u);
}

TEST(SchedulerSpeculation, DraftsNeverPassMaxTokens) {
  Speculating s;
  s.submit_repeating(1, 3);
  s.answer_drafts(0, 303);
  EXPECT_EQ(render_plan(s.h.out.plans.front()), "plan 2 1@7+2od1");  // 2 more tokens at most: 1 draft
  s.answer_drafts(1, 555);
  EXPECT_EQ(s.delivered(), (std::vector<std::int32_t>{303, 300, 555}));
  ASSERT_EQ(s.h.out.finals.size(), 1u);
  EXPECT_EQ(finish_name(s.h.out.finals[0].finish), "length");
}

// No drafts: a batch over speculate_max_batch, a request that asks none, one that asks for
// logprobs; the requests then follow steps in flight as without speculation.
TEST(SchedulerSpeculation, NoDraftsForALargeBatchARequestThatAsksNoneOrOneWithLogprobs) {
  auto drafts_sent = [](const Speculating& s) {
    for (const std::string& line : s.h.out.lines) {
      if (line.starts_with("plan") && line.find('d') != std::string::npos) return true;
    }
    return false;
  };
  Speculating batch(1);
  batch.submit_repeating(1, 6);
  batch.submit_repeating(2, 6);
  for (int i = 0; i < 100 && !batch.h.out.plans.empty(); ++i) batch.answer_drafts(0, 303);
  EXPECT_FALSE(drafts_sent(batch));
  EXPECT_EQ(batch.h.out.finals.size(), 2u);
  Speculating none;
  none.submit_repeating(1, 6, {}, 0);
  for (int i = 0; i < 100 && !none.h.out.plans.empty(); ++i) none.answer_drafts(0, 303);
  EXPECT_FALSE(drafts_sent(none));
  auto sampled = [&](bool logprobs) {
    auto s = std::make_unique<Speculating>();
    Submit submit;
    submit.prompt_kind = static_cast<std::uint8_t>(PromptKind::tokens);
    submit.tokens = {300, 301, 300, 301, 300};
    submit.sampling.temperature = 0.7f;
    submit.sampling.top_k = 40;
    submit.sampling.logprobs = logprobs;
    submit.sampling.max_tokens = 6;
    s->h.hand("gateway", std::move(submit), 1);
    for (int i = 0; i < 100 && !s->h.out.plans.empty(); ++i) s->answer_drafts(0, 301);
    EXPECT_EQ(s->h.out.finals.size(), 1u);
    return drafts_sent(*s);
  };
  EXPECT_FALSE(sampled(true));
  // A sampled request drafts as a greedy one does: its draws verify them (the executor's part).
  EXPECT_TRUE(sampled(false));
}

// The token after `token` in the loop 300 301 302 303.
std::int32_t in_loop_after(std::int32_t token) { return token == 303 ? 300 : token + 1; }

// After a step with nothing kept the request decodes without drafts for 2, then 4, 8 ... steps
// (following the step in flight meanwhile), each miss shortens the next drafts (the acceptance
// estimate falls: 4, then 2, then 1), and a step that keeps one ends the back-off.
TEST(SchedulerSpeculation, MissesBackOffAndShortenTheDraftsAndAHitEndsTheBackOff) {
  Speculating s;
  s.submit_repeating(1, 40);
  std::vector<std::uint32_t> drafted;  // per plan: its drafts
  for (int i = 0; i < 12 && !s.h.out.plans.empty(); ++i) {
    drafted.push_back(s.h.out.plans.front().sequences.at(0).drafted);
    const std::vector<std::int32_t> so_far = s.delivered();
    s.answer_drafts(0, in_loop_after(so_far.empty() ? 302 : so_far.back()));  // the loop goes on, no draft kept
  }
  // The prompt, 4 drafts missed; 2 without, 2 drafts missed; 4 without, 1 missed; 8 without ...
  EXPECT_EQ(drafted, (std::vector<std::uint32_t>{0, 4, 0, 0, 2, 0, 0, 0, 0, 1, 0, 0}));
  EXPECT_EQ(s.h.policy.status().drafted_tokens, 7u);
  EXPECT_EQ(s.h.policy.status().accepted_tokens, 0u);
  // The next step with drafts keeps one: the step after it drafts again.
  for (int i = 0; i < 20 && s.h.out.plans.front().sequences.at(0).drafted == 0; ++i)
    s.answer_drafts(0, in_loop_after(s.delivered().back()));
  ASSERT_GT(s.h.out.plans.front().sequences.at(0).drafted, 0u);
  s.answer_drafts(1, in_loop_after(s.h.out.plans.front().sequences.at(0).tokens.at(1)));
  ASSERT_FALSE(s.h.out.plans.empty());
  EXPECT_GT(s.h.out.plans.front().sequences.at(0).drafted, 0u);
}

// Drafts that are all kept raise the estimate and so the drafts' length, up to draft_max; the
// guess carries the loop on past the end of what is known.
TEST(SchedulerSpeculation, KeptDraftsLengthenTheNextOnes) {
  Speculating s;
  s.submit_repeating(1, 50, {}, 8);
  std::vector<std::uint32_t> drafted;
  for (int i = 0; i < 6 && !s.h.out.plans.empty(); ++i) {
    const PlanSequence& seq = s.h.out.plans.front().sequences.at(0);
    drafted.push_back(seq.drafted);
    const std::int32_t last = seq.drafted > 0 ? seq.tokens.back() : 302;
    s.answer_drafts(seq.drafted, in_loop_after(last));
  }
  EXPECT_EQ(drafted, (std::vector<std::uint32_t>{0, 4, 6, 8, 8, 8}));
  // Every one kept, and delivered in the loop's order.
  const std::vector<std::int32_t> tokens = s.delivered();
  for (std::size_t i = 1; i < tokens.size(); ++i) EXPECT_EQ(tokens[i], in_loop_after(tokens[i - 1])) << i;
  EXPECT_EQ(s.h.policy.status().accepted_tokens, 34u);
}

// A request whose known tokens guess nothing past its token in flight follows that step, as
// without speculation: nothing is lost to waiting.
TEST(SchedulerSpeculation, ARequestWithNothingToGuessFollowsTheStepInFlight) {
  Speculating s;
  s.submit(1, {10, 20, 30, 40}, 8);
  ASSERT_EQ(s.h.out.plans.size(), 2u);
  EXPECT_EQ(render_plan(s.h.out.plans.back()), "plan 2 1@4+1of");
}

TEST(SchedulerSpeculation, DraftMaxOutsideItsRangeIsRefused) {
  Speculating s;
  s.submit_repeating(1, 4, {}, kMaxDraftTokens + 1);
  ASSERT_EQ(s.h.out.finals.size(), 1u);
  EXPECT_EQ(s.h.out.finals[0].error, static_cast<std::uint16_t>(RequestError::invalid_request));
  EXPECT_NE(s.h.out.finals[0].message.find("draft_max"), std::string::npos);
}

}  // namespace
}  // namespace mqlm::actors
