// libFuzzer target: the OpenAI request parsers (parse_completion_request for chat and
// completions, parse_tokenize_request for /tokenize and /detokenize), and the answers rendered
// for what they accept.
//
// The input's first byte picks the parser (bits 0-1: chat, completions, tokenize, detokenize)
// and how the rest becomes a body (bit 2 clear: the bytes as they are; set: msgpack, at most 512
// bytes of it, decoded by nlohmann and written out as JSON), so that byte mutations of the msgpack form change the
// JSON's shape (a key, a type, a nesting) instead of mostly breaking its syntax.
//
// Beyond "no crash, leak, UB, hang or allocation past libFuzzer's limit" it checks the parsers'
// contract: no exception; an error is a 4xx with a message and an OpenAI-shaped JSON body; an
// accepted request has a model, one prompt, sampling that validates and a Submit that survives
// the wire; and its answers (a whole body, a stream's chunks) are JSON.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>

#include "actors/http/openai_json.hpp"
#include "model/sampling/sampling_params.hpp"
#include "tests/fuzz/fuzz_support.hpp"
#include "tests/fuzz/msgpack_round_trip.hpp"

namespace {

using namespace mqlm::actors::openai;
using nlohmann::json;

[[noreturn]] void contract_broken(std::string_view what) { mqlm::fuzz::contract_broken("OpenAI JSON", what); }

json parsed_json(std::string_view text, std::string_view what) {
  json value = json::parse(text, nullptr, false);
  if (value.is_discarded()) contract_broken(what);
  return value;
}

void check_error(const ApiError& error) {
  if (error.status < 400 || error.status > 499) contract_broken("an error that is not a 4xx");
  if (error.message.empty()) contract_broken("an error without a message");
  const json body = parsed_json(error_body(error), "an error body that is not JSON");
  if (!body["error"]["message"].is_string()) contract_broken("an error body without error.message");
}

// Every chunk of a stream: "data: JSON\n\n", then "data: [DONE]\n\n" last.
void check_stream(const std::string& stream) {
  std::string_view rest = stream;
  while (!rest.empty()) {
    if (!rest.starts_with("data: ")) contract_broken("a stream chunk without data: ");
    const std::size_t end = rest.find("\n\n");
    if (end == std::string_view::npos) contract_broken("a stream chunk without its blank line");
    const std::string_view data = rest.substr(6, end - 6);
    if (data != "[DONE]") parsed_json(data, "a stream chunk that is not JSON");
    rest.remove_prefix(end + 2);
  }
}

void check_rendering(const CompletionRequest& request) {
  mqlm::messages::TokenLogprobs entry{7, -0.5f, {}, {}, "hi", {}};
  for (int i = 0; i < request.top_logprobs; ++i) {
    entry.top_tokens.push_back(i);
    entry.top_logprobs.push_back(-1.0f - static_cast<float>(i));
    entry.top_texts.emplace_back(i % 2 ? "\xe4\xbd" : "x");  // half a character too
  }
  mqlm::messages::TokenEvent event{{7}, "hi", {}};
  if (request.logprobs) event.logprobs.push_back(entry);
  mqlm::messages::FinalEvent final_event;
  final_event.completion_tokens = 1;
  const ResponseIdentity identity{"chatcmpl-fuzz", 1'700'000'000};
  mqlm::actors::front_end::GatheredOutput output;
  output.append(event);
  parsed_json(dump(completion_body(request, identity, output, final_event)), "a response body that is not JSON");
  StreamRenderer renderer(request, identity);
  check_stream(renderer.start() + renderer.tokens(event) + renderer.finish(final_event));
}

void check_completion(const CompletionRequest& request) {
  const auto& submit = request.submit;
  if (request.model.empty()) contract_broken("a request without a model");
  using mqlm::messages::PromptKind;
  const auto kind = static_cast<PromptKind>(submit.prompt_kind);
  if (request.endpoint == Endpoint::chat && (kind != PromptKind::chat || submit.chat.empty())) {
    contract_broken("a chat without messages");
  }
  if (request.endpoint == Endpoint::completions && kind != PromptKind::text && kind != PromptKind::tokens) {
    contract_broken("a completion whose prompt is neither text nor tokens");
  }
  if (request.top_logprobs < 0 || request.top_logprobs > kMaxTopLogprobs) contract_broken("top_logprobs range");
  if (mqlm::model::validate(submit.sampling)) contract_broken("sampling that does not validate");
  for (std::int32_t token : submit.tokens) {
    if (token < 0) contract_broken("a negative token id accepted");
  }
  if (!mqlm::fuzz::survives_msgpack(submit)) contract_broken("the Submit changed on the wire");
  check_rendering(request);
}

void check_tokenize(const mqlm::messages::Tokenize& question, bool detokenize) {
  if (question.detokenize != detokenize) contract_broken("a tokenize question of the other direction");
  if (detokenize && !question.text.empty()) contract_broken("a detokenize question with text");
  if (!detokenize && !question.tokens.empty()) contract_broken("a tokenize question with tokens");
}

// nlohmann reads msgpack and writes JSON recursively, a level of nesting at a time: the msgpack
// form is cut to kMaxMsgpackBytes (nesting as deep as that) so that the harness's own stack holds.
// The parser's input has no such bound: raw bodies nest as deep as max_len lets them.
constexpr std::size_t kMaxMsgpackBytes = 512;

std::optional<std::string> body_of(std::string_view rest, bool msgpack_form) {
  if (!msgpack_form) return std::string(rest);
  rest = rest.substr(0, kMaxMsgpackBytes);
  json value = json::from_msgpack(rest.begin(), rest.end(), true, false);
  if (value.is_discarded()) return std::nullopt;
  return value.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::uint8_t mode = data[0];
  const auto body = body_of(std::string_view(reinterpret_cast<const char*>(data) + 1, size - 1), mode & 4);
  if (!body) return 0;
  try {
    if ((mode & 3) < 2) {
      auto parsed = parse_completion_request((mode & 3) == 0 ? Endpoint::chat : Endpoint::completions, *body, 99);
      if (const auto* error = std::get_if<ApiError>(&parsed)) check_error(*error);
      if (const auto* request = std::get_if<CompletionRequest>(&parsed)) check_completion(*request);
    } else {
      const bool detokenize = (mode & 3) == 3;
      auto parsed = parse_tokenize_request(*body, detokenize);
      if (const auto* error = std::get_if<ApiError>(&parsed)) check_error(*error);
      if (const auto* question = std::get_if<mqlm::messages::Tokenize>(&parsed)) check_tokenize(*question, detokenize);
    }
  } catch (const std::exception& e) {
    contract_broken(std::string("an exception: ") + e.what());
  }
  return 0;
}
