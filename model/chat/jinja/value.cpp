#include "model/chat/jinja/value.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

namespace mqlm::model::jinja {

namespace {

void check_depth(std::uint32_t depth) {
  if (depth > kMaxDepth) {
    throw TemplateFailure("values nest more than " + std::to_string(kMaxDepth) + " levels deep");
  }
}

// The UTF-8 sequence at text[i]: its code point and length (a bad byte counts as itself).
std::pair<std::uint32_t, std::size_t> decode_utf8(std::string_view text, std::size_t i) {
  auto byte = static_cast<unsigned char>(text[i]);
  std::size_t length = byte < 0x80 ? 1 : byte >= 0xF0 ? 4 : byte >= 0xE0 ? 3 : byte >= 0xC0 ? 2 : 1;
  if (i + length > text.size()) return {byte, 1};
  std::uint32_t code = length == 1 ? byte : byte & (0x7F >> length);
  for (std::size_t k = 1; k < length; ++k) {
    auto next = static_cast<unsigned char>(text[i + k]);
    if ((next & 0xC0) != 0x80) return {byte, 1};
    code = (code << 6) | (next & 0x3F);
  }
  return {code, length};
}

std::string hex_escape(const char* format, std::uint32_t code) {
  char buffer[16];
  std::snprintf(buffer, sizeof buffer, format, code);
  return buffer;
}

std::string repr_string(const std::string& text) {
  char quote = text.find('\'') != std::string::npos && text.find('"') == std::string::npos ? '"' : '\'';
  std::string out(1, quote);
  for (std::size_t i = 0; i < text.size();) {
    auto [code, length] = decode_utf8(text, i);
    if (code == static_cast<unsigned char>(quote) || code == '\\') out += {'\\', static_cast<char>(code)};
    else if (code == '\n') out += "\\n";
    else if (code == '\r') out += "\\r";
    else if (code == '\t') out += "\\t";
    else if (code < 0x20 || (code >= 0x7F && code <= 0xA0) || code == 0xAD) out += hex_escape("\\x%02x", code);
    else if (code == 0x2028 || code == 0x2029) out += hex_escape("\\u%04x", code);
    else out.append(text, i, length);
    i += length;
  }
  return out + quote;
}

std::string json_string(const std::string& text, bool ensure_ascii) {
  std::string out = "\"";
  for (std::size_t i = 0; i < text.size();) {
    auto [code, length] = decode_utf8(text, i);
    switch (code) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (code < 0x20) out += hex_escape("\\u%04x", code);
        else if (ensure_ascii && code >= 0x10000) {
          std::uint32_t v = code - 0x10000;
          out += hex_escape("\\u%04x", 0xD800 + (v >> 10)) + hex_escape("\\u%04x", 0xDC00 + (v & 0x3FF));
        } else if (ensure_ascii && code >= 0x80) out += hex_escape("\\u%04x", code);
        else out.append(text, i, length);
    }
    i += length;
  }
  return out + "\"";
}

std::string sequence_text(const Value& value, std::string (*item)(const Value&)) {
  const bool tuple = value.is_tuple();
  std::string out = tuple ? "(" : "[";
  const Array& items = value.as_array();
  for (std::size_t i = 0; i < items.size(); ++i) out += (i ? ", " : "") + item(items[i]);
  if (tuple && items.size() == 1) out += ",";
  return out + (tuple ? ")" : "]");
}

std::string mapping_text(const Object& object) {
  std::string out = "{";
  bool first = true;
  for (const auto& [key, item] : object.entries()) {
    out += (first ? "" : ", ") + python_repr(key) + ": " + python_repr(item);
    first = false;
  }
  return out + "}";
}

// json.dumps writes a key that is not a string as its JSON text: 1 -> "1", True -> "true".
std::string json_key(const Value& key) {
  if (key.is_none()) return "null";
  if (key.is_bool()) return key.as_bool() ? "true" : "false";
  if (key.is_int()) return std::to_string(key.as_int());
  return python_float(key.as_double());
}

struct JsonWriter {
  const JsonOptions& options;
  std::string out;

  void newline(std::size_t level) {
    out += '\n';
    for (std::size_t i = 0; i < level; ++i) out += *options.indent;
  }
  bool write(const Value& value, std::size_t level);
  template <typename Items, typename WriteItem>
  bool write_items(const Items& items, char open, char close, std::size_t level, WriteItem write_item) {
    out += open;
    if (items.empty()) return out += close, true;
    for (std::size_t i = 0; i < items.size(); ++i) {
      if (i) out += options.item_separator;
      if (options.indent) newline(level + 1);
      if (!write_item(items[i])) return false;
    }
    if (options.indent) newline(level);
    out += close;
    return true;
  }
};

bool JsonWriter::write(const Value& value, std::size_t level) {
  if (value.is_none()) out += "null";
  else if (value.is_bool()) out += value.as_bool() ? "true" : "false";
  else if (value.is_int()) out += std::to_string(value.as_int());
  else if (value.is_float()) {
    double d = value.as_double();
    out += std::isnan(d) ? "NaN" : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity") : python_float(d);
  } else if (value.is_string()) out += json_string(value.as_string(), options.ensure_ascii);
  else if (value.is_array() && !value.is_generator()) {
    return write_items(value.as_array(), '[', ']', level, [&](const Value& item) { return write(item, level + 1); });
  } else if (value.is_object()) {
    std::vector<std::pair<std::string, const Value*>> entries;
    for (const auto& [key, item] : value.as_object().entries()) {
      if (key.is_string()) entries.emplace_back(key.as_string(), &item);
      else if (key.is_none() || key.is_number()) entries.emplace_back(json_key(key), &item);
      else return false;
    }
    if (options.sort_keys) {
      std::stable_sort(entries.begin(), entries.end(), [](auto& a, auto& b) { return a.first < b.first; });
    }
    return write_items(entries, '{', '}', level, [&](const std::pair<std::string, const Value*>& entry) {
      out += json_string(entry.first, options.ensure_ascii) + options.key_separator;
      return write(*entry.second, level + 1);
    });
  } else return false;
  return true;
}

}  // namespace

const Value* Object::find(std::string_view key) const {
  auto it = string_keys_.find(std::string(key));
  return it == string_keys_.end() ? nullptr : &entries_[it->second].second;
}

const Value* Object::find_key(const Value& key) const {
  if (key.is_string()) return find(key.as_string());
  for (const auto& [name, value] : entries_)
    if (equal(name, key)) return &value;
  return nullptr;
}

void Object::set(Value key, Value value) {
  depth_ = std::max(depth_, value.depth() + 1);
  check_depth(depth_);
  holds_namespace_ = holds_namespace_ || value.holds_namespace();
  if (key.is_string()) {
    auto [it, added] = string_keys_.emplace(key.as_string(), entries_.size());
    if (!added) {
      entries_[it->second].second = std::move(value);
      return;
    }
  } else {
    for (auto& [name, existing] : entries_) {
      if (equal(name, key)) {
        existing = std::move(value);
        return;
      }
    }
  }
  entries_.emplace_back(std::move(key), std::move(value));
}

Value::Value(Array a, Sequence kind) {
  ArrayValue array{nullptr, kind, 1, false};
  for (const Value& item : a) {
    array.depth = std::max(array.depth, item.depth() + 1);
    array.holds_namespace = array.holds_namespace || item.holds_namespace();
  }
  check_depth(array.depth);
  array.items = std::make_shared<const Array>(std::move(a));
  v_ = std::move(array);
}

std::int64_t Value::as_int() const { return is_bool() ? std::int64_t{as_bool()} : held<std::int64_t>("an int"); }

double Value::as_double() const { return is_float() ? held<double>("a float") : static_cast<double>(as_int()); }

std::uint32_t Value::depth() const {
  if (is_array()) return std::get<ArrayValue>(v_).depth;
  if (is_object()) return as_object().depth();
  if (is_namespace()) return as_namespace().depth();
  return 0;
}

bool Value::holds_namespace() const {
  if (is_array()) return std::get<ArrayValue>(v_).holds_namespace;
  if (is_object()) return as_object().holds_namespace();
  return is_namespace();
}

bool Value::truthy() const {
  if (is_undefined() || is_none()) return false;
  if (is_bool()) return as_bool();
  if (is_int()) return as_int() != 0;
  if (is_float()) return as_double() != 0.0;
  if (is_string()) return !as_string().empty();
  if (is_array()) return is_generator() || !as_array().empty();
  if (is_object()) return as_object().size() > 0;
  return true;
}

std::string Value::type_name() const {
  if (is_undefined()) return "Undefined";
  if (is_none()) return "NoneType";
  if (is_bool()) return "bool";
  if (is_int()) return "int";
  if (is_float()) return "float";
  if (is_string()) return "str";
  if (is_array()) return is_tuple() ? "tuple" : is_generator() ? "generator" : "list";
  if (is_object()) return "dict";
  if (is_namespace()) return "Namespace";
  return "function";
}

bool equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() == b.as_double();
    return a.as_int() == b.as_int();
  }
  if (a.is_undefined() || b.is_undefined()) return a.is_undefined() && b.is_undefined();
  if (a.is_none() || b.is_none()) return a.is_none() && b.is_none();
  if (a.is_string() && b.is_string()) return a.as_string() == b.as_string();
  if (a.is_array() && b.is_array()) {
    if (a.is_generator() || b.is_generator()) return false;
    if (a.is_tuple() != b.is_tuple() || a.as_array().size() != b.as_array().size()) return false;
    return std::equal(a.as_array().begin(), a.as_array().end(), b.as_array().begin(), equal);
  }
  if (a.is_object() && b.is_object()) {
    if (a.as_object().size() != b.as_object().size()) return false;
    for (const auto& [key, value] : a.as_object().entries()) {
      const Value* other = b.as_object().find_key(key);
      if (!other || !equal(value, *other)) return false;
    }
    return true;
  }
  if (a.is_namespace() && b.is_namespace()) return &a.as_namespace() == &b.as_namespace();
  if (a.is_callable() && b.is_callable()) return &a.as_callable() == &b.as_callable();
  return false;
}

std::optional<bool> less(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() < b.as_double();
    return a.as_int() < b.as_int();
  }
  if (a.is_string() && b.is_string()) return a.as_string() < b.as_string();
  if (a.is_array() && b.is_array() && a.sequence_kind() == b.sequence_kind() && !a.is_generator()) {
    const Array& x = a.as_array();
    const Array& y = b.as_array();
    for (std::size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (equal(x[i], y[i])) continue;
      return less(x[i], y[i]);
    }
    return x.size() < y.size();
  }
  return std::nullopt;
}

std::string python_float(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  char buffer[64];
  auto end = std::to_chars(buffer, buffer + sizeof buffer, value, std::chars_format::scientific).ptr;
  std::string scientific(buffer, end);  // "-1.2345e+02"
  bool negative = scientific[0] == '-';
  std::size_t e = scientific.find('e');
  std::string digits;
  for (std::size_t i = negative ? 1 : 0; i < e; ++i)
    if (scientific[i] != '.') digits += scientific[i];
  int exponent = std::stoi(scientific.substr(e + 1));
  int point = exponent + 1;  // value = 0.digits x 10^point
  std::string out = negative ? "-" : "";
  if (point > 16 || point < -3) {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char exp[16];
    std::snprintf(exp, sizeof exp, "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
    return out + exp;
  }
  if (point <= 0) return out + "0." + std::string(static_cast<std::size_t>(-point), '0') + digits;
  if (static_cast<std::size_t>(point) >= digits.size()) {
    return out + digits + std::string(static_cast<std::size_t>(point) - digits.size(), '0') + ".0";
  }
  return out + digits.substr(0, static_cast<std::size_t>(point)) + "." + digits.substr(static_cast<std::size_t>(point));
}

std::string python_str(const Value& value) {
  if (value.is_undefined()) return "";
  if (value.is_string()) return value.as_string();
  return python_repr(value);
}

std::string python_repr(const Value& value) {
  if (value.is_undefined()) return "Undefined";
  if (value.is_none()) return "None";
  if (value.is_bool()) return value.as_bool() ? "True" : "False";
  if (value.is_int()) return std::to_string(value.as_int());
  if (value.is_float()) return python_float(value.as_double());
  if (value.is_markup()) return "Markup(" + repr_string(value.as_string()) + ")";
  if (value.is_string()) return repr_string(value.as_string());
  if (value.is_generator()) return "<generator object>";
  if (value.is_array()) return sequence_text(value, python_repr);
  if (value.is_object()) return mapping_text(value.as_object());
  if (value.is_namespace()) return "<Namespace " + mapping_text(value.as_namespace()) + ">";
  return "<function " + value.as_callable().name + ">";
}

std::optional<std::string> to_json(const Value& value, const JsonOptions& options) {
  JsonWriter writer{options, {}};
  if (!writer.write(value, 0)) return std::nullopt;
  return std::move(writer.out);
}

std::string html_escape(std::string_view text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

std::size_t code_points(std::string_view text) {
  std::size_t count = 0;
  for (std::size_t i = 0; i < text.size(); i += decode_utf8(text, i).second) ++count;
  return count;
}

std::vector<std::string> split_code_points(std::string_view text) {
  std::vector<std::string> out;
  for (std::size_t i = 0; i < text.size();) {
    std::size_t length = decode_utf8(text, i).second;
    out.emplace_back(text.substr(i, length));
    i += length;
  }
  return out;
}

}  // namespace mqlm::model::jinja
