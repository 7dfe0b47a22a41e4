// Python's semantics of access, iteration, containment, arithmetic and comparison, as jinja2's
// sandbox applies them.
#include <algorithm>
#include <cmath>
#include <limits>

#include "model/chat/jinja/builtins.hpp"

namespace mqlm::model::jinja {

namespace {

constexpr std::string_view kStringMethods[] = {
    "strip", "lstrip", "rstrip", "split", "rsplit", "splitlines", "startswith", "endswith", "upper", "lower",
    "title", "capitalize", "replace", "find", "rfind", "count", "join", "format", "isdigit", "isalpha",
    "isalnum", "isspace", "islower", "isupper"};
constexpr std::string_view kDictMethods[] = {"items", "keys", "values", "get", "copy"};
constexpr std::string_view kListMethods[] = {"index", "count", "copy"};
// What the immutable sandbox refuses: the methods that change a list or a dict.
constexpr std::string_view kDictMutators[] = {"pop", "popitem", "setdefault", "update", "clear"};
constexpr std::string_view kListMutators[] = {"append", "pop", "insert", "extend", "remove", "reverse", "sort", "clear"};

template <std::size_t N>
bool listed(const std::string_view (&names)[N], std::string_view name) {
  return std::find(std::begin(names), std::end(names), name) != std::end(names);
}

std::string object_type(const Value& value) {  // jinja2's object_type_repr
  if (value.is_none()) return "None";
  return value.type_name() + " object";
}

Value bound_method(const Value& self, const std::string& name) {
  return Value::make_callable(name, [self, name](Interpreter& in, CallArgs& args) {
    return call_method(in, self, name, args);
  });
}

Value missing_attribute(const Value& object, const std::string& name) {
  return Undefined{"'" + object_type(object) + "' has no attribute '" + name + "'"};
}

bool ascii(const std::string& text) {
  return std::all_of(text.begin(), text.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; });
}

std::vector<std::string> characters(const std::string& text) {
  if (!ascii(text)) return split_code_points(text);
  std::vector<std::string> out;
  out.reserve(text.size());
  for (char c : text) out.emplace_back(1, c);
  return out;
}

std::int64_t checked(Interpreter& in, long double exact, std::int64_t result) {
  if (exact > static_cast<long double>(std::numeric_limits<std::int64_t>::max()) ||
      exact < static_cast<long double>(std::numeric_limits<std::int64_t>::min())) {
    in.fail("an integer outgrew 64 bits");
  }
  return result;
}

Value repeat(Interpreter& in, const Value& sequence, std::int64_t times) {
  if (times <= 0) return sequence.is_string() ? Value(std::string()) : Value(Array{}, sequence.sequence_kind());
  if (sequence.is_string()) {
    in.charge(sequence.as_string().size() * static_cast<std::size_t>(times));
    std::string out;
    for (std::int64_t i = 0; i < times; ++i) out += sequence.as_string();
    return out;
  }
  in.charge(sequence.as_array().size() * sizeof(Value) * static_cast<std::size_t>(times));
  Array out;
  for (std::int64_t i = 0; i < times; ++i) out.insert(out.end(), sequence.as_array().begin(), sequence.as_array().end());
  return Value(std::move(out), sequence.sequence_kind());
}

[[noreturn]] void unsupported(Interpreter& in, const std::string& op, const Value& a, const Value& b) {
  in.fail("unsupported operand type(s) for " + op + ": '" + a.type_name() + "' and '" + b.type_name() + "'");
}

Value integer_arithmetic(Interpreter& in, const std::string& op, std::int64_t x, std::int64_t y) {
  using Wide = long double;
  // Python's integers do not overflow; ours fail past 64 bits, found before the overflow (which
  // is undefined in C++: jinja.fuzz found 90532596 * 646668853801).
  std::int64_t result = 0;
  const bool overflow = op == "+"   ? __builtin_add_overflow(x, y, &result)
                        : op == "-" ? __builtin_sub_overflow(x, y, &result)
                        : op == "*" ? __builtin_mul_overflow(x, y, &result)
                                    : false;
  if (overflow) in.fail("an integer outgrew 64 bits");
  if (op == "+" || op == "-" || op == "*") return result;
  if (op == "/") {
    if (y == 0) in.fail("division by zero");
    return static_cast<double>(x) / static_cast<double>(y);
  }
  if (op == "//" || op == "%") {
    if (y == 0) in.fail("integer division or modulo by zero");
    if (x == std::numeric_limits<std::int64_t>::min() && y == -1) {
      if (op == "%") return std::int64_t{0};
      in.fail("an integer outgrew 64 bits");
    }
    std::int64_t quotient = x / y, remainder = x % y;
    if (remainder != 0 && ((remainder < 0) != (y < 0))) {
      --quotient;
      remainder += y;
    }
    return op == "//" ? quotient : remainder;
  }
  if (y < 0) return std::pow(static_cast<double>(x), static_cast<double>(y));
  Wide exact = std::pow(Wide(x), Wide(y));
  return checked(in, exact, static_cast<std::int64_t>(std::llround(exact)));
}

Value float_arithmetic(Interpreter& in, const std::string& op, double x, double y) {
  if (op == "+") return x + y;
  if (op == "-") return x - y;
  if (op == "*") return x * y;
  if (op == "**") return std::pow(x, y);
  if (y == 0.0) in.fail("float division by zero");
  if (op == "/") return x / y;
  double quotient = std::floor(x / y);
  if (op == "//") return quotient;
  double remainder = std::fmod(x, y);
  if (remainder != 0.0 && ((remainder < 0) != (y < 0))) remainder += y;
  return remainder;
}

}  // namespace

void fail_undefined(const Interpreter& in, const Value& undefined) {
  const std::string& hint = undefined.as_undefined().hint;
  in.fail(hint.empty() ? "a value is undefined" : hint);
}

Value get_attribute(Interpreter& in, const Value& object, const std::string& name) {
  if (object.is_undefined()) fail_undefined(in, object);
  auto unsafe = [&] {
    return Value(Undefined{"access to attribute '" + name + "' of '" + object.type_name() + "' object is unsafe", true});
  };
  if (object.is_string() && listed(kStringMethods, name)) return bound_method(object, name);
  if (object.is_object()) {
    if (listed(kDictMethods, name)) return bound_method(object, name);
    if (listed(kDictMutators, name)) return unsafe();
    if (const Value* found = object.as_object().find(name)) return *found;
  }
  if (object.is_array()) {
    if (listed(kListMethods, name)) return bound_method(object, name);
    if (listed(kListMutators, name)) return unsafe();
  }
  if (object.is_namespace()) {
    if (const Value* found = object.as_namespace().find(name)) return *found;
  }
  return missing_attribute(object, name);
}

Value get_item(Interpreter& in, const Value& object, const Value& key) {
  if (object.is_undefined()) fail_undefined(in, object);
  const bool index = key.is_int() || key.is_bool();
  if (object.is_generator()) return Undefined{"'generator' object is not subscriptable"};
  if (index && (object.is_array() || object.is_string())) {
    std::int64_t i = key.as_int();
    if (object.is_array()) {
      const auto size = static_cast<std::int64_t>(object.as_array().size());
      if (i < 0) i += size;
      if (i >= 0 && i < size) return object.as_array()[static_cast<std::size_t>(i)];
    } else {
      std::vector<std::string> chars = characters(object.as_string());
      const auto size = static_cast<std::int64_t>(chars.size());
      if (i < 0) i += size;
      if (i >= 0 && i < size) return chars[static_cast<std::size_t>(i)];
    }
    return Undefined{"'" + object_type(object) + "' has no element " + std::to_string(key.as_int())};
  }
  if (object.is_object()) {
    if (const Value* found = object.as_object().find_key(key)) return *found;
  }
  if (key.is_string()) return get_attribute(in, object, key.as_string());
  return Undefined{"'" + object_type(object) + "' has no element " + python_repr(key)};
}

Value get_slice(Interpreter& in, const Value& object, const Value& start, const Value& stop, const Value& step) {
  if (object.is_undefined()) fail_undefined(in, object);
  if (!object.is_string() && (!object.is_array() || object.is_generator())) {
    return Undefined{"'" + object.type_name() + "' object is not subscriptable"};
  }
  auto given = [&](const Value& v) -> std::optional<std::int64_t> {
    if (v.is_undefined() || v.is_none()) return std::nullopt;
    if (!v.is_int() && !v.is_bool()) in.fail("slice indices must be integers or None");
    return v.as_int();
  };
  std::vector<std::string> chars;
  if (object.is_string()) chars = characters(object.as_string());
  const auto length = static_cast<std::int64_t>(object.is_string() ? chars.size() : object.as_array().size());
  const std::int64_t by = given(step).value_or(1);
  if (by == 0) in.fail("slice step cannot be zero");
  const std::int64_t lower = by > 0 ? 0 : -1, upper = by > 0 ? length : length - 1;
  auto adjust = [&](std::optional<std::int64_t> v, std::int64_t fallback) {
    if (!v) return fallback;
    std::int64_t i = *v < 0 ? *v + length : *v;
    return std::clamp(i, lower, upper);
  };
  const std::int64_t from = adjust(given(start), by > 0 ? lower : upper);
  const std::int64_t to = adjust(given(stop), by > 0 ? upper : lower);
  std::string text;
  Array items;
  for (std::int64_t i = from; by > 0 ? i < to : i > to; i += by) {
    in.step();
    if (object.is_string()) text += chars[static_cast<std::size_t>(i)];
    else items.push_back(object.as_array()[static_cast<std::size_t>(i)]);
  }
  if (object.is_string()) return in.make_string(std::move(text));
  return Value(std::move(items), object.sequence_kind());
}

Array iterate(Interpreter& in, const Value& value) {
  if (value.is_undefined()) return {};
  if (value.is_array()) return value.as_array();
  if (value.is_object()) {
    Array keys;
    for (const auto& [key, item] : value.as_object().entries()) keys.push_back(key);
    return keys;
  }
  if (value.is_string()) {
    Array chars;
    for (auto& c : characters(value.as_string())) chars.emplace_back(std::move(c));
    return chars;
  }
  in.fail("'" + value.type_name() + "' object is not iterable");
}

bool contains(Interpreter& in, const Value& container, const Value& item) {
  if (container.is_string()) {
    if (!item.is_string()) in.fail("'in <string>' requires string as left operand, not " + item.type_name());
    return container.as_string().find(item.as_string()) != std::string::npos;
  }
  if (container.is_object()) return container.as_object().find_key(item) != nullptr;
  if (container.is_array()) {
    const Array& items = container.as_array();
    return std::any_of(items.begin(), items.end(), [&](const Value& v) { return equal(v, item); });
  }
  if (container.is_undefined()) return false;
  in.fail("argument of type '" + container.type_name() + "' is not iterable");
}

Value arithmetic(Interpreter& in, const std::string& op, const Value& a, const Value& b) {
  if (a.is_undefined()) fail_undefined(in, a);
  if (b.is_undefined()) fail_undefined(in, b);
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return float_arithmetic(in, op, a.as_double(), b.as_double());
    return integer_arithmetic(in, op, a.as_int(), b.as_int());
  }
  if (op == "+") {
    if (a.is_markup() || b.is_markup()) {
      if (a.is_string() && b.is_string()) {
        auto safe = [](const Value& v) { return v.is_markup() ? v.as_string() : html_escape(v.as_string()); };
        std::string text = safe(a) + safe(b);
        in.charge(text.size());
        return Markup{std::move(text)};
      }
    } else if (a.is_string() && b.is_string()) {
      return in.make_string(a.as_string() + b.as_string());
    }
    if (a.is_array() && b.is_array() && a.sequence_kind() == b.sequence_kind() && !a.is_generator()) {
      Array items = a.as_array();
      items.insert(items.end(), b.as_array().begin(), b.as_array().end());
      in.charge(items.size() * sizeof(Value));
      return Value(std::move(items), a.sequence_kind());
    }
    if (a.is_string() || (a.is_array() && a.sequence_kind() == Sequence::list)) {
      in.fail("can only concatenate " + a.type_name() + " (not \"" + b.type_name() + "\") to " + a.type_name());
    }
  }
  auto repeatable = [](const Value& v) { return v.is_string() || (v.is_array() && !v.is_generator()); };
  if (op == "*") {
    if (repeatable(a) && (b.is_int() || b.is_bool())) return repeat(in, a, b.as_int());
    if (repeatable(b) && (a.is_int() || a.is_bool())) return repeat(in, b, a.as_int());
  }
  if (op == "%" && a.is_string()) in.fail("string formatting with % is not supported: use the format filter");
  unsupported(in, op, a, b);
}

bool compare(Interpreter& in, const std::string& op, const Value& a, const Value& b) {
  if (op == "==") return equal(a, b);
  if (op == "!=") return !equal(a, b);
  if (op == "in") return contains(in, b, a);
  if (op == "notin") return !contains(in, b, a);
  if (a.is_undefined()) fail_undefined(in, a);
  if (b.is_undefined()) fail_undefined(in, b);
  std::optional<bool> lt = op == "<" || op == ">=" ? less(a, b) : less(b, a);
  if (!lt) {
    in.fail("'" + op + "' not supported between instances of '" + a.type_name() + "' and '" + b.type_name() + "'");
  }
  if (op == "<" || op == ">") return *lt;
  return !*lt;  // a <= b is not (b < a); a >= b is not (a < b)
}

std::vector<std::optional<Value>> bind_args(Interpreter& in, std::string_view what, CallArgs& args,
                                            std::initializer_list<std::string_view> params) {
  std::vector<std::optional<Value>> bound(params.size());
  if (args.positional.size() > params.size()) {
    in.fail(std::string(what) + " takes at most " + std::to_string(params.size()) + " argument(s), " +
            std::to_string(args.positional.size()) + " given");
  }
  for (std::size_t i = 0; i < args.positional.size(); ++i) bound[i] = std::move(args.positional[i]);
  for (auto& [key, value] : args.keyword) {
    auto it = std::find(params.begin(), params.end(), key);
    if (it == params.end()) in.fail(std::string(what) + " got an unexpected keyword argument '" + key + "'");
    auto& slot = bound[static_cast<std::size_t>(it - params.begin())];
    if (slot) in.fail(std::string(what) + " got multiple values for argument '" + key + "'");
    slot = std::move(value);
  }
  return bound;
}

}  // namespace mqlm::model::jinja
