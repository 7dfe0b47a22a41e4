#include "model/grammar/response_grammar.hpp"

#include <nlohmann/json.hpp>

namespace mqlm::model::grammar {

std::variant<std::shared_ptr<const Grammar>, SchemaError> response_grammar(const ResponseFormat& format) {
  if (format.kind == static_cast<std::uint8_t>(ResponseKind::json_object)) {
    return compile_json_schema(nlohmann::ordered_json{{"type", "object"}}, false);
  }
  if (format.kind != static_cast<std::uint8_t>(ResponseKind::json_schema)) {
    return SchemaError{"the response_format asks for no JSON"};
  }
  const nlohmann::ordered_json schema = nlohmann::ordered_json::parse(format.schema, nullptr, false);
  if (schema.is_discarded()) return SchemaError{"the schema is not valid JSON"};
  return compile_json_schema(schema, format.strict);
}

std::vector<std::string> token_pieces(const Tokenizer& tokenizer) {
  std::vector<std::string> pieces(tokenizer.size());
  for (std::size_t id = 0; id < pieces.size(); ++id) {
    const auto token = static_cast<TokenId>(id);
    const TokenType type = tokenizer.token_type(token);
    if (type == TokenType::control || type == TokenType::unknown || type == TokenType::unused ||
        type == TokenType::user_defined) {
      continue;
    }
    pieces[id] = tokenizer.decode(std::span<const TokenId>(&token, 1), DecodeOptions{.sequence_start = false});
  }
  return pieces;
}

}  // namespace mqlm::model::grammar
