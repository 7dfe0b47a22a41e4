// Renders a batch of (template file, context) cases with mqlm's interpreter, for the conformance
// test (conformance_test.py), which renders the same with Python's jinja2 and compares.
// Input (stdin): {"now": unix seconds, "cases": [{"template": path, "context": {...}}, ...]}.
// Output (stdout): one result per case: {"ok": true, "text": ...} or {"ok": false, "error": ...}.
#include <fstream>
#include <iostream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "model/chat/jinja/json_input.hpp"
#include "model/chat/jinja/template.hpp"

namespace jinja = mqlm::model::jinja;
using nlohmann::ordered_json;

namespace {

ordered_json render_case(const ordered_json& entry, const jinja::RenderOptions& options) {
  std::ifstream file(entry.at("template").get<std::string>(), std::ios::binary);
  std::stringstream source;
  source << file.rdbuf();
  auto parsed = jinja::Template::parse(source.str());
  if (auto* error = std::get_if<jinja::TemplateError>(&parsed)) return {{"ok", false}, {"error", error->message}};
  auto context = jinja::value_from_json(entry.at("context"));
  if (auto* error = std::get_if<jinja::JsonInputError>(&context)) return {{"ok", false}, {"error", error->message}};
  auto rendered = std::get<jinja::Template>(parsed).render(std::get<jinja::Value>(context).as_object(), options);
  if (auto* error = std::get_if<jinja::TemplateError>(&rendered)) return {{"ok", false}, {"error", error->message}};
  return {{"ok", true}, {"text", std::get<std::string>(rendered)}};
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
