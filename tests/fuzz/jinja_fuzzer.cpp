// libFuzzer target: the chat template interpreter (model/chat/jinja) on hostile templates, as a
// GGUF file or --chat-template may carry them. The input is the template's source; it renders
// over a conversation with a system prompt, a tool call and a tool result, and tools.
// Contract: parsing and rendering end (under the limits below) with a value or an error that
// says something, and the output never exceeds its limit.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <variant>

#include <nlohmann/json.hpp>

#include "model/chat/jinja/json_input.hpp"
#include "model/chat/jinja/template.hpp"
#include "tests/fuzz/fuzz_support.hpp"

namespace {

namespace jinja = mqlm::model::jinja;

const jinja::Object& variables() {
  static const jinja::Object object = [] {
    auto context = nlohmann::ordered_json::parse(R"({
      "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "call00001", "type": "function",
          "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "tool_call_id": "call00001", "content": "21 C"}],
      "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
        "properties": {"city": {"type": "string"}}, "required": ["city"]}}}],
      "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>"})");
    return std::get<jinja::Value>(jinja::value_from_json(context)).as_object();
  }();
  return object;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view source(reinterpret_cast<const char*>(data), size);
  auto parsed = jinja::Template::parse(source);
  if (auto* error = std::get_if<jinja::TemplateError>(&parsed)) {
    if (error->message.empty()) mqlm::fuzz::contract_broken("jinja", "a parse error without a message");
    return 0;
  }
  jinja::RenderOptions options;  // small enough for libFuzzer's time and memory limits
  options.limits.max_steps = 200'000;
  options.limits.max_output_bytes = std::size_t{1} << 20;
  options.limits.max_string_bytes = std::size_t{32} << 20;
  auto rendered = std::get<jinja::Template>(parsed).render(variables(), options);
  if (auto* text = std::get_if<std::string>(&rendered)) {
    if (text->size() > options.limits.max_output_bytes) mqlm::fuzz::contract_broken("jinja", "output over its limit");
  } else if (std::get<jinja::TemplateError>(rendered).message.empty() && !std::get<jinja::TemplateError>(rendered).raised) {
    mqlm::fuzz::contract_broken("jinja", "a render error without a message");
  }
  return 0;
}
