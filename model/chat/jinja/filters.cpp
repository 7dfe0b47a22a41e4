// The filters and tests of jinja2 that chat templates use, tojson as transformers defines it.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <unordered_map>

#include "model/chat/jinja/builtins.hpp"
#include "model/chat/jinja/strings.hpp"

namespace mqlm::model::jinja {

namespace {

using Filter = Value (*)(Interpreter&, const Value&, CallArgs&);
using Test = bool (*)(Interpreter&, const Value&, CallArgs&);

bool flag(const std::optional<Value>& value) { return value && value->truthy(); }

Value text_of(Interpreter& in, std::string text) { return in.make_string(std::move(text)); }

// jinja2's make_attrgetter: "a.b.0" looked up item by item.
Value attribute_path(Interpreter& in, Value item, const Value& path) {
  if (!path.is_string()) return get_item(in, item, path);
  for (const std::string& part : python_split(path.as_string(), std::string("."), -1, false)) {
    bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    // Digits are an index (jinja2 makes them an int); one past 64 bits indexes nothing, as a key.
    std::int64_t index = 0;
    bool fits = digits && std::from_chars(part.data(), part.data() + part.size(), index).ec == std::errc();
    item = get_item(in, item, fits ? Value(index) : Value(part));
  }
  return item;
}

// Sort keys: the item (or its attribute), strings lowered unless case_sensitive.
Value sort_key(Interpreter& in, const Value& item, const std::optional<Value>& attribute, bool case_sensitive) {
  Value key = attribute && !attribute->is_none() ? attribute_path(in, item, *attribute) : item;
  if (!case_sensitive && key.is_string()) return ascii_lower(key.as_string());
  return key;
}

bool ordered_before(Interpreter& in, const Value& a, const Value& b) {
  auto result = less(a, b);
  if (!result) in.fail("'<' not supported between instances of '" + a.type_name() + "' and '" + b.type_name() + "'");
  return *result;
}

void sort_by_keys(Interpreter& in, std::vector<std::pair<Value, Value>>& keyed, bool reverse) {
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
    return reverse ? ordered_before(in, b.first, a.first) : ordered_before(in, a.first, b.first);
  });
}

Value filter_tojson(Interpreter& in, const Value& value, CallArgs& args) {
  auto bound = bind_args(in, "tojson", args, {"ensure_ascii", "indent", "separators", "sort_keys"});
  JsonOptions options;
  options.ensure_ascii = flag(bound[0]);
  options.sort_keys = flag(bound[3]);
  if (bound[1] && !bound[1]->is_none()) {
    if (bound[1]->is_string()) options.indent = bound[1]->as_string();
    else options.indent = std::string(static_cast<std::size_t>(std::max<std::int64_t>(0, bound[1]->as_int())), ' ');
    options.item_separator = ",";
  }
  if (bound[2] && !bound[2]->is_none()) {
    if (!bound[2]->is_array() || bound[2]->as_array().size() != 2 || !bound[2]->as_array()[0].is_string() ||
        !bound[2]->as_array()[1].is_string()) {
      in.fail("tojson's separators are two strings");
    }
    options.item_separator = bound[2]->as_array()[0].as_string();
    options.key_separator = bound[2]->as_array()[1].as_string();
  }
  auto json = to_json(value, options);
  if (!json) in.fail("Object of type " + value.type_name() + " is not JSON serializable");
  return text_of(in, std::move(*json));
}

Value filter_length(Interpreter& in, const Value& value, CallArgs& args) {
  bind_args(in, "length", args, {});
  if (value.is_string()) return static_cast<std::int64_t>(code_points(value.as_string()));
  if (value.is_array() && !value.is_generator()) return static_cast<std::int64_t>(value.as_array().size());
  if (value.is_object()) return static_cast<std::int64_t>(value.as_object().size());
  if (value.is_undefined()) return std::int64_t{0};
  in.fail("object of type '" + value.type_name() + "' has no len()");
}

Value filter_trim(Interpreter& in, const Value& value, CallArgs& args) {
  auto bound = bind_args(in, "trim", args, {"chars"});
  std::optional<std::string> chars;
  if (bound[0] && !bound[0]->is_none()) chars = python_str(*bound[0]);
  return text_of(in, python_strip(python_str(value), chars, true, true));
}

Value filter_string(Interpreter& in, const Value& value, CallArgs& args) {
  bind_args(in, "string", args, {});
  return value.is_string() ? value : text_of(in, python_str(value));
}

Value filter_first(Interpreter& in, const Value& value, CallArgs& args) {
  bind_args(in, "first", args, {});
  Array items = iterate(in, value);
  return items.empty() ? Value(Undefined{"No first item, sequence was empty."}) : items.front();
}

Value filter_last(Interpreter& in, const Value& value, CallArgs& args) {
  bind_args(in, "last", args, {});
  if (value.is_generator()) in.fail("'generator' object is not reversible");
  Array items = iterate(in, value);
  return items.empty() ? Value(Undefined{"No last item, sequence was empty."}) : items.back();
}

Value filter_join(Interpreter& in, const Value& value, CallArgs& args) {
  auto bound = bind_args(in, "join", args, {"d", "attribute"});
  std::string separator = bound[0] ? python_str(*bound[0]) : "";
  std::string out;
  Array items = iterate(in, value);
  for (std::size_t i = 0; i < items.size(); ++i) {
    in.step();
    const Value item = bound[1] && !bound[1]->is_none() ? attribute_path(in, items[i], *bound[1]) : items[i];
    out += (i ? separator : "") + python_str(item);
  }
  return text_of(in, std::move(out));
}

Value filter_list(Interpreter& in, const Value& value, CallArgs& args) {
  bind_args(in, "list", args, {});
  return Value(iterate(in, value));
}

Value filter_map(Interpreter& in, const Value& value, CallArgs& args) {
  Array out;
  std::optional<Value> attribute, fallback;
  for (auto& [key, v] : args.keyword) {
    if (key == "attribute") attribute = v;
    else if (key == "default") fallback = v;
    else in.fail("map got an unexpected keyword argument '" + key + "'");
  }
  if (!attribute && args.positional.empty()) in.fail("map needs a filter name or attribute=");
  if (!value.truthy()) return Value(Array{}, Sequence::generator);  // jinja2: "if value:"
  for (const Value& item : iterate(in, value)) {
    in.step();
    if (attribute) {
      Value mapped = attribute_path(in, item, *attribute);
      out.push_back(mapped.is_undefined() && fallback ? *fallback : mapped);
      continue;
    }
    CallArgs rest{{args.positional.begin() + 1, args.positional.end()}, {}};
    out.push_back(apply_filter(in, python_str(args.positional[0]), item, rest));
  }
  return Value(std::move(out), Sequence::generator);
}

// select / reject (by a test on the item) and selectattr / rejectattr (on an attribute of it).
Value select_items(Interpreter& in, const Value& value, CallArgs& args, bool by_attribute, bool keep) {
  if (!args.keyword.empty()) in.fail("select filters take no keyword arguments");
  std::size_t next = 0;
  std::optional<Value> attribute;
  if (by_attribute) {
    if (args.positional.empty()) in.fail("selectattr and rejectattr need an attribute");
    attribute = args.positional[next++];
  }
  std::optional<std::string> test;
  if (next < args.positional.size()) test = python_str(args.positional[next++]);
  if (test && !has_test(*test)) in.fail("no test named '" + *test + "'");
  Array out;
  if (!value.truthy()) return Value(Array{}, Sequence::generator);  // jinja2: "if value:"
  for (const Value& item : iterate(in, value)) {
    in.step();
    Value subject = attribute ? attribute_path(in, item, *attribute) : item;
    CallArgs test_args{{args.positional.begin() + static_cast<std::ptrdiff_t>(next), args.positional.end()}, {}};
    bool passes = test ? apply_test(in, *test, subject, test_args) : subject.truthy();
    if (passes == keep) out.push_back(item);
  }
  return Value(std::move(out), Sequence::generator);
}

Value filter_select(Interpreter& in, const Value& v, CallArgs& a) { return select_items(in, v, a, false, true); }
Value filter_reject(Interpreter& in, const Value& v, CallArgs& a) { return select_items(in, v, a, false, false); }
Value filter_selectattr(Interpreter& in, const Value& v, CallArgs& a) { return select_items(in, v, a, true, true); }
Value filter_rejectattr(Interpreter& in, const Value& v, CallArgs& a) { return select_items(in, v, a, true, false); }

Value filter_default(Interpreter& in, const Value& value, CallArgs& args) {
  auto bound = bind_args(in, "default", args, {"default_value", "boolean"});
  bool use_default = value.is_undefined() || (flag(bound[1]) && !value.truthy());
  return use_default ? bound[0].value_or(Value(std::string())) : value;
}

Value filter_upper(Interpreter& in, const Value& value, CallArgs& args) {
  bind_args(in, "upper", args, {});
  return text_of(in, ascii_upper(python_str(value)));
}

Value filter_lower(Interpreter& in, const Value& value, CallArgs& args) {
  bind_args(in, "lower", args, {});
  return text_of(in, ascii_lower(python_str(value)));
}

Value filter_capitalize(Interpreter& in, const Value& value, CallArgs& args) {
  bind_args(in, "capitalize", args, {});
  return text_of(in, python_capitalize(python_str(value)));
}

// jinja2's title: each word (split at whitespace, - ( { [ <) with its first character upper.
Value filter_title(Interpreter& in, const Value& value, CallArgs& args) {
  bind_args(in, "title", args, {});
  std::string text = python_str(value), out;
  bool word_start = true;
  for (char c : text) {
    bool separator = is_python_space(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
    out += separator ? c : static_cast<char>(word_start ? std::toupper(static_cast<unsigned char>(c))
                                                         : std::tolower(static_cast<unsigned char>(c)));
    word_start = separator;
  }
  return text_of(in, std::move(out));
}

Value filter_replace(Interpreter& in, const Value& value, CallArgs& args) {
  auto bound = bind_args(in, "replace", args, {"old", "new", "count"});
  if (!bound[0] || !bound[1]) in.fail("replace takes the old and the new text");
  std::int64_t count = bound[2] && !bound[2]->is_none() ? bound[2]->as_int() : -1;
  return text_of(in, python_replace(python_str(value), python_str(*bound[0]), python_str(*bound[1]), count));
}

Value filter_int(Interpreter& in, const Value& value, CallArgs& args) {
  auto bound = bind_args(in, "int", args, {"default", "base"});
  Value fallback = bound[0].value_or(Value(std::int64_t{0}));
  if (value.is_int() || value.is_bool()) return value.as_int();
  if (value.is_float()) return static_cast<std::int64_t>(value.as_double());
  if (!value.is_string()) return fallback;
  std::string text = python_strip(value.as_string(), std::nullopt, true, true);
  std::erase(text, '_');
  try {
    std::size_t used = 0;
    std::int64_t parsed = std::stoll(text, &used, static_cast<int>(bound[1] ? bound[1]->as_int() : 10));
    if (used == text.size()) return parsed;
    double d = std::stod(text, &used);
    if (used == text.size() && std::isfinite(d)) return static_cast<std::int64_t>(d);
  } catch (const std::exception&) {
  }
  return fallback;
}

Value filter_float(Interpreter& in, const Value& value, CallArgs& args) {
  auto bound = bind_args(in, "float", args, {"default"});
  if (value.is_number()) return value.as_double();
  if (value.is_string()) {
    std::string text = python_strip(value.as_string(), std::nullopt, true, true);
    try {
      std::size_t used = 0;
      double d = std::stod(text, &used);
      if (used == text.size()) return d;
    } catch (const std::exception&) {
    }
  }
  return bound[0].value_or(Value(0.0));
}

Value filter_items(Interpreter& in, const Value& value, CallArgs& args) {
  bind_args(in, "items", args, {});
  if (value.is_undefined()) return Value(Array{}, Sequence::generator);
  if (!value.is_object()) in.fail("Can only get item pairs from a mapping.");
  CallArgs none;
  return Value(call_method(in, value, "items", none).as_array(), Sequence::generator);
}

Value filter_unique(Interpreter& in, const Value& value, CallArgs& args) {
  auto bound = bind_args(in, "unique", args, {"case_sensitive", "attribute"});
  Array out, seen;
  for (const Value& item : iterate(in, value)) {
    in.step();
    Value key = sort_key(in, item, bound[1], flag(bound[0]));
    if (std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return equal(s, key); })) continue;
    seen.push_back(key);
    out.push_back(item);
  }
  return Value(std::move(out), Sequence::generator);
}

Value filter_indent(Interpreter& in, const Value& value, CallArgs& args) {
  auto bound = bind_args(in, "indent", args, {"width", "first", "blank"});
  std::string indentation = !bound[0] ? "    "
                            : bound[0]->is_string() ? bound[0]->as_string()
                                                    : std::string(static_cast<std::size_t>(std::max<std::int64_t>(0, bound[0]->as_int())), ' ');
  std::vector<std::string> lines = python_splitlines(python_str(value) + "\n");
  std::string out;
  for (std::size_t i = 0; i < lines.size(); ++i) {
    if (i > 0) out += "\n" + ((flag(bound[2]) || !lines[i].empty()) ? indentation : "");
    out += lines[i];
  }
  if (flag(bound[1])) out = indentation + out;
  return text_of(in, std::move(out));
}

Value filter_round(Interpreter& in, const Value& value, CallArgs& args) {
  auto bound = bind_args(in, "round", args, {"precision", "method"});
  if (!value.is_number()) in.fail("round needs a number, not " + value.type_name());
  double scale = std::pow(10.0, static_cast<double>(bound[0] ? bound[0]->as_int() : 0));
  std::string method = bound[1] ? python_str(*bound[1]) : "common";
  double x = value.as_double() * scale;
  if (method == "ceil") return std::ceil(x) / scale;
  if (method == "floor") return std::floor(x) / scale;
  if (method != "common") in.fail("method must be common, ceil or floor");
  return std::nearbyint(x) / scale;  // Python's round: halves to even
}

Value filter_abs(Interpreter& in, const Value& value, CallArgs& args) {
  bind_args(in, "abs", args, {});
  if (value.is_float()) return std::fabs(value.as_double());
  if (value.is_int() || value.is_bool()) return value.as_int() < 0 ? -value.as_int() : value.as_int();
  in.fail("bad operand type for abs(): '" + value.type_name() + "'");
}

Value filter_dictsort(Interpreter& in, const Value& value, CallArgs& args) {
  auto bound = bind_args(in, "dictsort", args, {"case_sensitive", "by", "reverse"});
  if (!value.is_object()) in.fail("dictsort needs a mapping, not " + value.type_name());
  bool by_value = bound[1] && python_str(*bound[1]) == "value";
  std::vector<std::pair<Value, Value>> keyed;
  for (const auto& [key, item] : value.as_object().entries()) {
    Value pair(Array{key, item}, Sequence::tuple);
    keyed.emplace_back(sort_key(in, by_value ? item : key, std::nullopt, flag(bound[0])), pair);
  }
  sort_by_keys(in, keyed, flag(bound[2]));
  Array out;
  for (auto& [key, pair] : keyed) out.push_back(std::move(pair));
  return Value(std::move(out));
}

Value filter_sort(Interpreter& in, const Value& value, CallArgs& args) {
  auto bound = bind_args(in, "sort", args, {"reverse", "case_sensitive", "attribute"});
  std::vector<std::pair<Value, Value>> keyed;
  for (const Value& item : iterate(in, value)) keyed.emplace_back(sort_key(in, item, bound[2], flag(bound[1])), item);
  sort_by_keys(in, keyed, flag(bound[0]));
  Array out;
  for (auto& [key, item] : keyed) out.push_back(std::move(item));
  return Value(std::move(out));
}

Value extreme(Interpreter& in, const Value& value, CallArgs& args, bool smallest) {
  auto bound = bind_args(in, smallest ? "min" : "max", args, {"case_sensitive", "attribute"});
  Array items = iterate(in, value);
  if (items.empty()) return Undefined{std::string("No aggregated item, sequence was empty.")};
  std::size_t best = 0;
  for (std::size_t i = 1; i < items.size(); ++i) {
    Value a = sort_key(in, items[i], bound[1], flag(bound[0])), b = sort_key(in, items[best], bound[1], flag(bound[0]));
    if (smallest ? ordered_before(in, a, b) : ordered_before(in, b, a)) best = i;
  }
  return items[best];
}

Value filter_min(Interpreter& in, const Value& v, CallArgs& a) { return extreme(in, v, a, true); }
Value filter_max(Interpreter& in, const Value& v, CallArgs& a) { return extreme(in, v, a, false); }

Value filter_sum(Interpreter& in, const Value& value, CallArgs& args) {
  auto bound = bind_args(in, "sum", args, {"attribute", "start"});
  Value total = bound[1].value_or(Value(std::int64_t{0}));
  for (const Value& item : iterate(in, value)) {
    total = arithmetic(in, "+", total, bound[0] && !bound[0]->is_none() ? attribute_path(in, item, *bound[0]) : item);
  }
  return total;
}

Value filter_reverse(Interpreter& in, const Value& value, CallArgs& args) {
  bind_args(in, "reverse", args, {});
  Array items = iterate(in, value);
  std::reverse(items.begin(), items.end());
  if (!value.is_string()) return Value(std::move(items), Sequence::generator);  // an iterator in jinja2
  std::string out;
  for (const Value& c : items) out += c.as_string();
  return text_of(in, std::move(out));
}

Value filter_wordcount(Interpreter& in, const Value& value, CallArgs& args) {
  bind_args(in, "wordcount", args, {});
  std::int64_t words = 0;
  bool in_word = false;
  for (char c : python_str(value)) {
    bool word = std::isalnum(static_cast<unsigned char>(c)) || c == '_' || static_cast<unsigned char>(c) >= 0x80;
    if (word && !in_word) ++words;
    in_word = word;
  }
  return words;
}

Value filter_escape(Interpreter& in, const Value& value, CallArgs& args) {
  bind_args(in, "escape", args, {});
  if (value.is_markup()) return value;
  std::string text = html_escape(python_str(value));
  in.charge(text.size());
  return Markup{std::move(text)};
}

Value filter_safe(Interpreter& in, const Value& value, CallArgs& args) {
  bind_args(in, "safe", args, {});
  if (value.is_markup()) return value;
  std::string text = python_str(value);
  in.charge(text.size());
  return Markup{std::move(text)};
}

Value filter_attr(Interpreter& in, const Value& value, CallArgs& args) {
  auto bound = bind_args(in, "attr", args, {"name"});
  if (!bound[0] || !bound[0]->is_string()) in.fail("attr takes an attribute name");
  return get_attribute(in, value, bound[0]->as_string());
}

const std::unordered_map<std::string_view, Filter>& filters() {
  static const std::unordered_map<std::string_view, Filter> table = {
      {"tojson", filter_tojson}, {"length", filter_length}, {"count", filter_length}, {"trim", filter_trim},
      {"string", filter_string}, {"safe", filter_safe}, {"first", filter_first}, {"last", filter_last},
      {"join", filter_join}, {"list", filter_list}, {"map", filter_map}, {"select", filter_select},
      {"reject", filter_reject}, {"selectattr", filter_selectattr}, {"rejectattr", filter_rejectattr},
      {"default", filter_default}, {"d", filter_default}, {"upper", filter_upper}, {"lower", filter_lower},
      {"capitalize", filter_capitalize}, {"title", filter_title}, {"replace", filter_replace},
      {"int", filter_int}, {"float", filter_float}, {"items", filter_items}, {"unique", filter_unique},
      {"indent", filter_indent}, {"round", filter_round}, {"abs", filter_abs}, {"dictsort", filter_dictsort},
      {"sort", filter_sort}, {"min", filter_min}, {"max", filter_max}, {"sum", filter_sum},
      {"reverse", filter_reverse}, {"wordcount", filter_wordcount}, {"escape", filter_escape},
      {"e", filter_escape}, {"attr", filter_attr},
  };
  return table;
}

// ---- tests ----

Value one_arg(Interpreter& in, std::string_view name, CallArgs& args) {
  auto bound = bind_args(in, name, args, {"other"});
  if (!bound[0]) in.fail("the test '" + std::string(name) + "' needs an argument");
  return *bound[0];
}

bool no_args(Interpreter& in, std::string_view name, CallArgs& args) {
  bind_args(in, name, args, {});
  return true;
}

const std::unordered_map<std::string_view, Test>& tests() {
  static const std::unordered_map<std::string_view, Test> table = {
      {"defined", [](Interpreter& in, const Value& v, CallArgs& a) { return no_args(in, "defined", a) && !v.is_undefined(); }},
      {"undefined", [](Interpreter& in, const Value& v, CallArgs& a) { return no_args(in, "undefined", a) && v.is_undefined(); }},
      {"none", [](Interpreter& in, const Value& v, CallArgs& a) { return no_args(in, "none", a) && v.is_none(); }},
      {"string", [](Interpreter& in, const Value& v, CallArgs& a) { return no_args(in, "string", a) && v.is_string(); }},
      {"mapping", [](Interpreter& in, const Value& v, CallArgs& a) { return no_args(in, "mapping", a) && v.is_object(); }},
      {"iterable", [](Interpreter& in, const Value& v, CallArgs& a) {
         return no_args(in, "iterable", a) && (v.is_undefined() || v.is_string() || v.is_array() || v.is_object());
       }},
      {"sequence", [](Interpreter& in, const Value& v, CallArgs& a) {
         return no_args(in, "sequence", a) &&
                (v.is_undefined() || v.is_string() || (v.is_array() && !v.is_generator()) || v.is_object());
       }},
      {"number", [](Interpreter& in, const Value& v, CallArgs& a) { return no_args(in, "number", a) && v.is_number(); }},
      {"integer", [](Interpreter& in, const Value& v, CallArgs& a) { return no_args(in, "integer", a) && v.is_int(); }},
      {"float", [](Interpreter& in, const Value& v, CallArgs& a) { return no_args(in, "float", a) && v.is_float(); }},
      {"boolean", [](Interpreter& in, const Value& v, CallArgs& a) { return no_args(in, "boolean", a) && v.is_bool(); }},
      {"true", [](Interpreter& in, const Value& v, CallArgs& a) { return no_args(in, "true", a) && v.is_bool() && v.as_bool(); }},
      {"false", [](Interpreter& in, const Value& v, CallArgs& a) { return no_args(in, "false", a) && v.is_bool() && !v.as_bool(); }},
      {"callable", [](Interpreter& in, const Value& v, CallArgs& a) { return no_args(in, "callable", a) && v.is_callable(); }},
      {"lower", [](Interpreter& in, const Value& v, CallArgs& a) {
         return no_args(in, "lower", a) && v.is_string() && v.as_string() == ascii_lower(v.as_string());
       }},
      {"upper", [](Interpreter& in, const Value& v, CallArgs& a) {
         return no_args(in, "upper", a) && v.is_string() && v.as_string() == ascii_upper(v.as_string());
       }},
      {"even", [](Interpreter& in, const Value& v, CallArgs& a) {
         return no_args(in, "even", a) && equal(arithmetic(in, "%", v, Value(std::int64_t{2})), Value(std::int64_t{0}));
       }},
      {"odd", [](Interpreter& in, const Value& v, CallArgs& a) {
         return no_args(in, "odd", a) && equal(arithmetic(in, "%", v, Value(std::int64_t{2})), Value(std::int64_t{1}));
       }},
      {"divisibleby", [](Interpreter& in, const Value& v, CallArgs& a) {
         return equal(arithmetic(in, "%", v, one_arg(in, "divisibleby", a)), Value(std::int64_t{0}));
       }},
      {"sameas", [](Interpreter& in, const Value& v, CallArgs& a) {
         Value other = one_arg(in, "sameas", a);
         return v.type_name() == other.type_name() && equal(v, other);
       }},
      {"in", [](Interpreter& in, const Value& v, CallArgs& a) { return contains(in, one_arg(in, "in", a), v); }},
      {"escaped", [](Interpreter& in, const Value&, CallArgs& a) { return !no_args(in, "escaped", a); }},
  };
  return table;
}

// Tests named by a comparison: eq, ==, equalto, ...
const std::unordered_map<std::string_view, std::string_view>& comparison_tests() {
  static const std::unordered_map<std::string_view, std::string_view> table = {
      {"eq", "=="}, {"equalto", "=="}, {"==", "=="}, {"ne", "!="}, {"!=", "!="}, {"lt", "<"},
      {"lessthan", "<"}, {"<", "<"}, {"le", "<="}, {"<=", "<="}, {"gt", ">"}, {"greaterthan", ">"},
      {">", ">"}, {"ge", ">="}, {">=", ">="}};
  return table;
}

}  // namespace

bool has_filter(std::string_view name) { return filters().count(name) > 0; }

bool has_test(std::string_view name) {
  return tests().count(name) > 0 || comparison_tests().count(name) > 0 || name == "filter" || name == "test";
}

Value apply_filter(Interpreter& in, const std::string& name, const Value& operand, CallArgs& args) {
  auto it = filters().find(name);
  if (it == filters().end()) in.fail("no filter named '" + name + "'");
  return it->second(in, operand, args);
}

bool apply_test(Interpreter& in, const std::string& name, const Value& operand, CallArgs& args) {
  if (auto comparison = comparison_tests().find(name); comparison != comparison_tests().end()) {
    return compare(in, std::string(comparison->second), operand, one_arg(in, name, args));
  }
  if (name == "filter" || name == "test") {
    return no_args(in, name, args) && operand.is_string() &&
           (name == "filter" ? has_filter(operand.as_string()) : has_test(operand.as_string()));
  }
  auto it = tests().find(name);
  if (it == tests().end()) in.fail("no test named '" + name + "'");
  return it->second(in, operand, args);
}

}  // namespace mqlm::model::jinja
