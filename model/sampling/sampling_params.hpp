// What a request asks of the sampler and of the stop conditions, and its validation: the values
// come from clients, so every absurd one is an error value that names the field, the value and
// the accepted range.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <msgpack.hpp>

namespace mqlm::model {

// One logit_bias entry: bias is added to the token's logit before the penalties.
struct TokenBias {
  std::int32_t token = 0;
  float bias = 0.0f;  // [-100, 100], OpenAI's range: -100 bans the token, 100 all but forces it
  MSGPACK_DEFINE(token, bias);
  bool operator==(const TokenBias&) const = default;
};

// What the generated text must be (OpenAI's response_format), enforced by constraining each
// draw to the tokens a grammar allows (model/grammar): any text, any JSON object, or JSON that
// validates against a schema.
enum class ResponseKind : std::uint8_t { text = 0, json_object = 1, json_schema = 2 };

struct ResponseFormat {
  std::uint8_t kind = 0;  // ResponseKind
  std::string schema;     // json_schema: the schema as JSON text (its keys in the client's order)
  bool strict = false;    // json_schema: OpenAI's strict (additionalProperties true refused)
  MSGPACK_DEFINE(kind, schema, strict);
  bool constrained() const { return kind != static_cast<std::uint8_t>(ResponseKind::text); }
  bool operator==(const ResponseFormat&) const = default;
};

struct SamplingParams {
  float temperature = 1.0f;          // 0: greedy (argmax, ties to the lowest id); up to 100
  std::int32_t top_k = 0;            // keep the k most likely; 0: off
  float top_p = 1.0f;                // keep the smallest set reaching p, in (0, 1]; 1: off
  float min_p = 0.0f;                // keep p >= min_p * p_max, in [0, 1]; 0: off
  float repetition_penalty = 1.0f;   // CTRL / llama.cpp: positive logits / r, negative * r; 1: off
  std::int32_t repetition_last_n = 64;  // over the last N tokens of prompt and output; 0: off
  float presence_penalty = 0.0f;     // OpenAI: minus this once if the token was generated, [-2, 2]
  float frequency_penalty = 0.0f;    // OpenAI: minus this per time it was generated, [-2, 2]
  std::uint64_t seed = 0;            // same seed and logits => same tokens
  std::int32_t max_tokens = 256;     // generated tokens, at least 1
  std::vector<std::string> stop;     // stop strings, never emitted themselves
  std::vector<std::int32_t> stop_token_ids;  // in addition to the model's end-of-turn tokens
  bool logprobs = false;             // report the chosen token's logprob
  std::int32_t top_logprobs = 0;     // and this many alternatives', 0..20 (needs logprobs)
  std::vector<TokenBias> logit_bias; // distinct tokens, at most 1024
  bool ignore_eos = false;           // the model's end-of-generation tokens do not stop it (stop_token_ids do)
  ResponseFormat response_format;    // text unless asked: no constraint
  // The wire form (the serving messages carry it): a positional array of the fields above. New
  // fields go last, so that arrays written before them (recorded traces) still read.
  MSGPACK_DEFINE(temperature, top_k, top_p, min_p, repetition_penalty, repetition_last_n, presence_penalty,
                 frequency_penalty, seed, max_tokens, stop, stop_token_ids, logprobs, top_logprobs, logit_bias,
                 ignore_eos, response_format);
};

// What validation measures against; the engine knows the model and the room left in the context.
struct SamplingLimits {
  std::int32_t vocab_size = 0;                // 0: unknown, token ids are only checked >= 0
  std::int32_t max_tokens = 1 << 20;          // e.g. context length minus prompt length
};

inline constexpr float kMaxTemperature = 100.0f;
inline constexpr float kMaxRepetitionPenalty = 100.0f;
inline constexpr float kMaxPresenceFrequencyPenalty = 2.0f;  // OpenAI's range, both signs
inline constexpr std::int32_t kMaxRepetitionLastN = 1 << 20;
inline constexpr std::int32_t kMaxTopLogprobs = 20;
inline constexpr std::size_t kMaxStopStrings = 16;
inline constexpr std::size_t kMaxStopStringBytes = 256;
inline constexpr std::size_t kMaxStopTokenIds = 64;
inline constexpr std::size_t kMaxLogitBiasEntries = 1024;
inline constexpr float kMaxLogitBias = 100.0f;  // OpenAI's range, both signs
inline constexpr std::size_t kMaxSchemaBytes = 64 * 1024;  // response_format's schema as JSON text

struct SamplingParamsError {
  std::string field;    // "temperature", "stop[2]", "logit_bias[\"123\"]", ...
  std::string message;  // what was wrong and what is accepted
};

// Greedy with nothing that reads the sampler's history or changes the logits: the argmax (lowest id
// on ties, as the sampler breaks them) is the sampler's choice, and the sampler need not be told
// the token, because its history feeds only the penalties, which are off for the whole request.
bool plain_greedy(const SamplingParams& params);

// The first problem found, or nothing when every field is acceptable.
std::optional<SamplingParamsError> validate(const SamplingParams& params,
                                            const SamplingLimits& limits = {});

}  // namespace mqlm::model
