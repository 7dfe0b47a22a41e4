#include "model/chat/jinja/parser.hpp"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <initializer_list>
#include <stdexcept>


namespace mqlm::model::jinja {

namespace {

constexpr int kMaxNesting = 128;

struct ParseFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class Parser {
 public:
  explicit Parser(const std::vector<Token>& tokens) : tokens_(tokens) {}

  Body parse_template() {
    Body body = parse_body({});
    if (current().kind != TokenKind::end) fail("unexpected '" + current().text + "'");
    return body;
  }

 private:
  // ---- tokens ----
  const Token& current() const { return tokens_[pos_]; }
  const Token& peek(std::size_t ahead = 1) const { return tokens_[std::min(pos_ + ahead, tokens_.size() - 1)]; }
  void next() {
    if (pos_ + 1 < tokens_.size()) ++pos_;
  }
  bool is(TokenKind kind, std::string_view text) const { return current().kind == kind && current().text == text; }
  bool is_op(std::string_view text) const { return is(TokenKind::op, text); }
  bool is_name(std::string_view text) const { return is(TokenKind::name, text); }
  bool skip_op(std::string_view text) {
    if (!is_op(text)) return false;
    next();
    return true;
  }
  bool skip_name(std::string_view text) {
    if (!is_name(text)) return false;
    next();
    return true;
  }
  [[noreturn]] void fail(const std::string& what) const {
    throw ParseFailure("line " + std::to_string(current().line) + ": " + what);
  }
  std::string describe(const Token& token) const {
    switch (token.kind) {
      case TokenKind::end: return "the end of the template";
      case TokenKind::block_end: return "'%}'";
      case TokenKind::variable_end: return "'}}'";
      case TokenKind::text: return "text";
      default: return "'" + token.text + "'";
    }
  }
  void expect_op(std::string_view text) {
    if (!skip_op(text)) fail("expected '" + std::string(text) + "', found " + describe(current()));
  }
  // An integer token's value (a literal, or an item index written as an attribute: x.0).
  Value integer_value(const Token& token) const {
    std::int64_t value = 0;
    const char* end = token.text.data() + token.text.size();
    if (std::from_chars(token.text.data(), end, value).ec != std::errc()) {
      fail("the integer " + token.text + " does not fit in 64 bits");
    }
    return Value(value);
  }
  std::string expect_name() {
    if (current().kind != TokenKind::name) fail("expected a name, found " + describe(current()));
    std::string name = current().text;
    next();
    return name;
  }
  void expect_block_end() {
    if (current().kind != TokenKind::block_end) fail("expected '%}', found " + describe(current()));
    next();
  }
  ExprPtr node(ExprKind kind) {
    auto expr = std::make_unique<Expr>();
    expr->kind = kind;
    expr->line = current().line;
    return expr;
  }
  struct Nesting {
    explicit Nesting(Parser& p) : parser(p) {
      if (++parser.nesting_ > kMaxNesting) parser.fail("the template nests deeper than " + std::to_string(kMaxNesting) + " levels");
    }
    ~Nesting() { --parser.nesting_; }
    Parser& parser;
  };

  // ---- statements ----
  Body parse_body(std::initializer_list<std::string_view> ends);
  StmtPtr parse_statement();
  StmtPtr parse_if();
  StmtPtr parse_for();
  StmtPtr parse_set();
  StmtPtr parse_macro();
  StmtPtr parse_call_block();
  StmtPtr parse_filter_block();
  std::vector<Param> parse_params();
  Body parse_until_end(std::string_view end);

  // ---- expressions ----
  ExprPtr parse_tuple(bool with_condexpr, bool explicit_parens = false);
  ExprPtr parse_expression(bool with_condexpr = true);
  ExprPtr parse_logical(int level);
  ExprPtr parse_not();
  ExprPtr parse_compare();
  ExprPtr parse_binary(int level);
  ExprPtr parse_unary(bool with_filter);
  ExprPtr parse_primary();
  ExprPtr parse_sequence(ExprKind kind, std::string_view close);
  ExprPtr parse_dict();
  ExprPtr parse_postfix(ExprPtr expr);
  ExprPtr parse_subscript(ExprPtr expr);
  ExprPtr parse_filter_expr(ExprPtr expr);
  ExprPtr parse_filter(ExprPtr operand);
  ExprPtr parse_test(ExprPtr operand);
  void parse_call_args(Expr& call);
  ExprPtr parse_call(ExprPtr callee);
  ExprPtr parse_assign_target(bool with_namespace);

  const std::vector<Token>& tokens_;
  std::size_t pos_ = 0;
  int nesting_ = 0;
};

// Statements up to a block tag named in `ends` (left current, after its {%), or the end.
Body Parser::parse_body(std::initializer_list<std::string_view> ends) {
  Nesting guard(*this);
  Body body;
  while (current().kind != TokenKind::end) {
    const Token& token = current();
    if (token.kind == TokenKind::text) {
      auto stmt = std::make_unique<Stmt>();
      stmt->kind = StmtKind::text;
      stmt->line = token.line;
      stmt->text = token.text;
      body.push_back(std::move(stmt));
      next();
    } else if (token.kind == TokenKind::variable_begin) {
      next();
      auto stmt = std::make_unique<Stmt>();
      stmt->kind = StmtKind::output;
      stmt->line = current().line;
      stmt->expr = parse_tuple(true);
      if (current().kind != TokenKind::variable_end) fail("expected '}}', found " + describe(current()));
      next();
      body.push_back(std::move(stmt));
    } else if (token.kind == TokenKind::block_begin) {
      next();
      if (current().kind == TokenKind::name &&
          std::find(ends.begin(), ends.end(), current().text) != ends.end()) {
        return body;
      }
      body.push_back(parse_statement());
    } else {
      fail("unexpected " + describe(token));
    }
  }
  if (ends.size() > 0) fail("a block is not closed: expected '" + std::string(*ends.begin()) + "' before the end");
  return body;
}

StmtPtr Parser::parse_statement() {
  if (current().kind != TokenKind::name) fail("expected a tag name, found " + describe(current()));
  const std::string tag = current().text;
  if (tag == "if") return parse_if();
  if (tag == "for") return parse_for();
  if (tag == "set") return parse_set();
  if (tag == "macro") return parse_macro();
  if (tag == "call") return parse_call_block();
  if (tag == "filter") return parse_filter_block();
  auto stmt = std::make_unique<Stmt>();
  stmt->line = current().line;
  if (tag == "break" || tag == "continue") {
    next();
    stmt->kind = StmtKind::loop_control;
    stmt->text = tag;
    expect_block_end();
    return stmt;
  }
  if (tag == "generation") {  // transformers' marker of assistant text: rendered as its body
    next();
    expect_block_end();
    stmt->kind = StmtKind::scope;
    stmt->body = parse_until_end("endgeneration");
    return stmt;
  }
  fail("unknown tag '" + tag + "'");
}

Body Parser::parse_until_end(std::string_view end) {
  Body body = parse_body({end});
  next();
  expect_block_end();
  return body;
}

StmtPtr Parser::parse_if() {
  auto stmt = std::make_unique<Stmt>();
  stmt->kind = StmtKind::if_;
  stmt->line = current().line;
  next();
  while (true) {
    ExprPtr condition = parse_tuple(false);
    expect_block_end();
    Body body = parse_body({"elif", "else", "endif"});
    stmt->branches.emplace_back(std::move(condition), std::move(body));
    if (skip_name("elif")) continue;
    if (skip_name("else")) {
      expect_block_end();
      stmt->branches.emplace_back(nullptr, parse_body({"endif"}));
    }
    next();
    expect_block_end();
    return stmt;
  }
}

StmtPtr Parser::parse_for() {
  auto stmt = std::make_unique<Stmt>();
  stmt->kind = StmtKind::for_;
  stmt->line = current().line;
  next();
  stmt->target = parse_assign_target(false);
  if (!skip_name("in")) fail("expected 'in' in the for loop, found " + describe(current()));
  stmt->expr = parse_tuple(false);
  if (skip_name("if")) stmt->condition = parse_expression();
  if (is_name("recursive")) fail("recursive for loops are not supported");
  expect_block_end();
  stmt->body = parse_body({"endfor", "else"});
  if (skip_name("else")) {
    expect_block_end();
    stmt->else_body = parse_body({"endfor"});
  }
  next();
  expect_block_end();
  return stmt;
}

StmtPtr Parser::parse_set() {
  auto stmt = std::make_unique<Stmt>();
  stmt->line = current().line;
  next();
  stmt->target = parse_assign_target(true);
  if (skip_op("=")) {
    stmt->kind = StmtKind::set;
    stmt->expr = parse_tuple(true);
    expect_block_end();
    return stmt;
  }
  if (stmt->target->kind == ExprKind::tuple) fail("a block set assigns one name");
  stmt->kind = StmtKind::set_block;
  while (is_op("|")) stmt->filters.push_back(parse_filter(nullptr));
  expect_block_end();
  stmt->body = parse_until_end("endset");
  return stmt;
}

std::vector<Param> Parser::parse_params() {
  std::vector<Param> params;
  expect_op("(");
  while (!skip_op(")")) {
    if (!params.empty()) expect_op(",");
    if (skip_op(")")) break;
    Param param{expect_name(), nullptr};
    if (skip_op("=")) param.default_value = parse_expression();
    else if (!params.empty() && params.back().default_value) fail("a parameter without a default follows one with");
    params.push_back(std::move(param));
  }
  return params;
}

StmtPtr Parser::parse_macro() {
  auto stmt = std::make_unique<Stmt>();
  stmt->kind = StmtKind::macro;
  stmt->line = current().line;
  next();
  stmt->text = expect_name();
  stmt->params = parse_params();
  expect_block_end();
  stmt->body = parse_until_end("endmacro");
  return stmt;
}

StmtPtr Parser::parse_call_block() {
  auto stmt = std::make_unique<Stmt>();
  stmt->kind = StmtKind::call_block;
  stmt->line = current().line;
  next();
  if (is_op("(")) stmt->params = parse_params();
  stmt->expr = parse_expression();
  if (stmt->expr->kind != ExprKind::call) fail("a call block needs a call");
  expect_block_end();
  stmt->body = parse_until_end("endcall");
  return stmt;
}

StmtPtr Parser::parse_filter_block() {
  auto stmt = std::make_unique<Stmt>();
  stmt->kind = StmtKind::filter_block;
  stmt->line = current().line;
  next();
  stmt->filters.push_back(parse_filter(nullptr));
  while (is_op("|")) stmt->filters.push_back(parse_filter(nullptr));
  expect_block_end();
  stmt->body = parse_until_end("endfilter");
  return stmt;
}

ExprPtr Parser::parse_assign_target(bool with_namespace) {
  auto one = [&]() -> ExprPtr {
    auto target = node(ExprKind::name);
    target->name = expect_name();
    if (with_namespace && is_op(".")) {
      next();
      auto attribute = node(ExprKind::attribute);
      attribute->name = expect_name();
      attribute->children.push_back(std::move(target));
      return attribute;
    }
    return target;
  };
  ExprPtr first = one();
  if (!is_op(",")) return first;
  auto tuple = node(ExprKind::tuple);
  tuple->children.push_back(std::move(first));
  while (skip_op(",")) {
    if (current().kind != TokenKind::name || is_name("in")) break;
    tuple->children.push_back(one());
  }
  for (const auto& item : tuple->children)
    if (item->kind != ExprKind::name) fail("only names can be unpacked into");
  return tuple;
}

// ---- expressions ----

ExprPtr Parser::parse_tuple(bool with_condexpr, bool explicit_parens) {
  const int line = current().line;
  std::vector<ExprPtr> items;
  bool is_tuple = false;
  while (true) {
    if (!items.empty()) {
      if (!skip_op(",")) break;
      is_tuple = true;
    }
    const Token& token = current();
    bool ends = token.kind == TokenKind::variable_end || token.kind == TokenKind::block_end ||
                (token.kind == TokenKind::op && token.text == ")") || (token.kind == TokenKind::name && token.text == "if");
    if (ends && (!items.empty() || explicit_parens)) break;
    items.push_back(parse_expression(with_condexpr));
  }
  if (!is_tuple && items.size() == 1) return std::move(items[0]);
  if (!is_tuple && !explicit_parens) fail("expected an expression, found " + describe(current()));
  auto tuple = node(ExprKind::tuple);
  tuple->line = line;
  tuple->children = std::move(items);
  return tuple;
}

ExprPtr Parser::parse_expression(bool with_condexpr) {
  Nesting guard(*this);
  if (!with_condexpr) return parse_logical(0);
  ExprPtr expr = parse_logical(0);
  while (is_name("if")) {
    next();
    auto conditional = node(ExprKind::conditional);
    conditional->children.push_back(parse_logical(0));
    conditional->children.push_back(std::move(expr));
    conditional->children.push_back(skip_name("else") ? parse_expression() : nullptr);
    expr = std::move(conditional);
  }
  return expr;
}

// "or" (level 0) over "and" (level 1) over "not".
ExprPtr Parser::parse_logical(int level) {
  const char* op = level == 0 ? "or" : "and";
  auto operand = [&] { return level == 0 ? parse_logical(1) : parse_not(); };
  ExprPtr left = operand();
  while (is_name(op)) {
    auto binary = node(ExprKind::binary);
    next();
    binary->name = op;
    binary->children.push_back(std::move(left));
    binary->children.push_back(operand());
    left = std::move(binary);
  }
  return left;
}

ExprPtr Parser::parse_not() {
  if (!is_name("not")) return parse_compare();
  Nesting guard(*this);
  auto unary = node(ExprKind::unary);
  next();
  unary->name = "not";
  unary->children.push_back(parse_not());
  return unary;
}

ExprPtr Parser::parse_compare() {
  ExprPtr first = parse_binary(0);
  auto compare = node(ExprKind::compare);
  compare->children.push_back(std::move(first));
  while (true) {
    const Token& token = current();
    if (token.kind == TokenKind::op &&
        (token.text == "==" || token.text == "!=" || token.text == "<" || token.text == "<=" || token.text == ">" ||
         token.text == ">=")) {
      compare->ops.push_back(token.text);
      next();
    } else if (is_name("in")) {
      compare->ops.push_back("in");
      next();
    } else if (is_name("not") && peek().kind == TokenKind::name && peek().text == "in") {
      compare->ops.push_back("notin");
      next();
      next();
    } else {
      break;
    }
    compare->children.push_back(parse_binary(0));
  }
  if (compare->ops.empty()) return std::move(compare->children[0]);
  return compare;
}

// Levels, loosest first: + -, ~, * / // %, **.
ExprPtr Parser::parse_binary(int level) {
  static const std::vector<std::vector<std::string_view>> kLevels = {{"+", "-"}, {"~"}, {"*", "/", "//", "%"}, {"**"}};
  if (level == static_cast<int>(kLevels.size())) return parse_unary(true);
  ExprPtr left = parse_binary(level + 1);
  while (current().kind == TokenKind::op) {
    const auto& ops = kLevels[static_cast<std::size_t>(level)];
    if (std::find(ops.begin(), ops.end(), current().text) == ops.end()) break;
    auto binary = node(ExprKind::binary);
    binary->name = current().text;
    next();
    binary->children.push_back(std::move(left));
    binary->children.push_back(parse_binary(level + 1));
    left = std::move(binary);
  }
  return left;
}

ExprPtr Parser::parse_unary(bool with_filter) {
  Nesting guard(*this);
  ExprPtr expr;
  if (is_op("-") || is_op("+")) {
    expr = node(ExprKind::unary);
    expr->name = current().text;
    next();
    expr->children.push_back(parse_unary(false));
  } else {
    expr = parse_postfix(parse_primary());
  }
  return with_filter ? parse_filter_expr(std::move(expr)) : std::move(expr);
}

ExprPtr Parser::parse_primary() {
  const Token& token = current();
  auto constant = [&](Value value) {
    auto expr = node(ExprKind::constant);
    expr->value = std::move(value);
    next();
    return expr;
  };
  if (token.kind == TokenKind::name) {
    const std::string& n = token.text;
    if (n == "true" || n == "True") return constant(true);
    if (n == "false" || n == "False") return constant(false);
    if (n == "none" || n == "None") return constant(None{});
    auto expr = node(ExprKind::name);
    expr->name = n;
    next();
    return expr;
  }
  if (token.kind == TokenKind::string) {
    std::string text = token.text;
    auto expr = constant(Value());
    while (current().kind == TokenKind::string) {  // adjacent literals join
      text += current().text;
      next();
    }
    expr->value = Value(std::move(text));
    return expr;
  }
  if (token.kind == TokenKind::integer) {
    return constant(integer_value(token));
  }
  // strtod, not stod: past the double's range Python gives inf (or 0), stod throws.
  if (token.kind == TokenKind::floating) return constant(Value(std::strtod(token.text.c_str(), nullptr)));
  if (skip_op("(")) {
    ExprPtr expr = parse_tuple(true, true);
    expect_op(")");
    return expr;
  }
  if (skip_op("[")) return parse_sequence(ExprKind::list, "]");
  if (skip_op("{")) return parse_dict();
  fail("expected an expression, found " + describe(token));
}

ExprPtr Parser::parse_sequence(ExprKind kind, std::string_view close) {
  auto list = node(kind);
  while (!skip_op(close)) {
    if (!list->children.empty()) expect_op(",");
    if (skip_op(close)) break;
    list->children.push_back(parse_expression());
  }
  return list;
}

ExprPtr Parser::parse_dict() {
  auto dict = node(ExprKind::dict);
  while (!skip_op("}")) {
    if (!dict->children.empty()) expect_op(",");
    if (skip_op("}")) break;
    dict->children.push_back(parse_expression());
    expect_op(":");
    dict->children.push_back(parse_expression());
  }
  return dict;
}

ExprPtr Parser::parse_postfix(ExprPtr expr) {
  while (true) {
    if (is_op(".")) {
      next();
      if (current().kind == TokenKind::integer) {
        auto item = node(ExprKind::item);
        auto index = node(ExprKind::constant);
        index->value = integer_value(current());
        next();
        item->children.push_back(std::move(expr));
        item->children.push_back(std::move(index));
        expr = std::move(item);
        continue;
      }
      auto attribute = node(ExprKind::attribute);
      attribute->name = expect_name();
      attribute->children.push_back(std::move(expr));
      expr = std::move(attribute);
    } else if (is_op("[")) {
      next();
      expr = parse_subscript(std::move(expr));
    } else if (is_op("(")) {
      expr = parse_call(std::move(expr));
    } else {
      return expr;
    }
  }
}

// After '[': an index or a slice [start:stop:step].
ExprPtr Parser::parse_subscript(ExprPtr expr) {
  std::vector<ExprPtr> parts(1);
  bool slice = false;
  auto ends_part = [&] { return is_op(":") || is_op("]"); };
  if (!ends_part()) parts[0] = parse_expression();
  while (parts.size() < 3 && skip_op(":")) {
    slice = true;
    parts.push_back(ends_part() ? nullptr : parse_expression());
  }
  expect_op("]");
  if (!slice) {
    if (!parts[0]) fail("an empty subscript");
    auto item = node(ExprKind::item);
    item->children.push_back(std::move(expr));
    item->children.push_back(std::move(parts[0]));
    return item;
  }
  auto result = node(ExprKind::slice);
  result->children.push_back(std::move(expr));
  parts.resize(3);
  for (auto& part : parts) result->children.push_back(std::move(part));
  return result;
}

ExprPtr Parser::parse_filter_expr(ExprPtr expr) {
  while (true) {
    if (is_op("|")) {
      expr = parse_filter(std::move(expr));
    } else if (is_name("is")) {
      expr = parse_test(std::move(expr));
    } else if (is_op("(")) {
      expr = parse_call(std::move(expr));
    } else {
      return expr;
    }
  }
}

// At '|' (or a filter block's first name): name(args).
ExprPtr Parser::parse_filter(ExprPtr operand) {
  skip_op("|");
  auto filter = node(ExprKind::filter);
  filter->name = expect_name();
  while (skip_op(".")) filter->name += "." + expect_name();
  filter->children.push_back(std::move(operand));
  if (is_op("(")) parse_call_args(*filter);
  return filter;
}

ExprPtr Parser::parse_test(ExprPtr operand) {
  next();  // "is"
  auto test = node(ExprKind::test);
  test->negated = skip_name("not");
  test->name = expect_name();
  while (skip_op(".")) test->name += "." + expect_name();
  test->children.push_back(std::move(operand));
  const Token& token = current();
  if (is_op("(")) {
    parse_call_args(*test);
  } else if ((token.kind == TokenKind::name || token.kind == TokenKind::string || token.kind == TokenKind::integer ||
              token.kind == TokenKind::floating || is_op("[") || is_op("{")) &&
             !is_name("else") && !is_name("or") && !is_name("and")) {
    if (is_name("is")) fail("tests cannot be chained with 'is'");
    test->children.push_back(parse_postfix(parse_primary()));
  }
  return test;
}

ExprPtr Parser::parse_call(ExprPtr callee) {
  auto call = node(ExprKind::call);
  call->children.push_back(std::move(callee));
  parse_call_args(*call);
  return call;
}

void Parser::parse_call_args(Expr& call) {
  expect_op("(");
  bool first = true;
  while (!skip_op(")")) {
    if (!first) expect_op(",");
    first = false;
    if (skip_op(")")) break;
    if (is_op("*") || is_op("**")) fail("*args and **kwargs in calls are not supported");
    if (current().kind == TokenKind::name && peek().kind == TokenKind::op && peek().text == "=") {
      std::string key = current().text;
      next();
      next();
      call.keywords.emplace_back(std::move(key), parse_expression());
    } else {
      if (!call.keywords.empty()) fail("a positional argument follows a keyword argument");
      call.children.push_back(parse_expression());
    }
  }
}

}  // namespace

std::variant<Body, TemplateSyntaxError> parse(const std::vector<Token>& tokens) {
  try {
    return Parser(tokens).parse_template();
  } catch (const ParseFailure& failure) {
    return TemplateSyntaxError{failure.what()};
  }
}

}  // namespace mqlm::model::jinja
