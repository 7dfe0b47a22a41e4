// A parsed template: statements over expressions, as the parser makes them and the interpreter
// walks them. One node type each for expressions and statements; which fields a node uses
// depends on its kind (said beside each).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "model/chat/jinja/value.hpp"

namespace mqlm::model::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

enum class ExprKind : std::uint8_t {
  constant,     // value
  name,         // name
  list,         // children: the items
  tuple,        // children: the items
  dict,         // children: key, value, key, value, ...
  attribute,    // children[0].name
  item,         // children[0][children[1]]
  slice,        // children[0][children[1]:children[2]:children[3]] (null where left out)
  call,         // children[0](children[1..], keywords)
  filter,       // children[0] | name(children[1..], keywords); children[0] null in a filter block
  test,         // children[0] is name(children[1..]); negated for "is not"
  unary,        // name ("not", "-", "+") children[0]
  binary,       // children[0] name children[1]: + - * / // % ** ~ and or
  compare,      // children[0] ops[0] children[1] ops[1] children[2] ...: == != < <= > >= in notin
  conditional,  // children[1] if children[0] else children[2] (null: undefined)
};

struct Expr {
  ExprKind kind;
  int line = 0;
  Value value;
  std::string name;
  std::vector<ExprPtr> children;
  std::vector<std::pair<std::string, ExprPtr>> keywords;
  std::vector<std::string> ops;
  bool negated = false;
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

enum class StmtKind : std::uint8_t {
  text,          // text
  output,        // {{ expr }}
  if_,           // branches: (condition, body), the else's condition null
  for_,          // for targets in expr (if condition): body, else_body
  set,           // set target = expr (target: a name, a tuple of names, or ns.attribute)
  set_block,     // set targets[0] | filters: body
  macro,         // macro name(params): body
  call_block,    // call(params) expr: body (the body is the macro `caller`)
  filter_block,  // filter filters: body
  loop_control,  // break (name "break") or continue
  scope,         // a body rendered in place ({% generation %})
};

struct Param {
  std::string name;
  ExprPtr default_value;  // null: none given
};

struct Stmt {
  StmtKind kind;
  int line = 0;
  std::string text;  // text; macro and loop-control names
  ExprPtr expr;
  ExprPtr target;
  ExprPtr condition;
  std::vector<std::pair<ExprPtr, Body>> branches;
  std::vector<ExprPtr> filters;  // filter expressions with a null operand
  std::vector<Param> params;
  Body body;
  Body else_body;
};

struct TemplateSyntaxError;

}  // namespace mqlm::model::jinja
