#include "model/chat/chat_template.hpp"

#include <algorithm>
#include <array>
#include <optional>

#include <nlohmann/json.hpp>

#include "model/chat/jinja/json_input.hpp"

namespace mqlm::model {

namespace {

// Texts of the tokens that end a turn in the template families of llama.cpp's collection.
constexpr std::array<std::string_view, 12> kEndOfTurnTexts = {
    "<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end_of_text|>", "<end_of_turn>", "<|end|>",
    "<|endoftext|>", "</s>", "<|END_OF_TURN_TOKEN|>", "<｜end▁of▁sentence｜>", "<|return|>", "<|call|>"};

std::string token_text(const Vocabulary& vocabulary, std::int32_t id) {
  if (id < 0 || static_cast<std::size_t>(id) >= vocabulary.tokens.size()) return "";
  return vocabulary.tokens[static_cast<std::size_t>(id)];
}

ChatTemplateError error(std::string message) { return {std::move(message)}; }

// JSON text as a template value; nullopt when it is not JSON (or nests too deep).
std::optional<jinja::Value> json_value(std::string_view text) {
  const auto parsed = nlohmann::ordered_json::parse(text, nullptr, false);
  if (parsed.is_discarded()) return std::nullopt;
  auto value = jinja::value_from_json(parsed);
  if (std::holds_alternative<jinja::JsonInputError>(value)) return std::nullopt;
  return std::get<jinja::Value>(std::move(value));
}

// A call as transformers' templates read it: {id, type: "function", function: {name, arguments}}.
// Templates index the arguments as a mapping (tool_call.arguments | tojson, .items()), so JSON
// text that is an object is given parsed, as llama.cpp's server and vLLM give it; other text
// (not JSON, or JSON of another type) stays the string it is.
jinja::Value tool_call_value(const ChatToolCall& call) {
  std::optional<jinja::Value> arguments = json_value(call.arguments);
  if (!arguments || !arguments->is_object()) arguments = jinja::Value(call.arguments);
  jinja::Object function;
  function.set("name", call.name);
  function.set("arguments", std::move(*arguments));
  jinja::Object value;
  value.set("id", call.id);
  value.set("type", "function");
  value.set("function", jinja::Value(std::move(function)));
  return value;
}

// A message's keys in the order OpenAI's clients write them: role, a tool result's tool_call_id
// and name, content, an assistant's tool_calls; those it has not left out.
jinja::Value message_value(const ChatMessage& message) {
  jinja::Object turn;
  turn.set("role", message.role);
  if (!message.tool_call_id.empty()) turn.set("tool_call_id", message.tool_call_id);
  if (!message.name.empty()) turn.set("name", message.name);
  turn.set("content", message.has_content ? jinja::Value(message.content) : jinja::Value(jinja::None{}));
  if (!message.tool_calls.empty()) {
    jinja::Array calls;
    for (const auto& call : message.tool_calls) calls.push_back(tool_call_value(call));
    turn.set("tool_calls", jinja::Value(std::move(calls)));
  }
  return turn;
}

// tools and the kwargs into `variables`, which hold the server's own already.
std::optional<ChatTemplateError> add_extras(const ChatExtras& extras, jinja::Object& variables) {
  if (!extras.tools.empty()) {
    auto tools = json_value(extras.tools);
    if (!tools || !tools->is_array()) return error("tools are not a JSON array of tools");
    variables.set("tools", std::move(*tools));
  }
  if (extras.kwargs.empty()) return std::nullopt;
  auto kwargs = json_value(extras.kwargs);
  if (!kwargs || !kwargs->is_object()) return error("chat_template_kwargs is not a JSON object");
  for (const auto& [key, value] : kwargs->as_object().entries()) {
    const std::string& name = key.as_string();
    if (is_reserved_template_variable(name)) {
      return error("chat_template_kwargs may not set '" + name + "': the server gives the template its " + name);
    }
    variables.set(name, value);
  }
  return std::nullopt;
}

}  // namespace

std::variant<ChatTemplate, ChatTemplateError> ChatTemplate::make(std::string_view source, std::string bos_text,
                                                                 std::string eos_text) {
  auto parsed = jinja::Template::parse(source);
  if (auto* problem = std::get_if<jinja::TemplateError>(&parsed)) {
    return error("the chat template does not parse: " + problem->message +
                 "; give a template that does with --chat-template FILE");
  }
  return ChatTemplate(std::get<jinja::Template>(std::move(parsed)), std::string(source), std::move(bos_text),
                      std::move(eos_text));
}

std::variant<std::string, ChatTemplateError> ChatTemplate::render(std::span<const ChatMessage> messages,
                                                                  bool add_generation_prompt, std::int64_t now_unix_s,
                                                                  const ChatExtras& extras) const {
  if (messages.empty()) return error("the conversation has no messages: give at least one user message");
  jinja::Array turns;
  for (std::size_t i = 0; i < messages.size(); ++i) {
    const std::string& role = messages[i].role;
    if (role != "system" && role != "user" && role != "assistant" && role != "tool") {
      return error("message " + std::to_string(i) + " has role \"" + role +
                   "\": the roles are system, user, assistant and tool");
    }
    turns.push_back(message_value(messages[i]));
  }
  jinja::Object variables;
  variables.set("messages", jinja::Value(std::move(turns)));
  variables.set("add_generation_prompt", add_generation_prompt);
  variables.set("bos_token", bos_text_);
  variables.set("eos_token", eos_text_);
  variables.set("tools", jinja::None{});
  variables.set("documents", jinja::None{});
  if (auto problem = add_extras(extras, variables)) return *problem;
  jinja::RenderOptions options;
  options.now_unix_s = now_unix_s;
  auto rendered = compiled_.render(variables, options);
  if (auto* problem = std::get_if<jinja::TemplateError>(&rendered)) {
    if (problem->raised) return error("the model's chat template refuses this conversation: " + problem->message);
    return error("the model's chat template failed on this conversation: " + problem->message);
  }
  return std::get<std::string>(std::move(rendered));
}

std::vector<std::int32_t> ChatTemplate::end_of_turn_tokens(const Vocabulary& vocabulary) const {
  std::vector<std::int32_t> ids;
  for (std::size_t id = 0; id < vocabulary.tokens.size(); ++id) {
    const std::string& text = vocabulary.tokens[id];
    if (std::find(kEndOfTurnTexts.begin(), kEndOfTurnTexts.end(), text) != kEndOfTurnTexts.end() &&
        source_.find(text) != std::string::npos) {
      ids.push_back(static_cast<std::int32_t>(id));
    }
  }
  for (std::int32_t id : {vocabulary.eos, vocabulary.eot})
    if (id >= 0) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

std::variant<ChatTemplate, ChatTemplateError> chat_template_for(const Vocabulary& vocabulary,
                                                                std::string_view override_source) {
  std::string_view source = override_source.empty() ? std::string_view(vocabulary.chat_template) : override_source;
  if (source.find_first_not_of(" \t\r\n") == std::string_view::npos) {
    return error("the model has no chat template (tokenizer.chat_template is empty): start the server with "
                 "--chat-template FILE, or send a prompt instead of messages");
  }
  // A vocabulary without BOS or EOS gives "" (transformers leaves the variable undefined, which prints so).
  return ChatTemplate::make(source, token_text(vocabulary, vocabulary.bos), token_text(vocabulary, vocabulary.eos));
}

}  // namespace mqlm::model
