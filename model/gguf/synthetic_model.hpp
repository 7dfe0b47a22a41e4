// Models with seeded random weights, laid out as llama.cpp lays out llama / qwen2 / qwen3 / phi3 /
// gemma2 / gemma3 GGUF
// files, for tests (preset tiny: a few MB) and benchmarks (llama3-8b: written in seconds).
//
// Matrices are normal(0, 0.02) in the weight types llama-quantize would give them for the file
// type asked (quant_mixture.hpp), or all in one type; norm weights are 1 + normal(0, 0.02) and
// biases normal(0, 0.02), in F32. Large models repeat a pool of 4M random elements per weight
// type (each tensor starts where the previous one stopped), which is as good as fresh numbers
// for a benchmark and takes no time to make; a model smaller than the pool repeats nothing.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <map>

#include "gpu/weight_formats.hpp"
#include "model/gguf/gguf_writer.hpp"
#include "model/gguf/quant_mixture.hpp"
#include "model/gguf/rope_scaling.hpp"
#include "model/gguf/synthetic_vocabulary.hpp"

namespace mqlm::model::gguf {

struct ModelShape {
  // "llama"; "qwen2" adds q/k/v biases; "qwen3" adds per-head q/k norms; "phi3" fuses q/k/v into
  // attn_qkv and gate and up into ffn_up; "gemma2" adds the norms after attention and the
  // feed-forward block (its output always the embedding's), "gemma3" those and q/k norms
  std::string arch = "llama";
  std::uint32_t layers = 2;
  std::uint32_t hidden = 256;
  std::uint32_t heads = 4;
  std::uint32_t kv_heads = 2;
  std::uint32_t head_dim = 64;
  std::uint32_t ffn = 768;
  std::uint32_t vocab = 1024;
  std::uint32_t context = 2048;
  float rope_base = 500000.0f;
  float rms_epsilon = 1e-5f;
  bool tied_embeddings = false;  // no output.weight: the output projection is token_embd's
  std::uint32_t rotary_dims = 0;  // rope.dimension_count: the first of each head's dimensions turn; 0: all
  // the rope.scaling.* keys (none: no keys); longrope (phi3): rope_factors_long.weight and
  // rope_factors_short.weight, made up (longrope_factors), and attn_factor derived from the context's
  // stretch past original_context unless given
  RopeScaling rope_scaling = {};
  // llama3 scaling as convert_hf_to_gguf writes it (and llama.cpp reads it): the factors in the
  // rope_freqs.weight tensor and no keys; false: the keys, and no tensor.
  bool rope_freqs_tensor = true;
  // gemma2 and gemma3: attention.sliding_window (gemma2's every other layer, gemma3's five of six)
  // and gemma3's rope.freq_base_swa, the local layers' base; gemma2's soft caps of attention scores
  // and logits (attn_logit_softcapping, final_logit_softcapping).
  std::uint32_t sliding_window = 0;
  float rope_base_local = 10000.0f;
  float attn_softcap = 50.0f, final_softcap = 30.0f;
  // A mixture of experts (qwen3moe; llama with experts is Mixtral): `experts` SwiGLU blocks of
  // expert_ffn rows (0: ffn, which Mixtral's always are) in ffn_{gate,up,down}_exps, a router
  // ffn_gate_inp in F32 (as convert_hf_to_gguf writes it), experts_used of them a token. 0: dense.
  std::uint32_t experts = 0, experts_used = 0, expert_ffn = 0;
  // qwen35 (a hybrid): one attention layer every full_attention_interval (its q projection twice
  // as wide: each head's q, then its gate), the others Gated DeltaNet layers of ssm_k_heads q/k
  // heads and ssm_v_heads v heads, all ssm_head_dim wide, and a causal convolution of
  // ssm_conv_kernel taps. rope_sections: rope.dimension_sections (M-RoPE's, which llama.cpp needs).
  std::uint32_t ssm_k_heads = 0, ssm_v_heads = 0, ssm_head_dim = 0, ssm_conv_kernel = 4;
  std::uint32_t full_attention_interval = 4;
  std::array<std::int32_t, 4> rope_sections{};
  VocabularyKind vocabulary = VocabularyKind::llama_bpe;  // the tokenizer (synthetic_vocabulary.hpp)
};

// "tiny", "llama3-1b" (Llama 3.2 1B's shape), "llama3-8b", "phi3-mini" (Phi-3-mini-4k's),
// "phi3-mini-128k" (its LongRoPE sibling's), "gemma2-2b", "gemma3-4b", "qwen3moe-30b-a3b"
// (Qwen3-30B-A3B's), "mixtral-8x7b", "tiny-qwen35" (a hybrid of 8 layers, two attending, for
// tests), "qwen35-9b" (Qwen3.5-9B's).
std::optional<ModelShape> model_preset(std::string_view name);
std::vector<std::string_view> model_preset_names();
// Why a shape cannot be made (zero sizes, heads not a multiple of KV heads, odd head dim, a
// vocabulary below the byte tokens and specials, an unknown arch, rotary dims odd or past the head,
// a scaling factor that is not positive), or nullopt.
std::optional<std::string> shape_problem(const ModelShape& shape);

// What llama-quantize's rule needs to know of the shape.
MixtureModel mixture_model(const ModelShape& shape);

struct SyntheticModel {
  GgufWriter writer;  // ready to write(); tensor data is quantized and made as it is written
  std::map<std::string, gpu::WeightType> matrix_types;  // of every matrix, by tensor name
  std::vector<std::string> notes;  // matrices whose rows did not fit the type chosen, and their type
};

// Matrices in the types `mixture` gives them (llama-quantize's for its file type, which
// general.file_type names). The shape must have no shape_problem (std::invalid_argument
// otherwise). Same arguments, same bytes.
SyntheticModel make_synthetic_model(const ModelShape& shape, const QuantMixture& mixture, std::uint64_t seed,
                                    const std::string& name);
// Every matrix in `type` (llama-quantize --pure), but where its rows are not whole blocks of it
// (Q4_K needs 256): llama-quantize's fallback there (Q5_0 for Q4_K), said in notes.
SyntheticModel make_synthetic_model(const ModelShape& shape, gpu::WeightType type, std::uint64_t seed,
                                    const std::string& name);

}  // namespace mqlm::model::gguf
