#include "model/chat/jinja/lexer.hpp"

#include <cctype>
#include <optional>

#include "model/tokenizer/utf8.hpp"

namespace mqlm::model::jinja {

namespace {

constexpr std::string_view kSpace = " \t\n\r\v\f";

bool is_space(char c) { return kSpace.find(c) != std::string_view::npos; }
bool is_name_start(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool is_name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }

// Python's "unicode-escape" decoding of a literal's body, as jinja2 reads string literals.
// Returns how many characters of `body` from `i` the escape took, appending what it means.
std::size_t decode_escape(std::string_view body, std::size_t i, std::string& out) {
  char c = body[i + 1];
  switch (c) {
    case '\n': return 2;
    case '\\': case '\'': case '"': out += c; return 2;
    case 'a': out += '\a'; return 2;
    case 'b': out += '\b'; return 2;
    case 'f': out += '\f'; return 2;
    case 'n': out += '\n'; return 2;
    case 'r': out += '\r'; return 2;
    case 't': out += '\t'; return 2;
    case 'v': out += '\v'; return 2;
    default: break;
  }
  std::size_t digits = c == 'x' ? 2 : c == 'u' ? 4 : c == 'U' ? 8 : 0;
  if (digits > 0 && i + 2 + digits <= body.size()) {
    std::string hex(body.substr(i + 2, digits));
    if (hex.find_first_not_of("0123456789abcdefABCDEF") == std::string::npos) {
      utf8::append_code_point(out, static_cast<char32_t>(std::stoul(hex, nullptr, 16)));
      return 2 + digits;
    }
  }
  if (c >= '0' && c <= '7') {
    std::size_t n = 1;
    while (n < 3 && i + 1 + n < body.size() && body[i + 1 + n] >= '0' && body[i + 1 + n] <= '7') ++n;
    utf8::append_code_point(out, static_cast<char32_t>(std::stoul(std::string(body.substr(i + 1, n)), nullptr, 8)));
    return 1 + n;
  }
  out += '\\';  // an unknown escape keeps its backslash
  return 1;
}

std::string unescape(std::string_view body) {
  std::string out;
  for (std::size_t i = 0; i < body.size();) {
    if (body[i] == '\\' && i + 1 < body.size()) i += decode_escape(body, i, out);
    else out += body[i++];
  }
  return out;
}

class Lexer {
 public:
  explicit Lexer(std::string source) : source_(std::move(source)) {}

  std::variant<std::vector<Token>, TemplateSyntaxError> run() {
    while (pos_ < source_.size()) {
      if (auto error = next_tag()) return *error;
    }
    tokens_.push_back({TokenKind::end, "", line_});
    return std::move(tokens_);
  }

 private:
  std::optional<TemplateSyntaxError> next_tag();
  void emit_text(std::string text, char opener, char modifier);
  std::optional<TemplateSyntaxError> comment();
  std::optional<TemplateSyntaxError> raw(std::size_t body_start);
  std::optional<TemplateSyntaxError> expression(char opener);
  std::optional<TemplateSyntaxError> expression_token(std::vector<char>& brackets);
  bool at_end_of_tag(char opener);
  void push(TokenKind kind, std::string text) { tokens_.push_back({kind, std::move(text), line_}); }
  void advance(std::size_t n) {
    for (std::size_t i = 0; i < n && pos_ < source_.size(); ++i, ++pos_)
      if (source_[pos_] == '\n') ++line_;
  }
  void skip_spaces() {
    while (pos_ < source_.size() && is_space(source_[pos_])) advance(1);
  }
  TemplateSyntaxError error(const std::string& what) const {
    return {"line " + std::to_string(line_) + ": " + what};
  }

  std::string source_;
  std::size_t pos_ = 0;
  int line_ = 1;
  bool line_starting_ = true;  // the last thing read ended a line (for lstrip_blocks)
  std::vector<Token> tokens_;
};

std::optional<TemplateSyntaxError> Lexer::next_tag() {
  std::size_t tag = pos_;
  while ((tag = source_.find('{', tag)) != std::string::npos) {
    char next = tag + 1 < source_.size() ? source_[tag + 1] : '\0';
    if (next == '{' || next == '%' || next == '#') break;
    ++tag;
  }
  if (tag == std::string::npos) {
    emit_text(source_.substr(pos_), '\0', '\0');
    advance(source_.size() - pos_);
    return std::nullopt;
  }
  char opener = source_[tag + 1];
  char modifier = tag + 2 < source_.size() ? source_[tag + 2] : '\0';
  emit_text(source_.substr(pos_, tag - pos_), opener, modifier);
  advance(tag - pos_ + 2 + (modifier == '-' || modifier == '+' ? 1 : 0));
  line_starting_ = false;
  if (opener == '#') return comment();
  if (opener == '%') {
    std::size_t p = pos_;
    while (p < source_.size() && is_space(source_[p])) ++p;
    if (source_.compare(p, 3, "raw") == 0 && (p + 3 >= source_.size() || !is_name_char(source_[p + 3]))) {
      p += 3;
      while (p < source_.size() && is_space(source_[p])) ++p;
      if (p < source_.size() && (source_[p] == '-' || source_[p] == '+')) ++p;
      if (source_.compare(p, 2, "%}") == 0) return raw(p + 2);
    }
  }
  return expression(opener);
}

// Text before a tag, with the tag's whitespace control applied to it.
void Lexer::emit_text(std::string text, char opener, char modifier) {
  if (modifier == '-') {
    std::size_t last = text.find_last_not_of(kSpace);
    text.erase(last == std::string::npos ? 0 : last + 1);
  } else if (modifier != '+' && (opener == '%' || opener == '#')) {  // lstrip_blocks
    std::size_t line_start = text.rfind('\n');
    line_start = line_start == std::string::npos ? 0 : line_start + 1;
    bool only_blanks = line_start < text.size() && text.find_first_not_of(" \t\r\v\f", line_start) == std::string::npos;
    if ((line_start > 0 || line_starting_) && only_blanks) text.erase(line_start);
  }
  if (!text.empty()) push(TokenKind::text, std::move(text));
}

std::optional<TemplateSyntaxError> Lexer::comment() {
  std::size_t close = source_.find("#}", pos_);
  if (close == std::string::npos) return error("a comment ({#) is not closed");
  char before = close > pos_ ? source_[close - 1] : '\0';
  advance(close + 2 - pos_);
  if (before == '-') skip_spaces();
  else if (before != '+' && pos_ < source_.size() && source_[pos_] == '\n') advance(1);
  line_starting_ = pos_ > 0 && source_[pos_ - 1] == '\n';
  return std::nullopt;
}

// {% raw %} ... {% endraw %}: the text between, untouched but for the endraw tag's own control.
std::optional<TemplateSyntaxError> Lexer::raw(std::size_t body_start) {
  advance(body_start - pos_);
  if (pos_ < source_.size() && source_[pos_] == '\n') advance(1);  // trim_blocks
  for (std::size_t tag = source_.find("{%", pos_); tag != std::string::npos; tag = source_.find("{%", tag + 2)) {
    std::size_t p = tag + 2;
    char modifier = p < source_.size() && (source_[p] == '-' || source_[p] == '+') ? source_[p++] : '\0';
    while (p < source_.size() && is_space(source_[p])) ++p;
    if (source_.compare(p, 6, "endraw") != 0) continue;
    p += 6;
    while (p < source_.size() && is_space(source_[p])) ++p;
    char close_modifier = p < source_.size() && (source_[p] == '-' || source_[p] == '+') ? source_[p++] : '\0';
    if (source_.compare(p, 2, "%}") != 0) continue;
    emit_text(source_.substr(pos_, tag - pos_), '%', modifier);
    advance(p + 2 - pos_);
    if (close_modifier == '-') skip_spaces();
    else if (close_modifier != '+' && pos_ < source_.size() && source_[pos_] == '\n') advance(1);
    line_starting_ = source_[pos_ - 1] == '\n';
    return std::nullopt;
  }
  return error("{% raw %} has no {% endraw %}");
}

bool Lexer::at_end_of_tag(char opener) {
  const char close = opener == '{' ? '}' : '%';
  auto at = [&](std::size_t p, std::string_view text) { return source_.compare(p, text.size(), text) == 0; };
  std::string end = std::string(1, close) + "}";
  if (at(pos_, "-" + end)) {
    advance(3);
    skip_spaces();
  } else if (opener == '%' && at(pos_, "+" + end)) {
    advance(3);
  } else if (at(pos_, end)) {
    advance(2);
    if (opener == '%' && pos_ < source_.size() && source_[pos_] == '\n') advance(1);  // trim_blocks
  } else {
    return false;
  }
  push(opener == '{' ? TokenKind::variable_end : TokenKind::block_end, "");
  line_starting_ = source_[pos_ - 1] == '\n';
  return true;
}

std::optional<TemplateSyntaxError> Lexer::expression(char opener) {
  push(opener == '{' ? TokenKind::variable_begin : TokenKind::block_begin, "");
  std::vector<char> brackets;
  while (true) {
    skip_spaces();
    if (pos_ >= source_.size()) return error(opener == '{' ? "a {{ is not closed" : "a {% is not closed");
    if (brackets.empty() && at_end_of_tag(opener)) return std::nullopt;
    if (auto problem = expression_token(brackets)) return problem;
  }
}

std::optional<TemplateSyntaxError> Lexer::expression_token(std::vector<char>& brackets) {
  const char c = source_[pos_];
  if (c == '\'' || c == '"') {
    std::size_t p = pos_ + 1;
    while (p < source_.size() && source_[p] != c) p += source_[p] == '\\' ? 2 : 1;
    if (p >= source_.size()) return error("a string is not closed");
    push(TokenKind::string, unescape(std::string_view(source_).substr(pos_ + 1, p - pos_ - 1)));
    advance(p + 1 - pos_);
    return std::nullopt;
  }
  if (is_digit(c)) {
    std::size_t p = pos_;
    auto digits = [&] { while (p < source_.size() && (is_digit(source_[p]) || source_[p] == '_')) ++p; };
    digits();
    bool floating = false;
    if (p + 1 < source_.size() && source_[p] == '.' && is_digit(source_[p + 1])) { ++p; digits(); floating = true; }
    if (p < source_.size() && (source_[p] == 'e' || source_[p] == 'E')) {
      std::size_t q = p + 1 + (p + 1 < source_.size() && (source_[p + 1] == '+' || source_[p + 1] == '-'));
      if (q < source_.size() && is_digit(source_[q])) { p = q; digits(); floating = true; }
    }
    std::string text = source_.substr(pos_, p - pos_);
    std::erase(text, '_');
    push(floating ? TokenKind::floating : TokenKind::integer, text);
    advance(p - pos_);
    return std::nullopt;
  }
  if (is_name_start(c)) {
    std::size_t p = pos_;
    while (p < source_.size() && is_name_char(source_[p])) ++p;
    push(TokenKind::name, source_.substr(pos_, p - pos_));
    advance(p - pos_);
    return std::nullopt;
  }
  for (std::string_view two : {"//", "**", "==", "!=", "<=", ">="}) {
    if (source_.compare(pos_, 2, two) == 0) {
      push(TokenKind::op, std::string(two));
      advance(2);
      return std::nullopt;
    }
  }
  if (std::string_view("+-*/%~<>=.:|,;").find(c) != std::string_view::npos) {
    push(TokenKind::op, std::string(1, c));
    advance(1);
    return std::nullopt;
  }
  if (c == '(' || c == '[' || c == '{') {
    brackets.push_back(c == '(' ? ')' : c == '[' ? ']' : '}');
  } else if (c == ')' || c == ']' || c == '}') {
    if (brackets.empty() || brackets.back() != c) return error(std::string("unexpected '") + c + "'");
    brackets.pop_back();
  } else {
    return error(std::string("unexpected character '") + c + "'");
  }
  push(TokenKind::op, std::string(1, c));
  advance(1);
  return std::nullopt;
}

}  // namespace

std::variant<std::vector<Token>, TemplateSyntaxError> tokenize(std::string_view source) {
  std::string normalised;
  normalised.reserve(source.size());
  for (std::size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      normalised += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      normalised += source[i];
    }
  }
  if (!normalised.empty() && normalised.back() == '\n') normalised.pop_back();  // keep_trailing_newline=False
  return Lexer(std::move(normalised)).run();
}

}  // namespace mqlm::model::jinja
