// A llama-family model from a GGUF file: its configuration from the metadata and its tensors
// from the mapping, as the forward passes take them. Unsupported architectures, tensor types or
// missing keys are load-time errors that name what is wrong.
#pragma once

#include <string>
#include <variant>

#include "model/gguf/gguf_file.hpp"
#include "model/llama/llama_config.hpp"
#include "model/llama/reference_model.hpp"

namespace mqlm::model {

// The configuration, or what is wrong with the metadata or with a tensor's type: every loader
// reads this first, so a file holding a tensor mqlm does not compute with (IQ2_XXS, ...) is
// refused, naming it, before any of it reaches the GPU.
std::variant<LlamaConfig, std::string> read_llama_config(const gguf::GgufFile& file);

// Tensors by name from the file; the file must outlive the source. A tensor whose type mqlm
// does not compute with makes the lookup throw std::runtime_error naming it.
TensorSource gguf_tensor_source(const gguf::GgufFile& file);

}  // namespace mqlm::model
