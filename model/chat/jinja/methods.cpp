// The methods of strings, dicts and lists that templates call, and the global functions.
#include <charconv>
#include <ctime>

#include "model/chat/jinja/builtins.hpp"
#include "model/chat/jinja/strings.hpp"

namespace mqlm::model::jinja {

namespace {

std::optional<std::string> optional_string(Interpreter& in, const std::optional<Value>& value, std::string_view what) {
  if (!value || value->is_none()) return std::nullopt;
  if (!value->is_string()) in.fail(std::string(what) + " must be a string or None, not " + value->type_name());
  return value->as_string();
}

std::int64_t optional_int(Interpreter& in, const std::optional<Value>& value, std::int64_t fallback) {
  if (!value || value->is_none()) return fallback;
  if (!value->is_int() && !value->is_bool()) in.fail("an integer is needed, not " + value->type_name());
  return value->as_int();
}

Value string_list(std::vector<std::string> parts) {
  Array items;
  items.reserve(parts.size());
  for (auto& part : parts) items.emplace_back(std::move(part));
  return Value(std::move(items));
}

// str.startswith / endswith: a prefix or a tuple of them.
bool affix_matches(Interpreter& in, const std::string& text, const Value& affix, bool at_start) {
  auto one = [&](const Value& candidate) {
    if (!candidate.is_string()) in.fail("startswith / endswith takes strings, not " + candidate.type_name());
    const std::string& a = candidate.as_string();
    if (a.size() > text.size()) return false;
    return at_start ? text.compare(0, a.size(), a) == 0 : text.compare(text.size() - a.size(), a.size(), a) == 0;
  };
  if (affix.is_array()) {
    for (const Value& candidate : affix.as_array())
      if (one(candidate)) return true;
    return false;
  }
  return one(affix);
}

// str.format with {} / {0} / {name} fields and {{ }} escapes; no format specs.
std::string python_format(Interpreter& in, const std::string& text, CallArgs& args) {
  std::string out;
  std::size_t next_auto = 0;
  for (std::size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if ((c == '{' || c == '}') && i + 1 < text.size() && text[i + 1] == c) {
      out += c;
      ++i;
      continue;
    }
    if (c == '}') in.fail("single '}' encountered in format string");
    if (c != '{') {
      out += c;
      continue;
    }
    std::size_t close = text.find('}', i);
    if (close == std::string::npos) in.fail("single '{' encountered in format string");
    std::string field = text.substr(i + 1, close - i - 1);
    bool as_repr = field.size() >= 2 && field.substr(field.size() - 2) == "!r";
    if (as_repr || (field.size() >= 2 && field.substr(field.size() - 2) == "!s")) field.resize(field.size() - 2);
    if (field.find_first_of(":!.[") != std::string::npos) in.fail("format specs in str.format are not supported");
    const Value* value = nullptr;
    if (field.empty() || std::isdigit(static_cast<unsigned char>(field[0]))) {
      std::size_t index = next_auto;
      if (field.empty()) {
        ++next_auto;
      } else if (std::from_chars(field.data(), field.data() + field.size(), index).ec != std::errc()) {
        in.fail("Replacement index " + field + " out of range");
      }
      if (index >= args.positional.size()) in.fail("Replacement index " + std::to_string(index) + " out of range");
      value = &args.positional[index];
    } else {
      for (const auto& [key, v] : args.keyword)
        if (key == field) value = &v;
      if (!value) in.fail("'" + field + "' is not among the format's arguments");
    }
    out += as_repr ? python_repr(*value) : python_str(*value);
    i = close;
  }
  return out;
}

Value string_method(Interpreter& in, const std::string& text, const std::string& name, CallArgs& args) {
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    auto chars = optional_string(in, bind_args(in, name, args, {"chars"})[0], "chars");
    return in.make_string(python_strip(text, chars, name != "rstrip", name != "lstrip"));
  }
  if (name == "split" || name == "rsplit") {
    auto bound = bind_args(in, name, args, {"sep", "maxsplit"});
    auto sep = optional_string(in, bound[0], "sep");
    if (sep && sep->empty()) in.fail("empty separator");
    in.charge(text.size());
    return string_list(python_split(text, sep, optional_int(in, bound[1], -1), name == "rsplit"));
  }
  if (name == "splitlines") return string_list(python_splitlines(text));
  if (name == "startswith" || name == "endswith") {
    auto bound = bind_args(in, name, args, {"prefix"});
    if (!bound[0]) in.fail(name + " takes a prefix");
    return affix_matches(in, text, *bound[0], name == "startswith");
  }
  if (name == "upper") return in.make_string(ascii_upper(text));
  if (name == "lower") return in.make_string(ascii_lower(text));
  if (name == "title") return in.make_string(python_title(text));
  if (name == "capitalize") return in.make_string(python_capitalize(text));
  if (name == "replace") {
    auto bound = bind_args(in, name, args, {"old", "new", "count"});
    auto old = optional_string(in, bound[0], "old"), replacement = optional_string(in, bound[1], "new");
    if (!old || !replacement) in.fail("replace takes two strings");
    return in.make_string(python_replace(text, *old, *replacement, optional_int(in, bound[2], -1)));
  }
  if (name == "find" || name == "rfind" || name == "count") {
    auto sub = optional_string(in, bind_args(in, name, args, {"sub"})[0], "sub");
    if (!sub) in.fail(name + " takes a string");
    if (name == "count") {
      std::int64_t n = 0;
      for (std::size_t at = text.find(*sub); at != std::string::npos; at = text.find(*sub, at + std::max<std::size_t>(1, sub->size()))) ++n;
      return n;
    }
    std::size_t at = name == "find" ? text.find(*sub) : text.rfind(*sub);
    return at == std::string::npos ? std::int64_t{-1} : static_cast<std::int64_t>(code_points(text.substr(0, at)));
  }
  if (name == "join") {
    auto bound = bind_args(in, name, args, {"iterable"});
    std::string out;
    Array items = iterate(in, bound[0].value_or(Value(Array{})));
    for (std::size_t i = 0; i < items.size(); ++i) {
      if (!items[i].is_string()) in.fail("sequence item " + std::to_string(i) + ": expected str instance, " + items[i].type_name() + " found");
      out += (i ? text : "") + items[i].as_string();
    }
    return in.make_string(std::move(out));
  }
  if (name == "format") return in.make_string(python_format(in, text, args));
  bind_args(in, name, args, {});
  auto all = [&](int (*predicate)(int)) {
    return !text.empty() && std::all_of(text.begin(), text.end(), [&](char c) { return predicate(static_cast<unsigned char>(c)) != 0; });
  };
  if (name == "isdigit") return all(std::isdigit);
  if (name == "isalpha") return all(std::isalpha);
  if (name == "isalnum") return all(std::isalnum);
  if (name == "isspace") return !text.empty() && std::all_of(text.begin(), text.end(), is_python_space);
  bool has_cased = std::any_of(text.begin(), text.end(), [](char c) { return std::isalpha(static_cast<unsigned char>(c)); });
  if (name == "islower") return has_cased && text == ascii_lower(text);
  return has_cased && text == ascii_upper(text);  // isupper
}

Value dict_method(Interpreter& in, const Object& object, const std::string& name, CallArgs& args) {
  if (name == "get") {
    auto bound = bind_args(in, name, args, {"key", "default"});
    if (!bound[0]) in.fail("get expected at least 1 argument, got 0");
    const Value* found = object.find_key(*bound[0]);
    return found ? *found : bound[1].value_or(Value(None{}));
  }
  bind_args(in, name, args, {});
  if (name == "copy") return Value(object);
  Array items;
  for (const auto& [key, value] : object.entries()) {
    if (name == "items") items.emplace_back(Array{key, value}, Sequence::tuple);
    else items.push_back(name == "keys" ? key : value);
  }
  return Value(std::move(items));
}

Value list_method(Interpreter& in, const Value& self, const std::string& name, CallArgs& args) {
  if (name == "copy") return self;
  auto bound = bind_args(in, name, args, {"value"});
  if (!bound[0]) in.fail(name + " takes exactly one argument");
  const Array& items = self.as_array();
  std::int64_t count = 0;
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (!equal(items[i], *bound[0])) continue;
    if (name == "index") return static_cast<std::int64_t>(i);
    ++count;
  }
  if (name == "index") in.fail(python_repr(*bound[0]) + " is not in list");
  return count;
}

Value range_function(Interpreter& in, CallArgs& args) {
  auto bound = bind_args(in, "range", args, {"start", "stop", "step"});
  if (!bound[0]) in.fail("range expected at least 1 argument, got 0");
  std::int64_t start = 0, stop = optional_int(in, bound[0], 0), step = 1;
  if (bound[1]) {
    start = stop;
    stop = optional_int(in, bound[1], 0);
    step = optional_int(in, bound[2], 1);
  }
  if (step == 0) in.fail("range() arg 3 must not be zero");
  Array items;
  for (std::int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
    if (items.size() >= 100000) in.fail("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
    items.emplace_back(i);
  }
  in.charge(items.size() * sizeof(Value));
  return Value(std::move(items));
}

Value mapping_from(Interpreter& in, CallArgs& args, bool as_namespace) {
  Object object;
  if (args.positional.size() > 1) in.fail("namespace() and dict() take at most one positional argument");
  if (!args.positional.empty()) {
    const Value& source = args.positional[0];
    if (source.is_object()) object = source.as_object();
    else if (source.is_namespace()) object = source.as_namespace();
    else in.fail("cannot make a dict of a " + source.type_name());
  }
  for (auto& [key, value] : args.keyword) object.set(key, std::move(value));
  if (as_namespace) {
    if (object.holds_namespace()) in.fail("a namespace cannot hold a namespace here");
    return Value::make_namespace(std::move(object));
  }
  return Value(std::move(object));
}

Value strftime_now(Interpreter& in, CallArgs& args) {
  auto format = optional_string(in, bind_args(in, "strftime_now", args, {"format"})[0], "format");
  if (!format) in.fail("strftime_now takes a format");
  if (format->size() > 256) in.fail("strftime_now's format is longer than 256 characters");
  std::time_t now = static_cast<std::time_t>(in.options().now_unix_s);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char buffer[4096];
  std::size_t length = std::strftime(buffer, sizeof buffer, format->c_str(), &utc);
  return std::string(buffer, length);
}

}  // namespace

Value call_method(Interpreter& in, const Value& self, const std::string& name, CallArgs& args) {
  if (self.is_string()) return string_method(in, self.as_string(), name, args);
  if (self.is_object()) return dict_method(in, self.as_object(), name, args);
  return list_method(in, self, name, args);
}

Object builtin_globals() {
  Object globals;
  globals.set("range", Value::make_callable("range", range_function));
  globals.set("namespace", Value::make_callable("namespace", [](Interpreter& in, CallArgs& args) {
    return mapping_from(in, args, true);
  }));
  globals.set("dict", Value::make_callable("dict", [](Interpreter& in, CallArgs& args) {
    return mapping_from(in, args, false);
  }));
  globals.set("raise_exception", Value::make_callable("raise_exception", [](Interpreter& in, CallArgs& args) -> Value {
    auto bound = bind_args(in, "raise_exception", args, {"message"});
    throw TemplateRaised(bound[0] ? python_str(*bound[0]) : "");
  }));
  globals.set("strftime_now", Value::make_callable("strftime_now", strftime_now));
  return globals;
}

}  // namespace mqlm::model::jinja
