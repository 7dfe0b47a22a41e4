#include "model/llama/gguf_model.hpp"

#include <optional>
#include <stdexcept>

namespace mqlm::model {

namespace {

// What is wrong with the first tensor whose type mqlm does not compute with, or nothing.
std::optional<std::string> uncomputed_tensor(const gguf::GgufFile& file) {
  for (const gguf::TensorInfo& tensor : file.tensors()) {
    auto type = gguf::weight_type(tensor);
    if (auto* error = std::get_if<gguf::GgufError>(&type)) return error->detail;
  }
  return std::nullopt;
}

}  // namespace

std::variant<LlamaConfig, std::string> read_llama_config(const gguf::GgufFile& file) {
  auto arch_name = file.get_string("general.architecture");
  if (!arch_name) return std::string("general.architecture is missing");
  LlamaConfig c;
  if (!parse_architecture(std::string(*arch_name), c.arch)) {
    return "architecture '" + std::string(*arch_name) + "' is not supported (mqlm runs llama, qwen2 and qwen3)";
  }
  const std::string a(*arch_name);
  auto need = [&](const std::string& key, std::uint32_t& out) -> std::string {
    auto v = file.get_uint(a + "." + key);
    if (!v || *v == 0 || *v > 0xffffffffu) return "metadata " + a + "." + key + " is missing or not a positive integer";
    out = static_cast<std::uint32_t>(*v);
    return {};
  };
  for (auto [key, field] : {std::pair{"block_count", &c.n_layers}, std::pair{"embedding_length", &c.n_embd},
                            std::pair{"feed_forward_length", &c.n_ff}, std::pair{"attention.head_count", &c.n_head}}) {
    if (std::string why = need(key, *field); !why.empty()) return why;
  }
  c.n_head_kv = static_cast<std::uint32_t>(file.get_uint(a + ".attention.head_count_kv").value_or(c.n_head));
  c.head_dim = static_cast<std::uint32_t>(file.get_uint(a + ".attention.key_length").value_or(c.n_embd / c.n_head));
  if (auto v = file.get_uint(a + ".attention.value_length"); v && *v != c.head_dim) {
    return "attention.value_length differs from key_length: not supported";
  }
  c.n_ctx_train = static_cast<std::uint32_t>(file.get_uint(a + ".context_length").value_or(4096));
  c.rope_base = static_cast<float>(file.get_float(a + ".rope.freq_base").value_or(10000.0));
  c.rms_eps = static_cast<float>(file.get_float(a + ".attention.layer_norm_rms_epsilon").value_or(1e-5));
  if (auto type = file.get_string(a + ".rope.scaling.type"); type && *type != "none") {
    if (*type != "linear") return "rope scaling '" + std::string(*type) + "' is not supported (linear is)";
    c.rope_scale = static_cast<float>(file.get_float(a + ".rope.scaling.factor").value_or(1.0));
  }
  const gguf::TensorInfo* embd = file.tensor("token_embd.weight");
  if (embd == nullptr) return std::string("the model has no tensor token_embd.weight");
  c.n_vocab = static_cast<std::uint32_t>(embd->rows());
  if (auto v = file.get_uint(a + ".vocab_size"); v && *v != c.n_vocab) {
    return "vocab_size " + std::to_string(*v) + " differs from token_embd.weight's " + std::to_string(c.n_vocab) + " rows";
  }
  c.tied_output = file.tensor("output.weight") == nullptr;
  if (std::string why = c.check(); !why.empty()) return why;
  if (auto why = uncomputed_tensor(file)) return *why;
  return c;
}

TensorSource gguf_tensor_source(const gguf::GgufFile& file) {
  return [&file](const std::string& name) -> std::optional<TensorBytes> {
    const gguf::TensorInfo* info = file.tensor(name);
    if (info == nullptr) return std::nullopt;
    auto type = gguf::weight_type(*info);
    if (auto* error = std::get_if<gguf::GgufError>(&type)) throw std::runtime_error(error->message());
    if (info->dims.size() > 2) throw std::runtime_error(name + " has more than two dimensions");
    return TensorBytes{std::get<gpu::WeightType>(type), info->rows(), info->row_length(), file.data(*info)};
  };
}

}  // namespace mqlm::model
