// A Jinja2 template as Hugging Face chat templates are written, parsed once and rendered with
// transformers' settings: trim_blocks and lstrip_blocks, the loopcontrols extension, jinja2's
// immutable sandbox (lists and dicts cannot be changed; append, pop, update raise), its default
// Undefined (prints empty, is false, raises on attribute access, arithmetic and calls),
// transformers' tojson (ensure_ascii false, json.dumps's separators), and the globals
// raise_exception(message), strftime_now(format), range, namespace and dict.
//
// Rendering is bounded, since a template comes from a model file or a flag and its input from
// clients: output size, interpreter steps (loop iterations and expression evaluations), macro
// call depth, value nesting and the bytes of all strings made are limited, and reaching a limit
// is an error naming it, as is anything the template does wrong.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <variant>

#include "model/chat/jinja/ast.hpp"
#include "model/chat/jinja/value.hpp"

namespace mqlm::model::jinja {

struct RenderLimits {
  std::size_t max_output_bytes = std::size_t{16} << 20;
  std::uint64_t max_steps = 20'000'000;          // about a second of the slowest templates' work
  std::size_t max_call_depth = 64;               // macros calling macros
  std::size_t max_string_bytes = std::size_t{512} << 20;  // all strings the render makes, together
};

struct RenderOptions {
  RenderLimits limits;
  std::int64_t now_unix_s = 0;  // the time strftime_now formats, in UTC
};

struct TemplateError {
  std::string message;  // what went wrong and where (line), or the template's own raise_exception
  bool raised = false;  // raise_exception: the template refuses its input
};

class Template {
 public:
  static std::variant<Template, TemplateError> parse(std::string_view source);
  std::variant<std::string, TemplateError> render(const Object& variables, const RenderOptions& options = {}) const;

 private:
  explicit Template(std::shared_ptr<const Body> body) : body_(std::move(body)) {}
  std::shared_ptr<const Body> body_;
};

}  // namespace mqlm::model::jinja
