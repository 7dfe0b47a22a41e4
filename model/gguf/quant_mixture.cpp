#include "model/gguf/quant_mixture.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <stdexcept>

namespace mqlm::model::gguf {

namespace {

using gpu::WeightType;

// llama-quantize's aliases: the name it takes and the mixture it means.
constexpr std::pair<std::string_view, FileType> kAliases[] = {
    {"q3_k", FileType::q3_k_m}, {"q4_k", FileType::q4_k_m}, {"q5_k", FileType::q5_k_m}};

std::string lower_case(std::string_view text) {
  std::string lower(text);
  std::ranges::transform(lower, lower.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return lower;
}

// The N of a "blk.N." name; llama.cpp counts attn_v and ffn_down in layer order, one each a
// layer in the models we make, so its counters are the layer number.
std::uint32_t layer_of(std::string_view name) {
  constexpr std::string_view prefix = "blk.";
  std::uint32_t layer = 0;
  if (!name.starts_with(prefix) ||
      std::from_chars(name.data() + prefix.size(), name.data() + name.size(), layer).ec != std::errc{}) {
    throw std::invalid_argument("a layer's tensor is named blk.N.*, not " + std::string(name));
  }
  return layer;
}

// llama.cpp's use_more_bits: the first and last eighth of the layers and every third between.
bool more_bits(std::uint32_t layer, std::uint32_t layers) {
  return layer < layers / 8 || layer >= 7 * layers / 8 || (layer - layers / 8) % 3 == 2;
}

bool contains(std::string_view name, std::string_view part) { return name.find(part) != std::string_view::npos; }

}  // namespace

std::string_view file_type_name(FileType type) {
  switch (type) {
    case FileType::f32: return "f32";
    case FileType::f16: return "f16";
    case FileType::bf16: return "bf16";
    case FileType::q8_0: return "q8_0";
    case FileType::q4_0: return "q4_0";
    case FileType::q4_1: return "q4_1";
    case FileType::q5_0: return "q5_0";
    case FileType::q5_1: return "q5_1";
    case FileType::q2_k: return "q2_k";
    case FileType::q3_k_s: return "q3_k_s";
    case FileType::q3_k_m: return "q3_k_m";
    case FileType::q3_k_l: return "q3_k_l";
    case FileType::q4_k_s: return "q4_k_s";
    case FileType::q4_k_m: return "q4_k_m";
    case FileType::q5_k_s: return "q5_k_s";
    case FileType::q5_k_m: return "q5_k_m";
    case FileType::q6_k: return "q6_k";
    case FileType::iq4_nl: return "iq4_nl";
    case FileType::iq4_xs: return "iq4_xs";
  }
  return "unknown";
}

std::optional<FileType> parse_file_type(std::string_view name) {
  std::string lower = lower_case(name);
  for (auto type : all_file_types) {
    if (file_type_name(type) == lower) return type;
  }
  for (auto [alias, type] : kAliases) {
    if (alias == lower) return type;
  }
  return std::nullopt;
}

std::vector<std::string> file_type_names() {
  std::vector<std::string> names;
  for (auto type : all_file_types) {
    names.emplace_back(file_type_name(type));
    for (auto [alias, meant] : kAliases) {
      if (meant == type) names.emplace_back(alias);
    }
  }
  return names;
}

WeightType default_weight_type(FileType type) {
  switch (type) {
    case FileType::f32: return WeightType::f32;
    case FileType::f16: return WeightType::f16;
    case FileType::bf16: return WeightType::bf16;
    case FileType::q8_0: return WeightType::q8_0;
    case FileType::q4_0: return WeightType::q4_0;
    case FileType::q4_1: return WeightType::q4_1;
    case FileType::q5_0: return WeightType::q5_0;
    case FileType::q5_1: return WeightType::q5_1;
    case FileType::q2_k: return WeightType::q2_k;
    case FileType::q3_k_s:
    case FileType::q3_k_m:
    case FileType::q3_k_l: return WeightType::q3_k;
    case FileType::q4_k_s:
    case FileType::q4_k_m: return WeightType::q4_k;
    case FileType::q5_k_s:
    case FileType::q5_k_m: return WeightType::q5_k;
    case FileType::q6_k: return WeightType::q6_k;
    case FileType::iq4_nl: return WeightType::iq4_nl;
    case FileType::iq4_xs: return WeightType::iq4_xs;
  }
  throw std::invalid_argument("unknown file type");
}

FileType file_type_of(WeightType type) {
  // The first file type in the list with this default: the _S one of the K-quants.
  for (auto file_type : all_file_types) {
    if (default_weight_type(file_type) == type) return file_type;
  }
  throw std::invalid_argument("no file type is mostly " + std::string(gpu::weight_type_name(type)));
}

WeightType fitting_type(WeightType wanted, std::uint64_t row_length) {
  if (row_length % gpu::block_elements(wanted) == 0) return wanted;
  WeightType smaller = wanted;
  switch (wanted) {
    case WeightType::iq4_xs: smaller = WeightType::iq4_nl; break;
    case WeightType::q2_k:
    case WeightType::q3_k: smaller = WeightType::q4_0; break;
    case WeightType::q4_k: smaller = WeightType::q5_0; break;
    case WeightType::q5_k: smaller = WeightType::q5_1; break;
    case WeightType::q6_k: smaller = WeightType::q8_0; break;
    default: break;  // already blocks of 32: F16 below
  }
  return row_length % gpu::block_elements(smaller) == 0 ? smaller : WeightType::f16;
}

QuantMixture::QuantMixture(FileType file_type, MixtureModel model, bool pure)
    : file_type_(file_type), model_(std::move(model)), pure_(pure), default_type_(default_weight_type(file_type)) {
  if (model_.layers == 0 || model_.kv_heads == 0) throw std::invalid_argument("a model has layers and KV heads");
}

MatrixType QuantMixture::matrix_type(std::string_view name, std::uint64_t row_length) const {
  // llama.cpp leaves F32, F16 and BF16 files as they are: no mixture and no fallback.
  if (!gpu::quantized(default_type_)) return {default_type_, default_type_};
  WeightType chosen = pure_ ? default_type_ : chosen_type(name, row_length);
  return {fitting_type(chosen, row_length), chosen};
}

WeightType QuantMixture::chosen_type(std::string_view name, std::uint64_t row_length) const {
  if (name == "output.weight" || (model_.tied_embeddings && name == "token_embd.weight")) {
    return output_type(row_length);
  }
  // llama.cpp takes a fused attn_qkv for an attn_v (its own attn_qkv branch is never reached).
  if (contains(name, "attn_v.weight") || contains(name, "attn_qkv.weight")) return attn_v_type(layer_of(name));
  if (contains(name, "attn_k.weight") && eight_experts()) return WeightType::q8_0;
  if (contains(name, "ffn_down")) return ffn_down_type(layer_of(name));
  if (contains(name, "attn_output.weight")) return attn_output_type();
  return default_type_;
}

WeightType QuantMixture::output_type(std::uint64_t row_length) const {
  if (row_length % gpu::block_elements(default_type_) != 0) return WeightType::q8_0;
  return default_type_ == WeightType::q8_0 ? WeightType::q8_0 : WeightType::q6_k;
}

WeightType QuantMixture::attn_v_type(std::uint32_t layer) const {
  const bool grouped = model_.heads / model_.kv_heads >= 4;
  WeightType type = default_type_;
  switch (file_type_) {
    case FileType::q2_k: type = grouped ? WeightType::q4_k : WeightType::q3_k; break;
    case FileType::q3_k_m: type = layer < 2 ? WeightType::q5_k : WeightType::q4_k; break;
    case FileType::q3_k_l: type = WeightType::q5_k; break;
    case FileType::iq4_nl:
    case FileType::iq4_xs:
      if (grouped) type = WeightType::q5_k;
      break;
    case FileType::q4_k_m:
    case FileType::q5_k_m:
      if (more_bits(layer, model_.layers)) type = WeightType::q6_k;
      break;
    case FileType::q4_k_s:
      if (layer < 4) type = WeightType::q5_k;
      break;
    default: break;
  }
  // A 70B model's attn_v is 8 times smaller than its attn_q: more bits there cost little.
  if (is_70b() && (type == WeightType::q3_k || type == WeightType::q4_k)) type = WeightType::q5_k;
  return eight_experts() ? WeightType::q8_0 : type;
}

WeightType QuantMixture::ffn_down_type(std::uint32_t layer) const {
  const std::uint32_t layers = model_.layers;
  switch (file_type_) {
    case FileType::q2_k: return WeightType::q3_k;
    case FileType::q3_k_m: return layer < layers / 16 ? WeightType::q5_k : WeightType::q4_k;
    case FileType::q3_k_l: return WeightType::q5_k;
    case FileType::q4_k_m:
    case FileType::q5_k_m: return more_bits(layer, layers) ? WeightType::q6_k : default_type_;
    case FileType::iq4_nl:
    case FileType::iq4_xs:
    case FileType::q4_k_s: return layer < layers / 8 ? WeightType::q5_k : default_type_;
    default: return default_type_;
  }
}

WeightType QuantMixture::attn_output_type() const {
  if (eight_experts()) {
    switch (file_type_) {
      case FileType::q2_k:
      case FileType::q3_k_s:
      case FileType::q3_k_m:
      case FileType::q4_k_s:
      case FileType::q4_k_m:
      case FileType::iq4_nl:
      case FileType::iq4_xs: return WeightType::q5_k;
      default: return default_type_;
    }
  }
  switch (file_type_) {
    case FileType::q2_k: return WeightType::q3_k;
    case FileType::q3_k_m: return WeightType::q4_k;
    case FileType::q3_k_l: return WeightType::q5_k;
    default: return default_type_;
  }
}

// llama.cpp calls llama's 80-layer models with grouped KV heads, and qwen2's, 70B.
bool QuantMixture::is_70b() const {
  if (model_.layers != 80) return false;
  return (model_.arch == "llama" && model_.heads != model_.kv_heads) || model_.arch == "qwen2";
}

}  // namespace mqlm::model::gguf
