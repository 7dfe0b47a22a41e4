#include "actors/http/openai_embeddings.hpp"

#include <bit>
#include <string>

#include "actors/front_end/front_end.hpp"

namespace mqlm::actors::openai {

using nlohmann::json;

namespace {

messages::Submit text_input(const json& value, std::uint8_t pooling) {
  messages::Submit submit;
  submit.prompt_kind = static_cast<std::uint8_t>(messages::PromptKind::text);
  submit.text = value.get<std::string>();
  submit.pooling = pooling;
  return submit;
}

// One input: a string or token ids; empty ones are refused (there is nothing to embed).
std::optional<ApiError> read_input(const json& value, const std::string& field, std::uint8_t pooling,
                                   std::vector<messages::Submit>& out) {
  if (value.is_string()) {
    if (value.get_ref<const std::string&>().empty()) {
      return invalid_request("'" + field + "' is an empty string: there is nothing to embed", field, "invalid_value");
    }
    out.push_back(text_input(value, pooling));
    return std::nullopt;
  }
  if (!value.is_array()) return wrong_type(field, "a string or an array of token ids", value);
  if (value.empty()) return invalid_request("'" + field + "' has no tokens: there is nothing to embed", field, "invalid_value");
  messages::Submit submit;
  submit.prompt_kind = static_cast<std::uint8_t>(messages::PromptKind::tokens);
  submit.pooling = pooling;
  if (auto failure = read_token_ids(value, field, submit.tokens)) return failure;
  out.push_back(std::move(submit));
  return std::nullopt;
}

// "input": one string, one list of token ids, or an array of either.
std::optional<ApiError> read_inputs(const json& value, std::uint8_t pooling, std::vector<messages::Submit>& out) {
  const bool several = value.is_array() && !value.empty() && (value[0].is_string() || value[0].is_array());
  if (!several) return read_input(value, "input", pooling, out);
  if (value.size() > kMaxEmbeddingInputs) {
    return invalid_request("'input' has " + std::to_string(value.size()) + " inputs: at most " +
                               std::to_string(kMaxEmbeddingInputs) + " are accepted",
                           "input", "invalid_value");
  }
  for (std::size_t i = 0; i < value.size(); ++i) {
    if (auto failure = read_input(value[i], "input[" + std::to_string(i) + "]", pooling, out)) return failure;
  }
  return std::nullopt;
}

std::optional<ApiError> read_field(const std::string& key, const json& value, EmbeddingRequest& request,
                                   std::uint8_t pooling) {
  if (key == "input") return read_inputs(value, pooling, request.submits);
  if (key == "model") {
    if (!value.is_string()) return wrong_type(key, "a string", value);
    request.model = value.get<std::string>();
    if (request.model.size() > front_end::kMaxModelNameBytes) return invalid_request("'model' is too long", key);
    return std::nullopt;
  }
  if (key == "encoding_format") {
    if (value.is_null()) return std::nullopt;
    if (!value.is_string() || (value != "float" && value != "base64")) {
      return invalid_request("'encoding_format' must be \"float\" or \"base64\"", key, "invalid_value");
    }
    request.base64 = value == "base64";
    return std::nullopt;
  }
  if (key == "dimensions") return read_integer(value, key, 1, std::numeric_limits<std::int32_t>::max(), request.dimensions);
  if (key == "user") return value.is_string() || value.is_null() ? std::nullopt : std::optional(wrong_type(key, "a string", value));
  return invalid_request("Unrecognized request argument supplied: " + key.substr(0, 64), key.substr(0, 64),
                         "unknown_parameter");
}

}  // namespace

std::variant<EmbeddingRequest, ApiError> parse_embedding_request(std::string_view body, std::uint8_t pooling) {
  auto parsed = parse_body(body);
  if (auto* error = std::get_if<ApiError>(&parsed)) return *error;
  const json& object = std::get<json>(parsed);
  EmbeddingRequest request;
  for (const auto& [key, value] : object.items()) {
    if (auto failure = read_field(key, value, request, pooling)) return *failure;
  }
  if (!object.contains("input")) return invalid_request("'input' is missing: give the text or tokens to embed", "input");
  for (messages::Submit& submit : request.submits) submit.model = request.model;
  return request;
}

std::string base64_floats(const std::vector<float>& values) {
  static constexpr char kDigits[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string bytes;
  bytes.reserve(values.size() * 4);
  for (float v : values) {
    const auto bits = std::bit_cast<std::uint32_t>(v);
    for (int shift = 0; shift < 32; shift += 8) bytes.push_back(static_cast<char>((bits >> shift) & 0xFFu));
  }
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (std::size_t i = 0; i < bytes.size(); i += 3) {
    const std::size_t n = std::min<std::size_t>(3, bytes.size() - i);
    std::uint32_t group = 0;
    for (std::size_t k = 0; k < 3; ++k) {
      group = (group << 8) | (k < n ? static_cast<std::uint8_t>(bytes[i + k]) : 0u);
    }
    for (std::size_t k = 0; k < 4; ++k) out.push_back(k <= n ? kDigits[(group >> (18 - 6 * k)) & 0x3Fu] : '=');
  }
  return out;
}

std::variant<json, ApiError> embeddings_json(const EmbeddingRequest& request,
                                             const std::vector<messages::FinalEvent>& finals) {
  json data = json::array();
  std::uint64_t prompt_tokens = 0;
  for (std::size_t i = 0; i < finals.size(); ++i) {
    const messages::FinalEvent& final_event = finals[i];
    if (!finish_reason(final_event)) {
      ApiError error = error_for(final_event);
      if (finals.size() > 1) error.message = "input[" + std::to_string(i) + "]: " + error.message;
      return error;
    }
    if (final_event.embedding.empty()) return ApiError{500, "server_error", "input " + std::to_string(i) +
                                                       " was computed but no embedding came back", std::nullopt,
                                                       "internal_error"};
    if (request.dimensions && static_cast<std::size_t>(*request.dimensions) != final_event.embedding.size()) {
      return invalid_request("'dimensions' is " + std::to_string(*request.dimensions) + ": this model's embeddings have " +
                                 std::to_string(final_event.embedding.size()) +
                                 " dimensions and are not shortened; leave it out or give that",
                             "dimensions", "invalid_value");
    }
    json vector = request.base64 ? json(base64_floats(final_event.embedding)) : json(final_event.embedding);
    data.push_back({{"object", "embedding"}, {"index", i}, {"embedding", std::move(vector)}});
    prompt_tokens += final_event.prompt_tokens;
  }
  return json{{"object", "list"},
              {"data", std::move(data)},
              {"model", request.model},
              {"usage", {{"prompt_tokens", prompt_tokens}, {"total_tokens", prompt_tokens}}}};
}

}  // namespace mqlm::actors::openai
