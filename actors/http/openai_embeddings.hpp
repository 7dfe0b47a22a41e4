// POST /v1/embeddings as OpenAI's API has it (and vLLM's and llama-server's): each input becomes
// a Submit with pooling, and the vectors in their FinalEvents become the answer. Pure functions,
// as openai_json.hpp's are.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/http/openai_json.hpp"
#include "messages/serving.hpp"

namespace mqlm::actors::openai {

// OpenAI takes at most 2048 inputs in one request.
inline constexpr std::size_t kMaxEmbeddingInputs = 2048;

struct EmbeddingRequest {
  std::vector<messages::Submit> submits;  // one per input, in order
  std::string model;                      // as the client named it, echoed in the answer
  bool base64 = false;                    // encoding_format "base64": little-endian float32 bytes
  std::optional<std::int64_t> dimensions; // must equal the model's width where given
};

// {"model", "input": string | [string] | [token id] | [[token id]], "encoding_format": "float" |
// "base64", "dimensions", "user"}; pooling: the server's (model::Pooling, mean or last).
std::variant<EmbeddingRequest, ApiError> parse_embedding_request(std::string_view body, std::uint8_t pooling);

// {"object": "list", "data": [{"object": "embedding", "index", "embedding"}], "model", "usage"} from
// each input's final, in order; the first final that failed is the answer's error instead, as is
// a dimensions the vectors do not have.
std::variant<nlohmann::json, ApiError> embeddings_json(const EmbeddingRequest& request,
                                                       const std::vector<messages::FinalEvent>& finals);

// The vector's float32 values, little-endian, in base64 (what OpenAI's clients decode).
std::string base64_floats(const std::vector<float>& values);

}  // namespace mqlm::actors::openai
