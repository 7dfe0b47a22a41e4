// JSON Schema -> grammar (grammar.hpp): the text a model may write for OpenAI's response_format.
//
// What a schema may say (anything else is refused, the keyword and where it is named):
//   type (one or a list), const, enum, anyOf, oneOf (its branches are not checked for overlap),
//   allOf of one schema, $ref to "#" or "#/..." within the schema ($defs, definitions; recursion
//   allowed), and the annotations title, description, examples, default, $schema, $id, $comment.
//   object: properties (written in the order given), required, additionalProperties (false; in
//     strict mode it must not be true or a schema; outside it, an object with properties writes
//     only those, one without any writes keys of its own with values of that schema);
//   array: items, minItems, maxItems;   string: minLength, maxLength, format (date, time,
//   date-time, uuid, email: a pattern each, written as RFC 3339 and RFC 4122 have them);
//   number, integer, boolean, null.  No type: any JSON value.
// The text is JSON as a model writes it, with whitespace bounded: between tokens none, one
// space, or a newline and up to 20 spaces or tabs; none before or after the value. Numbers are
// bounded too: at most 16 digits before the point, 16 after, 3 in the exponent.
//
// Objects keep their keys in the order written (nlohmann::ordered_json), which is the order the
// properties are generated in. json_object (any JSON object) is the schema {"type": "object"}.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <variant>

#include <nlohmann/json.hpp>

#include "model/grammar/grammar.hpp"

namespace mqlm::model::grammar {

struct SchemaLimits {
  std::size_t max_depth = 32;             // schemas nested in schemas
  std::size_t max_elements = 1 << 18;     // the grammar's size
  std::size_t max_enum = 1024;            // enum values
  std::size_t max_repeat = 1024;          // minItems, maxItems, minLength, maxLength
};

struct SchemaError {
  std::string message;  // what is wrong and where ("/properties/name: ...")
};

std::variant<std::shared_ptr<const Grammar>, SchemaError> compile_json_schema(const nlohmann::ordered_json& schema,
                                                                             bool strict,
                                                                             const SchemaLimits& limits = {});

}  // namespace mqlm::model::grammar
