// Tokens into statements (the grammar and operator precedence of jinja2's parser). Filter and
// test names are checked when they run, as jinja2 3 does for those in conditional code (a
// template may name a filter jinja2 lacks in a branch it never takes). Nesting deeper than 128
// levels (of expressions or of blocks) is an error, not a deep recursion.
#pragma once

#include <variant>
#include <vector>

#include "model/chat/jinja/ast.hpp"
#include "model/chat/jinja/lexer.hpp"

namespace mqlm::model::jinja {

std::variant<Body, TemplateSyntaxError> parse(const std::vector<Token>& tokens);

}  // namespace mqlm::model::jinja
