#include "model/gguf/rope_scaling.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace mqlm::model::gguf {

namespace {

constexpr RopeScalingType kTypes[] = {RopeScalingType::none, RopeScalingType::linear, RopeScalingType::yarn,
                                      RopeScalingType::llama3, RopeScalingType::longrope};
constexpr std::uint32_t kLlama3OriginalContext = 8192;

// The float at `key`, or `fallback`; a key of another type is an error.
std::variant<float, std::string> float_key(const GgufFile& file, const std::string& key, float fallback) {
  if (file.find(key) == nullptr) return fallback;
  auto value = file.get_float(key);
  if (!value || !std::isfinite(*value)) return "metadata " + key + " is not a number";
  return static_cast<float>(*value);
}

}  // namespace

const char* rope_scaling_type_name(RopeScalingType type) {
  switch (type) {
    case RopeScalingType::none: return "none";
    case RopeScalingType::linear: return "linear";
    case RopeScalingType::yarn: return "yarn";
    case RopeScalingType::llama3: return "llama3";
    case RopeScalingType::longrope: return "longrope";
  }
  return "?";
}

std::optional<RopeScalingType> parse_rope_scaling_type(std::string_view name) {
  for (RopeScalingType type : kTypes) {
    if (name == rope_scaling_type_name(type)) return type;
  }
  return std::nullopt;
}

std::variant<RopeScaling, std::string> read_rope_scaling(const GgufFile& file, const std::string& arch) {
  const std::string p = arch + ".rope.scaling.";
  RopeScaling s;
  const std::string_view type_name = file.get_string(p + "type").value_or("linear");
  auto type = parse_rope_scaling_type(type_name);
  if (!type) {
    return "rope scaling '" + std::string(type_name) + "' is not supported (none, linear, yarn, llama3 and longrope are)";
  }
  s.type = *type;
  std::string why;
  auto read = [&](const std::string& key, float& out) {
    auto value = float_key(file, key, out);
    if (auto* error = std::get_if<std::string>(&value)) {
      if (why.empty()) why = *error;
    } else {
      out = std::get<float>(value);
    }
  };
  if (s.type == RopeScalingType::llama3) s.factor = 8.0f;  // Hugging Face's default
  if (s.type != RopeScalingType::none) {
    read(file.find(p + "factor") != nullptr ? p + "factor" : arch + ".rope.scale_linear", s.factor);
  }
  read(p + "attn_factor", s.attn_factor);
  read(p + "yarn_ext_factor", s.yarn_ext_factor);
  read(p + "yarn_beta_fast", s.yarn_beta_fast);
  read(p + "yarn_beta_slow", s.yarn_beta_slow);
  read(p + "low_freq_factor", s.low_freq_factor);
  read(p + "high_freq_factor", s.high_freq_factor);
  if (!why.empty()) return why;
  if (s.factor == 0.0f) s.factor = 1.0f;  // llama.cpp reads 0 as unscaled
  if (!(s.factor > 0) || !(s.attn_factor > 0)) return std::string("rope scaling factors must be positive");
  if (s.type == RopeScalingType::llama3 && !(s.high_freq_factor > s.low_freq_factor && s.low_freq_factor > 0)) {
    return std::string("llama3 rope scaling needs 0 < low_freq_factor < high_freq_factor");
  }
  const auto original = file.get_uint(p + "original_context_length");
  if (original && (*original == 0 || *original > 0xffffffffu)) return p + "original_context_length is out of range";
  s.original_context = original ? static_cast<std::uint32_t>(*original)
                                : (s.type == RopeScalingType::llama3 ? kLlama3OriginalContext : 0);
  return s;
}

void write_rope_scaling(GgufWriter& writer, const std::string& arch, const RopeScaling& s) {
  if (s.type == RopeScalingType::none) return;
  const std::string p = arch + ".rope.scaling.";
  if (s.type != RopeScalingType::longrope) {
    writer.set(p + "type", std::string(rope_scaling_type_name(s.type)));
    writer.set(p + "factor", s.factor);
  }
  if (s.attn_factor != 1.0f) writer.set(p + "attn_factor", s.attn_factor);
  if (s.original_context != 0) writer.set(p + "original_context_length", s.original_context);
  if (s.type == RopeScalingType::llama3) {
    writer.set(p + "low_freq_factor", s.low_freq_factor);
    writer.set(p + "high_freq_factor", s.high_freq_factor);
  }
}

std::vector<float> llama3_rope_factors(const RopeScaling& s, float freq_base, std::uint32_t rotary_dims) {
  const float original = static_cast<float>(s.original_context != 0 ? s.original_context : kLlama3OriginalContext);
  const float low_wavelength = original / s.low_freq_factor, high_wavelength = original / s.high_freq_factor;
  std::vector<float> factors(rotary_dims / 2);
  for (std::uint32_t i = 0; i < factors.size(); ++i) {
    const float freq = 1.0f / std::pow(freq_base, static_cast<float>(2 * i) / static_cast<float>(rotary_dims));
    const float wavelength = 2.0f * std::numbers::pi_v<float> / freq;
    if (wavelength < high_wavelength) {
      factors[i] = 1.0f;
    } else if (wavelength > low_wavelength) {
      factors[i] = s.factor;
    } else {
      const float smooth = (original / wavelength - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
      factors[i] = 1.0f / ((1.0f - smooth) / s.factor + smooth);
    }
  }
  return factors;
}

float longrope_attn_factor(float scale, std::uint32_t original_context) {
  if (!(scale > 1.0f) || original_context < 2) return 1.0f;
  return std::sqrt(1.0f + std::log(scale) / std::log(static_cast<float>(original_context)));
}

std::vector<float> longrope_factors(float scale, std::uint32_t rotary_dims, bool long_context) {
  std::vector<float> factors(rotary_dims / 2);
  for (std::size_t i = 0; i < factors.size(); ++i) {
    const float t = factors.size() < 2 ? 1.0f : static_cast<float>(i) / static_cast<float>(factors.size() - 1);
    factors[i] = long_context ? 1.0f + (std::max(scale, 1.0f) - 1.0f) * t * t : 1.0f + 2.0f * t;
  }
  return factors;
}

}  // namespace mqlm::model::gguf
