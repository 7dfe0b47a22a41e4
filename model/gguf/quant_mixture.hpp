// llama-quantize's mixtures: for a file type (llama.cpp's llama_ftype, "Q4_K_M"), the weight type
// it gives each matrix of a llama, qwen2 or qwen3 model, so that `mqlm make-model --type q4_k_m`
// writes the files people download. Our reading of llama.cpp's src/llama-quant.cpp
// (llama_tensor_get_type and its callers), without an importance matrix, experts or overrides:
//   output.weight (token_embd.weight when tied)  Q6_K; Q8_0 in Q8_0 files or where the rows are not
//                                                whole blocks of the file's type
//   attn_v       Q2_K: Q4_K with 4+ heads per KV head, else Q3_K; Q3_K_M: Q5_K in layers 0-1,
//                else Q4_K; Q3_K_L: Q5_K; IQ4_*: Q5_K with 4+ heads per KV head; Q4_K_M, Q5_K_M:
//                Q6_K where more_bits(layer); Q4_K_S: Q5_K in layers 0-3; 70B models: Q5_K
//                where the choice was Q3_K or Q4_K
//   ffn_down     Q2_K: Q3_K; Q3_K_M: Q5_K in the first 1/16 of the layers, else Q4_K; Q3_K_L:
//                Q5_K; Q4_K_M, Q5_K_M: Q6_K where more_bits(layer); IQ4_*, Q4_K_S: Q5_K in
//                the first 1/8
//   attn_output  Q2_K: Q3_K; Q3_K_M: Q4_K; Q3_K_L: Q5_K
//   the rest     the file type's own type
// A model of exactly 8 experts (llama.cpp has Mixtral in mind) has attn_k and attn_v in Q8_0 and
// attn_output Q5_K in Q2_K, Q3_K_S, Q3_K_M, Q4_K_S, Q4_K_M and IQ4_* files (the file type's own
// type otherwise); ffn_down_exps is an ffn_down, and the routers (ffn_gate_inp) are not quantized.
// more_bits(layer) holds in the first and last eighth of the layers and every third layer
// between. Then, where a matrix's rows are not whole blocks of the chosen type, a type with
// smaller blocks: IQ4_XS -> IQ4_NL, Q2_K and Q3_K -> Q4_0, Q4_K -> Q5_0, Q5_K -> Q5_1,
// Q6_K -> Q8_0, and F16 where even that does not fit. F32, F16 and BF16 files have every matrix
// in that type. Norms and biases are not matrices: they stay F32.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gpu/weight_formats.hpp"

namespace mqlm::model::gguf {

// llama.cpp's llama_ftype values, which general.file_type holds.
enum class FileType : std::uint32_t {
  f32 = 0, f16 = 1, q4_0 = 2, q4_1 = 3, q8_0 = 7, q5_0 = 8, q5_1 = 9, q2_k = 10, q3_k_s = 11, q3_k_m = 12,
  q3_k_l = 13, q4_k_s = 14, q4_k_m = 15, q5_k_s = 16, q5_k_m = 17, q6_k = 18, iq4_nl = 25, iq4_xs = 30, bf16 = 32,
};
inline constexpr FileType all_file_types[] = {
    FileType::f32,    FileType::f16,    FileType::bf16,   FileType::q8_0,   FileType::q4_0,   FileType::q4_1,
    FileType::q5_0,   FileType::q5_1,   FileType::q2_k,   FileType::q3_k_s, FileType::q3_k_m, FileType::q3_k_l,
    FileType::q4_k_s, FileType::q4_k_m, FileType::q5_k_s, FileType::q5_k_m, FileType::q6_k,   FileType::iq4_nl,
    FileType::iq4_xs};

std::string_view file_type_name(FileType type);  // "q4_k_m", as llama-quantize names it in lower case
// llama-quantize's names in any case, and its aliases q3_k, q4_k and q5_k for the _M mixtures.
std::optional<FileType> parse_file_type(std::string_view name);
// Every name parse_file_type takes (aliases after the file type they stand for), for help texts.
std::vector<std::string> file_type_names();
// The type of most matrices (llama_ftype_get_default_type): q4_k for Q4_K_S and Q4_K_M.
gpu::WeightType default_weight_type(FileType type);
// The file type a file of `type` alone is said to be (Q4_K_S for q4_k, Q3_K_S for q3_k, ...).
FileType file_type_of(gpu::WeightType type);
// `wanted` where rows of row_length elements are whole blocks of it, else llama-quantize's
// fallback with smaller blocks (F16 when nothing else fits).
gpu::WeightType fitting_type(gpu::WeightType wanted, std::uint64_t row_length);

// What the rule reads of the model besides a matrix's name and row length.
struct MixtureModel {
  std::string arch = "llama";  // "llama", "qwen2" or "qwen3"
  std::uint32_t layers = 1;
  std::uint32_t heads = 1;
  std::uint32_t kv_heads = 1;
  bool tied_embeddings = false;  // no output.weight: token_embd.weight is chosen for as the output
  std::uint32_t experts = 0;     // a mixture of experts: 8 (Mixtral's count) changes attention's types
};

struct MatrixType {
  gpu::WeightType type;    // what the matrix is written in
  gpu::WeightType chosen;  // the rule's choice before the fallback: differs when the rows do not fit it
};

class QuantMixture {
 public:
  // pure: every matrix in the file type's default type, as llama-quantize --pure (its shape
  // fallbacks still apply).
  QuantMixture(FileType file_type, MixtureModel model, bool pure = false);

  FileType file_type() const { return file_type_; }
  // For a matrix (a 2-D "*.weight" tensor) named as llama.cpp names them ("blk.3.attn_v.weight").
  MatrixType matrix_type(std::string_view name, std::uint64_t row_length) const;

 private:
  gpu::WeightType chosen_type(std::string_view name, std::uint64_t row_length) const;
  gpu::WeightType output_type(std::uint64_t row_length) const;
  gpu::WeightType attn_v_type(std::uint32_t layer) const;
  gpu::WeightType ffn_down_type(std::uint32_t layer) const;
  gpu::WeightType attn_output_type() const;
  bool eight_experts() const { return model_.experts == 8; }
  bool is_70b() const;

  FileType file_type_;
  MixtureModel model_;
  bool pure_;
  gpu::WeightType default_type_;
};

}  // namespace mqlm::model::gguf
