// From a request's response_format to what constrains its sampling: the grammar (json_object's
// any object, or the json_schema compiled) and, per model, the vocabulary's pieces as a trie.
#pragma once

#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "model/grammar/json_schema.hpp"
#include "model/grammar/token_mask.hpp"
#include "model/sampling/sampling_params.hpp"
#include "model/tokenizer/tokenizer.hpp"

namespace mqlm::model::grammar {

// The grammar for a constrained format (format.constrained()); a schema that is not JSON, or
// that the compiler refuses, is a SchemaError saying why. Front ends call it to refuse a bad
// schema before the request goes on; the executor calls it again to constrain the sequence.
std::variant<std::shared_ptr<const Grammar>, SchemaError> response_grammar(const ResponseFormat& format);

// Each token's bytes as generated text continues (sequence_start false); empty for the tokens a
// constrained text never holds: control, unknown, unused and added (user_defined) tokens.
std::vector<std::string> token_pieces(const Tokenizer& tokenizer);

}  // namespace mqlm::model::grammar
