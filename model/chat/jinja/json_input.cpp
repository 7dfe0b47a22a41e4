#include "model/chat/jinja/json_input.hpp"

namespace mqlm::model::jinja {

namespace {

Value convert(const nlohmann::ordered_json& json, std::uint32_t depth) {
  if (depth > kMaxDepth) throw TemplateFailure("the input nests deeper than " + std::to_string(kMaxDepth) + " levels");
  switch (json.type()) {
    case nlohmann::ordered_json::value_t::null: return None{};
    case nlohmann::ordered_json::value_t::boolean: return json.get<bool>();
    case nlohmann::ordered_json::value_t::number_integer: return json.get<std::int64_t>();
    case nlohmann::ordered_json::value_t::number_unsigned: {
      auto n = json.get<std::uint64_t>();
      if (n > static_cast<std::uint64_t>(INT64_MAX)) return static_cast<double>(n);
      return static_cast<std::int64_t>(n);
    }
    case nlohmann::ordered_json::value_t::number_float: return json.get<double>();
    case nlohmann::ordered_json::value_t::string: return json.get<std::string>();
    case nlohmann::ordered_json::value_t::array: {
      Array items;
      items.reserve(json.size());
      for (const auto& item : json) items.push_back(convert(item, depth + 1));
      return Value(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Object object;
      for (const auto& [key, item] : json.items()) object.set(key, convert(item, depth + 1));
      return object;
    }
    default: throw TemplateFailure("binary JSON values cannot be template input");
  }
}

}  // namespace

std::variant<Value, JsonInputError> value_from_json(const nlohmann::ordered_json& json) {
  try {
    return convert(json, 0);
  } catch (const TemplateFailure& failure) {
    return JsonInputError{failure.what()};
  }
}

}  // namespace mqlm::model::jinja
