// Renders a batch of (template file, context) cases with mqlm's interpreter, for the conformance
// test (conformance_test.py), which renders the same with Python's jinja2 and compares.
// Input (stdin): {"now": unix seconds, "cases": [case, ...]}, each case {"template": path} and one of
//   "context": {...}: the template's variables, given to the interpreter as they are;
//   "chat": {"messages", "tools"?, "kwargs"?, "add_generation_prompt"}: a request as the server
//     takes it (messages in OpenAI's shape, tool calls' arguments as JSON text), rendered by
//     model::ChatTemplate as the server renders it, with bos_token <s> and eos_token </s>.
// Output (stdout): one result per case: {"ok": true, "text": ...} or {"ok": false, "error": ...}.
#include <fstream>
#include <iostream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "model/chat/chat_template.hpp"
#include "model/chat/jinja/json_input.hpp"
#include "model/chat/jinja/template.hpp"

namespace jinja = mqlm::model::jinja;
namespace model = mqlm::model;
using nlohmann::ordered_json;

namespace {

ordered_json failed(const std::string& message) { return {{"ok", false}, {"error", message}}; }

ordered_json render_context(const std::string& source, const ordered_json& context,
                            const jinja::RenderOptions& options) {
  auto parsed = jinja::Template::parse(source);
  if (auto* error = std::get_if<jinja::TemplateError>(&parsed)) return failed(error->message);
  auto variables = jinja::value_from_json(context);
  if (auto* error = std::get_if<jinja::JsonInputError>(&variables)) return failed(error->message);
  auto rendered = std::get<jinja::Template>(parsed).render(std::get<jinja::Value>(variables).as_object(), options);
  if (auto* error = std::get_if<jinja::TemplateError>(&rendered)) return failed(error->message);
  return {{"ok", true}, {"text", std::get<std::string>(rendered)}};
}

// A message in OpenAI's shape as the front ends read it into a chat turn.
model::ChatMessage chat_message(const ordered_json& message) {
  model::ChatMessage turn;
  turn.role = message.at("role").get<std::string>();
  const auto content = message.find("content");
  turn.has_content = content != message.end() && !content->is_null();
  if (turn.has_content) turn.content = content->get<std::string>();
  turn.tool_call_id = message.value("tool_call_id", "");
  turn.name = message.value("name", "");
  for (const auto& call : message.value("tool_calls", ordered_json::array())) {
    const ordered_json& function = call.at("function");
    const ordered_json& arguments = function.at("arguments");
    turn.tool_calls.push_back({call.at("id").get<std::string>(), function.at("name").get<std::string>(),
                               arguments.is_string() ? arguments.get<std::string>() : arguments.dump()});
  }
  return turn;
}

ordered_json render_chat(const std::string& source, const ordered_json& chat, std::int64_t now) {
  auto made = model::ChatTemplate::make(source, "<s>", "</s>");
  if (auto* error = std::get_if<model::ChatTemplateError>(&made)) return failed(error->message);
  std::vector<model::ChatMessage> messages;
  for (const auto& message : chat.at("messages")) messages.push_back(chat_message(message));
  model::ChatExtras extras;
  if (chat.contains("tools")) extras.tools = chat["tools"].dump();
  if (chat.contains("kwargs")) extras.kwargs = chat["kwargs"].dump();
  auto rendered = std::get<model::ChatTemplate>(made).render(messages, chat.at("add_generation_prompt").get<bool>(),
                                                             now, extras);
  if (auto* error = std::get_if<model::ChatTemplateError>(&rendered)) return failed(error->message);
  return {{"ok", true}, {"text", std::get<std::string>(rendered)}};
}

ordered_json render_case(const ordered_json& entry, const jinja::RenderOptions& options) {
  std::ifstream file(entry.at("template").get<std::string>(), std::ios::binary);
  std::stringstream source;
  source << file.rdbuf();
  if (entry.contains("chat")) return render_chat(source.str(), entry["chat"], options.now_unix_s);
  return render_context(source.str(), entry.at("context"), options);
}

}  // namespace

int main() {
  ordered_json input = ordered_json::parse(std::cin);
  jinja::RenderOptions options;
  options.now_unix_s = input.at("now").get<std::int64_t>();
  ordered_json results = ordered_json::array();
  for (const auto& entry : input.at("cases")) results.push_back(render_case(entry, options));
  std::cout << results.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  return 0;
}
