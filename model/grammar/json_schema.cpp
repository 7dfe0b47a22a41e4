#include "model/grammar/json_schema.hpp"

#include <limits>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string_view>
#include <vector>

#include "model/grammar/matcher.hpp"

namespace mqlm::model::grammar {
namespace {

using json = nlohmann::ordered_json;
using Sequence = GrammarBuilder::Sequence;

constexpr std::size_t kMaxIndent = 20;       // spaces or tabs after a newline
constexpr std::size_t kMaxIntegerDigits = 16;
constexpr std::size_t kMaxFractionDigits = 16;
constexpr std::size_t kMaxExponentDigits = 3;
constexpr std::size_t kUnbounded = std::numeric_limits<std::size_t>::max();  // a repeat with no maximum

// Refusals travel up the recursion as this and leave compile_json_schema as a SchemaError.
struct Refusal : std::runtime_error {
  using std::runtime_error::runtime_error;
};

const std::set<std::string, std::less<>> kAnnotations = {"title", "description", "examples", "default",
                                                         "$schema", "$id", "$comment", "$defs", "definitions"};
const std::set<std::string, std::less<>> kKeywords = {
    "type",     "const",    "enum",      "anyOf",     "oneOf",     "allOf",     "$ref",   "properties",
    "required", "additionalProperties",  "items",     "minItems",  "maxItems",  "minLength", "maxLength",
    "format"};

ByteSet digits() { return ByteSet{}.add_range('0', '9'); }
ByteSet hex_digits() { return ByteSet{}.add_range('0', '9').add_range('a', 'f').add_range('A', 'F'); }

class Compiler {
  using B = GrammarBuilder;

 public:
  Compiler(const json& root, bool strict, const SchemaLimits& limits) : root_(root), strict_(strict), limits_(limits) {}

  std::shared_ptr<const Grammar> compile() {
    const std::uint32_t root = schema("", root_, 0);
    auto grammar = std::make_shared<const Grammar>(std::move(b_).build(root));
    if (GrammarWalker(grammar).start().empty()) throw Refusal("the schema admits no value");
    return grammar;
  }

 private:
  [[noreturn]] static void refuse(const std::string& path, const std::string& why) {
    throw Refusal((path.empty() ? std::string("the schema") : path) + ": " + why);
  }

  void check_size() {
    if (b_.element_count() > limits_.max_elements) {
      throw Refusal("the schema makes a grammar of more than " + std::to_string(limits_.max_elements) +
                    " elements: make it smaller (fewer properties, enum values, or smaller length bounds)");
    }
  }

  std::uint32_t rule(const std::vector<Sequence>& alternatives) {
    const std::uint32_t r = b_.rule_of(alternatives);
    check_size();
    return r;
  }

  std::size_t bound(const json& s, const char* key, const std::string& path, std::size_t fallback) {
    if (!s.contains(key)) return fallback;
    const json& v = s[key];
    if (!v.is_number_unsigned() || v.get<std::uint64_t>() > limits_.max_repeat) {
      refuse(path, std::string("'") + key + "' must be an integer from 0 to " + std::to_string(limits_.max_repeat));
    }
    return v.get<std::size_t>();
  }

  // ---- shared pieces ------------------------------------------------------------------------

  std::uint32_t ws() {
    if (ws_) return *ws_;
    std::uint32_t indent = rule({{}});
    for (std::size_t i = 0; i < kMaxIndent; ++i) indent = rule({{}, {b_.bytes(ByteSet{}.add_all(" \t")), B::ref(indent)}});
    ws_ = rule({{}, {b_.byte(' ')}, {b_.byte('\n'), B::ref(indent)}});
    return *ws_;
  }

  // One character of a string's body: printable ASCII but '"' and '\', an escape, or a
  // well-formed UTF-8 sequence of 2 to 4 bytes (Unicode's table 3-7: no overlong forms, no
  // surrogates, nothing past U+10FFFF), so the text stays valid UTF-8.
  std::uint32_t string_char() {
    if (string_char_) return *string_char_;
    ByteSet plain = ByteSet{}.add_range(0x20, 0x7E);
    plain.words[0x22 >> 6] &= ~(std::uint64_t{1} << (0x22 & 63));
    plain.words[0x5C >> 6] &= ~(std::uint64_t{1} << (0x5C & 63));
    auto range = [&](std::uint8_t low, std::uint8_t high) { return b_.bytes(ByteSet{}.add_range(low, high)); };
    const Element cont = range(0x80, 0xBF);
    const Element hex = b_.bytes(hex_digits());
    string_char_ = rule({{b_.bytes(plain)},
                         {b_.byte('\\'), b_.bytes(ByteSet{}.add_all("\"\\/bfnrt"))},
                         {b_.byte('\\'), b_.byte('u'), hex, hex, hex, hex},
                         {range(0xC2, 0xDF), cont},
                         {range(0xE0, 0xE0), range(0xA0, 0xBF), cont},
                         {b_.bytes(ByteSet{}.add_range(0xE1, 0xEC).add_range(0xEE, 0xEF)), cont, cont},
                         {range(0xED, 0xED), range(0x80, 0x9F), cont},
                         {range(0xF0, 0xF0), range(0x90, 0xBF), cont, cont},
                         {range(0xF1, 0xF3), cont, cont, cont},
                         {range(0xF4, 0xF4), range(0x80, 0x8F), cont, cont}});
    return *string_char_;
  }

  // item{min,max} (max kUnbounded: no maximum), as a rule.
  std::uint32_t repeat(const Sequence& item, std::size_t min, std::size_t max) {
    std::uint32_t tail;
    if (max == kUnbounded) {
      tail = b_.new_rule();
      Sequence more = item;
      more.push_back(B::ref(tail));
      b_.add_alternative(tail, {});
      b_.add_alternative(tail, more);
    } else {
      tail = rule({{}});
      for (std::size_t i = min; i < max; ++i) {
        Sequence more = item;
        more.push_back(B::ref(tail));
        tail = rule({{}, more});
      }
    }
    Sequence all;
    for (std::size_t i = 0; i < min; ++i) all.insert(all.end(), item.begin(), item.end());
    all.push_back(B::ref(tail));
    return rule({all});
  }

  // item (sep item)* with between min and max items.
  Sequence list(const Sequence& item, const Sequence& sep, std::size_t min, std::size_t max) {
    if (max == 0) return {};
    Sequence more = sep;
    more.insert(more.end(), item.begin(), item.end());
    const std::size_t more_min = min > 0 ? min - 1 : 0;
    const std::size_t more_max = max == kUnbounded ? kUnbounded : max - 1;
    Sequence some = item;
    some.push_back(B::ref(repeat(more, more_min, more_max)));
    if (min > 0) return some;
    return {B::ref(rule({{}, some}))};
  }

  std::uint32_t any_string() {
    if (!any_string_) any_string_ = string_rule(0, kUnbounded);
    return *any_string_;
  }

  std::uint32_t string_rule(std::size_t min, std::size_t max) {
    Sequence s{b_.byte('"'), B::ref(repeat({B::ref(string_char())}, min, max)), b_.byte('"')};
    return rule({s});
  }

  std::uint32_t number(bool integer) {
    std::optional<std::uint32_t>& cached = integer ? integer_ : number_;
    if (cached) return *cached;
    const Element digit = b_.bytes(digits());
    const Sequence sign{B::ref(rule({{}, {b_.byte('-')}}))};
    Sequence int_part = sign;
    int_part.push_back(B::ref(rule({{b_.byte('0')},
                                    {b_.bytes(ByteSet{}.add_range('1', '9')), B::ref(repeat({digit}, 0, kMaxIntegerDigits - 1))}})));
    if (!integer) {
      const std::uint32_t fraction = rule({{}, {b_.byte('.'), B::ref(repeat({digit}, 1, kMaxFractionDigits))}});
      const std::uint32_t exponent = rule(
          {{}, {b_.bytes(ByteSet{}.add_all("eE")), B::ref(rule({{}, {b_.bytes(ByteSet{}.add_all("+-"))}})),
                B::ref(repeat({digit}, 1, kMaxExponentDigits))}});
      int_part.push_back(B::ref(fraction));
      int_part.push_back(B::ref(exponent));
    }
    cached = rule({int_part});
    return *cached;
  }

  // key ws ':' ws value ws
  Sequence member(const Sequence& key, std::uint32_t value) {
    Sequence m = key;
    m.insert(m.end(), {B::ref(ws()), b_.byte(':'), B::ref(ws()), B::ref(value), B::ref(ws())});
    return m;
  }

  // '{' ws (member (',' ws member)*)? '}' with keys of any string.
  std::uint32_t map(std::uint32_t value) {
    Sequence s{b_.byte('{'), B::ref(ws())};
    Sequence body = list(member({B::ref(any_string())}, value), {b_.byte(','), B::ref(ws())}, 0, kUnbounded);
    s.insert(s.end(), body.begin(), body.end());
    s.push_back(b_.byte('}'));
    return rule({s});
  }

  std::uint32_t array(std::uint32_t item, std::size_t min, std::size_t max) {
    Sequence s{b_.byte('['), B::ref(ws())};
    Sequence body = list({B::ref(item), B::ref(ws())}, {b_.byte(','), B::ref(ws())}, min, max);
    s.insert(s.end(), body.begin(), body.end());
    s.push_back(b_.byte(']'));
    return rule({s});
  }

  std::uint32_t any_value() {
    if (any_value_) return *any_value_;
    any_value_ = b_.new_rule();
    const std::uint32_t v = *any_value_;
    for (const Sequence& s : std::vector<Sequence>{{B::ref(map(v))},
                                                   {B::ref(array(v, 0, kUnbounded))},
                                                   {B::ref(any_string())},
                                                   {B::ref(number(false))},
                                                   b_.literal("true"),
                                                   b_.literal("false"),
                                                   b_.literal("null")}) {
      b_.add_alternative(v, s);
    }
    return v;
  }

  // ---- formats --------------------------------------------------------------------------------

  Sequence two_digits(char first_low, char first_high, char second_low, char second_high) {
    return {b_.bytes(ByteSet{}.add_range(first_low, first_high)), b_.bytes(ByteSet{}.add_range(second_low, second_high))};
  }

  // YYYY-MM-DD, every day one that exists (February to the 28th: valid in every year).
  Sequence date() {
    const Element digit = b_.bytes(digits());
    const Sequence d01_28{B::ref(rule({two_digits('0', '0', '1', '9'), two_digits('1', '1', '0', '9'),
                                         two_digits('2', '2', '0', '8')}))};
    const std::uint32_t d01_29 = rule({d01_28, b_.literal("29")});
    const std::uint32_t d01_30 = rule({{B::ref(d01_29)}, b_.literal("30")});
    const std::uint32_t d01_31 = rule({{B::ref(d01_30)}, b_.literal("31")});
    auto month = [&](std::string_view mm, std::uint32_t days) {
      Sequence s = b_.literal(mm);
      s.insert(s.end(), {b_.byte('-'), B::ref(days)});
      return s;
    };
    std::vector<Sequence> months;
    for (std::string_view mm : {"01", "03", "05", "07", "08", "10", "12"}) months.push_back(month(mm, d01_31));
    for (std::string_view mm : {"04", "06", "09", "11"}) months.push_back(month(mm, d01_30));
    Sequence february = b_.literal("02-");
    february.insert(february.end(), d01_28.begin(), d01_28.end());
    months.push_back(february);
    return {digit, digit, digit, digit, b_.byte('-'), B::ref(rule(months))};
  }

  // hh:mm:ss(.frac)?(Z|+hh:mm|-hh:mm): RFC 3339's full-time.
  Sequence time() {
    const std::uint32_t hour = rule({two_digits('0', '1', '0', '9'), two_digits('2', '2', '0', '3')});
    const Sequence minute = two_digits('0', '5', '0', '9');
    Sequence s{B::ref(hour), b_.byte(':')};
    s.insert(s.end(), minute.begin(), minute.end());
    s.push_back(b_.byte(':'));
    s.insert(s.end(), minute.begin(), minute.end());
    s.push_back(B::ref(rule({{}, {b_.byte('.'), B::ref(repeat({b_.bytes(digits())}, 1, 6))}})));
    Sequence offset{b_.bytes(ByteSet{}.add_all("+-")), B::ref(hour), b_.byte(':')};
    offset.insert(offset.end(), minute.begin(), minute.end());
    s.push_back(B::ref(rule({{b_.byte('Z')}, offset})));
    return s;
  }

  Sequence uuid() {
    Sequence s;
    const Element hex = b_.bytes(ByteSet{}.add_range('0', '9').add_range('a', 'f'));
    for (std::size_t group : {8, 4, 4, 4, 12}) {
      if (!s.empty()) s.push_back(b_.byte('-'));
      s.insert(s.end(), group, hex);
    }
    return s;
  }

  // local@label.label(.label){0,2}: letters, digits and ._%+- before the @, labels of letters,
  // digits and '-' (not first), a top-level label of 2 to 10 letters.
  Sequence email() {
    const ByteSet alnum = ByteSet{}.add_range('a', 'z').add_range('A', 'Z').add_range('0', '9');
    const Sequence local{b_.bytes(alnum), B::ref(repeat({b_.bytes(ByteSet(alnum).add_all("._%+-"))}, 0, 31))};
    const Sequence label{b_.bytes(alnum), B::ref(repeat({b_.bytes(ByteSet(alnum).add('-'))}, 0, 20))};
    Sequence dot_label{b_.byte('.')};
    dot_label.insert(dot_label.end(), label.begin(), label.end());
    Sequence s = local;
    s.push_back(b_.byte('@'));
    s.insert(s.end(), label.begin(), label.end());
    s.push_back(B::ref(repeat(dot_label, 0, 2)));
    s.push_back(b_.byte('.'));
    s.push_back(B::ref(repeat({b_.bytes(ByteSet{}.add_range('a', 'z').add_range('A', 'Z'))}, 2, 10)));
    return s;
  }

  std::uint32_t formatted(const std::string& format, const std::string& path) {
    Sequence body;
    if (format == "date") body = date();
    else if (format == "time") body = time();
    else if (format == "date-time") {
      body = date();
      body.push_back(b_.byte('T'));
      const Sequence t = time();
      body.insert(body.end(), t.begin(), t.end());
    } else if (format == "uuid") body = uuid();
    else if (format == "email") body = email();
    else refuse(path, "format \"" + format + "\" is not supported (date, time, date-time, uuid, email are)");
    body.insert(body.begin(), b_.byte('"'));
    body.push_back(b_.byte('"'));
    return rule({body});
  }

  // ---- schemas --------------------------------------------------------------------------------

  std::uint32_t schema(const std::string& path, const json& s, std::size_t depth);
  std::uint32_t typed(const std::string& path, const json& s, const std::string& type, std::size_t depth);
  std::uint32_t object(const std::string& path, const json& s, std::size_t depth);
  std::uint32_t reference(const std::string& path, const json& s, std::size_t depth);
  std::uint32_t alternatives(const std::string& path, const json& list, const char* key, std::size_t depth);
  std::uint32_t literals(const std::string& path, const json& values);

  const json& root_;
  bool strict_;
  SchemaLimits limits_;
  GrammarBuilder b_;
  std::optional<std::uint32_t> ws_, string_char_, any_string_, number_, integer_, any_value_;
  std::map<std::string, std::uint32_t> refs_;  // "$ref" target -> its rule, made once (recursion)
};

std::uint32_t Compiler::schema(const std::string& path, const json& s, std::size_t depth) {
  if (depth > limits_.max_depth) refuse(path, "nested deeper than " + std::to_string(limits_.max_depth) + " schemas");
  if (s.is_boolean()) {
    if (!s.get<bool>()) refuse(path, "the schema false admits no value");
    return any_value();
  }
  if (!s.is_object()) refuse(path, "a schema must be an object or a boolean");
  for (const auto& [key, value] : s.items()) {
    if (!kKeywords.contains(key) && !kAnnotations.contains(key)) refuse(path, "the keyword '" + key + "' is not supported");
  }
  if (s.contains("$ref")) return reference(path, s, depth);
  if (s.contains("const")) return literals(path, json::array({s["const"]}));
  if (s.contains("enum")) return literals(path + "/enum", s["enum"]);
  if (s.contains("anyOf")) return alternatives(path, s["anyOf"], "anyOf", depth);
  if (s.contains("oneOf")) return alternatives(path, s["oneOf"], "oneOf", depth);
  if (s.contains("allOf")) {
    const json& all = s["allOf"];
    if (!all.is_array() || all.size() != 1) refuse(path + "/allOf", "only an allOf of one schema is supported");
    return schema(path + "/allOf/0", all[0], depth + 1);
  }
  if (!s.contains("type")) {
    if (s.contains("properties") || s.contains("additionalProperties") || s.contains("required")) {
      return typed(path, s, "object", depth);
    }
    if (s.contains("items")) return typed(path, s, "array", depth);
    return any_value();
  }
  const json& type = s["type"];
  if (type.is_string()) return typed(path, s, type.get<std::string>(), depth);
  if (!type.is_array() || type.empty()) refuse(path + "/type", "'type' must be a type name or a list of them");
  std::vector<Sequence> each;
  for (const json& t : type) {
    if (!t.is_string()) refuse(path + "/type", "'type' must be a type name or a list of them");
    each.push_back({B::ref(typed(path, s, t.get<std::string>(), depth))});
  }
  return rule(each);
}

std::uint32_t Compiler::typed(const std::string& path, const json& s, const std::string& type, std::size_t depth) {
  if (type == "object") return object(path, s, depth);
  if (type == "array") {
    const std::size_t min = bound(s, "minItems", path, 0);
    const std::size_t max = bound(s, "maxItems", path, kUnbounded);
    if (max < min) refuse(path, "maxItems is below minItems");
    const std::uint32_t item = s.contains("items") ? schema(path + "/items", s["items"], depth + 1) : any_value();
    return array(item, min, max);
  }
  if (type == "string") {
    if (s.contains("format")) {
      if (!s["format"].is_string()) refuse(path + "/format", "'format' must be a string");
      return formatted(s["format"].get<std::string>(), path + "/format");
    }
    const std::size_t min = bound(s, "minLength", path, 0);
    if (!s.contains("maxLength") && min == 0) return any_string();
    const std::size_t max = bound(s, "maxLength", path, kUnbounded);
    if (max < min) refuse(path, "maxLength is below minLength");
    return string_rule(min, max);
  }
  if (type == "number") return number(false);
  if (type == "integer") return number(true);
  if (type == "boolean") return rule({b_.literal("true"), b_.literal("false")});
  if (type == "null") return rule({b_.literal("null")});
  refuse(path + "/type", "unknown type \"" + type + "\" (object, array, string, number, integer, boolean, null)");
}

// The properties in the order given, each optional one that may be left out; no other key.
// after[i]: the members from i on once one has been written (each after a comma);
// first[i]: the same before any has been.
std::uint32_t Compiler::object(const std::string& path, const json& s, std::size_t depth) {
  const json additional = s.value("additionalProperties", json(false));
  if (!additional.is_boolean() && !additional.is_object()) {
    refuse(path + "/additionalProperties", "'additionalProperties' must be a boolean or a schema");
  }
  const bool extra = !(additional.is_boolean() && !additional.get<bool>());
  if (strict_ && extra) refuse(path + "/additionalProperties", "strict mode requires additionalProperties false");
  const json properties = s.value("properties", json::object());
  if (!properties.is_object()) refuse(path + "/properties", "'properties' must be an object");
  const json required = s.value("required", json::array());
  std::set<std::string> needed;
  if (!required.is_array()) refuse(path + "/required", "'required' must be a list of property names");
  for (const json& name : required) {
    if (!name.is_string() || !properties.contains(name.get<std::string>())) {
      refuse(path + "/required", "'required' names " + name.dump() + ", which is not in 'properties'");
    }
    needed.insert(name.get<std::string>());
  }
  if (properties.empty()) return map(extra ? schema(path + "/additionalProperties", additional, depth + 1) : any_value());
  std::vector<std::pair<Sequence, bool>> members;  // (member, required)
  for (const auto& [name, sub] : properties.items()) {
    const std::uint32_t value = schema(path + "/properties/" + name, sub, depth + 1);
    members.emplace_back(member(b_.literal(json(name).dump()), value), needed.contains(name));
  }
  std::uint32_t after = rule({{}});
  std::uint32_t first = rule({{}});
  for (std::size_t i = members.size(); i-- > 0;) {
    const auto& [m, is_required] = members[i];
    Sequence with_comma{b_.byte(','), B::ref(ws())};
    with_comma.insert(with_comma.end(), m.begin(), m.end());
    with_comma.push_back(B::ref(after));
    Sequence alone = m;
    alone.push_back(B::ref(after));
    const std::uint32_t next_after = is_required ? rule({with_comma}) : rule({with_comma, {B::ref(after)}});
    first = is_required ? rule({alone}) : rule({alone, {B::ref(first)}});
    after = next_after;
  }
  return rule({{b_.byte('{'), B::ref(ws()), B::ref(first), b_.byte('}')}});
}

std::uint32_t Compiler::reference(const std::string& path, const json& s, std::size_t depth) {
  for (const auto& [key, value] : s.items()) {
    if (key != "$ref" && !kAnnotations.contains(key)) refuse(path, "'$ref' beside '" + key + "' is not supported");
  }
  if (!s["$ref"].is_string()) refuse(path + "/$ref", "'$ref' must be a string");
  const std::string target = s["$ref"].get<std::string>();
  if (auto it = refs_.find(target); it != refs_.end()) return it->second;
  if (target.empty() || target[0] != '#') refuse(path + "/$ref", "only references within the schema (\"#/...\") are supported");
  const json* referred = nullptr;
  try {
    const json::json_pointer pointer(target.substr(1));
    if (root_.contains(pointer)) referred = &root_.at(pointer);
  } catch (const json::exception&) {
  }
  if (referred == nullptr) refuse(path + "/$ref", "'" + target + "' names nothing in the schema");
  const std::uint32_t r = b_.new_rule();
  refs_.emplace(target, r);
  b_.add_alternative(r, {B::ref(schema(target.substr(1), *referred, depth + 1))});
  return r;
}

std::uint32_t Compiler::alternatives(const std::string& path, const json& list, const char* key, std::size_t depth) {
  if (!list.is_array() || list.empty()) refuse(path + "/" + key, std::string("'") + key + "' must be a list of schemas");
  std::vector<Sequence> each;
  for (std::size_t i = 0; i < list.size(); ++i) {
    each.push_back({B::ref(schema(path + "/" + key + "/" + std::to_string(i), list[i], depth + 1))});
  }
  return rule(each);
}

std::uint32_t Compiler::literals(const std::string& path, const json& values) {
  if (!values.is_array() || values.empty()) refuse(path, "'enum' must be a list of values");
  if (values.size() > limits_.max_enum) refuse(path, "more than " + std::to_string(limits_.max_enum) + " values");
  std::vector<Sequence> each;
  for (const json& v : values) each.push_back(b_.literal(v.dump()));
  return rule(each);
}

}  // namespace

std::variant<std::shared_ptr<const Grammar>, SchemaError> compile_json_schema(const nlohmann::ordered_json& schema, bool strict,
                                                                             const SchemaLimits& limits) {
  try {
    return Compiler(schema, strict, limits).compile();
  } catch (const Refusal& refusal) {
    return SchemaError{refusal.what()};
  }
}

}  // namespace mqlm::model::grammar
