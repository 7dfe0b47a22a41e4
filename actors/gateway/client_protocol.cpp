#include "actors/gateway/client_protocol.hpp"

#include <algorithm>
#include <limits>

#include "actors/front_end/model_admin.hpp"
#include "actors/front_end/tool_request.hpp"
#include "model/grammar/response_grammar.hpp"
#include "model/sampling/sampling_params.hpp"

namespace mqlm::actors::client_protocol {

using front_end::error_code_name;
using front_end::finish_reason_name;
using messages::RequestError;

namespace {

// ---- parsing --------------------------------------------------------------------------------

struct Failure {
  RequestError code = RequestError::malformed;
  std::string message;
};

using Check = std::optional<Failure>;

Failure malformed(std::string message) { return {RequestError::malformed, std::move(message)}; }
Failure invalid(std::string message) { return {RequestError::invalid_request, std::move(message)}; }

std::string_view type_name(const msgpack::object& o) {
  switch (o.type) {
    case msgpack::type::NIL: return "nil";
    case msgpack::type::BOOLEAN: return "a boolean";
    case msgpack::type::POSITIVE_INTEGER:
    case msgpack::type::NEGATIVE_INTEGER: return "an integer";
    case msgpack::type::FLOAT32:
    case msgpack::type::FLOAT64: return "a float";
    case msgpack::type::STR: return "a string";
    case msgpack::type::BIN: return "binary";
    case msgpack::type::ARRAY: return "an array";
    case msgpack::type::MAP: return "a map";
    case msgpack::type::EXT: return "an extension";
  }
  return "an unknown type";
}

Failure wrong_type(std::string_view key, std::string_view expected, const msgpack::object& o) {
  return malformed("'" + std::string(key) + "' must be " + std::string(expected) + ", not " +
                   std::string(type_name(o)));
}

bool is_integer(const msgpack::object& o) {
  return o.type == msgpack::type::POSITIVE_INTEGER || o.type == msgpack::type::NEGATIVE_INTEGER;
}

// The integer's value as text, whatever its width (for messages about out-of-range values).
std::string integer_text(const msgpack::object& o) {
  return o.type == msgpack::type::POSITIVE_INTEGER ? std::to_string(o.via.u64) : std::to_string(o.via.i64);
}

Check read_bool(const msgpack::object& o, std::string_view key, bool& out) {
  if (o.type != msgpack::type::BOOLEAN) return wrong_type(key, "true or false", o);
  out = o.via.boolean;
  return std::nullopt;
}

// Integers are numbers too: clients in languages without a separate float type send 1 for 1.0.
// Values beyond float's range become infinities, which model::validate rejects by name.
Check read_float(const msgpack::object& o, std::string_view key, float& out) {
  switch (o.type) {
    case msgpack::type::FLOAT32:
    case msgpack::type::FLOAT64: out = static_cast<float>(o.via.f64); return std::nullopt;
    case msgpack::type::POSITIVE_INTEGER: out = static_cast<float>(o.via.u64); return std::nullopt;
    case msgpack::type::NEGATIVE_INTEGER: out = static_cast<float>(o.via.i64); return std::nullopt;
    default: return wrong_type(key, "a number", o);
  }
}

Check read_int32(const msgpack::object& o, std::string_view key, std::int32_t& out) {
  if (!is_integer(o)) return wrong_type(key, "an integer", o);
  constexpr auto kMin = std::numeric_limits<std::int32_t>::min();
  constexpr auto kMax = std::numeric_limits<std::int32_t>::max();
  bool fits = o.type == msgpack::type::POSITIVE_INTEGER ? o.via.u64 <= static_cast<std::uint64_t>(kMax)
                                                        : o.via.i64 >= kMin;
  if (!fits) {
    return invalid(std::string(key) + " is " + integer_text(o) + ": it must be a 32-bit integer");
  }
  out = o.type == msgpack::type::POSITIVE_INTEGER ? static_cast<std::int32_t>(o.via.u64)
                                                  : static_cast<std::int32_t>(o.via.i64);
  return std::nullopt;
}

Check read_uint64(const msgpack::object& o, std::string_view key, std::uint64_t& out) {
  if (!is_integer(o)) return wrong_type(key, "an integer", o);
  if (o.type == msgpack::type::NEGATIVE_INTEGER) {
    return invalid(std::string(key) + " is " + integer_text(o) + ": it must be >= 0");
  }
  out = o.via.u64;
  return std::nullopt;
}

Check read_string(const msgpack::object& o, std::string_view key, std::size_t max_bytes, std::string& out) {
  if (o.type != msgpack::type::STR) return wrong_type(key, "a string", o);
  if (o.via.str.size > max_bytes) {
    return invalid(std::string(key) + " is " + std::to_string(o.via.str.size) + " bytes long: at most " +
                   std::to_string(max_bytes) + " are accepted");
  }
  out.assign(o.via.str.ptr, o.via.str.size);
  return std::nullopt;
}

// Token ids are checked >= 0 here; against the vocabulary by the scheduler, which knows it.
Check read_token_ids(const msgpack::object& o, std::string_view key, std::size_t max_count,
                     std::vector<std::int32_t>& out) {
  if (o.type != msgpack::type::ARRAY) return wrong_type(key, "an array of integers", o);
  if (o.via.array.size > max_count) {
    return invalid(std::string(key) + " has " + std::to_string(o.via.array.size) + " ids: at most " +
                   std::to_string(max_count) + " are accepted");
  }
  out.clear();
  out.reserve(o.via.array.size);
  for (std::uint32_t i = 0; i < o.via.array.size; ++i) {
    const msgpack::object& item = o.via.array.ptr[i];
    std::string field = std::string(key) + "[" + std::to_string(i) + "]";
    std::int32_t id = 0;
    if (auto failure = read_int32(item, field, id)) return failure;
    if (id < 0) return invalid(field + " is " + std::to_string(id) + ": a token id must be >= 0");
    out.push_back(id);
  }
  return std::nullopt;
}

// A map from token id to bias. Ids against the vocabulary, repeats and the bias range are left to
// model::validate (and the scheduler), which name the entry as the JSON API does.
Check read_logit_bias(const msgpack::object& o, std::vector<model::TokenBias>& out) {
  if (o.type != msgpack::type::MAP) return wrong_type("logit_bias", "a map from token ids to numbers", o);
  if (o.via.map.size > model::kMaxLogitBiasEntries) {
    return invalid("logit_bias has " + std::to_string(o.via.map.size) + " entries: at most " +
                   std::to_string(model::kMaxLogitBiasEntries) + " are accepted");
  }
  out.clear();
  out.reserve(o.via.map.size);
  for (std::uint32_t i = 0; i < o.via.map.size; ++i) {
    const msgpack::object_kv& kv = o.via.map.ptr[i];
    if (!is_integer(kv.key)) {
      return malformed("logit_bias has a key that is " + std::string(type_name(kv.key)) +
                       ": its keys are token ids, integers");
    }
    model::TokenBias entry;
    if (auto failure = read_int32(kv.key, "a logit_bias key", entry.token)) return failure;
    if (auto failure = read_float(kv.val, "logit_bias[\"" + std::to_string(entry.token) + "\"]", entry.bias)) {
      return failure;
    }
    out.push_back(entry);
  }
  return std::nullopt;
}

// {"type": "text" | "json_object"} or {"type": "json_schema", "schema": JSON text, "strict": bool}
// (docs/protocol.md); a schema the grammar compiler refuses is refused here, saying why.
Check read_response_format(const msgpack::object& o, model::ResponseFormat& out) {
  if (o.type != msgpack::type::MAP) return wrong_type("response_format", "a map", o);
  std::string type;
  for (std::uint32_t i = 0; i < o.via.map.size; ++i) {
    const msgpack::object_kv& kv = o.via.map.ptr[i];
    const std::string_view key = kv.key.type == msgpack::type::STR ? std::string_view(kv.key.via.str.ptr, kv.key.via.str.size) : "";
    Check failure;
    if (key == "type") failure = read_string(kv.val, "response_format.type", 16, type);
    else if (key == "schema") failure = read_string(kv.val, "response_format.schema", model::kMaxSchemaBytes, out.schema);
    else if (key == "strict") failure = read_bool(kv.val, "response_format.strict", out.strict);
    else return invalid("response_format has a key other than type, schema and strict");
    if (failure) return failure;
  }
  if (type == "text" || type == "json_object" || type == "json_schema") {
    out.kind = static_cast<std::uint8_t>(type == "text"          ? model::ResponseKind::text
                                         : type == "json_object" ? model::ResponseKind::json_object
                                                                 : model::ResponseKind::json_schema);
  } else {
    return invalid(R"(response_format.type must be "text", "json_object" or "json_schema")");
  }
  model::SamplingParams alone;
  alone.response_format = out;
  if (auto problem = model::validate(alone)) return invalid(problem->message);
  if (!out.constrained()) return std::nullopt;
  const auto grammar = model::grammar::response_grammar(out);
  if (const auto* refused = std::get_if<model::grammar::SchemaError>(&grammar)) {
    return invalid("response_format: " + refused->message);
  }
  return std::nullopt;
}

// Counts and lengths are left to model::validate, which names the limits; the frame's own bound
// already bounds what this allocates.
Check read_strings(const msgpack::object& o, std::string_view key, std::vector<std::string>& out) {
  if (o.type != msgpack::type::ARRAY) return wrong_type(key, "an array of strings", o);
  out.clear();
  out.reserve(o.via.array.size);
  for (std::uint32_t i = 0; i < o.via.array.size; ++i) {
    const msgpack::object& item = o.via.array.ptr[i];
    std::string field = std::string(key) + "[" + std::to_string(i) + "]";
    if (item.type != msgpack::type::STR) return wrong_type(field, "a string", item);
    out.emplace_back(item.via.str.ptr, item.via.str.size);
  }
  return std::nullopt;
}

std::string_view key_name(const msgpack::object_kv& kv) {
  return kv.key.type == msgpack::type::STR ? std::string_view(kv.key.via.str.ptr, kv.key.via.str.size)
                                           : std::string_view();
}

// A map inside the frame (a message, a tool call): string keys among `known`, each once (a
// repeat is found among the first known.size() + 1 keys, so this is quick on any map).
Check check_keys(const msgpack::object& o, const std::string& field, std::initializer_list<std::string_view> known) {
  for (std::uint32_t i = 0; i < o.via.map.size; ++i) {
    const std::string_view name = key_name(o.via.map.ptr[i]);
    if (std::find(known.begin(), known.end(), name) == known.end()) {
      std::string names;
      for (std::string_view k : known) names += (names.empty() ? "" : ", ") + std::string(k);
      return malformed(field + " has a key other than " + names +
                       (name.empty() ? std::string() : ": '" + std::string(name.substr(0, kMaxKeyBytes)) + "'"));
    }
    for (std::uint32_t j = 0; j < i; ++j) {
      if (key_name(o.via.map.ptr[j]) == name) return malformed(field + " has the key '" + std::string(name) + "' twice");
    }
  }
  return std::nullopt;
}

Check failure_of(std::optional<front_end::ToolProblem> problem) {
  if (!problem) return std::nullopt;
  return invalid(std::move(problem->message));
}

// A tool call's function: {name, arguments}, arguments the JSON text of an object.
Check read_called_function(const msgpack::object& o, const std::string& field, messages::ToolCall& out) {
  if (o.type != msgpack::type::MAP) return wrong_type(field, "a map {name, arguments}", o);
  if (auto failure = check_keys(o, field, {"name", "arguments"})) return failure;
  bool has_name = false, has_arguments = false;
  for (std::uint32_t i = 0; i < o.via.map.size; ++i) {
    const msgpack::object_kv& kv = o.via.map.ptr[i];
    const bool name = key_name(kv) == "name";
    (name ? has_name : has_arguments) = true;
    const Check failure = name ? read_string(kv.val, field + ".name", front_end::kMaxToolNameBytes, out.name)
                               : read_string(kv.val, field + ".arguments", kMaxFrameBytes, out.arguments);
    if (failure) return failure;
  }
  if (!has_name || !has_arguments) return malformed(field + " lacks " + (has_name ? "arguments" : "name"));
  return std::nullopt;
}

// One of an assistant's tool_calls, in OpenAI's shape: {id, type: "function", function}.
Check read_tool_call(const msgpack::object& o, const std::string& field, messages::ToolCall& out) {
  if (o.type != msgpack::type::MAP) return wrong_type(field, "a map {id, type, function}", o);
  if (auto failure = check_keys(o, field, {"id", "type", "function"})) return failure;
  bool has_function = false;
  for (std::uint32_t i = 0; i < o.via.map.size; ++i) {
    const msgpack::object_kv& kv = o.via.map.ptr[i];
    const std::string_view name = key_name(kv);
    Check failure;
    std::string type;
    if (name == "id") failure = read_string(kv.val, field + ".id", front_end::kMaxToolCallIdBytes, out.id);
    if (name == "type") {
      failure = read_string(kv.val, field + ".type", kMaxKeyBytes, type);
      if (!failure && type != "function") failure = invalid(field + ".type must be \"function\"");
    }
    if (name == "function") {
      has_function = true;
      failure = read_called_function(kv.val, field + ".function", out);
    }
    if (failure) return failure;
  }
  if (!has_function) return malformed(field + " lacks function");
  return std::nullopt;
}

Check read_tool_calls(const msgpack::object& o, const std::string& field, std::vector<messages::ToolCall>& out) {
  if (o.type != msgpack::type::ARRAY) return wrong_type(field, "an array of tool calls", o);
  if (o.via.array.size > front_end::kMaxToolCallsPerTurn) {
    return invalid(field + " has " + std::to_string(o.via.array.size) + " calls: at most " +
                   std::to_string(front_end::kMaxToolCallsPerTurn) + " are accepted");
  }
  for (std::uint32_t i = 0; i < o.via.array.size; ++i) {
    messages::ToolCall call;
    if (auto failure = read_tool_call(o.via.array.ptr[i], field + "[" + std::to_string(i) + "]", call)) return failure;
    out.push_back(std::move(call));
  }
  return std::nullopt;
}

// {role, content, tool_calls?, tool_call_id?, name?}: content nil or absent only for an
// assistant, which then has none.
Check read_chat_turn(const msgpack::object& o, const std::string& field, messages::ChatTurn& out) {
  if (o.type != msgpack::type::MAP) return wrong_type(field, "a map with role and content", o);
  if (auto failure = check_keys(o, field, {"role", "content", "tool_calls", "tool_call_id", "name"})) return failure;
  bool has_role = false, content_given = false;
  out.has_content = false;
  for (std::uint32_t i = 0; i < o.via.map.size; ++i) {
    const msgpack::object_kv& kv = o.via.map.ptr[i];
    const std::string_view name = key_name(kv);
    const std::string key_field = field + "." + std::string(name);
    Check failure;
    if (name == "role") {
      has_role = true;
      failure = read_string(kv.val, key_field, kMaxRoleBytes, out.role);
    } else if (name == "content") {
      content_given = true;
      out.has_content = kv.val.type != msgpack::type::NIL;
      if (out.has_content) failure = read_string(kv.val, key_field, kMaxFrameBytes, out.content);
    } else if (name == "tool_calls") {
      failure = read_tool_calls(kv.val, key_field, out.tool_calls);
    } else if (name == "tool_call_id") {
      failure = read_string(kv.val, key_field, front_end::kMaxToolCallIdBytes, out.tool_call_id);
    } else if (name == "name") {
      failure = read_string(kv.val, key_field, kMaxRoleBytes, out.name);
    }
    if (failure) return failure;
  }
  if (!has_role || (!content_given && out.role != "assistant")) {
    return malformed(field + " lacks " + (has_role ? "content" : "role") + ": each message is {role, content}");
  }
  if (out.role.empty()) return invalid(field + ".role is empty");
  return failure_of(front_end::check_turn_tools(out, field));
}

Check read_chat(const msgpack::object& o, std::vector<messages::ChatTurn>& out) {
  if (o.type != msgpack::type::ARRAY) return wrong_type("messages", "an array of {role, content} maps", o);
  if (o.via.array.size > kMaxChatTurns) {
    return invalid("messages has " + std::to_string(o.via.array.size) + " entries: at most " +
                   std::to_string(kMaxChatTurns) + " are accepted");
  }
  out.clear();
  out.reserve(o.via.array.size);
  for (std::uint32_t i = 0; i < o.via.array.size; ++i) {
    messages::ChatTurn turn;
    if (auto failure = read_chat_turn(o.via.array.ptr[i], "messages[" + std::to_string(i) + "]", turn)) {
      return failure;
    }
    out.push_back(std::move(turn));
  }
  return std::nullopt;
}

// A msgpack value as JSON; nullopt for binary and extensions. The decoder's pre-pass bounds the
// frame's nesting (8 levels), and so this recursion.
std::optional<nlohmann::json> json_from(const msgpack::object& o) {
  switch (o.type) {
    case msgpack::type::NIL: return nlohmann::json(nullptr);
    case msgpack::type::BOOLEAN: return nlohmann::json(o.via.boolean);
    case msgpack::type::POSITIVE_INTEGER: return nlohmann::json(o.via.u64);
    case msgpack::type::NEGATIVE_INTEGER: return nlohmann::json(o.via.i64);
    case msgpack::type::FLOAT32:
    case msgpack::type::FLOAT64: return nlohmann::json(o.via.f64);
    case msgpack::type::STR: return nlohmann::json(std::string(o.via.str.ptr, o.via.str.size));
    case msgpack::type::ARRAY: {
      auto array = nlohmann::json::array();
      for (std::uint32_t i = 0; i < o.via.array.size; ++i) {
        auto item = json_from(o.via.array.ptr[i]);
        if (!item) return std::nullopt;
        array.push_back(std::move(*item));
      }
      return array;
    }
    case msgpack::type::MAP: {
      auto object = nlohmann::json::object();
      for (std::uint32_t i = 0; i < o.via.map.size; ++i) {
        auto item = json_from(o.via.map.ptr[i].val);
        if (o.via.map.ptr[i].key.type != msgpack::type::STR || !item) return std::nullopt;
        object[std::string(key_name(o.via.map.ptr[i]))] = std::move(*item);
      }
      return object;
    }
    default: return std::nullopt;
  }
}

// tools: OpenAI's tools array as JSON text (schemas nest deeper than a frame may).
Check read_tools(const msgpack::object& o, messages::Submit& submit) {
  std::string text;
  if (auto failure = read_string(o, "tools", kMaxFrameBytes, text)) return failure;
  const auto tools = nlohmann::json::parse(text, nullptr, false);
  if (tools.is_discarded()) return invalid("tools is not JSON: give OpenAI's tools array as JSON text");
  return failure_of(front_end::read_tools(tools, "tools", submit.tools));
}

// "auto", "none", "required", or {type: "function", function: {name}} as OpenAI writes it.
Check read_tool_choice(const msgpack::object& o, messages::Submit& submit) {
  if (o.type == msgpack::type::STR) {
    return failure_of(front_end::read_tool_choice_mode(std::string_view(o.via.str.ptr, o.via.str.size), submit));
  }
  const auto choice = json_from(o);
  const nlohmann::json* name = nullptr;
  // Compared, not read: a type that is no string (a number, say) is simply not "function".
  if (choice && choice->is_object() && choice->contains("type") && (*choice)["type"] == "function" &&
      choice->contains("function") &&
      (*choice)["function"].is_object() && (*choice)["function"].contains("name")) {
    name = &(*choice)["function"]["name"];
  }
  if (name == nullptr || !name->is_string()) {
    return malformed(R"(tool_choice must be "auto", "none", "required" or {"type": "function", "function": {"name": NAME}})");
  }
  submit.tool_choice = static_cast<std::uint8_t>(messages::ToolChoice::function);
  submit.tool_choice_name = name->get<std::string>().substr(0, front_end::kMaxToolNameBytes + 1);
  return std::nullopt;
}

Check read_template_kwargs(const msgpack::object& o, messages::Submit& submit) {
  if (o.type != msgpack::type::MAP) return wrong_type("chat_template_kwargs", "a map", o);
  const auto kwargs = json_from(o);
  if (!kwargs) return malformed("chat_template_kwargs holds a value JSON has no type for (binary, an extension)");
  return failure_of(front_end::read_template_kwargs(*kwargs, submit.chat_template_kwargs));
}

// A generate request while its keys are read: which prompt keys appeared.
struct GenerateDraft {
  GenerateRequest request;
  int prompts_given = 0;
};

using KeyReader = Check (*)(const msgpack::object&, GenerateDraft&);

struct GenerateKey {
  std::string_view name;
  KeyReader read;
};

model::SamplingParams& sampling(GenerateDraft& d) { return d.request.submit.sampling; }

// Every key generate takes, and where its value goes. op and id are read before these.
const GenerateKey kGenerateKeys[] = {
    {"op", [](const msgpack::object&, GenerateDraft&) -> Check { return std::nullopt; }},
    {"id", [](const msgpack::object&, GenerateDraft&) -> Check { return std::nullopt; }},
    {"model",
     [](const msgpack::object& o, GenerateDraft& d) {
       return read_string(o, "model", kMaxModelNameBytes, d.request.submit.model);
     }},
    {"prompt",
     [](const msgpack::object& o, GenerateDraft& d) {
       ++d.prompts_given;
       d.request.submit.prompt_kind = static_cast<std::uint8_t>(messages::PromptKind::text);
       return read_string(o, "prompt", kMaxFrameBytes, d.request.submit.text);
     }},
    {"tokens",
     [](const msgpack::object& o, GenerateDraft& d) {
       ++d.prompts_given;
       d.request.submit.prompt_kind = static_cast<std::uint8_t>(messages::PromptKind::tokens);
       return read_token_ids(o, "tokens", kMaxPromptTokens, d.request.submit.tokens);
     }},
    {"messages",
     [](const msgpack::object& o, GenerateDraft& d) {
       ++d.prompts_given;
       d.request.submit.prompt_kind = static_cast<std::uint8_t>(messages::PromptKind::chat);
       return read_chat(o, d.request.submit.chat);
     }},
    {"stream", [](const msgpack::object& o, GenerateDraft& d) { return read_bool(o, "stream", d.request.stream); }},
    {"max_tokens",
     [](const msgpack::object& o, GenerateDraft& d) { return read_int32(o, "max_tokens", sampling(d).max_tokens); }},
    {"temperature",
     [](const msgpack::object& o, GenerateDraft& d) { return read_float(o, "temperature", sampling(d).temperature); }},
    {"top_k", [](const msgpack::object& o, GenerateDraft& d) { return read_int32(o, "top_k", sampling(d).top_k); }},
    {"top_p", [](const msgpack::object& o, GenerateDraft& d) { return read_float(o, "top_p", sampling(d).top_p); }},
    {"min_p", [](const msgpack::object& o, GenerateDraft& d) { return read_float(o, "min_p", sampling(d).min_p); }},
    {"repetition_penalty",
     [](const msgpack::object& o, GenerateDraft& d) {
       return read_float(o, "repetition_penalty", sampling(d).repetition_penalty);
     }},
    {"repetition_last_n",
     [](const msgpack::object& o, GenerateDraft& d) {
       return read_int32(o, "repetition_last_n", sampling(d).repetition_last_n);
     }},
    {"presence_penalty",
     [](const msgpack::object& o, GenerateDraft& d) {
       return read_float(o, "presence_penalty", sampling(d).presence_penalty);
     }},
    {"frequency_penalty",
     [](const msgpack::object& o, GenerateDraft& d) {
       return read_float(o, "frequency_penalty", sampling(d).frequency_penalty);
     }},
    {"seed", [](const msgpack::object& o, GenerateDraft& d) { return read_uint64(o, "seed", sampling(d).seed); }},
    {"draft_max",
     [](const msgpack::object& o, GenerateDraft& d) { return read_int32(o, "draft_max", d.request.submit.draft_max); }},
    {"stop", [](const msgpack::object& o, GenerateDraft& d) { return read_strings(o, "stop", sampling(d).stop); }},
    {"stop_token_ids",
     [](const msgpack::object& o, GenerateDraft& d) {
       return read_token_ids(o, "stop_token_ids", std::numeric_limits<std::uint32_t>::max(),
                             sampling(d).stop_token_ids);
     }},
    {"logprobs",
     [](const msgpack::object& o, GenerateDraft& d) { return read_bool(o, "logprobs", sampling(d).logprobs); }},
    {"top_logprobs",
     [](const msgpack::object& o, GenerateDraft& d) {
       return read_int32(o, "top_logprobs", sampling(d).top_logprobs);
     }},
    {"logit_bias",
     [](const msgpack::object& o, GenerateDraft& d) { return read_logit_bias(o, sampling(d).logit_bias); }},
    {"response_format",
     [](const msgpack::object& o, GenerateDraft& d) {
       return read_response_format(o, sampling(d).response_format);
     }},
    {"tools", [](const msgpack::object& o, GenerateDraft& d) { return read_tools(o, d.request.submit); }},
    {"tool_choice", [](const msgpack::object& o, GenerateDraft& d) { return read_tool_choice(o, d.request.submit); }},
    {"parallel_tool_calls",
     [](const msgpack::object& o, GenerateDraft& d) {
       return read_bool(o, "parallel_tool_calls", d.request.submit.parallel_tool_calls);
     }},
    {"chat_template_kwargs",
     [](const msgpack::object& o, GenerateDraft& d) { return read_template_kwargs(o, d.request.submit); }},
    {"pooling",
     [](const msgpack::object& o, GenerateDraft& d) -> Check {
       std::string name;
       if (auto failure = read_string(o, "pooling", kMaxModelNameBytes, name)) return failure;
       if (name != "mean" && name != "last") return invalid("pooling is \"" + name + "\": it must be \"mean\" or \"last\"");
       d.request.submit.pooling = name == "mean" ? 1 : 2;  // model::Pooling
       return std::nullopt;
     }},
};

// The frame's map, its keys checked: strings, short, each once.
struct Entries {
  std::vector<std::pair<std::string_view, const msgpack::object*>> items;
  std::vector<std::string_view> repeated;
  std::optional<Failure> problem;  // the first problem with the keys

  const msgpack::object* find(std::string_view name) const {
    for (const auto& [key, value] : items) {
      if (key == name) return value;
    }
    return nullptr;
  }
  bool is_repeated(std::string_view name) const {
    return std::find(repeated.begin(), repeated.end(), name) != repeated.end();
  }
};

Entries read_entries(const msgpack::object& map) {
  Entries entries;
  entries.items.reserve(map.via.map.size);
  for (std::uint32_t i = 0; i < map.via.map.size; ++i) {
    const msgpack::object_kv& kv = map.via.map.ptr[i];
    if (kv.key.type != msgpack::type::STR) {
      if (!entries.problem) {
        entries.problem = malformed("a key is " + std::string(type_name(kv.key)) + ": keys are strings such as \"op\"");
      }
      continue;
    }
    std::string_view name(kv.key.via.str.ptr, kv.key.via.str.size);
    if (name.size() > kMaxKeyBytes) {
      if (!entries.problem) {
        entries.problem = malformed("a key is " + std::to_string(name.size()) + " bytes long: no key is over " +
                                    std::to_string(kMaxKeyBytes));
      }
      continue;
    }
    if (entries.find(name) != nullptr) {
      if (!entries.is_repeated(name)) entries.repeated.push_back(name);
      if (!entries.problem) entries.problem = malformed("the key '" + std::string(name) + "' appears twice");
      continue;
    }
    entries.items.emplace_back(name, &kv.val);
  }
  return entries;
}

// The id, or why it is unusable.
std::variant<ClientId, Failure> read_id(const msgpack::object& o) {
  switch (o.type) {
    case msgpack::type::STR:
      if (o.via.str.size > kMaxIdBytes) {
        return malformed("'id' is " + std::to_string(o.via.str.size) + " bytes long: at most " +
                         std::to_string(kMaxIdBytes) + " are accepted");
      }
      return ClientId{std::string(o.via.str.ptr, o.via.str.size)};
    case msgpack::type::POSITIVE_INTEGER:
      if (o.via.u64 > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
        return malformed("'id' is " + std::to_string(o.via.u64) + ": integer ids are 64-bit signed");
      }
      return ClientId{static_cast<std::int64_t>(o.via.u64)};
    case msgpack::type::NEGATIVE_INTEGER: return ClientId{o.via.i64};
    default: return wrong_type("id", "a string or an integer", o);
  }
}

RequestProblem problem(Failure failure, std::optional<ClientId> id = std::nullopt, bool generate = false) {
  return RequestProblem{failure.code, std::move(failure.message), std::move(id), generate};
}

ClientRequest parse_generate(const Entries& entries, ClientId id) {
  GenerateDraft draft;
  draft.request.id = id;
  for (const auto& [name, value] : entries.items) {
    const GenerateKey* key = nullptr;
    for (const auto& candidate : kGenerateKeys) {
      if (candidate.name == name) key = &candidate;
    }
    if (key == nullptr) {
      return problem(malformed("generate has no key '" + std::string(name) + "'"), id, true);
    }
    if (auto failure = key->read(*value, draft)) return problem(std::move(*failure), id, true);
  }
  const messages::Submit& submit = draft.request.submit;
  if (draft.prompts_given != 1) {
    return problem(invalid(draft.prompts_given == 0 ? "no prompt: give one of prompt, tokens or messages"
                                                    : "several prompts: give only one of prompt, tokens or messages"),
                   id, true);
  }
  bool empty = submit.text.empty() && submit.tokens.empty() && submit.chat.empty();
  if (empty) {
    static constexpr std::string_view kKeys[] = {"", "prompt", "tokens", "messages"};
    return problem(invalid(std::string(kKeys[submit.prompt_kind]) + " is empty"), id, true);
  }
  if (auto error = model::validate(submit.sampling)) return problem(invalid(error->message), id, true);
  const bool asks_tools = !submit.tools.empty() || !submit.chat_template_kwargs.empty() ||
                          submit.tool_choice != static_cast<std::uint8_t>(messages::ToolChoice::automatic);
  if (asks_tools && submit.prompt_kind != static_cast<std::uint8_t>(messages::PromptKind::chat)) {
    return problem(invalid("tools, tool_choice and chat_template_kwargs are for messages, not a prompt or tokens"),
                   id, true);
  }
  if (auto failure = failure_of(front_end::check_tool_choice(submit))) return problem(std::move(*failure), id, true);
  return std::move(draft.request);
}

ClientRequest parse_status(const Entries& entries, std::optional<ClientId> id) {
  StatusRequest request{std::move(id), false};
  for (const auto& [name, value] : entries.items) {
    if (name == "op" || name == "id") continue;
    if (name != "trim") return problem(malformed("status has no key '" + std::string(name) + "'"), request.id);
    if (auto failure = read_bool(*value, "trim", request.trim)) return problem(std::move(*failure), request.id);
  }
  return request;
}

ClientRequest parse_admin(const Entries& entries, AdminOp op, std::optional<ClientId> id) {
  AdminRequest request{op, std::move(id), {}, false};
  const std::string_view op_name = op == AdminOp::load ? "load" : op == AdminOp::unload ? "unload" : "models";
  bool has_model = false;
  for (const auto& [name, value] : entries.items) {
    if (name == "op" || name == "id") continue;
    Check failure;
    if (name == "model") {
      has_model = true;
      failure = read_string(*value, "model", kMaxModelNameBytes, request.model);
    } else if (name == "if_idle" && op == AdminOp::unload) {
      failure = read_bool(*value, "if_idle", request.if_idle);
    } else {
      failure = malformed(std::string(op_name) + " has no key '" + std::string(name) + "'");
    }
    if (failure) return problem(std::move(*failure), request.id);
  }
  if (op != AdminOp::models && (!has_model || request.model.empty())) {
    return problem(invalid(std::string(op_name) + " needs 'model': the id of a configured model"), request.id);
  }
  return request;
}

// {"op": "clear_cache", "tier": "hot" | "ssd"}: the tier is required, and only those two.
ClientRequest parse_clear_cache(const Entries& entries, std::optional<ClientId> id) {
  AdminRequest request{AdminOp::clear_cache, std::move(id), {}, false, messages::CacheTier::hot};
  std::optional<messages::CacheTier> tier;
  for (const auto& [name, value] : entries.items) {
    if (name == "op" || name == "id") continue;
    if (name != "tier") return problem(malformed("clear_cache has no key '" + std::string(name) + "'"), request.id);
    if (value->type != msgpack::type::STR) return problem(wrong_type("tier", "\"hot\" or \"ssd\"", *value), request.id);
    const std::string_view text(value->via.str.ptr, value->via.str.size);
    tier = model_admin::tier_named(text);
    if (!tier) {
      return problem(invalid("tier is '" + std::string(text.substr(0, kMaxKeyBytes)) +
                             "': clear_cache empties the \"hot\" (RAM) or the \"ssd\" tier"),
                     request.id);
    }
  }
  if (!tier) return problem(invalid("clear_cache needs 'tier': \"hot\" or \"ssd\""), request.id);
  request.tier = *tier;
  return request;
}

ClientRequest parse_abort(const Entries& entries, ClientId id) {
  for (const auto& [name, value] : entries.items) {
    if (name != "op" && name != "id") return problem(malformed("abort has no key '" + std::string(name) + "'"), id);
  }
  return AbortRequest{std::move(id)};
}

// ---- encoding -------------------------------------------------------------------------------

using Packer = msgpack::packer<msgpack::sbuffer>;

void pack_text(Packer& pk, std::string_view text) {
  pk.pack_str(static_cast<std::uint32_t>(text.size()));
  pk.pack_str_body(text.data(), static_cast<std::uint32_t>(text.size()));
}

void pack_id(Packer& pk, const ClientId& id) {
  if (const auto* number = std::get_if<std::int64_t>(&id)) {
    pk.pack_int64(*number);
  } else {
    pack_text(pk, std::get<std::string>(id));
  }
}

void pack_tokens(Packer& pk, const std::vector<std::int32_t>& tokens) {
  pk.pack_array(static_cast<std::uint32_t>(tokens.size()));
  for (std::int32_t token : tokens) pk.pack_int32(token);
}

void pack_logprobs(Packer& pk, const std::vector<messages::TokenLogprobs>& logprobs) {
  pk.pack_array(static_cast<std::uint32_t>(logprobs.size()));
  for (const auto& entry : logprobs) {
    pk.pack_map(3);
    pack_text(pk, "token");
    pk.pack_int32(entry.token);
    pack_text(pk, "logprob");
    pk.pack_float(entry.logprob);
    pack_text(pk, "top");
    std::size_t top = std::min(entry.top_tokens.size(), entry.top_logprobs.size());
    pk.pack_array(static_cast<std::uint32_t>(top));
    for (std::size_t i = 0; i < top; ++i) {
      pk.pack_array(2);
      pk.pack_int32(entry.top_tokens[i]);
      pk.pack_float(entry.top_logprobs[i]);
    }
  }
}

// Tool call pieces: {"index", "id" and "name" (a call's first piece only), "arguments"}.
void pack_tool_call_pieces(Packer& pk, const std::vector<messages::ToolCallDelta>& pieces) {
  pk.pack_array(static_cast<std::uint32_t>(pieces.size()));
  for (const auto& piece : pieces) {
    const bool first = !piece.name.empty();
    pk.pack_map(first ? 4 : 2);
    pack_text(pk, "index");
    pk.pack_uint32(piece.index);
    if (first) {
      pack_text(pk, "id");
      pack_text(pk, piece.id);
      pack_text(pk, "name");
      pack_text(pk, piece.name);
    }
    pack_text(pk, "arguments");
    pack_text(pk, piece.arguments);
  }
}

// A chat's reasoning and tool calls, each when there is some: how many keys, then the keys.
std::uint32_t split_output_keys(const std::string& reasoning, const std::vector<messages::ToolCallDelta>& calls) {
  return (reasoning.empty() ? 0 : 1) + (calls.empty() ? 0 : 1);
}
void pack_split_output(Packer& pk, const std::string& reasoning, const std::vector<messages::ToolCallDelta>& calls) {
  if (!reasoning.empty()) {
    pack_text(pk, "reasoning");
    pack_text(pk, reasoning);
  }
  if (!calls.empty()) {
    pack_text(pk, "tool_calls");
    pack_tool_call_pieces(pk, calls);
  }
}

std::string to_string(const msgpack::sbuffer& buffer) { return std::string(buffer.data(), buffer.size()); }

double to_ms(std::int64_t ns) { return static_cast<double>(ns) / 1e6; }

// Takes "api_key" out of `entries`, into `key`: a failure when it is there but unusable.
std::optional<Failure> take_api_key(Entries& entries, std::string& key) {
  if (entries.is_repeated("api_key")) return malformed("the key 'api_key' appears twice");
  auto it = std::find_if(entries.items.begin(), entries.items.end(),
                         [](const auto& item) { return item.first == "api_key"; });
  if (it == entries.items.end()) return std::nullopt;
  if (auto failure = read_string(*it->second, "api_key", kMaxApiKeyBytes, key)) return failure;
  entries.items.erase(it);
  return std::nullopt;
}

}  // namespace

ClientRequest parse_request(std::span<const std::byte> frame, std::string* api_key) {
  if (frame.size() > kMaxFrameBytes) {
    return problem(malformed("the frame is " + std::to_string(frame.size()) + " bytes: at most " +
                             std::to_string(kMaxFrameBytes) + " are accepted"));
  }
  auto unpacked = messages::unpack_untrusted(frame, "frame");
  if (auto* error = std::get_if<messages::DecodeError>(&unpacked)) {
    return problem(malformed("the frame is not one msgpack map (" + error->detail + ")"));
  }
  const msgpack::object& root = std::get<msgpack::object_handle>(unpacked).get();
  if (root.type != msgpack::type::MAP) {
    return problem(malformed("the frame is " + std::string(type_name(root)) + ", not a map"));
  }
  if (root.via.map.size > kMaxKeys) {
    return problem(malformed("the map has " + std::to_string(root.via.map.size) + " keys: no request has over " +
                             std::to_string(kMaxKeys)));
  }
  Entries entries = read_entries(root);
  std::string key;
  std::optional<Failure> key_problem = take_api_key(entries, key);
  if (api_key != nullptr) *api_key = std::move(key);

  // The id first, so that every later error can name the request it is about.
  std::optional<ClientId> id;
  std::optional<Failure> id_problem;
  if (entries.is_repeated("id")) {
    id_problem = malformed("the key 'id' appears twice");
  } else if (const msgpack::object* id_value = entries.find("id")) {
    auto read = read_id(*id_value);
    if (auto* failure = std::get_if<Failure>(&read)) {
      id_problem = std::move(*failure);
    } else {
      id = std::get<ClientId>(std::move(read));
    }
  }

  const msgpack::object* op_value = entries.find("op");
  if (entries.is_repeated("op")) return problem(malformed("the key 'op' appears twice"), id);
  static constexpr std::string_view kOps = "generate, abort, status, load, unload, models or clear_cache";
  if (op_value == nullptr) return problem(malformed("'op' is missing: " + std::string(kOps)), id);
  if (op_value->type != msgpack::type::STR) return problem(wrong_type("op", "a string", *op_value), id);
  std::string_view op(op_value->via.str.ptr, op_value->via.str.size);
  const bool generate = op == "generate";
  const bool admin = op == "load" || op == "unload" || op == "models" || op == "clear_cache";
  if (!generate && !admin && op != "abort" && op != "status") {
    return problem(malformed("unknown op '" + std::string(op.substr(0, kMaxKeyBytes)) + "': " + std::string(kOps)),
                   id);
  }
  if (id_problem) return problem(std::move(*id_problem));
  if (key_problem) return problem(std::move(*key_problem), id, generate);
  if (!id && (generate || op == "abort")) {
    return problem(malformed("'id' is missing: " + std::string(op) + " needs one"));
  }
  if (entries.problem) return problem(std::move(*entries.problem), id, generate);

  if (generate) return parse_generate(entries, *id);
  if (op == "abort") return parse_abort(entries, *id);
  if (op == "load") return parse_admin(entries, AdminOp::load, std::move(id));
  if (op == "unload") return parse_admin(entries, AdminOp::unload, std::move(id));
  if (op == "models") return parse_admin(entries, AdminOp::models, std::move(id));
  if (op == "clear_cache") return parse_clear_cache(entries, std::move(id));
  return parse_status(entries, std::move(id));
}

namespace {

// Opens an event's map: "event" (its kind) and "id" when there is one, then `fields` more entries.
void begin_event(Packer& pk, std::string_view kind, const ClientId* id, std::uint32_t fields) {
  pk.pack_map(fields + 1 + (id != nullptr ? 1 : 0));
  pack_text(pk, "event");
  pack_text(pk, kind);
  if (id != nullptr) {
    pack_text(pk, "id");
    pack_id(pk, *id);
  }
}

}  // namespace

std::string encode_token_event(const ClientId& id, const messages::TokenEvent& event, bool with_logprobs) {
  msgpack::sbuffer buffer;
  Packer pk(buffer);
  begin_event(pk, "token", &id, 2 + (with_logprobs ? 1 : 0) + split_output_keys(event.reasoning, event.tool_calls));
  pack_text(pk, "tokens");
  pack_tokens(pk, event.tokens);
  pack_text(pk, "text");
  pack_text(pk, event.text);
  if (with_logprobs) {
    pack_text(pk, "logprobs");
    pack_logprobs(pk, event.logprobs);
  }
  pack_split_output(pk, event.reasoning, event.tool_calls);
  return to_string(buffer);
}

std::string encode_final_event(const ClientId& id, const messages::FinalEvent& final_event,
                               const front_end::GatheredOutput& gathered_before, bool with_logprobs) {
  const front_end::GatheredOutput gathered = gathered_before.with(final_event);
  auto reason = static_cast<messages::FinishReason>(final_event.finish);
  bool is_error = reason == messages::FinishReason::error;
  bool has_stop = !final_event.stop.empty();
  bool has_embedding = !final_event.embedding.empty();
  msgpack::sbuffer buffer;
  Packer pk(buffer);
  begin_event(pk, "final", &id,
              5 + (with_logprobs ? 1 : 0) + (has_stop ? 1 : 0) + (is_error ? 1 : 0) + (has_embedding ? 1 : 0) +
                  split_output_keys(gathered.reasoning, gathered.tool_calls));
  pack_text(pk, "finish_reason");
  pack_text(pk, finish_reason_name(reason));
  pack_text(pk, "text");
  pack_text(pk, gathered.text);
  pack_text(pk, "tokens");
  pack_tokens(pk, gathered.tokens);
  if (with_logprobs) {
    pack_text(pk, "logprobs");
    pack_logprobs(pk, gathered.logprobs);
  }
  pack_split_output(pk, gathered.reasoning, gathered.tool_calls);
  if (has_stop) {
    pack_text(pk, "stop");
    pack_text(pk, final_event.stop);
  }
  if (has_embedding) {
    pack_text(pk, "embedding");
    pk.pack(final_event.embedding);  // float32s
  }
  pack_text(pk, "usage");
  pk.pack_map(3);
  pack_text(pk, "prompt_tokens");
  pk.pack_uint32(final_event.prompt_tokens);
  pack_text(pk, "completion_tokens");
  pk.pack_uint32(final_event.completion_tokens);
  pack_text(pk, "cached_tokens");
  pk.pack_uint32(final_event.cached_tokens);
  pack_text(pk, "timings");
  pk.pack_map(3);
  pack_text(pk, "queue_ms");
  pk.pack_double(to_ms(final_event.queue_ns));
  pack_text(pk, "ttft_ms");
  pk.pack_double(to_ms(final_event.ttft_ns));
  pack_text(pk, "total_ms");
  pk.pack_double(to_ms(final_event.total_ns));
  if (is_error) {
    pack_text(pk, "error");
    pk.pack_map(2);
    pack_text(pk, "code");
    pack_text(pk, error_code_name(static_cast<RequestError>(final_event.error)));
    pack_text(pk, "message");
    pack_text(pk, final_event.message);
  }
  return to_string(buffer);
}

std::string encode_error_event(RequestError code, std::string_view message, const std::optional<ClientId>& id) {
  msgpack::sbuffer buffer;
  Packer pk(buffer);
  begin_event(pk, "error", id ? &*id : nullptr, 2);
  pack_text(pk, "code");
  pack_text(pk, error_code_name(code));
  pack_text(pk, "message");
  pack_text(pk, message);
  return to_string(buffer);
}

std::string encode_status_event(const std::optional<ClientId>& id, const messages::StatusReport& report,
                                const GatewayFigures& gateway, const messages::ModelsReport* memory) {
  msgpack::sbuffer buffer;
  Packer pk(buffer);
  begin_event(pk, "status", id ? &*id : nullptr, memory != nullptr ? 24 : 23);
  if (memory != nullptr) {
    pack_text(pk, "memory");
    const std::vector<std::uint8_t> packed = nlohmann::json::to_msgpack(model_admin::memory_json(*memory));
    buffer.write(reinterpret_cast<const char*>(packed.data()), packed.size());
  }
  pack_text(pk, "models");
  pk.pack_array(static_cast<std::uint32_t>(report.models.size()));
  for (const auto& model : report.models) pack_text(pk, model);
  auto number = [&](std::string_view key, std::uint64_t value) {
    pack_text(pk, key);
    pk.pack_uint64(value);
  };
  number("requests", report.requests);
  number("waiting", report.waiting);
  number("running", report.running);
  number("steps", report.steps);
  number("finished", report.finished);
  number("preemptions", report.preemptions);
  number("computed_tokens", report.computed_tokens);
  number("prefix_hit_tokens", report.prefix_hit_tokens);
  number("restored_hot_tokens", report.restored_hot_tokens);
  number("restored_ssd_tokens", report.restored_ssd_tokens);
  number("spilled_pages", report.spilled_pages);
  number("drafted_tokens", report.drafted_tokens);
  number("accepted_tokens", report.accepted_tokens);
  number("kv_pages", report.kv_pages);
  number("kv_pages_in_use", report.kv_pages_in_use);
  number("kv_pages_cached", report.kv_pages_cached);
  number("kv_references", report.kv_references);
  number("executor_slots", report.executor_slots);
  pack_text(pk, "executor_ready");
  pk.pack(report.executor_ready);
  pack_text(pk, "pool");
  pk.pack_map(6);
  number("active_bytes", report.pool.active_bytes);
  number("cached_bytes", report.pool.cached_bytes);
  number("peak_active_bytes", report.pool.peak_active_bytes);
  number("held_bytes", report.pool.held_bytes);
  number("blocks", report.pool.blocks);
  pack_text(pk, "active_by_owner");
  pk.pack_map(static_cast<std::uint32_t>(report.pool.active_by_owner.size()));
  for (const auto& [owner, bytes] : report.pool.active_by_owner) number(owner, bytes);
  number("gateway_requests", gateway.open_requests);
  number("curve_refused", gateway.curve_refused);
  return to_string(buffer);
}

std::string encode_json_event(std::string_view event, const std::optional<ClientId>& id, nlohmann::json fields) {
  fields["event"] = event;
  if (id) {
    if (const auto* number = std::get_if<std::int64_t>(&*id)) {
      fields["id"] = *number;
    } else {
      fields["id"] = std::get<std::string>(*id);
    }
  }
  const std::vector<std::uint8_t> packed = nlohmann::json::to_msgpack(fields);
  return std::string(reinterpret_cast<const char*>(packed.data()), packed.size());
}

std::string describe(const ClientId& id) {
  if (const auto* number = std::get_if<std::int64_t>(&id)) return std::to_string(*number);
  return "\"" + std::get<std::string>(id) + "\"";
}

}  // namespace mqlm::actors::client_protocol
