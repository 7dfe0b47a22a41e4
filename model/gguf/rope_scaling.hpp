// How a GGUF file says its rotary embedding is stretched past the context it was trained on: the
// {arch}.rope.scaling.* keys, read as llama.cpp reads them for the llama family, and Llama 3.1's
// per-pair frequency factors, which convert_hf_to_gguf writes as the rope_freqs.weight tensor.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "model/gguf/gguf_file.hpp"
#include "model/gguf/gguf_writer.hpp"

namespace mqlm::model::gguf {

// rope.scaling.type: none; linear (positions divided by the factor); yarn (YaRN: low-frequency
// pairs interpolated, high-frequency ones kept, a ramp between, cos and sin scaled); llama3
// (Llama 3.1's factors per pair; llama.cpp knows it only as the rope_freqs.weight tensor);
// longrope (Phi-3's: a divisor per pair, the rope_factors_long.weight tensor where the context is
// past the original one and rope_factors_short.weight where not, and cos and sin scaled by
// attn_factor; convert_hf_to_gguf writes the tensors and no type key, which reads as linear with
// a factor of 1).
enum class RopeScalingType : std::uint8_t { none, linear, yarn, llama3, longrope };

struct RopeScaling {
  RopeScalingType type = RopeScalingType::none;
  float factor = 1.0f;                 // rope.scaling.factor: how many times the context is stretched
  std::uint32_t original_context = 0;  // rope.scaling.original_context_length; 0: context_length
  float attn_factor = 1.0f;            // rope.scaling.attn_factor: cos and sin multiplied by it
  // YaRN: rope.scaling.yarn_ext_factor, yarn_beta_fast, yarn_beta_slow (llama.cpp's defaults).
  // convert_hf_to_gguf writes them where a model's config has them; llama.cpp (de3ff81) reads them
  // for grok alone and takes the defaults for llama, qwen2 and qwen3, so a file with other values
  // runs differently there. (rope.scaling.yarn_attn_factor is not read: llama.cpp overwrites it.)
  float yarn_ext_factor = 1.0f, yarn_beta_fast = 32.0f, yarn_beta_slow = 1.0f;
  // llama3: rope.scaling.low_freq_factor and high_freq_factor (Hugging Face's names and defaults).
  float low_freq_factor = 1.0f, high_freq_factor = 4.0f;
};

const char* rope_scaling_type_name(RopeScalingType type);  // "none", "linear", "yarn", "llama3", "longrope"
std::optional<RopeScalingType> parse_rope_scaling_type(std::string_view name);

// The file's scaling for architecture `arch`, or what is wrong with it. As llama.cpp: no type key
// means linear (by rope.scaling.factor or the older rope.scale_linear, 1 if neither), type none
// ignores the factor. llama3 without an original_context_length takes 8192 (Llama 3's).
std::variant<RopeScaling, std::string> read_rope_scaling(const GgufFile& file, const std::string& arch);

// The keys read_rope_scaling reads back (nothing for none; longrope as convert_hf_to_gguf writes
// Phi-3's: the original context and attn_factor, no type).
void write_rope_scaling(GgufWriter& writer, const std::string& arch, const RopeScaling& scaling);

// Llama 3.1's divisor of each pair's frequency (rotary_dims / 2 of them), as convert_hf_to_gguf
// computes rope_freqs.weight: 1 for wavelengths below original_context / high_freq_factor, the
// factor past original_context / low_freq_factor, a smooth blend between.
std::vector<float> llama3_rope_factors(const RopeScaling& scaling, float freq_base, std::uint32_t rotary_dims);

// Phi-3's attention factor for a context stretched `scale` times past `original_context`, as
// convert_hf_to_gguf computes rope.scaling.attn_factor: sqrt(1 + ln(scale) / ln(original)), 1 where
// the context is not past the original.
float longrope_attn_factor(float scale, std::uint32_t original_context);

// Made-up LongRoPE factors for random-weight models (rotary_dims / 2 of them), shaped as Phi-3's
// are: from 1 for the fastest pair, rising to `scale` for the slowest (the long ones) or to 3 in a
// straight line (the short ones: far enough from 1 that a model run with the wrong set tells).
std::vector<float> longrope_factors(float scale, std::uint32_t rotary_dims, bool long_context);

}  // namespace mqlm::model::gguf
