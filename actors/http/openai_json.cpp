#include "actors/http/openai_json.hpp"

#include <charconv>
#include <cmath>
#include <limits>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "actors/front_end/front_end.hpp"
#include "actors/front_end/tool_request.hpp"
#include "model/grammar/response_grammar.hpp"
#include "model/sampling/sampling_params.hpp"

namespace mqlm::actors::openai {

using messages::FinalEvent;
using messages::FinishReason;
using messages::RequestError;
using messages::TokenLogprobs;
using nlohmann::json;

namespace {

// Bounds on what one body may hold beyond its size (the server's body limit bounds the rest): those of
// any front end's request.
using front_end::kMaxModelNameBytes;
using front_end::kMaxPromptTokens;
using front_end::kMaxRoleBytes;
constexpr std::size_t kMaxChatMessages = front_end::kMaxChatTurns;
// OpenAI's temperature range (the sampler would take up to 100).
constexpr double kMaxTemperature = 2.0;
// What OpenAI writes for a logprob of minus infinity.
constexpr double kLowestLogprob = -9999.0;

using Check = std::optional<ApiError>;

std::string_view type_name(const json& value) { return front_end::json_type_name(value); }

ApiError tool_error(front_end::ToolProblem problem) {
  return invalid_request(std::move(problem.message), std::move(problem.field));
}

Check tool_check(std::optional<front_end::ToolProblem> problem) {
  if (!problem) return std::nullopt;
  return tool_error(std::move(*problem));
}

}  // namespace

ApiError wrong_type(const std::string& key, std::string_view expected, const json& value) {
  return invalid_request("'" + key + "' must be " + std::string(expected) + ", not " + std::string(type_name(value)),
                         key, "invalid_type");
}

namespace {

ApiError out_of_range(const std::string& key, const std::string& what) {
  return invalid_request("'" + key + "' " + what, key, "invalid_value");
}

std::string number_text(double value) {
  json j = value;
  return j.dump();
}

// A number, integer or not; null leaves `out` as it was (OpenAI's "not given").
Check read_number(const json& value, const std::string& key, double low, double high, float& out) {
  if (value.is_null()) return std::nullopt;
  if (!value.is_number()) return wrong_type(key, "a number", value);
  const double number = value.get<double>();
  if (!(number >= low && number <= high)) {
    return out_of_range(key, "is " + number_text(number) + ": it must be from " + number_text(low) + " to " +
                                 number_text(high));
  }
  out = static_cast<float>(number);
  return std::nullopt;
}

// A whole number (16 or 16.0) in [low, high]; null leaves `out` as it was.
}  // namespace

Check read_integer(const json& value, const std::string& key, std::int64_t low, std::int64_t high,
                   std::optional<std::int64_t>& out) {
  if (value.is_null()) return std::nullopt;
  if (value.is_number_unsigned()) {
    const auto number = value.get<std::uint64_t>();
    if (number > static_cast<std::uint64_t>(high)) {
      return out_of_range(key, "is " + std::to_string(number) + ": it must be at most " + std::to_string(high));
    }
    out = static_cast<std::int64_t>(number);
  } else if (value.is_number_integer()) {
    out = value.get<std::int64_t>();
  } else if (value.is_number_float()) {
    const double number = value.get<double>();
    if (std::trunc(number) != number || std::abs(number) > 9.0e18) {
      return wrong_type(key, "an integer", value);
    }
    out = static_cast<std::int64_t>(number);
  } else {
    return wrong_type(key, "an integer", value);
  }
  if (*out < low || *out > high) {
    return out_of_range(key, "is " + std::to_string(*out) + ": it must be from " + std::to_string(low) + " to " +
                                 std::to_string(high));
  }
  return std::nullopt;
}

namespace {

Check read_bool(const json& value, const std::string& key, bool& out) {
  if (value.is_null()) return std::nullopt;
  if (!value.is_boolean()) return wrong_type(key, "true or false", value);
  out = value.get<bool>();
  return std::nullopt;
}

Check read_stop(const json& value, std::vector<std::string>& out) {
  out.clear();
  if (value.is_null()) return std::nullopt;
  if (value.is_string()) {
    out.push_back(value.get<std::string>());
    return std::nullopt;
  }
  if (!value.is_array()) return wrong_type("stop", "a string or an array of strings", value);
  if (value.size() > model::kMaxStopStrings) {
    return out_of_range("stop", "has " + std::to_string(value.size()) + " strings: at most " +
                                    std::to_string(model::kMaxStopStrings) + " are accepted");
  }
  for (std::size_t i = 0; i < value.size(); ++i) {
    if (!value[i].is_string()) return wrong_type("stop[" + std::to_string(i) + "]", "a string", value[i]);
    out.push_back(value[i].get<std::string>());
  }
  return std::nullopt;
}

// Fields this server does not implement are accepted only with the value that asks for nothing.
Check require_absent(const json& value, const std::string& key, bool acceptable, const std::string& why) {
  if (value.is_null() || acceptable) return std::nullopt;
  return invalid_request(why, key, "unsupported_parameter");
}

bool is_empty_container(const json& value) { return (value.is_object() || value.is_array()) && value.empty(); }

// One chat message's text: a string, or text parts (joined by newlines).
Check read_content(const json& value, const std::string& field, std::string& out) {
  out.clear();
  if (value.is_string()) {
    out = value.get<std::string>();
    return std::nullopt;
  }
  if (!value.is_array()) return wrong_type(field, "a string or an array of content parts", value);
  for (std::size_t j = 0; j < value.size(); ++j) {
    const json& part = value[j];
    const std::string part_field = field + "[" + std::to_string(j) + "]";
    if (!part.is_object()) return wrong_type(part_field, "an object such as {\"type\": \"text\", \"text\": ...}", part);
    auto type = part.find("type");
    if (type == part.end() || !type->is_string() || type->get<std::string>() != "text") {
      return invalid_request("'" + part_field + ".type' must be \"text\": this server takes text only",
                             part_field + ".type", "unsupported_content");
    }
    auto text = part.find("text");
    if (text == part.end() || !text->is_string()) {
      return invalid_request("'" + part_field + ".text' must be a string", part_field + ".text");
    }
    if (j > 0) out += "\n";
    out += text->get<std::string>();
  }
  return std::nullopt;
}

// An optional string of a message: absent or null leaves `out` empty.
Check read_message_string(const json& object, const std::string& field, const char* key, std::size_t max_bytes,
                          std::string& out) {
  const auto it = object.find(key);
  if (it == object.end() || it->is_null()) return std::nullopt;
  const std::string key_field = field + "." + key;
  if (!it->is_string()) return wrong_type(key_field, "a string", *it);
  out = it->get<std::string>();
  if (out.size() > max_bytes) return out_of_range(key_field, "is too long: at most " + std::to_string(max_bytes) + " bytes");
  return std::nullopt;
}

// One of an assistant's tool_calls: {"id", "type": "function", "function": {"name", "arguments"}},
// arguments the JSON text of an object, as the model wrote it.
Check read_tool_call(const json& call, const std::string& field, messages::ToolCall& out) {
  if (!call.is_object()) return wrong_type(field, R"(an object {"id", "type": "function", "function"})", call);
  if (auto failure = read_message_string(call, field, "id", front_end::kMaxToolCallIdBytes, out.id)) return failure;
  if (auto type = call.find("type"); type != call.end() && !type->is_null() && *type != "function") {
    return invalid_request("'" + field + ".type' must be \"function\"", field + ".type");
  }
  const auto function = call.find("function");
  if (function == call.end()) return invalid_request("'" + field + ".function' is missing", field + ".function");
  if (!function->is_object()) return wrong_type(field + ".function", "an object {name, arguments}", *function);
  const std::string function_field = field + ".function";
  if (auto failure = read_message_string(*function, function_field, "name", kMaxRoleBytes, out.name)) return failure;
  const auto arguments = function->find("arguments");
  if (arguments == function->end()) {
    return invalid_request("'" + function_field + ".arguments' is missing", function_field + ".arguments");
  }
  if (!arguments->is_string()) return wrong_type(function_field + ".arguments", "a string of JSON", *arguments);
  out.arguments = arguments->get<std::string>();
  return std::nullopt;
}

Check read_tool_calls(const json& value, const std::string& field, std::vector<messages::ToolCall>& out) {
  if (value.is_null()) return std::nullopt;
  if (!value.is_array()) return wrong_type(field, "an array of tool calls", value);
  for (std::size_t i = 0; i < value.size() && i <= front_end::kMaxToolCallsPerTurn; ++i) {
    messages::ToolCall call;
    if (auto failure = read_tool_call(value[i], field + "[" + std::to_string(i) + "]", call)) return failure;
    out.push_back(std::move(call));
  }
  return std::nullopt;
}

// One message: role, content (text, text parts, or null and absent for an assistant, which then
// has none), an assistant's tool_calls, a tool result's tool_call_id, and a name.
Check read_message(const json& message, const std::string& field, messages::ChatTurn& turn) {
  if (!message.is_object()) return wrong_type(field, "an object with role and content", message);
  auto role = message.find("role");
  if (role == message.end()) return invalid_request("'" + field + ".role' is missing", field + ".role");
  if (!role->is_string()) return wrong_type(field + ".role", "a string", *role);
  turn.role = role->get<std::string>();
  if (turn.role.size() > kMaxRoleBytes) return out_of_range(field + ".role", "is too long");
  // OpenAI's newer name for the system prompt.
  if (turn.role == "developer") turn.role = "system";
  if (turn.role == "function") {
    return invalid_request("'" + field + ".role' is \"function\", the legacy role: send tool results as \"tool\" "
                           "messages with a tool_call_id",
                           field + ".role", "unsupported_parameter");
  }
  if (auto calls = message.find("tool_calls"); calls != message.end()) {
    if (auto failure = read_tool_calls(*calls, field + ".tool_calls", turn.tool_calls)) return failure;
  }
  if (auto failure = read_message_string(message, field, "tool_call_id", front_end::kMaxToolCallIdBytes,
                                         turn.tool_call_id)) {
    return failure;
  }
  if (auto failure = read_message_string(message, field, "name", kMaxRoleBytes, turn.name)) return failure;
  auto content = message.find("content");
  if (content == message.end() || content->is_null()) {
    if (turn.role != "assistant") {
      return invalid_request("'" + field + ".content' is " + (content == message.end() ? "missing" : "null") +
                                 ": only an assistant message may have no content",
                             field + ".content");
    }
    turn.has_content = false;
  } else if (auto failure = read_content(*content, field + ".content", turn.content)) {
    return failure;
  }
  return tool_check(front_end::check_turn_tools(turn, field));
}

Check read_messages(const json& value, std::vector<messages::ChatTurn>& out) {
  if (!value.is_array()) return wrong_type("messages", "an array of messages", value);
  if (value.empty()) return invalid_request("'messages' is empty: give at least one message", "messages");
  if (value.size() > kMaxChatMessages) {
    return out_of_range("messages", "has " + std::to_string(value.size()) + " entries: at most " +
                                        std::to_string(kMaxChatMessages) + " are accepted");
  }
  out.clear();
  for (std::size_t i = 0; i < value.size(); ++i) {
    messages::ChatTurn turn;
    if (auto failure = read_message(value[i], "messages[" + std::to_string(i) + "]", turn)) return failure;
    out.push_back(std::move(turn));
  }
  return std::nullopt;
}

}  // namespace

Check read_token_ids(const json& value, const std::string& key, std::vector<std::int32_t>& out) {
  if (value.size() > kMaxPromptTokens) {
    return out_of_range(key, "has " + std::to_string(value.size()) + " tokens: at most " +
                                 std::to_string(kMaxPromptTokens) + " are accepted");
  }
  out.clear();
  for (std::size_t i = 0; i < value.size(); ++i) {
    const std::string field = key + "[" + std::to_string(i) + "]";
    if (!value[i].is_number()) return wrong_type(field, "a token id", value[i]);
    std::optional<std::int64_t> id;
    if (auto failure = read_integer(value[i], field, 0, std::numeric_limits<std::int32_t>::max(), id)) return failure;
    out.push_back(static_cast<std::int32_t>(*id));
  }
  return std::nullopt;
}

namespace {

// OpenAI's logit_bias: an object from token ids, written as decimal strings, to biases in
// [-100, 100]. Ids past the vocabulary are the scheduler's to refuse: it knows the model.
Check read_logit_bias(const json& value, std::vector<model::TokenBias>& out) {
  out.clear();
  if (value.is_null()) return std::nullopt;
  if (!value.is_object()) return wrong_type("logit_bias", "an object from token ids to biases", value);
  if (value.size() > model::kMaxLogitBiasEntries) {
    return out_of_range("logit_bias", "has " + std::to_string(value.size()) + " entries: at most " +
                                          std::to_string(model::kMaxLogitBiasEntries) + " are accepted");
  }
  for (const auto& [key, bias] : value.items()) {
    const std::string field = "logit_bias[\"" + key.substr(0, 32) + "\"]";
    std::int32_t token = -1;
    auto [end, status] = std::from_chars(key.data(), key.data() + key.size(), token);
    if (key.empty() || status != std::errc{} || end != key.data() + key.size() || token < 0) {
      return invalid_request("'logit_bias' has the key \"" + key.substr(0, 32) +
                                 "\": keys must be token ids, as decimal strings like \"1234\"",
                             field, "invalid_value");
    }
    if (bias.is_null()) return wrong_type(field, "a number", bias);
    float number = 0.0f;
    if (auto failure = read_number(bias, field, -model::kMaxLogitBias, model::kMaxLogitBias, number)) return failure;
    out.push_back({token, number});
  }
  return std::nullopt;
}

// A completions prompt: a string, token ids, or one of either in an array.
Check read_prompt(const json& value, messages::Submit& submit) {
  const json* one = &value;
  if (value.is_array() && !value.empty() && (value[0].is_string() || value[0].is_array())) {
    if (value.size() > 1) {
      return invalid_request("'prompt' holds several prompts: send one request per prompt", "prompt",
                             "unsupported_parameter");
    }
    one = &value[0];
    if (one->is_array() && !one->empty() && !(*one)[0].is_number()) {
      return wrong_type("prompt[0][0]", "a token id", (*one)[0]);
    }
  }
  if (one->is_string()) {
    submit.prompt_kind = static_cast<std::uint8_t>(messages::PromptKind::text);
    submit.text = one->get<std::string>();
    return std::nullopt;
  }
  if (!one->is_array()) return wrong_type("prompt", "a string, or an array of token ids", value);
  if (one->empty()) return invalid_request("'prompt' is an empty array", "prompt");
  submit.prompt_kind = static_cast<std::uint8_t>(messages::PromptKind::tokens);
  return read_token_ids(*one, one == &value ? "prompt" : "prompt[0]", submit.tokens);
}

// A body while its fields are read.
struct Draft {
  CompletionRequest request;
  bool has_prompt = false;
  std::optional<std::int64_t> max_tokens;
  std::optional<std::int64_t> max_completion_tokens;
  std::optional<std::int64_t> top_logprobs;
  std::optional<std::int64_t> completion_logprobs;
  std::optional<std::int64_t> seed;
  std::optional<std::int64_t> top_k;
  const json* stream_options = nullptr;
  bool top_p_zero = false;
};

model::SamplingParams& sampling(Draft& d) { return d.request.submit.sampling; }

using FieldReader = Check (*)(const json&, Draft&);

struct Field {
  std::string_view name;
  FieldReader read;
};

Check ignore(const json&, Draft&) { return std::nullopt; }

Check read_model(const json& value, Draft& d) {
  if (!value.is_string()) return wrong_type("model", "a string", value);
  d.request.model = value.get<std::string>();
  if (d.request.model.size() > kMaxModelNameBytes) return out_of_range("model", "is too long");
  d.request.submit.model = d.request.model;
  return std::nullopt;
}

Check read_max_tokens(const json& value, Draft& d) {
  return read_integer(value, "max_tokens", 1, std::numeric_limits<std::int32_t>::max(), d.max_tokens);
}

Check read_temperature(const json& value, Draft& d) {
  return read_number(value, "temperature", 0.0, kMaxTemperature, sampling(d).temperature);
}

Check read_top_p(const json& value, Draft& d) {
  float top_p = 1.0f;
  if (auto failure = read_number(value, "top_p", 0.0, 1.0, top_p)) return failure;
  // top_p 0 keeps only the most likely token: greedy, which the sampler spells temperature 0.
  d.top_p_zero = top_p == 0.0f;
  sampling(d).top_p = d.top_p_zero ? 1.0f : top_p;
  return std::nullopt;
}

Check read_penalty(const json& value, const std::string& key, float& out) {
  return read_number(value, key, -model::kMaxPresenceFrequencyPenalty, model::kMaxPresenceFrequencyPenalty, out);
}

Check read_n(const json& value, Draft&) {
  std::optional<std::int64_t> n;
  if (auto failure = read_integer(value, "n", 1, std::numeric_limits<std::int32_t>::max(), n)) return failure;
  if (n && *n != 1) {
    return invalid_request("'n' is " + std::to_string(*n) + ": this server makes one choice per request (n = 1)",
                           "n", "unsupported_parameter");
  }
  return std::nullopt;
}

// chat_template_kwargs (vLLM's and llama-server's): more variables for the Jinja chat template
// (enable_thinking, ...), which the scheduler gives it.
Check read_chat_template_kwargs(const json& value, Draft& d) {
  if (value.is_null()) return std::nullopt;
  return tool_check(front_end::read_template_kwargs(value, d.request.submit.chat_template_kwargs));
}

Check read_tools(const json& value, Draft& d) {
  if (value.is_null()) return std::nullopt;
  return tool_check(front_end::read_tools(value, "tools", d.request.submit.tools));
}

// "auto", "none", "required", or {"type": "function", "function": {"name": NAME}}; the name is
// checked against the tools once every field is read.
Check read_tool_choice(const json& value, Draft& d) {
  messages::Submit& submit = d.request.submit;
  if (value.is_null()) return std::nullopt;
  if (value.is_string()) return tool_check(front_end::read_tool_choice_mode(value.get<std::string>(), submit));
  if (!value.is_object()) return wrong_type("tool_choice", R"("auto", "none", "required" or an object)", value);
  if (auto type = value.find("type"); type == value.end() || *type != "function") {
    return invalid_request("'tool_choice.type' must be \"function\"", "tool_choice.type");
  }
  const auto function = value.find("function");
  if (function == value.end() || !function->is_object()) {
    return invalid_request("'tool_choice.function' must be an object {\"name\": NAME}", "tool_choice.function");
  }
  const auto name = function->find("name");
  if (name == function->end() || !name->is_string()) {
    return invalid_request("'tool_choice.function.name' must be a string", "tool_choice.function.name");
  }
  submit.tool_choice = static_cast<std::uint8_t>(messages::ToolChoice::function);
  submit.tool_choice_name = name->get<std::string>().substr(0, front_end::kMaxToolNameBytes + 1);
  return std::nullopt;
}

// response_format: {"type": "text" | "json_object"}, or {"type": "json_schema", "json_schema":
// {"name", "description", "schema", "strict"}}, whose schema finish_response_format takes.
Check read_response_format(const json& v, Draft& d) {
  if (!v.is_object()) return wrong_type("response_format", "an object", v);
  const auto type = v.find("type");
  const std::string kind = type != v.end() && type->is_string() ? type->get<std::string>() : "";
  model::ResponseFormat& format = sampling(d).response_format;
  if (kind == "text") return std::nullopt;
  if (kind == "json_object") {
    format.kind = static_cast<std::uint8_t>(model::ResponseKind::json_object);
    return std::nullopt;
  }
  if (kind != "json_schema") {
    return invalid_request(R"('response_format.type' must be "text", "json_object" or "json_schema")",
                           "response_format.type");
  }
  const auto spec = v.find("json_schema");
  if (spec == v.end() || !spec->is_object() || !spec->contains("schema")) {
    return invalid_request("'response_format.json_schema' must be an object with a 'schema'",
                           "response_format.json_schema", "missing_required_parameter");
  }
  if (auto strict = spec->find("strict"); strict != spec->end() && !strict->is_null()) {
    if (auto failure = read_bool(*strict, "response_format.json_schema.strict", format.strict)) return failure;
  }
  format.kind = static_cast<std::uint8_t>(model::ResponseKind::json_schema);
  return std::nullopt;
}

// The schema as the client wrote it, its keys in order (the body parsed again as ordered_json:
// properties are generated in that order), and a 400 naming what the grammar compiler refuses.
Check finish_response_format(std::string_view body, model::ResponseFormat& format) {
  const char* param = "response_format.json_schema.schema";
  if (format.kind == static_cast<std::uint8_t>(model::ResponseKind::json_schema)) {
    const auto ordered = nlohmann::ordered_json::parse(body, nullptr, false);
    const nlohmann::ordered_json* schema = &ordered;
    for (const char* key : {"response_format", "json_schema", "schema"}) {
      if (!schema->is_object() || !schema->contains(key)) return invalid_request("the schema could not be read", param);
      schema = &(*schema)[key];
    }
    format.schema = schema->dump();
    if (format.schema.size() > model::kMaxSchemaBytes) {
      return invalid_request(fmt::format("the schema is {} bytes of JSON: at most {} are accepted",
                                         format.schema.size(), model::kMaxSchemaBytes), param);
    }
  }
  if (!format.constrained()) return std::nullopt;
  const auto grammar = model::grammar::response_grammar(format);
  if (const auto* refused = std::get_if<model::grammar::SchemaError>(&grammar)) {
    return invalid_request("response_format: " + refused->message, param, "invalid_schema");
  }
  return std::nullopt;
}

Check read_stream_options(const json& value, Draft& d) {
  if (value.is_null()) return std::nullopt;
  if (!value.is_object()) return wrong_type("stream_options", "an object", value);
  d.stream_options = &value;
  return std::nullopt;
}

// The fields both endpoints take; then each endpoint's own.
const Field kCommonFields[] = {
    {"response_format", read_response_format},
    {"model", read_model},
    {"max_tokens", read_max_tokens},
    {"temperature", read_temperature},
    {"top_p", read_top_p},
    {"stop", [](const json& v, Draft& d) { return read_stop(v, sampling(d).stop); }},
    {"seed",
     [](const json& v, Draft& d) {
       return read_integer(v, "seed", std::numeric_limits<std::int64_t>::min(),
                           std::numeric_limits<std::int64_t>::max(), d.seed);
     }},
    {"presence_penalty",
     [](const json& v, Draft& d) { return read_penalty(v, "presence_penalty", sampling(d).presence_penalty); }},
    {"frequency_penalty",
     [](const json& v, Draft& d) { return read_penalty(v, "frequency_penalty", sampling(d).frequency_penalty); }},
    {"stream", [](const json& v, Draft& d) { return read_bool(v, "stream", d.request.stream); }},
    {"stream_options", read_stream_options},
    {"n", read_n},
    {"logit_bias", [](const json& v, Draft& d) { return read_logit_bias(v, sampling(d).logit_bias); }},
    // Extensions that vLLM and llama.cpp's server also take.
    {"top_k",
     [](const json& v, Draft& d) {
       return read_integer(v, "top_k", 0, std::numeric_limits<std::int32_t>::max(), d.top_k);
     }},
    {"min_p", [](const json& v, Draft& d) { return read_number(v, "min_p", 0.0, 1.0, sampling(d).min_p); }},
    {"repetition_penalty",
     [](const json& v, Draft& d) {
       return read_number(v, "repetition_penalty", 0.0, model::kMaxRepetitionPenalty, sampling(d).repetition_penalty);
     }},
    {"ignore_eos", [](const json& v, Draft& d) { return read_bool(v, "ignore_eos", sampling(d).ignore_eos); }},
    // mqlm's own: prompt-lookup drafts a step for this greedy request (0: none), as `--draft-max`.
    {"draft_max",
     [](const json& v, Draft& d) -> Check {
       std::optional<std::int64_t> drafts;
       if (auto failure = read_integer(v, "draft_max", 0, messages::kMaxDraftTokens, drafts)) return failure;
       if (drafts) d.request.submit.draft_max = static_cast<std::int32_t>(*drafts);
       return std::nullopt;
     }},
    // llama-server's switch for its prompt cache; mqlm's prefix cache is always on.
    {"cache_prompt",
     [](const json& v, Draft&) {
       bool cache_prompt = true;
       return read_bool(v, "cache_prompt", cache_prompt);
     }},
    {"return_tokens_as_token_ids",
     [](const json& v, Draft& d) { return read_bool(v, "return_tokens_as_token_ids", d.request.tokens_as_ids); }},
    // Accounting and routing hints that change nothing here.
    {"user", ignore},
    {"store", ignore},
    {"metadata", ignore},
    {"service_tier", ignore},
    {"safety_identifier", ignore},
    {"prompt_cache_key", ignore},
};

const Field kChatFields[] = {
    {"messages",
     [](const json& v, Draft& d) {
       d.has_prompt = true;
       d.request.submit.prompt_kind = static_cast<std::uint8_t>(messages::PromptKind::chat);
       return read_messages(v, d.request.submit.chat);
     }},
    {"max_completion_tokens",
     [](const json& v, Draft& d) {
       return read_integer(v, "max_completion_tokens", 1, std::numeric_limits<std::int32_t>::max(),
                           d.max_completion_tokens);
     }},
    {"logprobs", [](const json& v, Draft& d) { return read_bool(v, "logprobs", d.request.logprobs); }},
    {"top_logprobs",
     [](const json& v, Draft& d) { return read_integer(v, "top_logprobs", 0, kMaxTopLogprobs, d.top_logprobs); }},
    {"tools", read_tools},
    {"functions",
     [](const json& v, Draft&) {
       return require_absent(v, "functions", is_empty_container(v),
                             "'functions' (the legacy form) is not supported here: give them as 'tools'");
     }},
    {"tool_choice", read_tool_choice},
    {"function_call",
     [](const json& v, Draft&) {
       return require_absent(v, "function_call", v.is_string() && (v == "none" || v == "auto"),
                             "'function_call' (the legacy form) is not supported here: use 'tool_choice'");
     }},
    {"parallel_tool_calls",
     [](const json& v, Draft& d) {
       return read_bool(v, "parallel_tool_calls", d.request.submit.parallel_tool_calls);
     }},
    {"modalities",
     [](const json& v, Draft&) {
       bool text = v.is_array() && v.size() == 1 && v[0] == "text";
       return require_absent(v, "modalities", text, "only the \"text\" modality is supported here");
     }},
    {"audio", [](const json& v, Draft&) { return require_absent(v, "audio", false, "audio is not supported here"); }},
    {"prediction",
     [](const json& v, Draft&) {
       return require_absent(v, "prediction", false, "'prediction' is not supported here");
     }},
    {"web_search_options",
     [](const json& v, Draft&) {
       return require_absent(v, "web_search_options", false, "web search is not supported here");
     }},
    {"reasoning_effort", ignore},
    {"verbosity", ignore},
    {"chat_template_kwargs", read_chat_template_kwargs},
};

const Field kCompletionFields[] = {
    {"prompt",
     [](const json& v, Draft& d) {
       d.has_prompt = true;
       return read_prompt(v, d.request.submit);
     }},
    {"logprobs",
     [](const json& v, Draft& d) {
       return read_integer(v, "logprobs", 0, kMaxTopLogprobs, d.completion_logprobs);
     }},
    {"best_of",
     [](const json& v, Draft&) {
       std::optional<std::int64_t> best_of;
       if (auto failure = read_integer(v, "best_of", 1, std::numeric_limits<std::int32_t>::max(), best_of)) {
         return failure;
       }
       return require_absent(v, "best_of", !best_of || *best_of == 1,
                             "'best_of' above 1 is not supported here: this server makes one completion per request");
     }},
    {"echo",
     [](const json& v, Draft&) {
       bool echo = false;
       if (auto failure = read_bool(v, "echo", echo)) return failure;
       return require_absent(v, "echo", !echo, "'echo' is not supported here");
     }},
    {"suffix",
     [](const json& v, Draft&) {
       return require_absent(v, "suffix", v.is_string() && v.get<std::string>().empty(),
                             "'suffix' is not supported here");
     }},
};

const Field* find_field(Endpoint endpoint, std::string_view name) {
  for (const auto& field : kCommonFields) {
    if (field.name == name) return &field;
  }
  if (endpoint == Endpoint::chat) {
    for (const auto& field : kChatFields) {
      if (field.name == name) return &field;
    }
  } else {
    for (const auto& field : kCompletionFields) {
      if (field.name == name) return &field;
    }
  }
  return nullptr;
}

// The checks across fields, once every field is read.
Check finish_draft(Endpoint endpoint, Draft& d, std::uint64_t default_seed) {
  CompletionRequest& r = d.request;
  model::SamplingParams& s = r.submit.sampling;
  if (r.model.empty()) {
    return invalid_request("you must provide a model parameter", "model", "missing_required_parameter");
  }
  if (!d.has_prompt) {
    const char* key = endpoint == Endpoint::chat ? "messages" : "prompt";
    return invalid_request(std::string("'") + key + "' is missing", key, "missing_required_parameter");
  }
  if (d.stream_options != nullptr) {
    if (!r.stream) {
      return invalid_request("'stream_options' is only allowed when 'stream' is true", "stream_options");
    }
    if (auto usage = d.stream_options->find("include_usage"); usage != d.stream_options->end()) {
      if (auto failure = read_bool(*usage, "stream_options.include_usage", r.include_usage)) return failure;
    }
  }
  // Chat's newer name wins over the older one, as OpenAI documents.
  if (d.max_completion_tokens) {
    s.max_tokens = static_cast<std::int32_t>(*d.max_completion_tokens);
  } else if (d.max_tokens) {
    s.max_tokens = static_cast<std::int32_t>(*d.max_tokens);
  } else if (endpoint == Endpoint::completions) {
    s.max_tokens = kCompletionsDefaultMaxTokens;
  }
  if (endpoint == Endpoint::chat) {
    if (auto failure = tool_check(front_end::check_tool_choice(r.submit))) return failure;
    if (d.top_logprobs && *d.top_logprobs > 0 && !r.logprobs) {
      return invalid_request("'top_logprobs' needs 'logprobs' to be true", "top_logprobs");
    }
    r.top_logprobs = d.top_logprobs ? static_cast<int>(*d.top_logprobs) : 0;
  } else if (d.completion_logprobs) {
    r.logprobs = true;
    r.top_logprobs = static_cast<int>(*d.completion_logprobs);
  }
  s.logprobs = r.logprobs;
  s.top_logprobs = r.logprobs ? r.top_logprobs : 0;
  s.seed = d.seed ? static_cast<std::uint64_t>(*d.seed) : default_seed;
  if (d.top_k) s.top_k = static_cast<std::int32_t>(*d.top_k);
  if (d.top_p_zero) s.temperature = 0.0f;
  if (auto error = model::validate(s)) return invalid_request(error->message, error->field);
  return std::nullopt;
}

// The body as a JSON object, or the 400 that says why it is not one.
}  // namespace

std::variant<json, ApiError> parse_body(std::string_view body) {
  json parsed = json::parse(body, nullptr, false);
  if (parsed.is_discarded()) {
    return invalid_request(
        "We could not parse the JSON body of your request: it is not valid JSON (send a JSON object, with "
        "Content-Type: application/json)",
        std::nullopt, "invalid_json");
  }
  if (!parsed.is_object()) {
    return invalid_request("The body of your request must be a JSON object, not " + std::string(type_name(parsed)),
                           std::nullopt, "invalid_json");
  }
  return parsed;
}

namespace {

// A /tokenize or /detokenize field: llama-server's names and vLLM's. add_special is left unset
// when not given, because the two servers' defaults differ (vLLM's, whose "prompt" names its
// style, adds them).
Check read_tokenize_field(const std::string& key, const json& value, messages::Tokenize& question,
                          std::optional<bool>& add_special, bool& has_input, bool& vllm_style) {
  const bool text_side = !question.detokenize;
  if (key == "model") {
    if (!value.is_string()) return wrong_type(key, "a string", value);
    question.model = value.get<std::string>();
    if (question.model.size() > kMaxModelNameBytes) return out_of_range(key, "is too long");
    return std::nullopt;
  }
  if (text_side && (key == "content" || key == "prompt")) {
    if (!value.is_string()) return wrong_type(key, "a string", value);
    question.text = value.get<std::string>();
    has_input = true;
    vllm_style = key == "prompt";
    return std::nullopt;
  }
  if (!text_side && key == "tokens") {
    if (!value.is_array()) return wrong_type(key, "an array of token ids", value);
    has_input = true;
    return read_token_ids(value, key, question.tokens);
  }
  if (text_side && (key == "add_special" || key == "add_special_tokens")) {
    bool add = false;
    if (auto failure = read_bool(value, key, add)) return failure;
    add_special = add;
    return std::nullopt;
  }
  if (text_side && key == "parse_special") return read_bool(value, key, question.parse_special);
  if (text_side && key == "with_pieces") return read_bool(value, key, question.with_pieces);
  return invalid_request("Unrecognized request argument supplied: " + key.substr(0, 64), key.substr(0, 64),
                         "unknown_parameter");
}

// ---- rendering ------------------------------------------------------------------------------

double logprob_value(float logprob) { return std::isfinite(logprob) ? static_cast<double>(logprob) : kLowestLogprob; }

json token_bytes(const std::string& piece) {
  json bytes = json::array();
  for (unsigned char c : piece) bytes.push_back(static_cast<int>(c));
  return bytes;
}

// A piece as llama-server writes it: a string when it is UTF-8 alone, else its bytes.
json piece_json(const std::string& piece) {
  try {
    (void)json(piece).dump();
    return piece;
  } catch (const json::type_error&) {
    return token_bytes(piece);
  }
}

// Characters in a piece: bytes that do not continue a UTF-8 sequence.
std::size_t characters(const std::string& piece) {
  std::size_t count = 0;
  for (unsigned char c : piece) count += (c & 0xC0) != 0x80 ? 1 : 0;
  return count;
}

// A token as logprobs name it: its piece, or "token_id:N" as vLLM writes it when asked.
std::string token_name(std::int32_t id, const std::string& piece, bool as_id) {
  return as_id ? "token_id:" + std::to_string(id) : piece;
}

// One entry of chat's logprobs: OpenAI's token, logprob and bytes (the piece's own, which may be
// part of a character), and the id beside them.
json chat_token(std::int32_t id, const std::string& piece, float logprob, bool as_id) {
  return {{"id", id}, {"token", token_name(id, piece, as_id)}, {"logprob", logprob_value(logprob)},
          {"bytes", token_bytes(piece)}};
}

std::size_t alternatives(const TokenLogprobs& entry, int top_logprobs) {
  return std::min({entry.top_tokens.size(), entry.top_logprobs.size(), entry.top_texts.size(),
                   static_cast<std::size_t>(std::max(top_logprobs, 0))});
}

const char* object_name(Endpoint endpoint, bool chunk) {
  if (endpoint == Endpoint::completions) return "text_completion";
  return chunk ? "chat.completion.chunk" : "chat.completion";
}

}  // namespace

ApiError invalid_request(std::string message, std::optional<std::string> param, std::optional<std::string> code) {
  return ApiError{400, "invalid_request_error", std::move(message), std::move(param), std::move(code)};
}

json error_json(const ApiError& error) {
  return {{"error",
                {{"message", error.message},
                 {"type", error.type},
                 {"param", error.param ? json(*error.param) : json(nullptr)},
                 {"code", error.code ? json(*error.code) : json(nullptr)}}}};
}

std::string error_body(const ApiError& error) { return dump(error_json(error)); }

std::variant<CompletionRequest, ApiError> parse_completion_request(Endpoint endpoint, std::string_view body,
                                                                   std::uint64_t seed) {
  auto parsed = parse_body(body);
  if (auto* error = std::get_if<ApiError>(&parsed)) return *error;
  Draft draft;
  draft.request.endpoint = endpoint;
  for (const auto& [key, value] : std::get<json>(parsed).items()) {
    const Field* field = find_field(endpoint, key);
    if (field == nullptr) {
      return invalid_request("Unrecognized request argument supplied: " + key.substr(0, 64), key.substr(0, 64),
                             "unknown_parameter");
    }
    if (auto failure = field->read(value, draft)) return *failure;
  }
  if (auto failure = finish_response_format(body, draft.request.submit.sampling.response_format)) return *failure;
  if (auto failure = finish_draft(endpoint, draft, seed)) return *failure;
  return std::move(draft.request);
}

std::variant<messages::Tokenize, ApiError> parse_tokenize_request(std::string_view body, bool detokenize) {
  auto parsed = parse_body(body);
  if (auto* error = std::get_if<ApiError>(&parsed)) return *error;
  messages::Tokenize question;
  question.detokenize = detokenize;
  std::optional<bool> add_special;
  bool has_input = false, vllm_style = false;
  for (const auto& [key, value] : std::get<json>(parsed).items()) {
    if (auto failure = read_tokenize_field(key, value, question, add_special, has_input, vllm_style)) {
      return *failure;
    }
  }
  if (!has_input) {
    const char* key = detokenize ? "tokens" : "content";
    return invalid_request(std::string("'") + key + "' is missing", key, "missing_required_parameter");
  }
  question.add_special = add_special.value_or(vllm_style);
  return question;
}

std::variant<json, ApiError> tokenized_json(const messages::Tokenize& question, const messages::Tokenized& answer) {
  if (answer.error != 0) {
    return error_for(front_end::error_final(static_cast<RequestError>(answer.error), answer.message));
  }
  if (question.detokenize) return json{{"content", answer.text}, {"prompt", answer.text}};
  json tokens = json::array();
  for (std::size_t i = 0; i < answer.tokens.size(); ++i) {
    if (question.with_pieces && i < answer.pieces.size()) {
      tokens.push_back({{"id", answer.tokens[i]}, {"piece", piece_json(answer.pieces[i])}});
    } else {
      tokens.push_back(answer.tokens[i]);
    }
  }
  return json{{"tokens", std::move(tokens)}, {"count", answer.tokens.size()}};
}

ApiError error_for(const FinalEvent& final_event) {
  const auto reason = static_cast<FinishReason>(final_event.finish);
  std::string message = final_event.message;
  if (reason == FinishReason::abort) {
    return ApiError{503, "server_error", message.empty() ? "the request was aborted" : message, std::nullopt,
                    "aborted"};
  }
  if (message.empty()) message = "the request failed";
  switch (static_cast<RequestError>(final_event.error)) {
    case RequestError::invalid_request:
    case RequestError::malformed: return invalid_request(message);
    case RequestError::unknown_model:
      return ApiError{404, "invalid_request_error", message, "model", "model_not_found"};
    case RequestError::prompt_too_long: return invalid_request(message, std::nullopt, "context_length_exceeded");
    case RequestError::busy: return ApiError{503, "server_error", message, std::nullopt, "server_busy"};
    case RequestError::unavailable: return ApiError{503, "server_error", message, std::nullopt, "unavailable"};
    case RequestError::shutting_down: return ApiError{503, "server_error", message, std::nullopt, "shutting_down"};
    case RequestError::gpu: return ApiError{500, "server_error", message, std::nullopt, "gpu_error"};
    case RequestError::insufficient_memory:
      return ApiError{507, "server_error", message, std::nullopt, "insufficient_memory"};
    case RequestError::model_failed: return ApiError{500, "server_error", message, std::nullopt, "model_failed"};
    case RequestError::unauthorized:
      return ApiError{401, "invalid_request_error", message, std::nullopt, "invalid_api_key"};
    case RequestError::forbidden: return ApiError{403, "invalid_request_error", message, std::nullopt, "forbidden"};
    case RequestError::none:
    case RequestError::internal: break;
  }
  return ApiError{500, "server_error", message, std::nullopt, "internal_error"};
}

std::optional<std::string> finish_reason(const FinalEvent& final_event) {
  switch (static_cast<FinishReason>(final_event.finish)) {
    case FinishReason::stop: return "stop";
    case FinishReason::length: return "length";
    case FinishReason::tool_calls: return "tool_calls";
    case FinishReason::abort:
    case FinishReason::error: break;
  }
  return std::nullopt;
}

json usage_json(const FinalEvent& final_event) {
  return {{"prompt_tokens", final_event.prompt_tokens},
          {"completion_tokens", final_event.completion_tokens},
          {"total_tokens", std::uint64_t{final_event.prompt_tokens} + final_event.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", final_event.cached_tokens}}}};
}

json chat_logprobs(const std::vector<TokenLogprobs>& logprobs, int top_logprobs, bool tokens_as_ids) {
  json content = json::array();
  for (const auto& entry : logprobs) {
    json top = json::array();
    for (std::size_t i = 0; i < alternatives(entry, top_logprobs); ++i) {
      top.push_back(chat_token(entry.top_tokens[i], entry.top_texts[i], entry.top_logprobs[i], tokens_as_ids));
    }
    json chosen = chat_token(entry.token, entry.text, entry.logprob, tokens_as_ids);
    chosen["top_logprobs"] = std::move(top);
    content.push_back(std::move(chosen));
  }
  return content;
}

json completion_logprobs(const std::vector<TokenLogprobs>& logprobs, int top_logprobs, std::size_t& text_offset,
                         bool tokens_as_ids) {
  json tokens = json::array(), token_logprobs = json::array(), tops = json::array(), offsets = json::array();
  json ids = json::array(), tops_by_id = json::array();
  for (const auto& entry : logprobs) {
    tokens.push_back(token_name(entry.token, entry.text, tokens_as_ids));
    ids.push_back(entry.token);
    token_logprobs.push_back(logprob_value(entry.logprob));
    // OpenAI lists the chosen token beside the alternatives: up to logprobs + 1 entries.
    json top = json::object(), top_by_id = json::object();
    for (std::size_t i = 0; i < alternatives(entry, top_logprobs); ++i) {
      top[token_name(entry.top_tokens[i], entry.top_texts[i], tokens_as_ids)] = logprob_value(entry.top_logprobs[i]);
      top_by_id[std::to_string(entry.top_tokens[i])] = logprob_value(entry.top_logprobs[i]);
    }
    top[token_name(entry.token, entry.text, tokens_as_ids)] = logprob_value(entry.logprob);
    top_by_id[std::to_string(entry.token)] = logprob_value(entry.logprob);
    tops.push_back(std::move(top));
    tops_by_id.push_back(std::move(top_by_id));
    offsets.push_back(text_offset);
    text_offset += characters(entry.text);
  }
  return {{"tokens", std::move(tokens)},         {"token_logprobs", std::move(token_logprobs)},
          {"top_logprobs", std::move(tops)},     {"text_offset", std::move(offsets)},
          {"token_ids", std::move(ids)},         {"top_logprobs_by_id", std::move(tops_by_id)}};
}

namespace {

// A chat message's tool_calls, whole: [{id, type "function", function {name, arguments}}].
json tool_calls_json(const std::vector<messages::ToolCallDelta>& calls) {
  json out = json::array();
  for (const auto& call : calls) {
    out.push_back({{"id", call.id},
                   {"type", "function"},
                   {"function", {{"name", call.name}, {"arguments", call.arguments}}}});
  }
  return out;
}

// A streamed delta's tool_calls: [{index, id, type, function {name, arguments}}], id, type and
// name on a call's first piece only.
json tool_call_deltas_json(const std::vector<messages::ToolCallDelta>& pieces) {
  json out = json::array();
  for (const auto& piece : pieces) {
    json delta = {{"index", piece.index}, {"function", {{"arguments", piece.arguments}}}};
    if (!piece.name.empty()) {
      delta["id"] = piece.id;
      delta["type"] = "function";
      delta["function"]["name"] = piece.name;
    }
    out.push_back(std::move(delta));
  }
  return out;
}

// The assistant's message: content (null when it made calls and wrote nothing else), its
// reasoning_content and tool_calls when it has them.
json chat_message(const front_end::GatheredOutput& all) {
  json message = {{"role", "assistant"},
                  {"content", all.text.empty() && !all.tool_calls.empty() ? json(nullptr) : json(all.text)},
                  {"refusal", nullptr}};
  if (!all.reasoning.empty()) message["reasoning_content"] = all.reasoning;
  if (!all.tool_calls.empty()) message["tool_calls"] = tool_calls_json(all.tool_calls);
  return message;
}

}  // namespace

json completion_body(const CompletionRequest& request, const ResponseIdentity& identity,
                     const front_end::GatheredOutput& gathered, const FinalEvent& final_event) {
  const front_end::GatheredOutput output = gathered.with(final_event);
  const std::string& text = output.text;
  json choice;
  if (request.endpoint == Endpoint::chat) {
    choice = {{"index", 0},
              {"message", chat_message(output)},
              {"logprobs", request.logprobs ? json{{"content", chat_logprobs(output.logprobs, request.top_logprobs,
                                                                             request.tokens_as_ids)},
                                                   {"refusal", nullptr}}
                                            : json(nullptr)}};
  } else {
    std::size_t offset = 0;
    choice = {{"index", 0},
              {"text", text},
              {"logprobs", request.logprobs ? completion_logprobs(output.logprobs, request.top_logprobs, offset,
                                                                  request.tokens_as_ids)
                                            : json(nullptr)}};
  }
  auto reason = finish_reason(final_event);
  choice["finish_reason"] = reason ? json(*reason) : json(nullptr);
  return {{"id", identity.id},
          {"object", object_name(request.endpoint, false)},
          {"created", identity.created},
          {"model", request.model},
          {"system_fingerprint", nullptr},
          {"choices", json::array({std::move(choice)})},
          {"usage", usage_json(final_event)}};
}

std::string dump(const json& body) { return body.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string sse_event(const json& data) { return "data: " + dump(data) + "\n\n"; }

StreamRenderer::StreamRenderer(CompletionRequest request, ResponseIdentity identity)
    : request_(std::move(request)), identity_(std::move(identity)) {}

json StreamRenderer::chunk(json choice) const {
  json body = {{"id", identity_.id},
               {"object", object_name(request_.endpoint, true)},
               {"created", identity_.created},
               {"model", request_.model},
               {"system_fingerprint", nullptr},
               {"choices", json::array({std::move(choice)})}};
  // With include_usage every chunk has the key, null until the last one (as OpenAI sends it).
  if (request_.include_usage) body["usage"] = nullptr;
  return body;
}

json StreamRenderer::content_choice(const std::string& text, const std::vector<TokenLogprobs>& logprobs,
                                   const std::string& reasoning, const std::vector<messages::ToolCallDelta>& calls) {
  const bool with_logprobs = request_.logprobs && !logprobs.empty();
  if (request_.endpoint == Endpoint::chat) {
    json delta = json::object();
    if (!text.empty() || (reasoning.empty() && calls.empty())) delta["content"] = text;
    if (!reasoning.empty()) delta["reasoning_content"] = reasoning;
    if (!calls.empty()) delta["tool_calls"] = tool_call_deltas_json(calls);
    return {{"index", 0},
            {"delta", std::move(delta)},
            {"logprobs", with_logprobs ? json{{"content", chat_logprobs(logprobs, request_.top_logprobs,
                                                                        request_.tokens_as_ids)},
                                              {"refusal", nullptr}}
                                       : json(nullptr)},
            {"finish_reason", nullptr}};
  }
  return {{"index", 0},
          {"text", text},
          {"logprobs", with_logprobs ? completion_logprobs(logprobs, request_.top_logprobs, text_offset_,
                                                                 request_.tokens_as_ids)
                                     : json(nullptr)},
          {"finish_reason", nullptr}};
}

std::string StreamRenderer::start() {
  if (request_.endpoint != Endpoint::chat) return {};
  return sse_event(chunk({{"index", 0},
                          {"delta", {{"role", "assistant"}, {"content", ""}, {"refusal", nullptr}}},
                          {"logprobs", nullptr},
                          {"finish_reason", nullptr}}));
}

std::string StreamRenderer::tokens(const messages::TokenEvent& event) {
  if (event.text.empty() && event.reasoning.empty() && event.tool_calls.empty() &&
      !(request_.logprobs && !event.logprobs.empty())) {
    return {};
  }
  return sse_event(chunk(content_choice(event.text, event.logprobs, event.reasoning, event.tool_calls)));
}

std::string StreamRenderer::finish(const FinalEvent& final_event) {
  auto reason = finish_reason(final_event);
  if (!reason) {
    return sse_event(error_json(error_for(final_event))) + std::string(kSseDone);
  }
  std::string out;
  if (!final_event.text.empty() || !final_event.reasoning.empty() || !final_event.tool_calls.empty()) {
    out += sse_event(chunk(content_choice(final_event.text, {}, final_event.reasoning, final_event.tool_calls)));
  }
  json last = request_.endpoint == Endpoint::chat
                  ? json{{"index", 0}, {"delta", json::object()}, {"logprobs", nullptr}, {"finish_reason", *reason}}
                  : json{{"index", 0}, {"text", ""}, {"logprobs", nullptr}, {"finish_reason", *reason}};
  out += sse_event(chunk(std::move(last)));
  if (request_.include_usage) {
    json usage = chunk(json(nullptr));
    usage["choices"] = json::array();
    usage["usage"] = usage_json(final_event);
    out += sse_event(usage);
  }
  out += kSseDone;
  return out;
}

}  // namespace mqlm::actors::openai
