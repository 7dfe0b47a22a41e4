// JSON (a request's messages and tools, a test's context) as template values: objects keep their
// key order, integers stay integers. Nesting deeper than kMaxDepth is an error value.
#pragma once

#include <string>
#include <variant>

#include <nlohmann/json.hpp>

#include "model/chat/jinja/value.hpp"

namespace mqlm::model::jinja {

struct JsonInputError {
  std::string message;
};

// nlohmann::ordered_json keeps the order keys came in, which templates print in.
std::variant<Value, JsonInputError> value_from_json(const nlohmann::ordered_json& json);

}  // namespace mqlm::model::jinja
