// The serving messages: what the gateway (and http) say to the scheduler about client requests,
// and what the scheduler and the executor say to each other about steps. Listed in the catalog
// (messages/catalog.hpp) like every other message.
//
//   client ──▶ gateway ──Submit / Abort / StatusQuery──▶ scheduler ──StepPlan / ExecutorQuery──▶ executor
//   client ◀── gateway ◀──TokenEvent / FinalEvent / StatusReport── scheduler ◀──StepResult / ExecutorReport── executor
//
// A request is named by the envelope's request_id, chosen by the front end that submitted it
// (gateway or http) and unique among its requests; the scheduler keys requests by (front end,
// request_id) and answers to that front end with the same request_id. Sequences (the scheduler's
// and executor's name for a request being computed) have ids of the scheduler's own.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <msgpack.hpp>

#include "messages/cache.hpp"
#include "model/sampling/sampling_params.hpp"

namespace mqlm::messages {

// ---- front end <-> scheduler --------------------------------------------------------------

// A function call an assistant turn made (OpenAI's tool_calls[i]): arguments is JSON text, an
// object, as the model wrote it (and as the client sends it back).
struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments;
  MSGPACK_DEFINE(id, name, arguments);
};

// One message of a chat. A content that is null (an assistant turn with only tool calls) has
// has_content false. A tool turn names the call it answers (tool_call_id) and may name the
// function (name).
struct ChatTurn {
  std::string role;
  std::string content;
  std::vector<ToolCall> tool_calls{};
  std::string tool_call_id{};
  std::string name{};
  bool has_content = true;
  MSGPACK_DEFINE(role, content, tool_calls, tool_call_id, name, has_content);
};

// OpenAI's tool_choice: auto (the model may call tools), none (it may not: its text is all
// content), required (it calls at least one), function (it calls the one named).
enum class ToolChoice : std::uint8_t { automatic = 0, none = 1, required = 2, function = 3 };

enum class PromptKind : std::uint8_t {
  text = 1,    // tokenized by the scheduler, with the model's BOS when it wants one
  tokens = 2,  // token ids, used exactly as given
  chat = 3,    // rendered with the model's chat template, then tokenized
};

// Drafted tokens a step may verify for one sequence at most (Submit::draft_max, the server's).
inline constexpr std::int32_t kMaxDraftTokens = 32;

// A request to generate. Answered by TokenEvents (each sampled token, whether or not the client
// streams: front ends gather them for clients that do not) and one FinalEvent. With pooling (an
// embedding), its prompt is computed and nothing generated: no TokenEvent, and the FinalEvent
// carries the pooled vector; sampling is not used.
struct Submit {
  std::string model;  // "" : the server's default model
  std::uint8_t prompt_kind = 1;  // PromptKind
  std::string text;
  std::vector<std::int32_t> tokens;
  std::vector<ChatTurn> chat;
  model::SamplingParams sampling;
  std::uint8_t pooling = 0;  // model::Pooling: none generates
  // Chat only. tools: the request's tools as JSON text (an array of {"type": "function",
  // "function": {name, description, parameters}}), "" for none; the template sees them, and
  // the output is read for calls to them (TokenEvent::tool_calls) unless tool_choice is none.
  std::string tools{};
  std::uint8_t tool_choice = 0;      // ToolChoice
  std::string tool_choice_name{};    // ToolChoice::function: the function's name
  bool parallel_tool_calls = true;   // false: at most one call
  std::string chat_template_kwargs{};  // JSON text, an object: more variables for the template; "" none
  // Prompt-lookup drafts a step at most (speculative decoding; not for requests with logprobs or a
  // response_format): -1 the server's setting (`mqlm serve --draft-max`), 0 none for this request.
  std::int32_t draft_max = -1;
  MSGPACK_DEFINE(model, prompt_kind, text, tokens, chat, sampling, pooling, tools, tool_choice, tool_choice_name,
                 parallel_tool_calls, chat_template_kwargs, draft_max);
};

enum class AbortReason : std::uint8_t {
  client = 1,       // the client asked
  client_gone = 2,  // the client disconnected
  shutdown = 3,     // the server is stopping and not finishing requests
};

// Ends the request named by the envelope's request_id (at the next step boundary); its
// FinalEvent says finish abort. Unknown ids are ignored (the request may have just finished).
struct Abort {
  std::uint8_t reason = 1;  // AbortReason
  MSGPACK_DEFINE(reason);
};

// The logprob of one chosen token and the top alternatives (most likely first). The texts are
// each token's own bytes (special tokens written as their text), filled by the scheduler, which
// has the tokenizer: a piece may be part of a UTF-8 character, so it is bytes, not always text.
struct TokenLogprobs {
  std::int32_t token = -1;
  float logprob = 0.0f;
  std::vector<std::int32_t> top_tokens;
  std::vector<float> top_logprobs;
  std::string text{};                    // the chosen token's piece
  std::vector<std::string> top_texts{};  // one per top token
  MSGPACK_DEFINE(token, logprob, top_tokens, top_logprobs, text, top_texts);
};

// A piece of a tool call as the output reveals it (OpenAI's streamed tool_calls[i]): the first
// piece of call `index` (0, 1, ... in the order the model makes them) has its id and name, and
// every piece a further part of its arguments' JSON text; the pieces of one call, joined, are
// the whole call.
struct ToolCallDelta {
  std::uint32_t index = 0;
  std::string id;
  std::string name;
  std::string arguments;
  MSGPACK_DEFINE(index, id, name, arguments);
};

// New output of a request: the tokens sampled since the last event and the text they make
// (whole UTF-8 characters; text that may begin a stop string is held back until it cannot).
// For a chat whose template reasons (<think> ... </think>) or that has tools, the text is split:
// text holds the answer's content only, reasoning the thinking, tool_calls the calls made.
struct TokenEvent {
  std::vector<std::int32_t> tokens;
  std::string text;
  std::vector<TokenLogprobs> logprobs;  // one per token when the request asked for logprobs
  std::string reasoning{};
  std::vector<ToolCallDelta> tool_calls{};
  MSGPACK_DEFINE(tokens, text, logprobs, reasoning, tool_calls);
};

// tool_calls: the model ended its turn having called tools (OpenAI's finish_reason "tool_calls").
enum class FinishReason : std::uint8_t { stop = 1, length = 2, abort = 3, error = 4, tool_calls = 5 };

// Why a request failed (FinishReason::error), for clients to act on.
enum class RequestError : std::uint16_t {
  none = 0,
  invalid_request = 1,   // a parameter out of range, an empty prompt, an unknown prompt kind
  unknown_model = 2,
  prompt_too_long = 3,   // prompt plus max_tokens exceed the model's context or the KV cache
  busy = 4,              // the server's queues are full; try again later
  unavailable = 5,       // the scheduler or executor is not answering (process died, stopping)
  gpu = 6,               // the step that computed this request failed on the GPU
  internal = 7,          // a bug: the message says what
  shutting_down = 8,     // the server is draining and takes no new requests
  malformed = 9,         // the client's frame could not be decoded (gateway only)
  insufficient_memory = 10,  // its model cannot be loaded under the memory ceiling (HTTP 507)
  model_failed = 11,     // its model could not be loaded (a bad file, a GPU error)
  unauthorized = 12,     // the server wants an API key, and the request had none or a wrong one
  forbidden = 13,        // an admin operation with a key that is not an admin key
};

// The last message of every request, whatever ended it.
struct FinalEvent {
  std::uint8_t finish = 1;   // FinishReason
  std::uint16_t error = 0;   // RequestError when finish is error
  std::string message;       // for errors: what was wrong and what to do
  std::string text;          // text held back until the end (a stop string's possible start)
  std::string stop;          // the stop string that ended the request, if one did
  std::uint32_t prompt_tokens = 0;
  std::uint32_t completion_tokens = 0;
  std::uint32_t cached_tokens = 0;  // prompt tokens taken from the prefix cache, not computed
  std::int64_t queue_ns = 0;        // submit to first scheduled
  std::int64_t ttft_ns = 0;         // submit to first token (0: none)
  std::int64_t total_ns = 0;        // submit to end
  std::vector<float> embedding{};   // an embedding request's vector (L2-normalised), when it finished
  std::string reasoning{};          // reasoning held back until the end (TokenEvent::reasoning)
  std::vector<ToolCallDelta> tool_calls{};  // tool call pieces held back until the end
  MSGPACK_DEFINE(finish, error, message, text, stop, prompt_tokens, completion_tokens, cached_tokens, queue_ns,
                 ttft_ns, total_ns, embedding, reasoning, tool_calls);
};

// The buffer pool's statistics (gpu::PoolStats on the wire).
struct PoolStatsWire {
  std::uint64_t active_bytes = 0;
  std::uint64_t cached_bytes = 0;
  std::uint64_t peak_active_bytes = 0;
  std::uint64_t held_bytes = 0;
  std::uint32_t blocks = 0;
  std::map<std::string, std::uint64_t> active_by_owner;
  MSGPACK_DEFINE(active_bytes, cached_bytes, peak_active_bytes, held_bytes, blocks, active_by_owner);
};

// The GPU's time since the executor's device was made (gpu::QueueTimeline): running submissions,
// idle between submissions queued in time, idle waiting for the host to send the next (a gap over
// 20 ms is no work, not counted).
struct GpuTimeWire {
  double busy_seconds = 0;
  double queued_idle_seconds = 0;
  double host_idle_seconds = 0;
  std::uint64_t submissions = 0;
  MSGPACK_DEFINE(busy_seconds, queued_idle_seconds, host_idle_seconds, submissions);
};

// Asks the scheduler for its tables and the executor's pool; trim: have the executor trim its
// pool first (the figures are then after the trim).
struct StatusQuery {
  bool trim = false;
  MSGPACK_DEFINE(trim);
};

// One model's requests as the scheduler ended them, whichever front end opened them.
struct ModelOutcomes {
  std::uint64_t finished = 0;         // ended, for any reason
  // Ended by the server's fault (gpu, internal, unavailable, model_failed, insufficient_memory),
  // not the client's (a bad request, an abort).
  std::uint64_t failed = 0;
  std::uint32_t failed_in_a_row = 0;  // the latest that failed one after another (0: the last did not)
  std::uint64_t prompt_tokens = 0;
  std::uint64_t completion_tokens = 0;
  MSGPACK_DEFINE(finished, failed, failed_in_a_row, prompt_tokens, completion_tokens);

  // Counts one ended request. An abort says nothing of the model's health either way.
  void record(FinishReason finish, RequestError error, std::uint32_t prompt, std::uint32_t completion) {
    ++finished;
    prompt_tokens += prompt;
    completion_tokens += completion;
    if (finish == FinishReason::abort) return;
    const bool servers_fault = finish == FinishReason::error &&
                               (error == RequestError::gpu || error == RequestError::internal ||
                                error == RequestError::unavailable || error == RequestError::model_failed ||
                                error == RequestError::insufficient_memory);
    if (servers_fault) {
      ++failed;
      ++failed_in_a_row;
    } else if (finish != FinishReason::error) {
      failed_in_a_row = 0;
    }
  }
};

struct StatusReport {
  std::vector<std::string> models;
  std::uint32_t requests = 0;   // in the request table
  std::uint32_t waiting = 0;
  std::uint32_t running = 0;
  std::uint64_t steps = 0;
  std::uint64_t finished = 0;   // requests ended, for any reason
  std::uint64_t preemptions = 0;
  std::uint64_t computed_tokens = 0;   // prompt and recomputed tokens run through the model
  std::uint64_t prefix_hit_tokens = 0; // prompt tokens taken from the GPU's prefix cache instead
  std::uint32_t kv_pages = 0;
  std::uint32_t kv_pages_in_use = 0;
  std::uint32_t kv_pages_cached = 0;
  std::uint64_t kv_references = 0;     // the sum of every page's reference count
  std::uint32_t executor_slots = 0;    // sequences the executor holds state for
  bool executor_ready = false;
  PoolStatsWire pool;
  // Prompt tokens whose pages came back from the cache-writer instead of being computed, by tier.
  std::uint64_t restored_hot_tokens = 0;
  std::uint64_t restored_ssd_tokens = 0;
  std::uint64_t spilled_pages = 0;     // prefix pages the GPU gave up, sent to the cache-writer
  std::map<std::string, ModelOutcomes> outcomes;  // by model, for the models requests named
  // Tokens sampled and sent to a front end, whichever protocol asked.
  std::uint64_t generated_tokens = 0;
  GpuTimeWire gpu_time;  // the executor's, as its last report gave it
  // Speculative decoding: draft tokens sent to be verified, and those the model's argmax agreed with.
  std::uint64_t drafted_tokens = 0;
  std::uint64_t accepted_tokens = 0;
  // New fields go last, so that recorded traces without them still read.
  MSGPACK_DEFINE(models, requests, waiting, running, steps, finished, preemptions, computed_tokens,
                 prefix_hit_tokens, kv_pages, kv_pages_in_use, kv_pages_cached, kv_references, executor_slots,
                 executor_ready, pool, restored_hot_tokens, restored_ssd_tokens, spilled_pages, outcomes,
                 generated_tokens, gpu_time, drafted_tokens, accepted_tokens);
};

// Tells a front end the server is stopping: from now on new requests get shutting_down; with
// abort_running, its open requests are aborted (else they run to their end). It answers Drained
// once none of its requests is open (at once if none is).
struct Drain {
  bool abort_running = false;
  MSGPACK_DEFINE(abort_running);
};

struct Drained {
  std::uint64_t requests_served = 0;  // requests that reached their final event in its life
  MSGPACK_DEFINE(requests_served);
};

// front end -> scheduler: text into token ids, or token ids into text, with a configured model's
// tokenizer (loaded or not), for /tokenize and /detokenize. Answered with Tokenized, by
// correlation id.
struct Tokenize {
  std::string model;                // "": the server's default model
  bool detokenize = false;          // false: text -> tokens; true: tokens -> text
  std::string text;
  std::vector<std::int32_t> tokens;
  bool add_special = false;         // BOS / EOS where the vocabulary asks for them
  bool parse_special = true;        // special tokens written in the text are those tokens
  bool with_pieces = false;         // each token's bytes beside its id
  MSGPACK_DEFINE(model, detokenize, text, tokens, add_special, parse_special, with_pieces);
};

struct Tokenized {
  std::uint16_t error = 0;          // RequestError; none: the answer is below
  std::string message;              // what was wrong
  std::vector<std::int32_t> tokens;
  std::vector<std::string> pieces;  // with_pieces: one per token (bytes, maybe part of a character)
  std::string text;                 // detokenize
  MSGPACK_DEFINE(error, message, tokens, pieces, text);
};

// ---- scheduler <-> executor -----------------------------------------------------------------

// A sequence the executor has not seen: its sampler is made from these (and lives until the
// sequence is released, across preemptions, so recomputing it draws the same tokens).
// pooling: an embedding, whose output is its prompt's pooled final hidden state, not a token.
struct SequenceStart {
  std::uint64_t sequence = 0;
  model::SamplingParams sampling;
  std::vector<std::int32_t> prompt;  // what the repetition penalty sees
  std::uint8_t pooling = 0;          // model::Pooling
  // The model's end-of-generation tokens, given where sampling.response_format constrains the
  // text: the only tokens allowed once it is complete, and allowed only then.
  std::vector<std::int32_t> end_tokens;
  MSGPACK_DEFINE(sequence, sampling, prompt, pooling, end_tokens);
};

// One sequence's share of a step: tokens at positions position, position + 1, ... whose K and V
// go to the pages of block_table (page i holds positions i * page_size ...). output: sample a
// token after the last of them (an embedding's: pool its prompt, which ends there). follows: its
// one token is the one the sequence's previous step samples, which the scheduler did not know
// when it planned this step (the executor puts it in; tokens holds a 0 in its place). A follower
// whose sampler the executor no longer has (its previous step failed) is left out of the step.
// drafted: speculative decoding (with output, never a follower, no logprobs or response_format):
// the last `drafted` tokens are guesses d1..dk of what follows the token before them; every one of
// the last drafted + 1 rows is an output row, drawn as the sequence draws, and the executor keeps
// the guesses the draws agree with (OutputToken::accepted). Their K and V past what is accepted is left in the pages, unread: the
// sequence's length is cut back to position + accepted + 1 and later steps write over it.
struct PlanSequence {
  std::uint64_t sequence = 0;
  std::uint32_t position = 0;
  std::vector<std::int32_t> tokens;
  std::vector<std::uint32_t> block_table;
  bool output = false;
  bool follows = false;
  std::uint32_t drafted = 0;
  MSGPACK_DEFINE(sequence, position, tokens, block_table, output, follows, drafted);
};

// One step of one model. released: sequences whose executor state is to be dropped (before the
// step runs). A plan with no sequences only releases (and trims when asked). Before the step
// computes, the executor copies the spill pages out to the cache-writer, then writes the restore
// pages from the plan's blobs (blob i into page restore[i]), in that order: a page may be given up
// and refilled in one plan.
struct StepPlan {
  std::uint64_t step = 0;
  std::string model;
  std::vector<SequenceStart> starts;
  std::vector<PlanSequence> sequences;
  std::vector<std::uint64_t> released;
  bool trim = false;  // trim the pool after the step
  std::vector<SpillPage> spill;
  std::vector<std::uint32_t> restore;
  std::uint64_t model_key = 0;  // the prefix cache's name for the model's weights (PrefixLookup)
  MSGPACK_DEFINE(step, model, starts, sequences, released, trim, spill, restore, model_key);
};

// One sequence's output of a step. accepted: for a sequence with drafts, the first drafts, in
// order, that its rows' draws agreed with; the sequence's new tokens are accepted and then
// token (the draw after the last accepted draft), 1 to drafted + 1 of them.
struct OutputToken {
  std::uint64_t sequence = 0;
  std::int32_t token = -1;
  bool has_logprobs = false;
  TokenLogprobs logprobs;
  std::vector<std::int32_t> accepted{};
  MSGPACK_DEFINE(sequence, token, has_logprobs, logprobs, accepted);
};

// The answer to a StepPlan: a token for each sequence that asked for output (for an embedding
// sequence its vector: pooled names it, and the message's blob of the same index holds the
// L2-normalised float32 values, in the host's order: a step's vectors may be megabytes, past a
// payload's limit), or an error
// (RequestError::gpu or internal) that fails every sequence of the step. kv_lost: the KV cache's
// contents are gone (the device was recreated), so every computed page must be recomputed.
struct StepResult {
  std::uint64_t step = 0;
  std::vector<OutputToken> tokens;
  std::uint16_t error = 0;
  std::string message;
  bool kv_lost = false;
  std::uint32_t slots = 0;   // sequences the executor holds state for, after the step
  bool has_pool = false;     // pool statistics ride along now and then, and after a trim
  PoolStatsWire pool;
  std::int64_t gpu_ns = 0;   // time the step took in the executor
  std::vector<std::uint64_t> pooled{};
  GpuTimeWire gpu_time;      // the GPU's time so far (executor), with every result
  MSGPACK_DEFINE(step, tokens, error, message, kv_lost, slots, has_pool, pool, gpu_ns, pooled, gpu_time);
};

struct ExecutorQuery {
  bool trim = false;
  MSGPACK_DEFINE(trim);
};

// What the executor has: sent in answer to ExecutorQuery (the scheduler asks when it starts, and
// plans nothing before the answer: it learns the KV cache's shape from it).
struct ModelInfo {
  std::string name;
  std::uint32_t kv_pages = 0;
  std::uint32_t page_size = 0;
  std::uint32_t n_ctx = 0;      // the longest sequence the model takes
  std::uint32_t n_vocab = 0;
  std::uint64_t page_bytes = 0;  // one KV page's K and V on the host (a spilled page's blob)
  MSGPACK_DEFINE(name, kv_pages, page_size, n_ctx, n_vocab, page_bytes);
};

// The executor's memory as the driver and the kernel see it, for the memory enforcer: the pool's
// figures count only what mqlm allocated, these also what the driver, other processes and host
// allocations take. Device figures are the device-local heaps summed (gpu::DeviceMemory); all
// zero when the executor has no device.
struct DeviceMemoryWire {
  std::uint64_t total_bytes = 0;
  std::uint64_t budget_bytes = 0;  // equals total_bytes when the driver reports no budget
  std::uint64_t usage_bytes = 0;   // 0 when the driver reports no budget
  bool has_budget = false;         // the device has VK_EXT_memory_budget
  std::uint64_t process_rss_bytes = 0;  // the executor process's resident set; 0 if unreadable
  MSGPACK_DEFINE(total_bytes, budget_bytes, usage_bytes, has_budget, process_rss_bytes);
};

struct ExecutorReport {
  std::vector<ModelInfo> models;
  std::uint32_t slots = 0;
  PoolStatsWire pool;
  std::string device;
  // Added last: earlier fields keep their positions. The codec still wants every field, so a
  // report from a build without this one is refused as malformed, not read as zeros.
  DeviceMemoryWire memory;
  // Greedy steps sent to the GPU before the step before them was answered, their tokens taken
  // there from its argmax (the executor's StepInFlight).
  std::uint64_t steps_chained = 0;
  GpuTimeWire gpu_time;
  MSGPACK_DEFINE(models, slots, pool, device, memory, steps_chained, gpu_time);
};

}  // namespace mqlm::messages
