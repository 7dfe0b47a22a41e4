// The first pass over a template: text and tags into tokens, with jinja2's whitespace rules as
// transformers sets them (trim_blocks and lstrip_blocks on, the trailing newline dropped):
// - {%- / {{- / {#- strip all whitespace before the tag, -%} / -}} / -#} all after it;
// - trim_blocks: the newline right after a block or comment tag goes (not after +%});
// - lstrip_blocks: spaces and tabs from the start of a line to a block or comment tag go (not
//   before {%+).
// Newlines are normalised to "\n" first. Errors carry the line.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace mqlm::model::jinja {

enum class TokenKind : std::uint8_t {
  text,           // template text, printed as is
  variable_begin, // {{
  variable_end,   // }}
  block_begin,    // {%
  block_end,      // %}
  name,           // an identifier or keyword
  string,         // a string literal, escapes resolved
  integer,
  floating,
  op,             // an operator or punctuation: + - * / // % ** ~ == != < <= > >= = . : | , ( ) [ ] { }
  end,            // the end of the template
};

struct Token {
  TokenKind kind;
  std::string text;
  int line = 1;
};

struct TemplateSyntaxError {
  std::string message;  // what is wrong, with the line
};

std::variant<std::vector<Token>, TemplateSyntaxError> tokenize(std::string_view source);

}  // namespace mqlm::model::jinja
