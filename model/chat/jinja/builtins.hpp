// What templates call by name: the filters (x | trim), the tests (x is defined), the methods of
// strings, dicts and lists (x.strip(), d.items()), the global functions, and the Python
// semantics of attribute and item access, iteration, containment and arithmetic that they and
// the interpreter share. Each behaves as in jinja2 under transformers' settings; differences
// are said where they are.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "model/chat/jinja/interpreter.hpp"
#include "model/chat/jinja/value.hpp"

namespace mqlm::model::jinja {

bool has_filter(std::string_view name);
bool has_test(std::string_view name);
Value apply_filter(Interpreter& in, const std::string& name, const Value& operand, CallArgs& args);
bool apply_test(Interpreter& in, const std::string& name, const Value& operand, CallArgs& args);

// obj.name: a method of the value's type first (Python's getattr), then a dict's key or a
// namespace's attribute; undefined when neither (an error only when obj itself is undefined).
Value get_attribute(Interpreter& in, const Value& object, const std::string& name);
// obj[key]: the item first, then (for a string key) the attribute.
Value get_item(Interpreter& in, const Value& object, const Value& key);
Value get_slice(Interpreter& in, const Value& object, const Value& start, const Value& stop, const Value& step);
Array iterate(Interpreter& in, const Value& value);  // what a for loop visits: items, keys, characters
bool contains(Interpreter& in, const Value& container, const Value& item);
Value arithmetic(Interpreter& in, const std::string& op, const Value& a, const Value& b);  // + - * / // % **
bool compare(Interpreter& in, const std::string& op, const Value& a, const Value& b);     // == != < <= > >= in notin
[[noreturn]] void fail_undefined(const Interpreter& in, const Value& undefined);

Value call_method(Interpreter& in, const Value& self, const std::string& name, CallArgs& args);
Object builtin_globals();

// Binds a call's arguments to parameter names (positional in order, then keywords): the value
// given to each, or nullopt. Fails on extra or unknown arguments, naming `what`.
std::vector<std::optional<Value>> bind_args(Interpreter& in, std::string_view what, CallArgs& args,
                                            std::initializer_list<std::string_view> params);

}  // namespace mqlm::model::jinja
