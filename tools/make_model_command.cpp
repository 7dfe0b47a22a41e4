// `mqlm make-model`: a GGUF file with seeded random weights and a vocabulary (byte-level BPE, or
// Gemma's or Phi-3's SentencePiece: --tokenizer), of
// a preset shape (or one adjusted by flags), for tests and benchmarks: its matrices in the types
// llama-quantize would give them for a file type (q4_k_m, q6_k, ...), or all in one (--pure).
#include <chrono>
#include <iostream>
#include <map>

#include <fmt/format.h>

#include "model/gguf/synthetic_model.hpp"
#include "tools/commands.hpp"

namespace mqlm::tools {

namespace {

struct MakeModelOptions {
  std::string preset = "tiny", type = "f16", output, arch, tokenizer = "llama-bpe";
  std::uint64_t seed = 1;
  std::optional<std::uint32_t> layers, hidden, heads, kv_heads, head_dim, ffn, vocab, context;
  std::optional<float> rope_base;
  std::optional<std::uint32_t> rotary_dims, sliding_window;
  std::optional<std::uint32_t> experts, experts_used, expert_ffn;
  std::string rope_scaling = "none";
  model::gguf::RopeScaling scaling;  // its factors, from the flags
  bool llama3_keys = false;
  bool tied = false;
  bool pure = false;
};

model::gguf::ModelShape shape_from(const MakeModelOptions& o) {
  auto shape = model::gguf::model_preset(o.preset);
  if (!shape) {
    throw CommandFailed(fmt::format("no preset named '{}' (there are {})", o.preset,
                                    fmt::join(model::gguf::model_preset_names(), ", ")), 2);
  }
  if (!o.arch.empty() && o.arch != shape->arch) {
    shape->arch = o.arch;
    if (o.arch == "qwen2" || o.arch == "qwen3" || o.arch == "qwen3moe") {  // Qwen's own values, unless a flag says otherwise
      shape->rope_base = 1000000.0f;
      shape->rms_epsilon = 1e-6f;
    } else if (o.arch == "phi3") {  // Phi-3's
      shape->rope_base = 10000.0f;
      shape->rms_epsilon = 1e-5f;
    } else if (o.arch == "gemma2" || o.arch == "gemma3") {  // Gemma's: tied, a window of 4096 or 1024
      shape->rope_base = o.arch == "gemma2" ? 10000.0f : 1000000.0f;
      shape->rms_epsilon = 1e-6f;
      shape->tied_embeddings = true;
      shape->sliding_window = o.arch == "gemma2" ? 4096 : 1024;
    }
    if (o.arch == "qwen3moe" && shape->experts == 0) {  // 8 experts of 256, 2 a token
      shape->experts = 8;
      shape->experts_used = 2;
      shape->expert_ffn = 256;
    }
  }
  if (o.experts) {
    shape->experts = *o.experts;
    if (shape->experts_used == 0) shape->experts_used = std::min(2u, *o.experts);
  }
  if (o.experts_used) shape->experts_used = *o.experts_used;
  if (o.expert_ffn) shape->expert_ffn = *o.expert_ffn;
  for (auto [field, value] : {std::pair{&model::gguf::ModelShape::layers, o.layers}, {&model::gguf::ModelShape::hidden, o.hidden},
                              {&model::gguf::ModelShape::heads, o.heads}, {&model::gguf::ModelShape::kv_heads, o.kv_heads},
                              {&model::gguf::ModelShape::head_dim, o.head_dim}, {&model::gguf::ModelShape::ffn, o.ffn},
                              {&model::gguf::ModelShape::vocab, o.vocab}, {&model::gguf::ModelShape::context, o.context}}) {
    if (value) (*shape).*field = *value;
  }
  if (o.rope_base) shape->rope_base = *o.rope_base;
  if (o.rotary_dims) shape->rotary_dims = *o.rotary_dims;
  if (o.sliding_window) shape->sliding_window = *o.sliding_window;
  if (o.rope_scaling != "none" || shape->rope_scaling.type == model::gguf::RopeScalingType::none) {
    shape->rope_scaling = o.scaling;  // the preset's own scaling (gemma3-4b's, phi3-mini-128k's) unless a flag names one
    shape->rope_scaling.type = *model::gguf::parse_rope_scaling_type(o.rope_scaling);
  }
  shape->rope_freqs_tensor = !o.llama3_keys;
  if (o.tied) shape->tied_embeddings = true;
  const auto tokenizer = model::gguf::parse_vocabulary_kind(o.tokenizer);
  if (!tokenizer) {
    throw CommandFailed(fmt::format("no tokenizer named '{}' (there are {})", o.tokenizer,
                                    fmt::join(model::gguf::vocabulary_kind_names(), ", ")), 2);
  }
  shape->vocabulary = *tokenizer;
  if (auto problem = model::gguf::shape_problem(*shape)) throw CommandFailed(*problem, 2);
  return *shape;
}

model::gguf::FileType file_type_from(const std::string& name) {
  auto file_type = model::gguf::parse_file_type(name);
  if (!file_type) {
    throw CommandFailed(fmt::format("unknown type '{}' (llama-quantize's file types: {})", name,
                                    fmt::join(model::gguf::file_type_names(), ", ")), 2);
  }
  return *file_type;
}

// "q4_k_m: q4_k 14, q6_k 5": how many matrices have each type.
std::string types_summary(const model::gguf::SyntheticModel& model, model::gguf::FileType file_type, bool pure) {
  std::map<gpu::WeightType, int> counts;
  for (const auto& [name, type] : model.matrix_types) ++counts[type];
  std::vector<std::string> parts;
  for (auto [type, count] : counts) parts.push_back(fmt::format("{} {}", gpu::weight_type_name(type), count));
  return fmt::format("{}{}: {}", model::gguf::file_type_name(file_type), pure ? " pure" : "", fmt::join(parts, ", "));
}

// ", sliding window 1024, rotary 32 of 64, rope yarn x4 from 512": what the file says of its
// attention's reach and its RoPE beyond the defaults.
std::string rope_summary(const model::gguf::ModelShape& shape) {
  std::string out;
  if (shape.sliding_window != 0 && (shape.arch == "gemma2" || shape.arch == "gemma3")) {
    out += fmt::format(", sliding window {}", shape.sliding_window);
  }
  if (shape.rotary_dims != 0 && shape.rotary_dims != shape.head_dim) {
    out += fmt::format(", rotary {} of {}", shape.rotary_dims, shape.head_dim);
  }
  if (shape.experts > 0) {
    out += fmt::format(", {} experts of {}, {} a token", shape.experts,
                       shape.expert_ffn != 0 ? shape.expert_ffn : shape.ffn, shape.experts_used);
  }
  const auto& r = shape.rope_scaling;
  if (r.type == model::gguf::RopeScalingType::none) return out;
  if (r.type == model::gguf::RopeScalingType::longrope) {
    return out + fmt::format(", rope longrope (rope_factors_long/short.weight) from {}",
                             r.original_context != 0 ? r.original_context : shape.context);
  }
  out += fmt::format(", rope {} x{}", model::gguf::rope_scaling_type_name(r.type), r.factor);
  if (r.original_context != 0) out += fmt::format(" from {}", r.original_context);
  if (r.type == model::gguf::RopeScalingType::llama3) out += shape.rope_freqs_tensor ? " (rope_freqs.weight)" : " (keys)";
  return out;
}

void make_model(const MakeModelOptions& o) {
  model::gguf::FileType file_type = file_type_from(o.type);
  model::gguf::ModelShape shape = shape_from(o);
  auto start = std::chrono::steady_clock::now();
  model::gguf::QuantMixture mixture(file_type, model::gguf::mixture_model(shape), o.pure);
  auto model = model::gguf::make_synthetic_model(shape, mixture, o.seed, "mqlm " + o.preset);
  for (const auto& note : model.notes) std::cerr << "note: " << note << "\n";
  if (auto error = model.writer.write(o.output)) throw CommandFailed(error->detail);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::uint64_t bytes = model.writer.file_size();
  std::cout << fmt::format(
      "wrote {}: {} {} layers, hidden {}, {} heads ({} KV) of {}, FFN {}, vocab {}{}{}; {}; {:.1f} MB in {:.2f} s\n",
      o.output, shape.arch, shape.layers, shape.hidden, shape.heads, shape.kv_heads, shape.head_dim, shape.ffn,
      shape.vocab, shape.tied_embeddings ? " (tied)" : "", rope_summary(shape), types_summary(model, file_type, o.pure),
      bytes / 1e6, seconds);
}

}  // namespace

void add_make_model_command(CLI::App& app) {
  auto options = std::make_shared<MakeModelOptions>();
  auto* cmd = app.add_subcommand("make-model", "write a GGUF model with seeded random weights (tests, benchmarks)");
  cmd->add_option("--preset", options->preset,
                  "tiny, llama3-1b, llama3-8b, phi3-mini, phi3-mini-128k, gemma2-2b, gemma3-4b, qwen3moe-30b-a3b, "
                  "mixtral-8x7b, tiny-qwen35 or qwen35-9b (qwen35: Gated DeltaNet hybrids, not served yet)")
      ->capture_default_str();
  cmd->add_option("--type", options->type,
                  fmt::format("llama-quantize's file type, any case (q3_k, q4_k, q5_k: the _m ones, as there); the "
                              "types it gives each matrix for it unless --pure: {}",
                              fmt::join(model::gguf::file_type_names(), ", ")))
      ->capture_default_str();
  cmd->add_flag("--pure", options->pure,
                "every matrix in the file type's main type (q4_k for q4_k_m), as llama-quantize --pure");
  cmd->add_option("-o,--output", options->output, "the GGUF file to write")->required();
  cmd->add_option("--seed", options->seed, "same seed, same file")->capture_default_str();
  cmd->add_option("--arch", options->arch,
                  "llama, qwen2 (q/k/v biases), qwen3 (q/k norms), phi3 (fused q/k/v and gate/up), gemma2 (sliding "
                  "window, soft caps, GeGLU, norms after each block), gemma3 (gemma2's blocks, q/k norms, no caps) or "
                  "qwen3moe (qwen3's attention, 8 experts of 256 unless the flags below say otherwise)")
      ->check(CLI::IsMember({"llama", "qwen2", "qwen3", "phi3", "gemma2", "gemma3", "qwen3moe"}));
  cmd->add_option("--experts", options->experts,
                  "a mixture of this many experts (qwen3moe; on llama, Mixtral's, each as wide as --ffn)");
  cmd->add_option("--experts-used", options->experts_used, "how many experts a token goes through (2 by default)");
  cmd->add_option("--expert-ffn", options->expert_ffn, "qwen3moe: each expert's feed-forward length");
  cmd->add_option("--layers", options->layers, "override the preset's layer count");
  cmd->add_option("--hidden", options->hidden, "override the embedding length");
  cmd->add_option("--heads", options->heads, "override the attention head count");
  cmd->add_option("--kv-heads", options->kv_heads, "override the KV head count");
  cmd->add_option("--head-dim", options->head_dim, "override the head dimension");
  cmd->add_option("--ffn", options->ffn, "override the feed-forward length");
  cmd->add_option("--vocab", options->vocab, "override the vocabulary size (at least 261; SentencePiece more)");
  cmd->add_option("--tokenizer", options->tokenizer,
                  "the vocabulary: llama-bpe, qwen2, gpt2, tekken or smollm (byte-level BPE under that pre-tokenizer), gemma or "
                  "phi3 (their SentencePiece layouts)")
      ->capture_default_str();
  cmd->add_option("--context", options->context, "override the context length");
  cmd->add_option("--rope-base", options->rope_base, "override the RoPE frequency base");
  cmd->add_option("--sliding-window", options->sliding_window,
                  "gemma2, gemma3: the local layers' window (attention.sliding_window)");
  cmd->add_option("--rotary-dims", options->rotary_dims, "turn only the first N dimensions of each head (partial rotary)");
  cmd->add_option("--rope-scaling", options->rope_scaling,
                  "none, linear, yarn, llama3 (written as the rope_freqs.weight tensor, as convert_hf_to_gguf does) or "
                  "longrope (phi3: Phi-3's rope_factors_long/short.weight, made up, past --rope-original-context)")
      ->check(CLI::IsMember({"none", "linear", "yarn", "llama3", "longrope"}))
      ->capture_default_str();
  cmd->add_option("--rope-factor", options->scaling.factor, "how many times the context is stretched")
      ->capture_default_str();
  cmd->add_option("--rope-original-context", options->scaling.original_context,
                  "yarn, llama3, longrope: the context the model was trained on (rope.scaling.original_context_length)");
  cmd->add_option("--rope-attn-factor", options->scaling.attn_factor, "rope.scaling.attn_factor")->capture_default_str();
  cmd->add_option("--rope-low-freq-factor", options->scaling.low_freq_factor, "llama3")->capture_default_str();
  cmd->add_option("--rope-high-freq-factor", options->scaling.high_freq_factor, "llama3")->capture_default_str();
  cmd->add_flag("--rope-llama3-keys", options->llama3_keys,
                "llama3: write the rope.scaling.* keys instead of the rope_freqs.weight tensor (llama.cpp reads only "
                "the tensor)");
  cmd->add_flag("--tied-embeddings", options->tied, "leave out output.weight (the output reuses token_embd)");
  cmd->callback([options] { make_model(*options); });
}

}  // namespace mqlm::tools
