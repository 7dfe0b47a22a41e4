// The tree-walking interpreter behind Template::render, and what the built-in filters, tests and
// methods (builtins.hpp) call back into: failing, counting work against the limits, calling a
// value. Scopes follow jinja2's: a for loop's body and a macro's get their own each time
// (a set inside does not leak out), if and the template's top level do not.
#pragma once

#include <memory>
#include <string>
#include <unordered_map>

#include "model/chat/jinja/ast.hpp"
#include "model/chat/jinja/template.hpp"

namespace mqlm::model::jinja {

class Interpreter {
 public:
  Interpreter(const RenderOptions& options, const Object& variables);

  std::string run(const Body& body);  // throws TemplateFailure

  [[noreturn]] void fail(const std::string& what) const;
  void step();                       // one unit of work
  void charge(std::size_t bytes);    // string bytes made
  Value make_string(std::string text);
  Value call(const Value& callee, CallArgs& args);
  const RenderOptions& options() const { return options_; }

 private:
  struct Frame {
    std::unordered_map<std::string, Value> vars;
    std::shared_ptr<Frame> parent;
  };
  enum class Flow { next, break_loop, continue_loop };
  // Bounds the C++ stack a template can take (macros recursing through deeply nested blocks).
  struct Nested {
    explicit Nested(Interpreter& in);
    ~Nested() { --in.nesting_; }
    Interpreter& in;
  };

  Flow exec(const Body& body);
  Flow exec(const Stmt& stmt);
  Flow exec_for(const Stmt& stmt);
  void exec_set(const Stmt& stmt);
  void exec_macro(const Stmt& stmt);
  void exec_call_block(const Stmt& stmt);
  std::string capture(const Body& body);
  std::string capture_in(std::shared_ptr<Frame> frame, const Body& body);
  Value apply_filters(const std::vector<ExprPtr>& filters, Value value);
  void write(const std::string& text);
  void assign(const Expr& target, Value value);
  Value make_macro(const Stmt& stmt, const std::string& name);
  Value call_macro(const Stmt& stmt, const std::shared_ptr<Frame>& closure, CallArgs& args, const Value& caller);

  Value eval(const Expr& expr);
  Value eval_name(const Expr& expr);
  Value eval_call(const Expr& expr);
  Value eval_compare(const Expr& expr);
  Value eval_binary(const Expr& expr);
  Value eval_unary(const Expr& expr);
  Value eval_slice(const Expr& expr);
  CallArgs eval_args(const Expr& expr, std::size_t first);
  Value lookup(const std::string& name) const;

  const RenderOptions& options_;
  std::shared_ptr<Frame> frame_;
  std::string* out_ = nullptr;
  std::size_t output_bytes_ = 0;
  std::uint64_t steps_ = 0;
  std::size_t string_bytes_ = 0;
  std::size_t call_depth_ = 0;
  std::size_t nesting_ = 0;  // statements and expressions being run, one inside another
  int line_ = 0;  // of the node being run, for errors
};

}  // namespace mqlm::model::jinja
