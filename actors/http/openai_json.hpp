// The OpenAI API as the http actor speaks it: request bodies of /v1/chat/completions and
// /v1/completions parsed into the serving messages (a Submit with validated sampling parameters),
// and the serving messages' answers (TokenEvents, a FinalEvent) rendered as OpenAI's response
// bodies and server-sent-event chunks. Pure functions: no sockets, no clock, no actor state (a
// debug log line aside).
//
// Bodies come from anyone who can connect: parsing checks every type and range, names the
// offending field, and never throws on input.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/front_end/events.hpp"
#include "messages/serving.hpp"

namespace mqlm::actors::openai {

enum class Endpoint : std::uint8_t { chat, completions };

// An error as OpenAI sends it: {"error": {"message", "type", "param", "code"}} with this status.
struct ApiError {
  int status = 400;
  std::string type = "invalid_request_error";
  std::string message;
  std::optional<std::string> param;
  std::optional<std::string> code;
};

ApiError invalid_request(std::string message, std::optional<std::string> param = std::nullopt,
                         std::optional<std::string> code = std::nullopt);

nlohmann::json error_json(const ApiError& error);
std::string error_body(const ApiError& error);

// What a completion request asks, as the scheduler and the response renderers need it.
struct CompletionRequest {
  Endpoint endpoint = Endpoint::chat;
  messages::Submit submit;   // prompt, model and validated sampling parameters
  std::string model;         // the model as the client named it, echoed in every response
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage: a last chunk with usage
  bool logprobs = false;       // chat: logprobs true; completions: logprobs given (0..20)
  int top_logprobs = 0;        // alternatives per token
  // vLLM's return_tokens_as_token_ids: logprobs name tokens "token_id:N", so that pieces which
  // are not text alone (half a UTF-8 character) stay apart in completions' top_logprobs maps.
  bool tokens_as_ids = false;
};

// The largest `logprobs` /v1/completions takes and `top_logprobs` /v1/chat/completions takes.
inline constexpr int kMaxTopLogprobs = 20;
// /v1/completions answers 16 tokens when max_tokens is not given, as OpenAI does.
inline constexpr std::int32_t kCompletionsDefaultMaxTokens = 16;

// seed: the sampler's seed when the body gives none (the caller draws one, so that requests
// without a seed differ, as OpenAI's do).
std::variant<CompletionRequest, ApiError> parse_completion_request(Endpoint endpoint, std::string_view body,
                                                                   std::uint64_t seed);

// Parsing pieces the endpoints share (openai_embeddings.cpp too): a field of the wrong type; an
// integer in [low, high] (null leaves out unset); token ids; the body as a JSON object.
ApiError wrong_type(const std::string& key, std::string_view expected, const nlohmann::json& value);
std::optional<ApiError> read_integer(const nlohmann::json& value, const std::string& key, std::int64_t low,
                                     std::int64_t high, std::optional<std::int64_t>& out);
std::optional<ApiError> read_token_ids(const nlohmann::json& value, const std::string& key,
                                       std::vector<std::int32_t>& out);
std::variant<nlohmann::json, ApiError> parse_body(std::string_view body);

// The HTTP error for a FinalEvent that ended with error or abort (and for refusals before one).
ApiError error_for(const messages::FinalEvent& final_event);

// "stop", "length", "tool_calls"; nullopt for abort and error, which are answered as errors.
std::optional<std::string> finish_reason(const messages::FinalEvent& final_event);

// A response's id ("chatcmpl-..." / "cmpl-...") and creation time (Unix seconds).
struct ResponseIdentity {
  std::string id;
  std::int64_t created = 0;
};

nlohmann::json usage_json(const messages::FinalEvent& final_event);

// The body of a finished request that did not stream (final_event ended with stop, length or
// tool_calls); output: what its TokenEvents brought (the gateway gathers the same way). A chat's
// message has reasoning_content and tool_calls when the scheduler split them off the text.
nlohmann::json completion_body(const CompletionRequest& request, const ResponseIdentity& identity,
                               const front_end::GatheredOutput& output,
                               const messages::FinalEvent& final_event);

// Chat's logprobs.content entries, each with its token id beside OpenAI's fields ("id", as
// llama-server adds it, also in top_logprobs); completions' {tokens, token_logprobs,
// top_logprobs, text_offset} with "token_ids" and "top_logprobs_by_id" (top_logprobs' maps keyed
// by token id, where two pieces of the same text cannot collide) beside them, whose offsets
// continue from text_offset (characters before the first token), which it advances.
// tokens_as_ids: tokens written "token_id:N" (CompletionRequest::tokens_as_ids).
nlohmann::json chat_logprobs(const std::vector<messages::TokenLogprobs>& logprobs, int top_logprobs,
                             bool tokens_as_ids = false);
nlohmann::json completion_logprobs(const std::vector<messages::TokenLogprobs>& logprobs, int top_logprobs,
                                   std::size_t& text_offset, bool tokens_as_ids = false);

// POST /tokenize and /detokenize, as llama-server takes them ({"content", "add_special",
// "parse_special", "with_pieces"}; {"tokens"}) and vLLM does ({"prompt", "add_special_tokens"};
// {"tokens"}), with "model" optional (the default model).
std::variant<messages::Tokenize, ApiError> parse_tokenize_request(std::string_view body, bool detokenize);
// {"tokens": [ids]} ({"id", "piece"} objects with with_pieces, a piece that is not UTF-8 alone
// as its bytes), "count" beside them; detokenize: {"content", "prompt"} (llama-server's, vLLM's).
// An error in the answer is the ApiError.
std::variant<nlohmann::json, ApiError> tokenized_json(const messages::Tokenize& question,
                                                     const messages::Tokenized& answer);

// "data: JSON\n\n", invalid UTF-8 (a token piece that is part of a character) replaced by U+FFFD.
std::string sse_event(const nlohmann::json& data);
inline constexpr std::string_view kSseDone = "data: [DONE]\n\n";
inline constexpr std::string_view kSseKeepalive = ": keepalive\n\n";

// JSON text of a body, invalid UTF-8 replaced as in sse_event.
std::string dump(const nlohmann::json& body);

// A streaming request's chunks, in order: start(), then tokens() per TokenEvent, then finish().
class StreamRenderer {
 public:
  StreamRenderer(CompletionRequest request, ResponseIdentity identity);

  // Chat's first chunk, delta {"role": "assistant", "content": ""}; nothing for completions.
  std::string start();
  // The event's text and logprobs as a chunk; "" when it has neither (text held back).
  std::string tokens(const messages::TokenEvent& event);
  // The held-back text, the chunk with finish_reason, the usage chunk when asked, [DONE]; an
  // error or abort is an error event ({"error": {...}}, which OpenAI's clients raise) and [DONE].
  std::string finish(const messages::FinalEvent& final_event);

 private:
  nlohmann::json chunk(nlohmann::json choice) const;
  // A chunk's choice: chat's delta has content, reasoning_content and tool_calls as given (content
  // when there is nothing else); completions' the text.
  nlohmann::json content_choice(const std::string& text, const std::vector<messages::TokenLogprobs>& logprobs,
                                const std::string& reasoning = {},
                                const std::vector<messages::ToolCallDelta>& calls = {});

  CompletionRequest request_;
  ResponseIdentity identity_;
  std::size_t text_offset_ = 0;
};

}  // namespace mqlm::actors::openai
