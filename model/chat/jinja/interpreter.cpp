#include "model/chat/jinja/interpreter.hpp"

#include "model/chat/jinja/builtins.hpp"
#include "model/chat/jinja/lexer.hpp"
#include "model/chat/jinja/parser.hpp"

namespace mqlm::model::jinja {

namespace {

std::string megabytes(std::size_t bytes) { return std::to_string(bytes >> 20) + " MiB"; }

constexpr std::size_t kMaxNesting = 1500;  // a few hundred KiB of stack

// The loop variable of one iteration.
Value loop_object(const Array& items, std::size_t i) {
  const auto n = static_cast<std::int64_t>(items.size());
  const auto index = static_cast<std::int64_t>(i);
  Object loop;
  loop.set("index", index + 1);
  loop.set("index0", index);
  loop.set("revindex", n - index);
  loop.set("revindex0", n - index - 1);
  loop.set("first", i == 0);
  loop.set("last", index == n - 1);
  loop.set("length", n);
  loop.set("depth", std::int64_t{1});
  loop.set("depth0", std::int64_t{0});
  loop.set("previtem", i > 0 ? items[i - 1] : Value(Undefined{"there is no previous item"}));
  loop.set("nextitem", index + 1 < n ? items[i + 1] : Value(Undefined{"there is no next item"}));
  loop.set("cycle", Value::make_callable("cycle", [i](Interpreter& in, CallArgs& args) {
    if (args.positional.empty()) in.fail("no items for cycling given");
    return args.positional[i % args.positional.size()];
  }));
  return loop;
}

}  // namespace

Interpreter::Interpreter(const RenderOptions& options, const Object& variables) : options_(options) {
  auto globals = std::make_shared<Frame>();
  const Object builtins = builtin_globals();
  for (const auto& [name, value] : builtins.entries()) globals->vars[name.as_string()] = value;
  auto context = std::make_shared<Frame>(Frame{{}, globals});
  for (const auto& [name, value] : variables.entries()) {
    if (name.is_string()) context->vars[name.as_string()] = value;
  }
  frame_ = std::make_shared<Frame>(Frame{{}, context});
}

std::string Interpreter::run(const Body& body) {
  std::string out;
  out_ = &out;
  if (exec(body) != Flow::next) fail("break or continue outside a for loop");
  return out;
}

void Interpreter::fail(const std::string& what) const {
  throw TemplateFailure("line " + std::to_string(line_) + ": " + what);
}

void Interpreter::step() {
  if (++steps_ > options_.limits.max_steps) {
    fail("the template took more than " + std::to_string(options_.limits.max_steps) +
         " steps (loop iterations and expressions): it does not finish on this input");
  }
}

void Interpreter::charge(std::size_t bytes) {
  string_bytes_ += bytes;
  if (string_bytes_ > options_.limits.max_string_bytes) {
    fail("the template made more than " + megabytes(options_.limits.max_string_bytes) + " of strings");
  }
}

Value Interpreter::make_string(std::string text) {
  charge(text.size());
  return Value(std::move(text));
}

void Interpreter::write(const std::string& text) {
  charge(text.size());
  if (out_ == nullptr) return;
  out_->append(text);
  if (out_->size() > options_.limits.max_output_bytes) {
    fail("the rendered text is longer than " + megabytes(options_.limits.max_output_bytes));
  }
}

Value Interpreter::call(const Value& callee, CallArgs& args) {
  if (callee.is_callable()) return callee.as_callable().call(*this, args);
  if (callee.is_undefined()) fail_undefined(*this, callee);
  fail("'" + callee.type_name() + "' object is not callable");
}

Value Interpreter::lookup(const std::string& name) const {
  for (const Frame* frame = frame_.get(); frame != nullptr; frame = frame->parent.get()) {
    auto it = frame->vars.find(name);
    if (it != frame->vars.end()) return it->second;
  }
  return Undefined{"'" + name + "' is undefined"};
}

// ---- statements ----

Interpreter::Flow Interpreter::exec(const Body& body) {
  for (const auto& stmt : body) {
    Flow flow = exec(*stmt);
    if (flow != Flow::next) return flow;
  }
  return Flow::next;
}

Interpreter::Nested::Nested(Interpreter& interpreter) : in(interpreter) {
  if (++in.nesting_ > kMaxNesting) {
    --in.nesting_;
    in.fail("the template nests more than " + std::to_string(kMaxNesting) + " blocks and expressions deep as it runs");
  }
}

Interpreter::Flow Interpreter::exec(const Stmt& stmt) {
  Nested nested(*this);
  step();
  line_ = stmt.line;
  switch (stmt.kind) {
    case StmtKind::text: write(stmt.text); break;
    case StmtKind::output: write(python_str(eval(*stmt.expr))); break;
    case StmtKind::if_:
      for (const auto& [condition, body] : stmt.branches) {
        if (!condition || eval(*condition).truthy()) return exec(body);
      }
      break;
    case StmtKind::for_: return exec_for(stmt);
    case StmtKind::set: assign(*stmt.target, eval(*stmt.expr)); break;
    case StmtKind::set_block: assign(*stmt.target, apply_filters(stmt.filters, make_string(capture(stmt.body)))); break;
    case StmtKind::macro: frame_->vars[stmt.text] = make_macro(stmt, stmt.text); break;
    case StmtKind::call_block: exec_call_block(stmt); break;
    case StmtKind::filter_block: write(python_str(apply_filters(stmt.filters, make_string(capture(stmt.body))))); break;
    case StmtKind::loop_control: return stmt.text == "break" ? Flow::break_loop : Flow::continue_loop;
    case StmtKind::scope: return exec(stmt.body);
  }
  return Flow::next;
}

Interpreter::Flow Interpreter::exec_for(const Stmt& stmt) {
  Array items = iterate(*this, eval(*stmt.expr));
  const std::shared_ptr<Frame> outer = frame_;
  if (stmt.condition) {
    Array kept;
    for (Value& item : items) {
      step();
      frame_ = std::make_shared<Frame>(Frame{{}, outer});
      assign(*stmt.target, item);
      if (eval(*stmt.condition).truthy()) kept.push_back(std::move(item));
    }
    items = std::move(kept);
  }
  for (std::size_t i = 0; i < items.size(); ++i) {
    step();
    frame_ = std::make_shared<Frame>(Frame{{}, outer});
    frame_->vars["loop"] = loop_object(items, i);
    assign(*stmt.target, items[i]);
    Flow flow = exec(stmt.body);
    frame_ = outer;
    if (flow == Flow::break_loop) break;
  }
  frame_ = outer;
  if (items.empty() && !stmt.else_body.empty()) {
    frame_ = std::make_shared<Frame>(Frame{{}, outer});
    Flow flow = exec(stmt.else_body);
    frame_ = outer;
    return flow;
  }
  return Flow::next;
}

void Interpreter::assign(const Expr& target, Value value) {
  if (target.kind == ExprKind::name) {
    frame_->vars[target.name] = std::move(value);
    return;
  }
  if (target.kind == ExprKind::attribute) {
    Value object = lookup(target.children[0]->name);
    if (!object.is_namespace()) fail("cannot assign attribute on non-namespace object");
    if (value.holds_namespace()) fail("a namespace cannot hold a namespace here");
    object.as_namespace().set(target.name, std::move(value));
    return;
  }
  Array items = iterate(*this, value);
  const std::size_t expected = target.children.size();
  if (items.size() != expected) {
    fail(items.size() > expected ? "too many values to unpack (expected " + std::to_string(expected) + ")"
                                 : "not enough values to unpack (expected " + std::to_string(expected) + ", got " +
                                       std::to_string(items.size()) + ")");
  }
  for (std::size_t i = 0; i < expected; ++i) assign(*target.children[i], std::move(items[i]));
}

std::string Interpreter::capture(const Body& body) { return capture_in(frame_, body); }

std::string Interpreter::capture_in(std::shared_ptr<Frame> frame, const Body& body) {
  std::string text;
  std::string* saved_out = out_;
  std::shared_ptr<Frame> saved_frame = std::move(frame_);
  out_ = &text;
  frame_ = std::move(frame);
  Flow flow = exec(body);
  out_ = saved_out;
  frame_ = std::move(saved_frame);
  if (flow != Flow::next) fail("break or continue outside a for loop");
  return text;
}

Value Interpreter::apply_filters(const std::vector<ExprPtr>& filters, Value value) {
  for (const auto& filter : filters) {
    CallArgs args = eval_args(*filter, 1);
    value = apply_filter(*this, filter->name, value, args);
  }
  return value;
}

// A macro sees its defining scope as it is when called (held weakly: a scope holding its own
// macros would otherwise never be freed).
Value Interpreter::make_macro(const Stmt& stmt, const std::string& name) {
  std::weak_ptr<Frame> scope = frame_;
  const Stmt* definition = &stmt;
  return Value::make_callable(name, [definition, scope](Interpreter& in, CallArgs& args) {
    std::shared_ptr<Frame> closure = scope.lock();
    if (!closure) in.fail("macro '" + definition->text + "' is called after its scope ended");
    Value caller;
    for (auto it = args.keyword.begin(); it != args.keyword.end(); ++it) {
      if (it->first != "caller") continue;
      caller = std::move(it->second);
      args.keyword.erase(it);
      break;
    }
    return in.call_macro(*definition, closure, args, caller);
  });
}

Value Interpreter::call_macro(const Stmt& stmt, const std::shared_ptr<Frame>& closure, CallArgs& args,
                              const Value& caller) {
  const std::string& name = stmt.text;
  if (args.positional.size() > stmt.params.size()) {
    fail("macro '" + name + "' takes not more than " + std::to_string(stmt.params.size()) + " argument(s)");
  }
  if (call_depth_ >= options_.limits.max_call_depth) {
    fail("macros call each other more than " + std::to_string(options_.limits.max_call_depth) + " deep");
  }
  auto frame = std::make_shared<Frame>(Frame{{}, closure});
  std::vector<bool> given(stmt.params.size(), false);
  for (std::size_t i = 0; i < args.positional.size(); ++i) {
    frame->vars[stmt.params[i].name] = std::move(args.positional[i]);
    given[i] = true;
  }
  for (auto& [key, value] : args.keyword) {
    std::size_t i = 0;
    while (i < stmt.params.size() && stmt.params[i].name != key) ++i;
    if (i == stmt.params.size()) fail("macro '" + name + "' takes no keyword argument '" + key + "'");
    if (given[i]) fail("macro '" + name + "' got multiple values for argument '" + key + "'");
    frame->vars[key] = std::move(value);
    given[i] = true;
  }
  if (!caller.is_undefined()) frame->vars["caller"] = caller;
  ++call_depth_;
  std::shared_ptr<Frame> saved = frame_;
  frame_ = frame;
  for (std::size_t i = 0; i < stmt.params.size(); ++i) {
    if (given[i]) continue;
    const Param& param = stmt.params[i];
    frame->vars[param.name] = param.default_value
                                  ? eval(*param.default_value)
                                  : Value(Undefined{"parameter '" + param.name + "' was not provided"});
  }
  frame_ = saved;
  std::string text = capture_in(frame, stmt.body);
  --call_depth_;
  return make_string(std::move(text));
}

void Interpreter::exec_call_block(const Stmt& stmt) {
  Value caller = make_macro(stmt, "caller");
  const Expr& call_expr = *stmt.expr;
  Value callee = eval(*call_expr.children[0]);
  CallArgs args = eval_args(call_expr, 1);
  args.keyword.emplace_back("caller", caller);
  write(python_str(call(callee, args)));
}

// ---- expressions ----

CallArgs Interpreter::eval_args(const Expr& expr, std::size_t first) {
  CallArgs args;
  for (std::size_t i = first; i < expr.children.size(); ++i) args.positional.push_back(eval(*expr.children[i]));
  for (const auto& [key, value] : expr.keywords) args.keyword.emplace_back(key, eval(*value));
  return args;
}

Value Interpreter::eval(const Expr& expr) {
  Nested nested(*this);
  step();
  line_ = expr.line;
  switch (expr.kind) {
    case ExprKind::constant: return expr.value;
    case ExprKind::name: return lookup(expr.name);
    case ExprKind::list:
    case ExprKind::tuple: {
      Array items;
      for (const auto& child : expr.children) items.push_back(eval(*child));
      return Value(std::move(items), expr.kind == ExprKind::tuple ? Sequence::tuple : Sequence::list);
    }
    case ExprKind::dict: {
      Object object;
      for (std::size_t i = 0; i + 1 < expr.children.size(); i += 2) {
        Value key = eval(*expr.children[i]);
        if (!key.is_string() && !key.is_number() && !key.is_none()) fail("unhashable type: '" + key.type_name() + "'");
        object.set(std::move(key), eval(*expr.children[i + 1]));
      }
      return object;
    }
    case ExprKind::attribute: return get_attribute(*this, eval(*expr.children[0]), expr.name);
    case ExprKind::item: {
      Value object = eval(*expr.children[0]);
      return get_item(*this, object, eval(*expr.children[1]));
    }
    case ExprKind::slice: return eval_slice(expr);
    case ExprKind::call: return eval_call(expr);
    case ExprKind::filter: {
      Value operand = eval(*expr.children[0]);
      CallArgs args = eval_args(expr, 1);
      return apply_filter(*this, expr.name, operand, args);
    }
    case ExprKind::test: {
      Value operand = eval(*expr.children[0]);
      CallArgs args = eval_args(expr, 1);
      return apply_test(*this, expr.name, operand, args) != expr.negated;
    }
    case ExprKind::unary: return eval_unary(expr);
    case ExprKind::binary: return eval_binary(expr);
    case ExprKind::compare: return eval_compare(expr);
    case ExprKind::conditional:
      if (eval(*expr.children[0]).truthy()) return eval(*expr.children[1]);
      return expr.children[2] ? eval(*expr.children[2]) : Value(Undefined{"the condition was false and there is no else"});
  }
  fail("unknown expression");
}

Value Interpreter::eval_slice(const Expr& expr) {
  Value object = eval(*expr.children[0]);
  Value parts[3];
  for (std::size_t i = 0; i < 3; ++i)
    if (expr.children[i + 1]) parts[i] = eval(*expr.children[i + 1]);
  return get_slice(*this, object, parts[0], parts[1], parts[2]);
}

Value Interpreter::eval_call(const Expr& expr) {
  Value callee = eval(*expr.children[0]);
  CallArgs args = eval_args(expr, 1);
  line_ = expr.line;
  return call(callee, args);
}

Value Interpreter::eval_unary(const Expr& expr) {
  Value operand = eval(*expr.children[0]);
  if (expr.name == "not") return !operand.truthy();
  if (operand.is_undefined()) fail_undefined(*this, operand);
  if (!operand.is_number()) fail("bad operand type for unary " + expr.name + ": '" + operand.type_name() + "'");
  if (expr.name == "+") return operand.is_float() ? Value(operand.as_double()) : Value(operand.as_int());
  return arithmetic(*this, "-", Value(std::int64_t{0}), operand);
}

Value Interpreter::eval_binary(const Expr& expr) {
  Value left = eval(*expr.children[0]);
  if (expr.name == "and") return left.truthy() ? eval(*expr.children[1]) : left;
  if (expr.name == "or") return left.truthy() ? left : eval(*expr.children[1]);
  Value right = eval(*expr.children[1]);
  line_ = expr.line;
  if (expr.name == "~") return make_string(python_str(left) + python_str(right));
  return arithmetic(*this, expr.name, left, right);
}

Value Interpreter::eval_compare(const Expr& expr) {
  Value left = eval(*expr.children[0]);
  for (std::size_t i = 0; i < expr.ops.size(); ++i) {
    Value right = eval(*expr.children[i + 1]);
    line_ = expr.line;
    if (!compare(*this, expr.ops[i], left, right)) return false;
    left = std::move(right);
  }
  return true;
}

// ---- Template ----

std::variant<Template, TemplateError> Template::parse(std::string_view source) {
  auto tokens = tokenize(source);
  if (auto* error = std::get_if<TemplateSyntaxError>(&tokens)) return TemplateError{error->message};
  auto body = jinja::parse(std::get<std::vector<Token>>(tokens));
  if (auto* error = std::get_if<TemplateSyntaxError>(&body)) return TemplateError{error->message};
  return Template(std::make_shared<const Body>(std::get<Body>(std::move(body))));
}

std::variant<std::string, TemplateError> Template::render(const Object& variables, const RenderOptions& options) const {
  try {
    Interpreter interpreter(options, variables);
    return interpreter.run(*body_);
  } catch (const TemplateRaised& raised) {
    return TemplateError{raised.what(), true};
  } catch (const TemplateFailure& failure) {
    return TemplateError{failure.what()};
  }
}

}  // namespace mqlm::model::jinja
