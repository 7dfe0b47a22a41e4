#include "model/sampling/sampling_params.hpp"

#include <cmath>
#include <cstdio>
#include <string_view>
#include <unordered_set>

namespace mqlm::model {
namespace {

std::string show(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", value);
  return text;
}

SamplingParamsError error(std::string field, double value, std::string_view expected) {
  std::string message = field + " is " + show(value) + ": " + std::string(expected);
  return {std::move(field), std::move(message)};
}

// Checks a real-valued field against [low, high] (or (low, high] when low is open); NaN and
// infinities fail every range.
std::optional<SamplingParamsError> check_range(const char* field, float value, float low,
                                               bool low_open, float high,
                                               std::string_view expected) {
  bool ok = std::isfinite(value) && (low_open ? value > low : value >= low) && value <= high;
  if (ok) return std::nullopt;
  return error(field, value, expected);
}

std::string token_id_range(const SamplingLimits& limits) {
  return limits.vocab_size > 0 ? "a token id must be in [0, " + std::to_string(limits.vocab_size) + ")"
                               : std::string("a token id must be >= 0");
}

bool valid_token_id(std::int32_t id, const SamplingLimits& limits) {
  return id >= 0 && (limits.vocab_size <= 0 || id < limits.vocab_size);
}

bool valid_utf8(std::string_view text) {
  std::size_t i = 0;
  while (i < text.size()) {
    auto lead = static_cast<unsigned char>(text[i]);
    std::size_t length = lead < 0x80 ? 1 : (lead >> 5) == 0x6 ? 2 : (lead >> 4) == 0xE ? 3
                         : (lead >> 3) == 0x1E ? 4 : 0;
    if (length == 0 || i + length > text.size()) return false;
    std::uint32_t code = length == 1 ? lead : lead & (0x7F >> length);
    for (std::size_t k = 1; k < length; ++k) {
      auto byte = static_cast<unsigned char>(text[i + k]);
      if ((byte & 0xC0) != 0x80) return false;
      code = (code << 6) | (byte & 0x3F);
    }
    static constexpr std::uint32_t kSmallest[] = {0, 0, 0x80, 0x800, 0x10000};
    if (code < kSmallest[length] || code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF)) return false;
    i += length;
  }
  return true;
}

std::optional<SamplingParamsError> check_stops(const SamplingParams& params,
                                               const SamplingLimits& limits) {
  if (params.stop.size() > kMaxStopStrings)
    return SamplingParamsError{"stop", "stop has " + std::to_string(params.stop.size()) +
                                           " strings: at most " + std::to_string(kMaxStopStrings) +
                                           " are accepted"};
  for (std::size_t i = 0; i < params.stop.size(); ++i) {
    const std::string& stop = params.stop[i];
    std::string field = "stop[" + std::to_string(i) + "]";
    if (stop.empty()) return SamplingParamsError{field, field + " is empty: remove it or give text"};
    if (stop.size() > kMaxStopStringBytes)
      return SamplingParamsError{field, field + " is " + std::to_string(stop.size()) +
                                            " bytes long: at most " +
                                            std::to_string(kMaxStopStringBytes) + " are accepted"};
    if (!valid_utf8(stop)) return SamplingParamsError{field, field + " is not valid UTF-8"};
  }
  if (params.stop_token_ids.size() > kMaxStopTokenIds)
    return SamplingParamsError{"stop_token_ids", "stop_token_ids has " +
                                                     std::to_string(params.stop_token_ids.size()) +
                                                     " ids: at most " +
                                                     std::to_string(kMaxStopTokenIds) +
                                                     " are accepted"};
  for (std::size_t i = 0; i < params.stop_token_ids.size(); ++i) {
    std::int32_t id = params.stop_token_ids[i];
    if (!valid_token_id(id, limits)) {
      std::string field = "stop_token_ids[" + std::to_string(i) + "]";
      return SamplingParamsError{field, field + " is " + std::to_string(id) + ": " + token_id_range(limits)};
    }
  }
  return std::nullopt;
}

// Fields are named as OpenAI's JSON writes them, a map keyed by the id as a string.
std::optional<SamplingParamsError> check_logit_bias(const SamplingParams& params,
                                                    const SamplingLimits& limits) {
  if (params.logit_bias.size() > kMaxLogitBiasEntries)
    return SamplingParamsError{"logit_bias", "logit_bias has " + std::to_string(params.logit_bias.size()) +
                                                 " entries: at most " + std::to_string(kMaxLogitBiasEntries) +
                                                 " are accepted"};
  std::unordered_set<std::int32_t> seen;
  for (const TokenBias& entry : params.logit_bias) {
    std::string field = "logit_bias[\"" + std::to_string(entry.token) + "\"]";
    if (!valid_token_id(entry.token, limits))
      return SamplingParamsError{field, field + " names token " + std::to_string(entry.token) + ": " +
                                            token_id_range(limits)};
    if (!seen.insert(entry.token).second)
      return SamplingParamsError{field, field + " appears twice: give each token one bias"};
    if (auto e = check_range(field.c_str(), entry.bias, -kMaxLogitBias, false, kMaxLogitBias,
                             "it must be in [-100, 100]"))
      return e;
  }
  return std::nullopt;
}

// The schema itself is the grammar compiler's to judge (model/grammar/response_grammar.hpp):
// here only its presence, its size, and what cannot go with a constraint.
std::optional<SamplingParamsError> check_response_format(const SamplingParams& params) {
  const ResponseFormat& format = params.response_format;
  if (format.kind > static_cast<std::uint8_t>(ResponseKind::json_schema))
    return SamplingParamsError{"response_format", "response_format kind " + std::to_string(format.kind) +
                                                      " is not 0 (text), 1 (json_object) or 2 (json_schema)"};
  const bool schema = format.kind == static_cast<std::uint8_t>(ResponseKind::json_schema);
  if (schema && format.schema.empty())
    return SamplingParamsError{"response_format", "a json_schema response_format needs its schema"};
  if (!schema && !format.schema.empty())
    return SamplingParamsError{"response_format", "a schema goes only with the json_schema response_format"};
  if (format.schema.size() > kMaxSchemaBytes)
    return SamplingParamsError{"response_format", "the schema is " + std::to_string(format.schema.size()) +
                                                      " bytes of JSON: at most " + std::to_string(kMaxSchemaBytes) +
                                                      " are accepted"};
  if (format.constrained() && params.ignore_eos)
    return SamplingParamsError{"ignore_eos", "ignore_eos cannot go with a json response_format: the text ends "
                                             "with the model's end token once the JSON is complete"};
  return std::nullopt;
}

}  // namespace

std::optional<SamplingParamsError> validate(const SamplingParams& params,
                                            const SamplingLimits& limits) {
  if (auto e = check_range("temperature", params.temperature, 0.0f, false, kMaxTemperature,
                           "it must be in [0, 100]; 0 means greedy"))
    return e;
  if (params.top_k < 0)
    return error("top_k", params.top_k, "it must be >= 0; 0 turns top-k off");
  if (auto e = check_range("top_p", params.top_p, 0.0f, true, 1.0f,
                           "it must be in (0, 1]; 1 turns top-p off"))
    return e;
  if (auto e = check_range("min_p", params.min_p, 0.0f, false, 1.0f,
                           "it must be in [0, 1]; 0 turns min-p off"))
    return e;
  if (auto e = check_range("repetition_penalty", params.repetition_penalty, 0.0f, true,
                           kMaxRepetitionPenalty, "it must be in (0, 100]; 1 turns it off"))
    return e;
  if (params.repetition_last_n < 0 || params.repetition_last_n > kMaxRepetitionLastN)
    return error("repetition_last_n", params.repetition_last_n,
                 "it must be in [0, 1048576]; 0 turns the repetition penalty off");
  if (auto e = check_range("presence_penalty", params.presence_penalty,
                           -kMaxPresenceFrequencyPenalty, false, kMaxPresenceFrequencyPenalty,
                           "it must be in [-2, 2]; 0 turns it off"))
    return e;
  if (auto e = check_range("frequency_penalty", params.frequency_penalty,
                           -kMaxPresenceFrequencyPenalty, false, kMaxPresenceFrequencyPenalty,
                           "it must be in [-2, 2]; 0 turns it off"))
    return e;
  if (params.max_tokens < 1 || params.max_tokens > limits.max_tokens)
    return error("max_tokens", params.max_tokens,
                 "it must be in [1, " + std::to_string(limits.max_tokens) +
                     "] (the room left in the context)");
  if (params.top_logprobs < 0 || params.top_logprobs > kMaxTopLogprobs)
    return error("top_logprobs", params.top_logprobs, "it must be in [0, 20]");
  if (params.top_logprobs > 0 && !params.logprobs)
    return error("top_logprobs", params.top_logprobs,
                 "it needs logprobs = true; set logprobs or leave top_logprobs at 0");
  if (auto e = check_stops(params, limits)) return e;
  if (auto e = check_response_format(params)) return e;
  return check_logit_bias(params, limits);
}

bool plain_greedy(const SamplingParams& p) {
  return p.temperature == 0.0f && !p.logprobs && p.presence_penalty == 0.0f && p.frequency_penalty == 0.0f &&
         (p.repetition_penalty == 1.0f || p.repetition_last_n == 0) && p.logit_bias.empty() &&
         !p.response_format.constrained();
}

}  // namespace mqlm::model
