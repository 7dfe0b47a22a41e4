// The values a Jinja template computes with, as Python's jinja2 sees them: undefined, none,
// bool, int, float, string, array (a list or tuple), object (a dict, in insertion order), a
// namespace (the one mutable kind, shared by reference) and a callable (a macro, a bound method,
// a global function). Arrays and objects are immutable once made (transformers renders in
// jinja2's immutable sandbox) and shared, so copying a value is cheap.
//
// Text follows Python's: str() of a value is what {{ value }} prints (None, True, 1.0,
// ['a', 1], {'k': 'v'}), repr() quotes strings as Python does, and JSON is json.dumps's.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

namespace mqlm::model::jinja {

class Value;
class Interpreter;

// Thrown inside the interpreter where a template goes wrong (an error it raises, a type error, a
// limit reached); the template's render turns it into an error value, so it never leaves there.
struct TemplateFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// raise_exception(message): the template refusing its input, with its own message.
struct TemplateRaised : TemplateFailure {
  using TemplateFailure::TemplateFailure;
};

using Array = std::vector<Value>;

class Object;

// Arguments of a call: positional, then keyword, in the order written.
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

struct Callable {
  std::string name;
  std::function<Value(Interpreter&, CallArgs&)> call;
};

struct Undefined {
  std::string hint;  // what was looked up ("'x' is undefined", "'dict object' has no attribute 'y'")
  bool unsafe = false;  // a mutating method (append, pop, ...): the sandbox refuses calling it
};

struct None {};

// A string marked safe (jinja2's Markup, from the safe and escape filters): `+` with a plain
// string escapes the plain one's HTML characters and stays safe. Otherwise a string.
struct Markup {
  std::string text;
};

// A list; a tuple (printed (a, b)); or what jinja2's map, select, reject, unique, items and
// reverse filters give, a generator: iterable only once made into a list, but always true, without
// a length, not JSON, not subscriptable.
enum class Sequence : std::uint8_t { list, tuple, generator };

struct ArrayValue {
  std::shared_ptr<const Array> items;
  Sequence kind = Sequence::list;
  std::uint32_t depth = 1;        // levels of nesting, this one included
  bool holds_namespace = false;   // somewhere inside
};

// How deep arrays and objects may nest: a template that nests deeper gets an error rather than
// a stack overflow when the value is printed, compared or destroyed.
inline constexpr std::uint32_t kMaxDepth = 256;

class Value {
 public:
  using Storage = std::variant<Undefined, None, bool, std::int64_t, double, std::string, Markup, ArrayValue,
                               std::shared_ptr<const Object>, std::shared_ptr<Object>, std::shared_ptr<const Callable>>;

  Value() = default;
  Value(Undefined u) : v_(std::move(u)) {}
  Value(None) : v_(None{}) {}
  Value(bool b) : v_(b) {}
  Value(int i) : v_(std::int64_t{i}) {}
  Value(std::int64_t i) : v_(i) {}
  Value(double d) : v_(d) {}
  Value(std::string s) : v_(std::move(s)) {}
  Value(const char* s) : v_(std::string(s)) {}
  Value(Markup m) : v_(std::move(m)) {}
  Value(Array a, Sequence kind = Sequence::list);
  Value(Object o);
  static Value make_namespace(Object o);  // a mutable object shared by reference
  static Value make_callable(std::string name, std::function<Value(Interpreter&, CallArgs&)> call) {
    return Value(Storage(std::make_shared<const Callable>(Callable{std::move(name), std::move(call)})));
  }

  bool is_undefined() const { return std::holds_alternative<Undefined>(v_); }
  bool is_none() const { return std::holds_alternative<None>(v_); }
  bool is_bool() const { return std::holds_alternative<bool>(v_); }
  bool is_int() const { return std::holds_alternative<std::int64_t>(v_); }
  bool is_float() const { return std::holds_alternative<double>(v_); }
  bool is_number() const { return is_int() || is_float() || is_bool(); }  // Python: bool is an int
  bool is_string() const { return std::holds_alternative<std::string>(v_) || is_markup(); }
  bool is_markup() const { return std::holds_alternative<Markup>(v_); }
  bool is_array() const { return std::holds_alternative<ArrayValue>(v_); }
  bool is_tuple() const { return is_array() && std::get<ArrayValue>(v_).kind == Sequence::tuple; }
  bool is_generator() const { return is_array() && std::get<ArrayValue>(v_).kind == Sequence::generator; }
  Sequence sequence_kind() const { return held<ArrayValue>("a list").kind; }
  bool is_object() const { return std::holds_alternative<std::shared_ptr<const Object>>(v_); }
  bool is_namespace() const { return std::holds_alternative<std::shared_ptr<Object>>(v_); }
  bool is_callable() const { return std::holds_alternative<std::shared_ptr<const Callable>>(v_); }

  // A value of another type is a TemplateFailure naming both (Python's TypeError), never an
  // exception from std::variant: templates come from model files (jinja.fuzz: tojson(indent=x)).
  bool as_bool() const { return held<bool>("a bool"); }
  std::int64_t as_int() const;   // int or bool
  double as_double() const;      // int, bool or float
  const std::string& as_string() const { return is_markup() ? std::get<Markup>(v_).text : held<std::string>("a str"); }
  const Array& as_array() const { return *held<ArrayValue>("a list").items; }
  const Object& as_object() const { return *held<std::shared_ptr<const Object>>("a dict"); }
  Object& as_namespace() const { return *held<std::shared_ptr<Object>>("a namespace"); }
  const Callable& as_callable() const { return *held<std::shared_ptr<const Callable>>("a callable"); }
  const Undefined& as_undefined() const { return held<Undefined>("undefined"); }

  bool truthy() const;
  std::uint32_t depth() const;   // 0 for a scalar
  bool holds_namespace() const;  // is one or holds one
  std::string type_name() const;  // Python's: 'str', 'int', 'dict', 'list', 'NoneType', ...

 private:
  explicit Value(Storage v) : v_(std::move(v)) {}
  template <class T>
  const T& held(const char* wanted) const {
    if (const T* v = std::get_if<T>(&v_)) return *v;
    throw TemplateFailure(std::string("expected ") + wanted + ", got a value of type '" + type_name() + "'");
  }
  Storage v_;
};

// A dict, kept in insertion order. Keys are strings (what JSON gives) or other scalars a template
// writes ({0: 'a'}), equal as Python's are (1, 1.0 and True are one key).
class Object {
 public:
  const Value* find(std::string_view key) const;  // a string key
  const Value* find_key(const Value& key) const;
  void set(Value key, Value value);  // replaces in place, or appends
  const std::vector<std::pair<Value, Value>>& entries() const { return entries_; }
  std::size_t size() const { return entries_.size(); }
  std::uint32_t depth() const { return depth_; }
  bool holds_namespace() const { return holds_namespace_; }

 private:
  std::vector<std::pair<Value, Value>> entries_;
  std::unordered_map<std::string, std::size_t> string_keys_;  // where each string key is in entries_
  std::uint32_t depth_ = 1;
  bool holds_namespace_ = false;
};

inline Value::Value(Object o) : v_(std::make_shared<const Object>(std::move(o))) {}
inline Value Value::make_namespace(Object o) { return Value(Storage(std::make_shared<Object>(std::move(o)))); }

// Python's ==: 1 == 1.0 == True, lists and dicts by content, undefined equals undefined.
bool equal(const Value& a, const Value& b);
// Python's <: numbers, strings (by code point), lists; other pairs are not ordered.
std::optional<bool> less(const Value& a, const Value& b);

std::string python_str(const Value& value);   // str(value); undefined is ""
std::string python_repr(const Value& value);  // repr(value)
std::string python_float(double value);       // repr(float): 1.0, 0.1, 1e-05, 1e+20, inf, nan

struct JsonOptions {
  std::optional<std::string> indent;  // none: one line
  std::string item_separator = ", ";  // json.dumps's defaults: ", " and ": " on one line,
  std::string key_separator = ": ";   // "," and ": " with an indent
  bool ensure_ascii = false;
  bool sort_keys = false;
};
// json.dumps(value); nullopt for what JSON cannot hold (undefined, a namespace, a callable).
std::optional<std::string> to_json(const Value& value, const JsonOptions& options);

std::string html_escape(std::string_view text);  // jinja2's escape: & < > " '

// Length in code points of UTF-8 text (Python's len of a str).
std::size_t code_points(std::string_view text);
std::vector<std::string> split_code_points(std::string_view text);

}  // namespace mqlm::model::jinja
