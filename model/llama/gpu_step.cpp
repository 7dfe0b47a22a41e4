// One step of the GPU forward pass, as the model reads: the step's inputs and scratch buffers,
// the token embedding, then per layer the attention block and the feed-forward block, then the
// output. Which kernels it records is decided once, in the StepPlan (step_plan.hpp).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <variant>
#include <vector>

#include <fmt/format.h>

#include "gpu/ops.hpp"
#include "model/llama/gpu_model.hpp"
#include "model/llama/step_plan.hpp"

namespace mqlm::model {

namespace ops = gpu::ops;
using gpu::BufferRange;
using gpu::PoolBuffer;

namespace {

std::uint32_t rows_of(const GpuTensor& w) { return static_cast<std::uint32_t>(w.rows); }
std::uint32_t cols_of(const GpuTensor& w) { return static_cast<std::uint32_t>(w.cols); }

// A step's small inputs, from its batch, checked against the vocabulary and the cache.
struct StepInputs {
  std::vector<std::uint32_t> ids;          // (tokens) token ids
  std::vector<std::int32_t> positions;     // (tokens)
  std::vector<std::uint32_t> slots;        // (tokens) cache rows: page * page_size + offset
  std::vector<std::uint32_t> seq_pos;      // (tokens, 2) sequence, position
  std::vector<std::uint32_t> tables;       // (sequences, max_pages) block tables, zero-padded
  std::vector<std::uint32_t> output_rows;  // (max(outputs, 1)) the tokens whose logits are wanted
  std::uint32_t max_pages = 1, outputs = 0, max_context = 0;
};

StepInputs step_inputs(const StepBatch& batch, const GpuKvCache& cache, std::uint32_t n_vocab) {
  const auto n = static_cast<std::uint32_t>(batch.tokens.size());
  const std::uint32_t page_size = cache.page_size();
  StepInputs in;
  for (const auto& table : batch.block_tables) in.max_pages = std::max<std::uint32_t>(in.max_pages, table.size());
  in.ids.resize(n);
  in.slots.resize(n);
  in.seq_pos.resize(2 * n);
  in.positions.resize(n);
  for (std::uint32_t t = 0; t < n; ++t) {
    const StepToken& s = batch.tokens[t];
    if (s.token < 0 || static_cast<std::uint32_t>(s.token) >= n_vocab) {
      throw std::out_of_range("token id " + std::to_string(s.token) + " is outside the vocabulary");
    }
    if (s.sequence >= batch.block_tables.size() || s.position / page_size >= batch.block_tables[s.sequence].size()) {
      throw std::out_of_range("token " + std::to_string(t) + " has no cache page for its position");
    }
    std::uint32_t page = batch.block_tables[s.sequence][s.position / page_size];
    if (page >= cache.pages()) throw std::out_of_range("block table names page " + std::to_string(page));
    in.ids[t] = static_cast<std::uint32_t>(s.token);
    in.positions[t] = static_cast<std::int32_t>(s.position);
    in.slots[t] = page * page_size + s.position % page_size;
    in.seq_pos[2 * t] = s.sequence;
    in.seq_pos[2 * t + 1] = s.position;
    in.max_context = std::max(in.max_context, s.position + 1);
    if (s.output) in.output_rows.push_back(t);
  }
  in.tables.assign(batch.block_tables.size() * in.max_pages, 0);
  for (std::size_t s = 0; s < batch.block_tables.size(); ++s) {
    std::copy(batch.block_tables[s].begin(), batch.block_tables[s].end(), in.tables.begin() + s * in.max_pages);
  }
  in.outputs = static_cast<std::uint32_t>(in.output_rows.size());
  if (in.outputs == 0) in.output_rows.push_back(0);  // keep buffers non-empty; nothing is read back
  return in;
}

// A step's buffers on the GPU: pool scratch, reused once the step's submissions are done. Those
// marked "when used" are made by the first dispatch that needs them.
struct StepScratch {
  PoolBuffer ids, positions, slots;  // (tokens) each: the inputs
  PoolBuffer seq_pos;                // (tokens, 2)
  PoolBuffer tables;                 // (sequences, max_pages)
  PoolBuffer output_rows;            // (outputs)
  PoolBuffer x;                      // (tokens, n_embd) the residual stream
  PoolBuffer h;                      // (tokens, n_embd) a norm's output
  PoolBuffer q;                      // (tokens, n_head * head_dim)
  PoolBuffer k, v;                   // (tokens, n_head_kv * head_dim)
  PoolBuffer attn;                   // (tokens, n_head * head_dim) attention's output
  PoolBuffer proj;                   // (tokens, n_embd) a residual product before its add
  PoolBuffer picked;                 // (outputs + 1, n_embd) the normed rows whose logits are wanted
  PoolBuffer logits;                 // (max(outputs, 1), n_vocab)
  // The sampler's inputs (StepSampling), when the step samples: its rows, their entries and masks,
  // the passes' arrival counters (zero).
  PoolBuffer sample_rows, sample_entries, sample_mask, sample_arrivals;
  PoolBuffer sample_mask_host;  // the masks as written (host-visible), copied to sample_mask before the draws
  PoolBuffer split_parts;            // (StepPlan::split_bytes) the K slices of a group of products
  PoolBuffer weights16;              // (StepPlan::weights16_bytes) a group's weights as F16
  PoolBuffer attn_parts;             // (ops::attention_scratch_bytes) split attention's partials
  PoolBuffer gate, up;               // (tokens, n_ff) each; when used
  // A mixture of experts' (when the model has one): the router's logits (tokens, n_expert), each
  // token's experts and their weights (tokens, used), each (token, expert)'s gate and up (tokens,
  // used, n_ff_exp) and output (tokens, used, n_embd).
  PoolBuffer router_logits, experts, expert_weights, expert_gate, expert_up, expert_out;
  PoolBuffer expert_glu_q8;  // int8 blocks of (tokens, used, n_ff_exp): the down products' input; when used
  PoolBuffer expert_order, expert_tiles;  // wide steps: the pairs grouped by expert (ops::moe_sort)
  PoolBuffer expert_glu16;  // (tokens, used, n_ff_exp) F16 silu(gate) * up: tensor-core down products' input; when used
  PoolBuffer acts16;                 // (padded tokens, max(n_embd, q_dim, n_ff)) F16; when used
  PoolBuffer glu16;                  // (padded tokens, n_ff) F16 silu(gate) * up; when used
  PoolBuffer acts_q8;                // int8 blocks of (tokens, max(n_embd, q_dim, n_ff)); when used
  PoolBuffer normed_q8;              // int8 blocks of (tokens, n_embd): rmsnorm(x); when used
};

// A product of a group that split K: its slices, summed after the products of its group.
struct PendingSum {
  BufferRange parts;
  const PoolBuffer* out;
  std::uint32_t count, splits;
};

}  // namespace

class GpuModel::Step {
 public:
  Step(GpuModel& model, const StepBatch& batch, GpuKvCache& cache, StepProfile* profile,
       const PendingTokens* tokens_from, std::vector<float>* hidden);
  void record_embedding();
  // x += wo x attention(rope(wq x a), rope(wk x a), wv x a), a = rmsnorm(x); k and v to the cache.
  void record_attention(std::uint32_t l);
  // x += down x (silu(gate x a) * (up x a)), a = rmsnorm(x).
  void record_feed_forward(std::uint32_t l);
  // Sends the layers recorded so far where a part of the step ends.
  void end_layer(std::uint32_t l);
  StepResult record_output(StepOutput want);
  // masks_later: the output part, recorded by record_output and held, sent with the mask's words.
  bool holds_output() const { return holds_output_; }
  std::uint64_t send_held(std::span<const std::uint32_t> mask);

 private:
  gpu::Recording& rec() { return *rec_; }
  void mark(const char* label);
  void start_profiling();
  PoolBuffer upload(std::span<const std::byte> bytes);
  template <class T>
  PoolBuffer upload(const std::vector<T>& v) { return upload(std::as_bytes(std::span(v))); }
  PoolBuffer scratch(std::uint64_t floats);
  BufferRange acts16();
  BufferRange acts_q8();
  BufferRange normed_q8();
  BufferRange glu16();

  // The rotary embedding of layer l's q and k: the local layers' where the model has them.
  const ops::RopeShape& rope(std::uint32_t l) const { return c_.local_layer(l) ? rope_local_ : rope_; }
  BufferRange rope_frequencies(std::uint32_t l) const {
    return (c_.local_layer(l) ? model_.rope_frequencies_local_ : model_.rope_frequencies_).range();
  }
  void record_qkv_heads(const GpuLayer& L, std::uint32_t l);
  void record_qkv(const GpuLayer& L, const LayerPlan& p, std::uint32_t l);
  void record_glu(const GpuLayer& L, const LayerPlan& p, const GpuTensor* next_norm);
  void record_down(const GpuLayer& L, const LayerPlan& p, const GpuTensor* next_norm);
  // A product of a group: its weights, its plan, its output.
  using GroupProduct = std::tuple<const GpuTensor*, const ProductPlan*, const PoolBuffer*>;
  std::vector<PendingSum> normed_products(const GpuTensor& norm, NormInput input,
                                          std::initializer_list<GroupProduct> products);
  void sum_products(const std::vector<PendingSum>& sums);
  void residual_product(const GpuTensor& w, const ProductPlan& p, const PoolBuffer& in, bool in_ready,
                        const GpuTensor* next_norm);
  void post_normed_product(const GpuTensor& w, const ProductPlan& p, const PoolBuffer& in, bool in_ready,
                           const GpuTensor& norm, const GpuTensor* next_norm);
  void record_geglu(const GpuLayer& L, const LayerPlan& p, const GpuTensor* next_norm);
  // Whether the residual product before made `norm`'s input (F16 or int8): its own dispatch is skipped.
  bool made_by_residual(const GpuTensor& norm) { return std::exchange(normed_by_residual_, nullptr) == &norm; }
  void record_experts(const GpuLayer& L, const LayerPlan& p);
  bool experts_fused(const GpuLayer& L) const;
  void record_experts_fused(const GpuLayer& L);
  void record_router(const GpuLayer& L, bool q8, bool only_q8);
  void expert_product(const GpuTensor& w, BufferRange acts, const PoolBuffer& out, const ops::ExpertProduct& shape);
  bool experts_on_tensor_cores(const GpuLayer& L) const;
  void expert_products_f16(const GpuLayer& L, const LayerPlan& p);
  void narrow_residual(const GpuTensor& w, const ProductPlan& p, BufferRange input, const GpuTensor* next_norm);
  std::uint32_t product_narrow(const GpuTensor& w, const PoolBuffer& out, std::uint32_t columns, bool accumulate,
                               BufferRange dequantized = {}, BufferRange split_scratch = {}, bool sum_later = false,
                               BufferRange input = {});
  std::vector<BufferRange> dequantize(const std::vector<std::pair<const GpuTensor*, const ProductPlan*>>& ws);
  void norm_f16(const GpuTensor& norm);
  void to_f16(const PoolBuffer& in, std::uint32_t rows, std::uint32_t width);
  void add_bias(const GpuTensor& bias, const PoolBuffer& io, std::uint32_t width);
  void record_output_product(const GpuTensor& w);
  void upload_sampling();
  void record_sampling(const PoolBuffer& ids, const PoolBuffer& readback, std::uint32_t rows);
  void finish();
  void read_hidden();

  GpuModel& model_;
  const LlamaConfig& c_;
  GpuKvCache& cache_;
  StepProfile* profile_;
  const PendingTokens* tokens_from_;
  const StepSampling* sampling_;
  std::vector<float>* hidden_;  // where the normed hidden states go, when asked for
  PoolBuffer hidden_readback_;  // (tokens, n_embd) host-visible, copied at the end of the step
  gpu::ComputeQueue& queue_;
  gpu::BufferPool& pool_;
  gpu::KernelLibrary& lib_;
  const gpu::DeviceFeatures& features_;
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  const std::uint32_t n_;
  StepInputs in_;
  StepPlan plan_;
  StepScratch s_;
  ops::RopeShape rope_, rope_local_;
  ops::AttentionShape attention_;
  std::optional<gpu::Recording> rec_;
  // While the step's inputs go up (the constructor), each after the first runs alongside the
  // others: they write buffers of their own.
  bool inputs_open_ = true, inputs_started_ = false;
  bool profiling_ = false;
  std::vector<const char*> labels_;  // what each timestamp ends
  // The norm whose input the residual product before it made: F16 along with its split sum
  // (narrow_residual), int8 along with a post-norm add (post_normed_product).
  const GpuTensor* normed_by_residual_ = nullptr;
  std::uint32_t part_size_ = 1, part_layers_ = 0;
  bool holds_output_ = false;
  std::size_t held_mask_words_ = 0;  // masks_later: the words send_held writes (the batch is gone by then)
};

GpuModel::Step::Step(GpuModel& model, const StepBatch& batch, GpuKvCache& cache, StepProfile* profile,
                     const PendingTokens* tokens_from, std::vector<float>* hidden)
    : model_(model),
      c_(model.config_),
      cache_(cache),
      profile_(profile),
      tokens_from_(tokens_from),
      sampling_(batch.sampling ? &*batch.sampling : nullptr),
      hidden_(hidden),
      queue_(model.gpu_.queue),
      pool_(model.gpu_.pool),
      lib_(model.gpu_.kernels),
      features_(queue_.device().features()),
      n_(static_cast<std::uint32_t>(batch.tokens.size())),
      in_(step_inputs(batch, cache, c_.n_vocab)),
      plan_(plan_step(features_, c_, model.layers_, model.output_.buffer ? model.output_ : model.token_embd_, n_,
                      in_.outputs, model.kernel_choice_)),
      rope_(rope_shape(c_, n_, c_.n_head)),
      rope_local_(rope_shape(c_, n_, c_.n_head, true)),
      attention_{n_, c_.n_head, c_.n_head_kv, c_.head_dim, cache.page_size(), in_.max_pages, c_.query_scale()},
      rec_(queue_.begin()) {
  attention_.max_context = in_.max_context;
  attention_.softcap = c_.attn_softcap;
  // The first part too: a copy of KV pages to the host may be in flight (read_pages_later), and
  // this step may write those pages.
  rec().after_previous_submissions();
  rec().set_label("a step's first part");
  // Token ids from the step before (tokens_from) are on the GPU already.
  if (tokens_from_ == nullptr) s_.ids = upload(in_.ids);
  s_.positions = upload(in_.positions);
  s_.slots = upload(in_.slots);
  s_.seq_pos = upload(in_.seq_pos);
  s_.tables = upload(in_.tables);
  s_.output_rows = upload(in_.output_rows);
  if (sampling_ != nullptr) upload_sampling();
  inputs_open_ = false;
  const std::uint64_t n = n_;
  s_.x = scratch(n * c_.n_embd);
  s_.h = scratch(n * c_.n_embd);
  s_.q = scratch(n * c_.q_dim());
  s_.k = scratch(n * c_.kv_dim());
  s_.v = scratch(n * c_.kv_dim());
  s_.attn = scratch(n * c_.q_dim());
  s_.proj = scratch(n * c_.n_embd);
  s_.picked = scratch(std::uint64_t{in_.outputs + 1} * c_.n_embd);
  s_.logits = scratch(std::uint64_t{std::max(in_.outputs, 1u)} * c_.n_vocab);
  start_profiling();
  if (plan_.split_bytes > 0) s_.split_parts = pool_.allocate(plan_.split_bytes, "scratch");
  if (plan_.weights16_bytes > 0) s_.weights16 = pool_.allocate(plan_.weights16_bytes, "scratch");
}

// Step inputs (token ids, positions, cache slots, block tables) travel in the command buffer
// itself into device memory (Recording::update: up to 64 KiB each), so that the kernels that read
// them every layer (rope, the cache writes, attention) read L2, not host memory across PCIe
// (H100, Q4_0 decode: attention 0.494 -> 0.449 ms a token). Larger ones stay in host-visible
// memory the kernels read directly.
PoolBuffer GpuModel::Step::upload(std::span<const std::byte> bytes) {
  if (bytes.size() <= 65536 && bytes.size() % 4 == 0 && !bytes.empty()) {
    PoolBuffer buffer = pool_.allocate(bytes.size(), "scratch");
    if (inputs_open_ && std::exchange(inputs_started_, true)) rec().next_runs_alongside();
    rec().update(buffer.range(), bytes);
    return buffer;
  }
  PoolBuffer buffer = pool_.allocate(std::max<std::size_t>(bytes.size(), 4), "scratch", gpu::MemoryKind::host);
  std::memcpy(buffer.mapped(), bytes.data(), bytes.size());
  return buffer;
}

PoolBuffer GpuModel::Step::scratch(std::uint64_t floats) {
  return pool_.allocate(std::max<std::uint64_t>(floats, 1) * 4, "scratch");
}

BufferRange GpuModel::Step::acts16() {
  if (!s_.acts16) {
    const std::uint64_t widest = std::max({c_.n_embd, c_.q_dim(), c_.n_ff});
    s_.acts16 = pool_.allocate(std::uint64_t{plan_.padded_tokens} * widest * 2, "scratch");
  }
  return s_.acts16.range();
}

BufferRange GpuModel::Step::acts_q8() {
  if (!s_.acts_q8) s_.acts_q8 = pool_.allocate(ops::q8_acts_bytes(std::max({c_.n_embd, c_.q_dim(), c_.n_ff}), n_), "scratch");
  return s_.acts_q8.range();
}

BufferRange GpuModel::Step::normed_q8() {
  if (!s_.normed_q8) s_.normed_q8 = pool_.allocate(ops::q8_acts_bytes(c_.n_embd, n_), "scratch");
  return s_.normed_q8.range();
}

BufferRange GpuModel::Step::glu16() {
  if (!s_.glu16) s_.glu16 = pool_.allocate(std::uint64_t{plan_.padded_tokens} * c_.n_ff * 2, "scratch");
  return s_.glu16.range();
}

// Profiling: a timestamp after each op, labelled with the kind of op it ends.
constexpr std::uint32_t kMaxStamps = 4096;

void GpuModel::Step::start_profiling() {
  profiling_ = profile_ != nullptr && features_.timestamp_period_ns > 0;
  if (profiling_ && !model_.timestamps_) {
    VkQueryPoolCreateInfo info{};
    info.sType = VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO;
    info.queryType = VK_QUERY_TYPE_TIMESTAMP;
    info.queryCount = kMaxStamps;
    VkQueryPool pool_handle = VK_NULL_HANDLE;
    if (vkCreateQueryPool(queue_.device().get(), &info, nullptr, &pool_handle) != VK_SUCCESS) {
      throw std::runtime_error("cannot create a timestamp query pool for profiling");
    }
    model_.timestamps_ = {queue_.device().get(), pool_handle};
  }
  if (profiling_) vkCmdResetQueryPool(rec().command_buffer(), model_.timestamps_.get(), 0, kMaxStamps);
  mark("start");
}

void GpuModel::Step::mark(const char* label) {
  if (!profiling_ || labels_.size() >= kMaxStamps) return;
  rec().write_timestamp(model_.timestamps_.get(), static_cast<std::uint32_t>(labels_.size()));
  labels_.push_back(label);
}

void GpuModel::Step::record_embedding() {
  const GpuTensor& embd = model_.token_embd_;
  ops::get_rows(rec(), lib_, embd.type, embd.buffer.range(),
                tokens_from_ != nullptr ? tokens_from_->ids.range() : s_.ids.range(), s_.x.range(), c_.n_embd, n_);
  if (c_.scaled_embedding()) {
    ops::scale(rec(), lib_, s_.x.range(), s_.x.range(), n_ * c_.n_embd, std::sqrt(static_cast<float>(c_.n_embd)));
  }
  mark("embedding");
  s_.attn_parts = pool_.allocate(ops::attention_scratch_bytes(attention_), "scratch");
  // A step sent while the GPU still runs the one it takes its tokens from goes as one submission:
  // the GPU has nothing to start meanwhile, and each part boundary is a gap on it (H100,
  // llama3-8b decode: Q4_0 316.5-318.2 -> 323.3-325.6 tok/s, Q8_0 216.0-222.6 -> 225.0-226.9).
  const bool gpu_busy = tokens_from_ != nullptr && queue_.completed() < tokens_from_->done_at;
  part_size_ = gpu_busy ? c_.n_layers : 1;
}

void GpuModel::Step::record_attention(std::uint32_t l) {
  const GpuLayer& L = model_.layers_[l];
  const LayerPlan& p = plan_.layers[l];
  if (p.qkv_write_heads) {
    record_qkv_heads(L, l);
  } else {
    record_qkv(L, p, l);
  }
  // The output product reads the attention's output as its last dispatch makes it where it can:
  // quantized for the int8 mat-vec, F16 for the tensor cores.
  ops::AttentionMerged merged;
  if (p.out.path == ProductPath::int8) {
    merged.q8 = acts_q8();
  } else if (p.out.path == ProductPath::narrow) {
    merged.f16 = acts16();
    merged.padded_rows = plan_.padded_tokens;
  }
  ops::AttentionShape shape = attention_;
  shape.window = c_.window(l);
  const bool ready = ops::attention(rec(), lib_, s_.q.range(), cache_.keys(l), cache_.values(l), s_.tables.range(),
                                    s_.seq_pos.range(), s_.attn_parts.range(), s_.attn.range(), shape, merged);
  mark("attention");
  if (c_.post_norms()) {
    post_normed_product(L.wo, p.out, s_.attn, ready, L.post_attn_norm, p.ffn_norm_q8 ? &L.ffn_norm : nullptr);
  } else {
    residual_product(L.wo, p.out, s_.attn, ready, p.ffn_norm_f16 ? &L.ffn_norm : nullptr);
  }
  mark("matmul out");
}

// The int8 q/k/v products write q turned, k and v into the cache.
void GpuModel::Step::record_qkv_heads(const GpuLayer& L, std::uint32_t l) {
  if (!made_by_residual(L.attn_norm)) {
    ops::quantize_q8_rms_norm(rec(), lib_, s_.x.range(), L.attn_norm.buffer.range(), c_.rms_eps, normed_q8(), c_.n_embd,
                              n_);
    mark("norm");
  }
  const std::tuple<const GpuTensor*, BufferRange, ops::HeadsOutput> heads[] = {
      {&L.wq, s_.q.range(), ops::HeadsOutput::q},
      {&L.wk, cache_.keys(l), ops::HeadsOutput::k_cache},
      {&L.wv, cache_.values(l), ops::HeadsOutput::v_cache}};
  for (const auto& [w, out, what] : heads) {
    if (what != ops::HeadsOutput::q) rec().next_runs_alongside();  // they write apart
    ops::matvec_q8_heads(rec(), lib_, w->type, w->buffer.range(), normed_q8(), out, s_.positions.range(),
                         s_.slots.range(), rope_frequencies(l), rope(l), what, rows_of(*w), cols_of(*w), n_,
                         plan_.kernels);
  }
  mark("matmul qkv, rope, kv write");
}

// q, k and v read the same input and write apart: no barriers between them. With nothing between
// them and rope, rope_kv_write adds the slices of those that split K.
void GpuModel::Step::record_qkv(const GpuLayer& L, const LayerPlan& p, std::uint32_t l) {
  std::vector<PendingSum> sums =
      normed_products(L.attn_norm, p.qkv_input, {{&L.wq, &p.q, &s_.q}, {&L.wk, &p.k, &s_.k}, {&L.wv, &p.v, &s_.v}});
  if (!p.rope_sums_qkv) {
    sum_products(sums);
    sums.clear();
  }
  mark("matmul qkv");
  add_bias(L.bq, s_.q, c_.q_dim());
  add_bias(L.bk, s_.k, c_.kv_dim());
  add_bias(L.bv, s_.v, c_.kv_dim());
  mark("bias");
  ops::QkNorms norms;  // rope_kv_write norms q and k's heads before it turns them
  if (c_.qk_norm()) norms = {L.q_norm.buffer.range(), L.k_norm.buffer.range(), c_.rms_eps};
  ops::QkvSlices slices;
  for (const PendingSum& s : sums) {
    if (s.out == &s_.q) {
      slices.q = s.parts;
      slices.q_splits = s.splits;
    } else if (s.out == &s_.k) {
      slices.k = s.parts;
      slices.k_splits = s.splits;
    } else {
      slices.v = s.parts;
      slices.v_splits = s.splits;
    }
  }
  ops::rope_kv_write(rec(), lib_, s_.q.range(), s_.k.range(), s_.v.range(), s_.positions.range(), rope_frequencies(l),
                     cache_.keys(l), cache_.values(l), s_.slots.range(), rope(l), c_.n_head_kv, slices, norms);
  mark("rope, kv write");
}

void GpuModel::Step::record_feed_forward(std::uint32_t l) {
  const GpuLayer& L = model_.layers_[l];
  const LayerPlan& p = plan_.layers[l];
  // The norm the down product may make along with its split sum, or its post-norm add as int8.
  const GpuTensor* next_attn_norm = l + 1 < c_.n_layers ? &model_.layers_[l + 1].attn_norm : nullptr;
  const GpuTensor* next_norm = p.next_norm_f16 ? next_attn_norm : nullptr;
  if (c_.moe()) {
    record_experts(L, p);
  } else if (c_.gelu()) {
    record_geglu(L, p, p.next_norm_q8 ? next_attn_norm : nullptr);
  } else if (p.glu) {
    record_glu(L, p, next_norm);
  } else {
    if (!s_.gate) {
      s_.gate = scratch(std::uint64_t{n_} * c_.n_ff);
      s_.up = scratch(std::uint64_t{n_} * c_.n_ff);
    }
    sum_products(normed_products(L.ffn_norm, p.ffn_input, {{&L.w_gate, &p.gate, &s_.gate}, {&L.w_up, &p.up, &s_.up}}));
    mark("matmul gate, up");
    record_down(L, p, next_norm);
  }
  mark("matmul down");
}

// x += rmsnorm(down x (gelu(gate) * up)), Gemma's feed-forward block (the norm after it too).
// next_norm: as post_normed_product's.
void GpuModel::Step::record_geglu(const GpuLayer& L, const LayerPlan& p, const GpuTensor* next_norm) {
  if (!s_.gate) {
    s_.gate = scratch(std::uint64_t{n_} * c_.n_ff);
    s_.up = scratch(std::uint64_t{n_} * c_.n_ff);
  }
  sum_products(normed_products(L.ffn_norm, p.ffn_input, {{&L.w_gate, &p.gate, &s_.gate}, {&L.w_up, &p.up, &s_.up}}));
  mark("matmul gate, up");
  const bool int8 = p.down.path == ProductPath::int8;  // gelu(gate) * up made as the product's int8 input
  if (int8) {
    ops::quantize_q8_gelu(rec(), lib_, s_.gate.range(), s_.up.range(), acts_q8(), c_.n_ff, n_);
  } else {
    ops::gelu_mul(rec(), lib_, s_.gate.range(), s_.up.range(), s_.gate.range(), n_ * c_.n_ff);
  }
  mark("gelu");
  post_normed_product(L.w_down, p.down, s_.gate, int8, L.post_ffn_norm, next_norm);
}

// x += the weighted sum of each token's experts' SwiGLU blocks, the experts and weights routed
// on the GPU; each product reads only the experts its tokens chose.
void GpuModel::Step::record_experts(const GpuLayer& L, const LayerPlan& p) {
  const std::uint32_t used = c_.n_expert_used, pairs = n_ * used;
  if (!s_.router_logits) {
    s_.router_logits = scratch(std::uint64_t{n_} * c_.n_expert);
    s_.experts = scratch(pairs);
    s_.expert_weights = scratch(pairs);
  }
  const bool gate_q8 = ops::experts_read_q8(L.w_gate.type), up_q8 = ops::experts_read_q8(L.w_up.type);
  // Wide steps on the tensor cores read F16 inputs (expert_products_f16), no int8 ones.
  const bool tensor_cores = n_ > ops::matvec_max_columns && experts_on_tensor_cores(L);
  record_router(L, !tensor_cores && (gate_q8 || up_q8), gate_q8 && up_q8);
  if (experts_fused(L)) {
    record_experts_fused(L);
    return;
  }
  if (!s_.expert_gate) {
    s_.expert_gate = scratch(std::uint64_t{pairs} * c_.n_ff_exp);
    s_.expert_up = scratch(std::uint64_t{pairs} * c_.n_ff_exp);
    s_.expert_out = scratch(std::uint64_t{pairs} * c_.n_embd);
  }
  ops::moe_route(rec(), lib_, s_.router_logits.range(), s_.experts.range(), s_.expert_weights.range(), n_, c_.n_expert,
                 used);
  mark("route");
  if (n_ > ops::matvec_max_columns) {  // wide: the products read each expert once per tile of its pairs
    if (!s_.expert_order) {
      s_.expert_order = scratch(pairs);
      s_.expert_tiles = pool_.allocate(ops::moe_tiles_bytes(pairs, c_.n_expert), "scratch");
    }
    ops::moe_sort(rec(), lib_, s_.experts.range(), s_.expert_order.range(), s_.expert_tiles.range(), pairs, c_.n_expert,
                  tensor_cores ? ops::experts_coopmat_pairs : ops::experts_tile_pairs);
    mark("route");
    if (tensor_cores) {
      expert_products_f16(L, p);
      ops::moe_combine(rec(), lib_, s_.expert_out.range(), s_.expert_weights.range(), s_.x.range(), n_, c_.n_embd, used);
      mark("experts sum");
      return;
    }
  }
  // gate and up read the same input and write apart.
  const ops::ExpertProduct gate_up{c_.n_ff_exp, c_.n_embd, n_, used};
  for (const auto& [w, out, q8] : {std::tuple{&L.w_gate, &s_.expert_gate, gate_q8}, {&L.w_up, &s_.expert_up, up_q8}}) {
    if (w == &L.w_up) rec().next_runs_alongside();
    ops::ExpertProduct shape = gate_up;
    shape.acts_q8 = q8;
    expert_product(*w, q8 ? acts_q8() : s_.h.range(), *out, shape);
  }
  mark("matmul experts gate, up");
  const ops::ExpertProduct down{c_.n_embd, c_.n_ff_exp, n_, used, true, ops::experts_read_q8(L.w_down.type)};
  if (down.acts_q8) {
    if (!s_.expert_glu_q8) s_.expert_glu_q8 = pool_.allocate(ops::q8_acts_bytes(c_.n_ff_exp, pairs), "scratch");
    ops::quantize_q8_silu(rec(), lib_, s_.expert_gate.range(), s_.expert_up.range(), s_.expert_glu_q8.range(),
                          c_.n_ff_exp, pairs);
  } else {
    ops::silu_mul(rec(), lib_, s_.expert_gate.range(), s_.expert_up.range(), s_.expert_gate.range(), pairs * c_.n_ff_exp);
  }
  mark("silu");
  if (n_ <= ops::matvec_max_columns && ops::experts_int8(features_, L.w_down.type)) {  // decode: the sum fused in
    ops::matvec_experts_sum(rec(), lib_, L.w_down.type, L.w_down.buffer.range(), s_.expert_glu_q8.range(),
                            s_.experts.range(), s_.expert_weights.range(), s_.x.range(), down);
    mark("matmul experts down, sum");
    return;
  }
  expert_product(L.w_down, down.acts_q8 ? s_.expert_glu_q8.range() : s_.expert_gate.range(), s_.expert_out, down);
  mark("matmul experts down");
  ops::moe_combine(rec(), lib_, s_.expert_out.range(), s_.expert_weights.range(), s_.x.range(), n_, c_.n_embd, used);
  mark("experts sum");
}

// Whether a decode step's experts take two dispatches after the router (record_experts_fused):
// where the choice has it and the products read int8 inputs with gate and up of one type.
bool GpuModel::Step::experts_fused(const GpuLayer& L) const {
  return plan_.kernels.experts_fused && n_ <= ops::matvec_max_columns &&
         ops::experts_glu_applies(features_, L.w_gate.type, L.w_up.type, c_.n_ff_exp) &&
         ops::experts_int8(features_, L.w_down.type);
}

// x += the weighted sum of each token's experts' SwiGLU blocks in two dispatches: gate and up of
// every (token, slot) pair, each workgroup ranking its token's router logits itself, with
// silu(gate) * up made as the down product's int8 input and the picks written as moe_route writes
// them; then down with the weighted sum. No moe_route and no quantize_q8_silu: two dispatch levels a
// layer fewer than record_experts' decode path.
void GpuModel::Step::record_experts_fused(const GpuLayer& L) {
  const std::uint32_t used = c_.n_expert_used;
  if (!s_.expert_glu_q8) s_.expert_glu_q8 = pool_.allocate(ops::q8_acts_bytes(c_.n_ff_exp, n_ * used), "scratch");
  ops::matvec_experts_glu(rec(), lib_, L.w_gate.type, L.w_gate.buffer.range(), L.w_up.buffer.range(), acts_q8(),
                          {s_.experts.range(), s_.expert_weights.range(), s_.router_logits.range(), c_.n_expert},
                          s_.expert_glu_q8.range(), {c_.n_ff_exp, c_.n_embd, n_, used, false, true});
  mark("matmul experts gate, up, silu");
  ops::matvec_experts_sum(rec(), lib_, L.w_down.type, L.w_down.buffer.range(), s_.expert_glu_q8.range(),
                          s_.experts.range(), s_.expert_weights.range(), s_.x.range(),
                          {c_.n_embd, c_.n_ff_exp, n_, used, true, true});
  mark("matmul experts down, sum");
}

// The router's logits of rmsnorm(x) and, where gate or up reads int8 activations (`q8`), the int8
// blocks of rmsnorm(x) alongside. A decode step whose gate and up both read int8 (`only_q8`: nothing else
// reads the normed x) has the router's mat-vec normalise x as it loads it: one dispatch level for
// the norm, the router and the int8 input, where it was three. A wide step's router product of
// float weights takes its own kernel (ops::router_logits: 212 us a layer on the tensor cores at 512
// tokens, bound by the latency of their 64 steps over K).
void GpuModel::Step::record_router(const GpuLayer& L, bool q8, bool only_q8) {
  const BufferRange norm = L.ffn_norm.buffer.range(), logits = s_.router_logits.range();
  const bool fused = only_q8 && n_ <= ops::matvec_max_columns && c_.n_embd % 4 == 0 &&
                     ops::matvec_can_accumulate(L.router.type, c_.n_embd, n_);
  if (fused) {
    ops::matvec_rms_norm(rec(), lib_, L.router.type, L.router.buffer.range(), s_.x.range(), norm, c_.rms_eps, logits,
                         c_.n_expert, c_.n_embd, n_, plan_.kernels);
  } else {
    ops::rms_norm(rec(), lib_, s_.x.range(), norm, s_.h.range(), n_, c_.n_embd, c_.rms_eps);
  }
  if (q8) {  // from x, alongside: it reads only x and writes apart
    rec().next_runs_alongside();
    ops::quantize_q8_rms_norm(rec(), lib_, s_.x.range(), norm, c_.rms_eps, acts_q8(), c_.n_embd, n_);
  }
  mark(fused ? "norm, matmul router" : "norm");
  if (fused) return;
  if (n_ > ops::matvec_max_columns && ops::router_logits_applies(L.router.type, c_.n_expert, c_.n_embd)) {
    ops::router_logits(rec(), lib_, L.router.type, L.router.buffer.range(), s_.h.range(), logits, c_.n_expert, c_.n_embd,
                       n_);
  } else {
    ops::matmul(rec(), lib_, L.router.type, L.router.buffer.range(), s_.h.range(), false, logits, c_.n_expert,
                c_.n_embd, n_, ops::MatmulPath::automatic, plan_.kernels);
  }
  mark("matmul router");
}

// One of the experts' products: a mat-vec per pair in decode steps, per expert's tile of pairs
// (sorted by record_experts) in wide ones.
void GpuModel::Step::expert_product(const GpuTensor& w, BufferRange acts, const PoolBuffer& out,
                                    const ops::ExpertProduct& shape) {
  if (s_.expert_order && n_ > ops::matvec_max_columns) {
    ops::matmul_experts(rec(), lib_, w.type, w.buffer.range(), acts, s_.expert_order.range(), s_.expert_tiles.range(),
                        out.range(), shape, c_.n_expert);
  } else {
    ops::matvec_experts(rec(), lib_, w.type, w.buffer.range(), acts, s_.experts.range(), out.range(), shape);
  }
}

// Whether a wide step's expert products take the tensor cores: where they read all three matrices.
bool GpuModel::Step::experts_on_tensor_cores(const GpuLayer& L) const {
  return ops::experts_coopmat_applies(features_, L.w_gate.type, c_.n_ff_exp, c_.n_embd) &&
         ops::experts_coopmat_applies(features_, L.w_up.type, c_.n_ff_exp, c_.n_embd) &&
         ops::experts_coopmat_applies(features_, L.w_down.type, c_.n_embd, c_.n_ff_exp);
}

// A wide step's expert products on the tensor cores, as expert_product makes them but from F16
// inputs: gate and up from the normed rows, down from silu(gate) * up. The matrices the plan says
// are decoded to F16 first, every expert's (gate and up side by side, then down where they were);
// F16 gate and up make silu(gate) * up in one dispatch where the plan says (glu).
void GpuModel::Step::expert_products_f16(const GpuLayer& L, const LayerPlan& p) {
  const std::uint32_t used = c_.n_expert_used, pairs = n_ * used;
  to_f16(s_.h, n_, c_.n_embd);
  mark("quantize");
  auto product = [&](const GpuTensor& w, BufferRange w16, BufferRange in, const PoolBuffer& out,
                     const ops::ExpertProduct& shape) {
    const bool f16 = w16.buffer != VK_NULL_HANDLE;
    ops::matmul_experts_coopmat(rec(), lib_, f16 ? gpu::WeightType::f16 : w.type, f16 ? w16 : w.buffer.range(), in,
                                s_.expert_order.range(), s_.expert_tiles.range(), out.range(), shape, c_.n_expert);
  };
  const auto gate_up16 = dequantize({{&L.w_gate, &p.gate}, {&L.w_up, &p.up}});
  if (p.gate.dequantize || p.up.dequantize) mark("dequantize experts");
  const ops::ExpertProduct gate_up{c_.n_ff_exp, c_.n_embd, n_, used};
  if (!s_.expert_glu16) s_.expert_glu16 = pool_.allocate(std::uint64_t{pairs} * c_.n_ff_exp * 2, "scratch");
  if (p.glu) {
    auto f16 = [](const GpuTensor& w, BufferRange w16) { return w16.buffer != VK_NULL_HANDLE ? w16 : w.buffer.range(); };
    ops::matmul_experts_glu(rec(), lib_, f16(L.w_gate, gate_up16[0]), f16(L.w_up, gate_up16[1]), acts16(),
                            s_.expert_order.range(), s_.expert_tiles.range(), s_.expert_glu16.range(), gate_up,
                            c_.n_expert);
    mark("matmul experts gate, up");
  } else {
    product(L.w_gate, gate_up16[0], acts16(), s_.expert_gate, gate_up);
    rec().next_runs_alongside();  // gate and up read the same input and write apart
    product(L.w_up, gate_up16[1], acts16(), s_.expert_up, gate_up);
    mark("matmul experts gate, up");
    ops::silu_mul_f16(rec(), lib_, s_.expert_gate.range(), s_.expert_up.range(), s_.expert_glu16.range(), pairs, pairs,
                      c_.n_ff_exp);
    mark("silu");
  }
  const BufferRange down16 = dequantize({{&L.w_down, &p.down}})[0];
  if (p.down.dequantize) mark("dequantize experts");
  product(L.w_down, down16, s_.expert_glu16.range(), s_.expert_out, {c_.n_embd, c_.n_ff_exp, n_, used, true});
  mark("matmul experts down");
}

// x += down x (silu(gate) * up), the SwiGLU one product.
void GpuModel::Step::record_glu(const GpuLayer& L, const LayerPlan& p, const GpuTensor* next_norm) {
  norm_f16(L.ffn_norm);
  const auto w16 = dequantize({{&L.w_gate, &p.gate}, {&L.w_up, &p.up}});
  const bool f16 = w16[0].buffer != VK_NULL_HANDLE;
  ops::matmul_narrow_glu(rec(), lib_, f16 ? gpu::WeightType::f16 : L.w_gate.type, f16 ? w16[0] : L.w_gate.buffer.range(),
                         f16 ? w16[1] : L.w_up.buffer.range(), s_.acts16.range(), glu16(), rows_of(L.w_gate),
                         cols_of(L.w_gate), n_, plan_.kernels);
  mark("matmul gate, up");
  narrow_residual(L.w_down, p.down, s_.glu16.range(), next_norm);
}

// x += down x (silu(gate) * up), gate and up made before.
void GpuModel::Step::record_down(const GpuLayer& L, const LayerPlan& p, const GpuTensor* next_norm) {
  const GpuTensor& w = L.w_down;
  switch (p.down.path) {
    case ProductPath::int8:  // silu(gate) * up made and quantized before the product
      ops::quantize_q8_silu(rec(), lib_, s_.gate.range(), s_.up.range(), acts_q8(), c_.n_ff, n_);
      mark("silu");
      ops::matvec_q8(rec(), lib_, w.type, w.buffer.range(), acts_q8(), s_.x.range(), rows_of(w), cols_of(w), n_, true,
                     plan_.kernels);
      return;
    case ProductPath::matvec:  // one kernel
      ops::matvec_accumulate_silu(rec(), lib_, w.type, w.buffer.range(), s_.gate.range(), s_.up.range(), s_.x.range(),
                                  rows_of(w), cols_of(w), n_, plan_.kernels);
      return;
    case ProductPath::narrow:  // silu(gate) * up made as the tensor cores' F16 input, one dispatch
      ops::silu_mul_f16(rec(), lib_, s_.gate.range(), s_.up.range(), acts16(), n_, plan_.padded_tokens, c_.n_ff);
      mark("silu");
      narrow_residual(w, p.down, {}, next_norm);
      return;
    case ProductPath::general:
      ops::silu_mul(rec(), lib_, s_.gate.range(), s_.up.range(), s_.gate.range(), n_ * c_.n_ff);
      mark("silu");
      residual_product(w, p.down, s_.gate, false, nullptr);
      return;
  }
}

// out_i = w_i x rmsnorm(x) for a group of products that read the same norm and write apart (no
// barriers between them). Returns the products that split K, whose sums the caller records.
std::vector<PendingSum> GpuModel::Step::normed_products(const GpuTensor& norm, NormInput input,
                                                        std::initializer_list<GroupProduct> products) {
  const bool any_narrow =
      std::ranges::any_of(products, [](const GroupProduct& p) { return std::get<1>(p)->path == ProductPath::narrow; });
  switch (input) {
    case NormInput::int8:
      if (made_by_residual(norm)) break;
      ops::quantize_q8_rms_norm(rec(), lib_, s_.x.range(), norm.buffer.range(), c_.rms_eps, normed_q8(), c_.n_embd, n_);
      mark("norm");
      break;
    case NormInput::fused: break;
    case NormInput::f16: norm_f16(norm); break;
    case NormInput::f32:
      ops::rms_norm(rec(), lib_, s_.x.range(), norm.buffer.range(), s_.h.range(), n_, c_.n_embd, c_.rms_eps);
      mark("norm");
      if (any_narrow) to_f16(s_.h, n_, c_.n_embd);
      break;
  }
  std::vector<BufferRange> dequantized(products.size());
  if (any_narrow) {
    std::vector<std::pair<const GpuTensor*, const ProductPlan*>> ws;
    for (const auto& [w, p, out] : products) ws.emplace_back(w, p);
    dequantized = dequantize(ws);
  }
  // Products whose grids are too small for the GPU split K, each into its own part of split_parts.
  std::vector<PendingSum> sums;
  std::uint64_t parts_offset = 0;
  std::size_t i = 0;
  for (const auto& [w, p, out] : products) {
    if (i > 0) rec().next_runs_alongside();
    const BufferRange w16 = dequantized[i++];
    switch (p->path) {
      case ProductPath::int8:
        ops::matvec_q8(rec(), lib_, w->type, w->buffer.range(), normed_q8(), out->range(), rows_of(*w), cols_of(*w), n_,
                       false, plan_.kernels);
        break;
      case ProductPath::matvec:
        ops::matvec_rms_norm(rec(), lib_, w->type, w->buffer.range(), s_.x.range(), norm.buffer.range(), c_.rms_eps,
                             out->range(), rows_of(*w), cols_of(*w), n_, plan_.kernels);
        break;
      case ProductPath::narrow: {
        const bool own = p->split_bytes > 0 && !w16.buffer && parts_offset + p->split_bytes <= s_.split_parts.size();
        const BufferRange parts = own ? s_.split_parts.range(parts_offset, p->split_bytes) : BufferRange{};
        if (own) parts_offset += p->split_bytes;
        const std::uint32_t splits = product_narrow(*w, *out, n_, false, w16, parts, true);
        if (splits > 1) sums.push_back({parts, out, rows_of(*w) * n_, splits});
        break;
      }
      case ProductPath::general:
        ops::matmul(rec(), lib_, w->type, w->buffer.range(), s_.h.range(), false, out->range(), rows_of(*w), cols_of(*w),
                    n_, ops::MatmulPath::automatic, plan_.kernels);
        break;
    }
  }
  return sums;
}

// The sums of a group's split products, recorded alongside each other.
void GpuModel::Step::sum_products(const std::vector<PendingSum>& sums) {
  for (std::size_t i = 0; i < sums.size(); ++i) {
    if (i > 0) rec().next_runs_alongside();
    ops::sum_splits(rec(), lib_, sums[i].parts, sums[i].out->range(), sums[i].count, sums[i].splits, false);
  }
}

// x += w x in. in_ready: `in` is already in the form the product reads, made by the dispatch
// before (the int8 path's in acts_q8, the tensor cores' F16 in acts16). next_norm: as
// narrow_residual's.
void GpuModel::Step::residual_product(const GpuTensor& w, const ProductPlan& p, const PoolBuffer& in, bool in_ready,
                                      const GpuTensor* next_norm) {
  const std::uint32_t m = rows_of(w), k = cols_of(w);
  switch (p.path) {
    case ProductPath::int8:
      if (!in_ready) ops::quantize_q8(rec(), lib_, in.range(), acts_q8(), k, n_);
      ops::matvec_q8(rec(), lib_, w.type, w.buffer.range(), acts_q8(), s_.x.range(), m, k, n_, true, plan_.kernels);
      return;
    case ProductPath::matvec:
      ops::matvec_accumulate(rec(), lib_, w.type, w.buffer.range(), in.range(), false, s_.x.range(), m, k, n_,
                             plan_.kernels);
      return;
    case ProductPath::narrow:
      if (!in_ready) to_f16(in, n_, k);
      narrow_residual(w, p, {}, next_norm);
      return;
    case ProductPath::general:
      ops::matmul(rec(), lib_, w.type, w.buffer.range(), in.range(), false, s_.proj.range(), m, k, n_,
                  ops::MatmulPath::automatic, plan_.kernels);
      ops::add(rec(), lib_, s_.x.range(), s_.proj.range(), s_.x.range(), n_ * c_.n_embd);
      return;
  }
}

// x += rmsnorm(w x in), Gemma's norm of a block's output before its residual add: the product
// into proj on the int8 path, the tensor cores' (K not split) or the general one (the plan takes
// no other here). in_ready: as residual_product's. next_norm: the norm whose int8 input
// (normed_q8) reads x next, made by the same dispatch as the add.
void GpuModel::Step::post_normed_product(const GpuTensor& w, const ProductPlan& p, const PoolBuffer& in, bool in_ready,
                                         const GpuTensor& norm, const GpuTensor* next_norm) {
  const std::uint32_t m = rows_of(w), k = cols_of(w);
  switch (p.path) {
    case ProductPath::int8:
      if (!in_ready) ops::quantize_q8(rec(), lib_, in.range(), acts_q8(), k, n_);
      ops::matvec_q8(rec(), lib_, w.type, w.buffer.range(), acts_q8(), s_.proj.range(), m, k, n_, false, plan_.kernels);
      break;
    case ProductPath::narrow:
      if (!in_ready) to_f16(in, n_, k);
      product_narrow(w, s_.proj, n_, false, dequantize({{&w, &p}}).front());
      break;
    case ProductPath::matvec:
    case ProductPath::general:
      ops::matmul(rec(), lib_, w.type, w.buffer.range(), in.range(), false, s_.proj.range(), m, k, n_,
                  ops::MatmulPath::automatic, plan_.kernels);
      break;
  }
  if (next_norm == nullptr) {
    ops::rms_norm_add(rec(), lib_, s_.proj.range(), norm.buffer.range(), s_.x.range(), n_, c_.n_embd, c_.rms_eps);
    return;
  }
  ops::rms_norm_add_quantize_q8(rec(), lib_, s_.proj.range(), norm.buffer.range(), s_.x.range(),
                                next_norm->buffer.range(), c_.rms_eps, normed_q8(), c_.n_embd, n_);
  normed_by_residual_ = next_norm;
}

// x += w x input (acts16 unless given), the add fused into the tensor cores' product. next_norm:
// the norm whose F16 form (norm_f16) reads x next; where the product splits K, the dispatch that
// adds its slices into x also makes that norm (one dispatch fewer: at 32 sequences each is ~5 us
// of a layer's 0.35 ms).
void GpuModel::Step::narrow_residual(const GpuTensor& w, const ProductPlan& p, BufferRange input,
                                     const GpuTensor* next_norm) {
  const BufferRange w16 = dequantize({{&w, &p}}).front();
  const bool sum_here = next_norm != nullptr && s_.split_parts;
  const std::uint32_t splits = product_narrow(w, s_.x, n_, true, w16,
                                              s_.split_parts ? s_.split_parts.range() : BufferRange{}, sum_here, input);
  if (!sum_here || splits == 1) return;  // unsplit, x is written: the norm runs as its own dispatch
  ops::sum_splits_rms_norm_f16(rec(), lib_, s_.split_parts.range(), splits, s_.x.range(), next_norm->buffer.range(),
                               acts16(), n_, plan_.padded_tokens, c_.n_embd, c_.rms_eps);
  normed_by_residual_ = next_norm;
}

// The narrow path's product of w (or its F16 form, dequantized) and the F16 activations (acts16
// unless given). split_scratch: where it may split K; sum_later: the caller records its sum.
std::uint32_t GpuModel::Step::product_narrow(const GpuTensor& w, const PoolBuffer& out, std::uint32_t columns,
                                             bool accumulate, BufferRange dequantized, BufferRange split_scratch,
                                             bool sum_later, BufferRange input) {
  const bool f16 = dequantized.buffer != VK_NULL_HANDLE;
  return ops::matmul_narrow(rec(), lib_, f16 ? gpu::WeightType::f16 : w.type, f16 ? dequantized : w.buffer.range(),
                            input.buffer != VK_NULL_HANDLE ? input : s_.acts16.range(), out.range(), rows_of(w),
                            cols_of(w), columns, accumulate, split_scratch, sum_later, plan_.kernels);
}

// Dequantizes each product its plan says into its own part of weights16 (the dispatches run
// alongside each other); returns each one's F16 range, empty for the others.
std::vector<BufferRange> GpuModel::Step::dequantize(
    const std::vector<std::pair<const GpuTensor*, const ProductPlan*>>& ws) {
  std::vector<BufferRange> ranges;
  std::uint64_t offset = 0;
  bool first = true;
  for (const auto& [w, p] : ws) {
    if (!p->dequantize) {
      ranges.emplace_back();
      continue;
    }
    const std::uint64_t bytes = std::uint64_t{w->rows} * w->cols * 2;
    ranges.push_back(s_.weights16.range(offset, bytes));
    offset += bytes;
    if (!std::exchange(first, false)) rec().next_runs_alongside();
    ops::dequantize_f16(rec(), lib_, w->type, w->buffer.range(), ranges.back(), rows_of(*w), cols_of(*w));
  }
  return ranges;
}

// rmsnorm(x) as the tensor cores' F16 input, in one dispatch (unless the residual product before
// made it).
void GpuModel::Step::norm_f16(const GpuTensor& norm) {
  if (made_by_residual(norm)) return;
  ops::rms_norm_f16(rec(), lib_, s_.x.range(), norm.buffer.range(), acts16(), n_, plan_.padded_tokens, c_.n_embd,
                    c_.rms_eps);
  mark("norm");
}

void GpuModel::Step::to_f16(const PoolBuffer& in, std::uint32_t rows, std::uint32_t width) {
  ops::to_f16(rec(), lib_, in.range(), acts16(), rows, width, ops::narrow_padded_columns(features_, rows, plan_.kernels));
}

void GpuModel::Step::add_bias(const GpuTensor& bias, const PoolBuffer& io, std::uint32_t width) {
  if (!bias.buffer) return;
  const std::uint64_t row_bytes = std::uint64_t{width} * 4;
  for (std::uint32_t t = 0; t < n_; ++t) {  // one row at a time: ops::add does not broadcast
    const BufferRange row = io.range(t * row_bytes, row_bytes);
    ops::add(rec(), lib_, row, bias.buffer.range(), row, width);
  }
}

// Parts of 1, 2, 4, ... layers up to layers_per_submission_: the GPU starts after one layer is
// recorded, and each part takes the host less time to record than the GPU takes to run the one
// before, so the GPU never waits for the host inside a step.
// A step whose output part waits for its masks (masks_later) sends its last layers too, so that
// the GPU runs every layer while the host works the masks out.
void GpuModel::Step::end_layer(std::uint32_t l) {
  const bool last = l + 1 >= c_.n_layers;
  ++part_layers_;
  if (!(last && sampling_ != nullptr && sampling_->masks_later) && (part_layers_ != part_size_ || last)) return;
  if (profile_ != nullptr && l == 0) {
    const auto first_part = std::chrono::steady_clock::now() - start_;
    profile_->first_part_ms += std::chrono::duration<double, std::milli>(first_part).count();
  }
  queue_.submit(rec());
  rec_.emplace(queue_.begin());
  rec().after_previous_submissions();
  rec().set_label("a step's later part");
  mark("waiting for the host");
  part_layers_ = 0;
  part_size_ = std::min(2 * part_size_, model_.layers_per_submission_);
}

// The output matrix over the normed rows whose logits are wanted.
void GpuModel::Step::record_output_product(const GpuTensor& w) {
  const std::uint32_t m = rows_of(w), k = cols_of(w), rows = in_.outputs;
  switch (plan_.output) {
    case OutputPath::narrow:
      to_f16(s_.picked, rows, k);
      product_narrow(w, s_.logits, rows, false);
      return;
    case OutputPath::int8:
      for (std::uint32_t r = 0; r < rows; r += ops::matvec_max_columns) {
        const std::uint32_t group = std::min(rows - r, ops::matvec_max_columns);
        ops::quantize_q8(rec(), lib_, s_.picked.range(std::uint64_t{r} * k * 4, std::uint64_t{group} * k * 4), acts_q8(), k,
                         group);
        ops::matvec_q8(rec(), lib_, w.type, w.buffer.range(), acts_q8(),
                       s_.logits.range(std::uint64_t{r} * m * 4, std::uint64_t{group} * m * 4), m, k, group, false,
                       plan_.kernels);
      }
      return;
    case OutputPath::general:
      ops::matmul(rec(), lib_, w.type, w.buffer.range(), s_.picked.range(), false, s_.logits.range(), m, k, rows,
                  ops::MatmulPath::automatic, plan_.kernels);
      return;
  }
}

// What is asked for comes back through host-visible memory, copied at the end of the submission:
// all the logits, or only each row's token (the argmax, or the sampler's choice with its logprobs).
GpuModel::StepResult GpuModel::Step::record_output(StepOutput want) {
  const std::uint32_t n_out = in_.outputs;
  PendingTokens pending;
  pending.sampled = sampling_ != nullptr;
  pending.count = n_out;
  pending.collected = false;
  if (hidden_ != nullptr && want == StepOutput::in_flight) {
    throw std::invalid_argument("a step sent without waiting cannot bring back hidden states");
  }
  if (n_out > 0 || hidden_ != nullptr) {
    ops::rms_norm(rec(), lib_, s_.x.range(), model_.output_norm_.buffer.range(), s_.h.range(), n_, c_.n_embd,
                  c_.rms_eps);
  }
  if (hidden_ != nullptr) {
    const std::uint64_t bytes = std::uint64_t{n_} * c_.n_embd * 4;
    hidden_readback_ = pool_.allocate(bytes, "scratch", gpu::MemoryKind::host);
    rec().copy(s_.h.range(0, bytes), hidden_readback_.range());
  }
  if (n_out == 0) {
    finish();
    if (want == StepOutput::logits) return std::vector<float>{};
    pending.done_at = queue_.last_submitted();  // no tokens: collect() finds none
    return pending;
  }
  // Only the rows whose logits are wanted go through the output matrix.
  ops::get_rows(rec(), lib_, gpu::WeightType::f32, s_.h.range(), s_.output_rows.range(), s_.picked.range(), c_.n_embd,
                n_out);
  record_output_product(model_.output_.buffer ? model_.output_ : model_.token_embd_);
  if (c_.final_softcap > 0.0f) {
    ops::soft_cap(rec(), lib_, s_.logits.range(), s_.logits.range(), n_out * c_.n_vocab, c_.final_softcap);
  }
  mark("output");
  if (want == StepOutput::logits) {
    const std::size_t count = std::size_t{n_out} * c_.n_vocab;
    PoolBuffer readback = pool_.allocate(count * 4, "scratch", gpu::MemoryKind::host);
    rec().copy(s_.logits.range(0, count * 4), readback.range());
    finish();
    std::vector<float> logits(count);
    std::memcpy(logits.data(), readback.mapped(), count * 4);
    return logits;
  }
  const std::uint64_t words = pending.sampled ? std::uint64_t{n_out} * ops::sample_out_words : n_out;
  PoolBuffer readback = pool_.allocate(words * 4, "scratch", gpu::MemoryKind::host);
  PoolBuffer ids = pool_.allocate(std::size_t{n_out} * 4, "scratch");
  if (pending.sampled) {
    record_sampling(ids, readback, n_out);
    pending.top_logprobs = top_logprob_counts(*sampling_);
  } else {
    PoolBuffer argmax_parts = pool_.allocate(ops::argmax_scratch_bytes(n_out, c_.n_vocab), "scratch");
    ops::argmax(rec(), lib_, s_.logits.range(), argmax_parts.range(), ids.range(), n_out, c_.n_vocab);
    mark("argmax");
    rec().copy(ids.range(), readback.range());
  }
  if (want == StepOutput::tokens || profile_ != nullptr) {
    finish();  // the caller reads the tokens now, or a profile is read here
    pending.done_at = queue_.last_submitted();
  } else if (sampling_ != nullptr && sampling_->masks_later) {
    holds_output_ = true;  // run() hands the step to `pending`; send_held sends this part
    rec().set_label("an output part held for its masks");
  } else {
    pending.done_at = queue_.submit(rec());  // the caller waits (collect)
  }
  pending.ids = std::move(ids);
  pending.readback = std::move(readback);
  return pending;
}

namespace {

// The host's description of a step's sampling, checked before the GPU reads it: a wrong offset
// would read another row's penalties or past a buffer.
void check_sampling(const StepSampling& s, std::uint32_t rows, std::uint32_t n_vocab, bool has_previous) {
  if (s.rows.size() != rows) {
    throw std::invalid_argument(fmt::format("sampling: {} rows for {} outputs", s.rows.size(), rows));
  }
  for (const ops::SampleRow& r : s.rows) {
    if (r.n == 0 || r.n > n_vocab) throw std::invalid_argument(fmt::format("sampling: a row of {} of {} columns", r.n, n_vocab));
    if (std::uint64_t{r.entries_offset} + r.entries_count > s.entries.size() / 4) {
      throw std::invalid_argument("sampling: a row's entries reach past the list");
    }
    if (r.mask_offset != 0xFFFFFFFFu && std::uint64_t{r.mask_offset} + (r.n + 31) / 32 > s.mask.size()) {
      throw std::invalid_argument("sampling: a row's mask reaches past the mask words");
    }
    if ((r.flags & ops::sample_flag_pending) != 0 && (!has_previous || (r.flags >> 16) >= rows)) {
      throw std::invalid_argument("sampling: a row counts a token of a step before that it does not follow");
    }
  }
}

}  // namespace

// The sampler's inputs go up with the step's others, at its start.
void GpuModel::Step::upload_sampling() {
  const StepSampling& s = *sampling_;
  check_sampling(s, in_.outputs, c_.n_vocab, tokens_from_ != nullptr);
  const std::vector<std::uint32_t> none(4, 0);
  s_.sample_rows = upload(std::as_bytes(std::span(s.rows)));
  s_.sample_entries = upload(s.entries.empty() ? none : s.entries);
  // The masks (16 KiB a row for a 128k vocabulary) go up through host-visible memory and are copied
  // to device memory just before the draws, which read them in every pass: read across PCIe they
  // cost ~1.5 ms a step at 32 rows (H200). masks_later: send_held writes them, before the part
  // that copies them is submitted (which makes them visible).
  const std::size_t mask_words = std::max<std::size_t>(s.mask.size(), 1);
  s_.sample_mask_host = pool_.allocate(mask_words * 4, "scratch", gpu::MemoryKind::host);
  s_.sample_mask = pool_.allocate(mask_words * 4, "scratch");
  if (s.masks_later) {
    held_mask_words_ = s.mask.size();
  } else if (!s.mask.empty()) {
    std::memcpy(s_.sample_mask_host.mapped(), s.mask.data(), s.mask.size() * 4);
  }
  s_.sample_arrivals = upload(std::vector<std::uint32_t>(std::size_t{in_.outputs} * ops::sample_arrival_words, 0));
}

// Each output row's token chosen on the GPU from its logits (ops::sample): the tokens to `ids`,
// for a next step, and with the logprobs to `readback`.
void GpuModel::Step::record_sampling(const PoolBuffer& ids, const PoolBuffer& readback, std::uint32_t rows) {
  PoolBuffer scratch = pool_.allocate(ops::sample_scratch_bytes(rows, c_.n_vocab), "scratch");
  PoolBuffer out = pool_.allocate(std::uint64_t{rows} * ops::sample_out_words * 4, "scratch");
  const BufferRange previous = tokens_from_ != nullptr ? tokens_from_->ids.range() : ids.range();
  if (!sampling_->mask.empty()) rec().copy(s_.sample_mask_host.range(), s_.sample_mask.range());
  ops::sample(rec(), lib_,
              {s_.logits.range(), s_.sample_rows.range(), s_.sample_entries.range(), s_.sample_mask.range(), previous,
               scratch.range(), out.range(), ids.range(), s_.sample_arrivals.range()},
              rows, c_.n_vocab, ops::sample_needs(sampling_->rows), [&](const char* pass) { mark(pass); });
  rec().copy(out.range(), readback.range());
}

std::uint64_t GpuModel::Step::send_held(std::span<const std::uint32_t> mask) {
  if (!std::exchange(holds_output_, false)) throw std::logic_error("send_held: the step holds no output part");
  if (mask.size() != held_mask_words_) {
    throw std::invalid_argument(fmt::format("send_held: {} mask words for a mask of {}", mask.size(), held_mask_words_));
  }
  std::memcpy(s_.sample_mask_host.mapped(), mask.data(), mask.size_bytes());
  return queue_.submit(rec());
}

// The normed hidden states, once the step is done.
void GpuModel::Step::read_hidden() {
  if (hidden_ == nullptr) return;
  hidden_->resize(std::size_t{n_} * c_.n_embd);
  std::memcpy(hidden_->data(), hidden_readback_.mapped(), hidden_->size() * 4);
}

// Submits what is left of the step and waits for it (and reads the hidden states asked for); a
// profile takes its times.
void GpuModel::Step::finish() {
  const auto submit_at = std::chrono::steady_clock::now();
  queue_.submit_and_wait(rec());
  read_hidden();
  if (profile_ == nullptr) return;
  auto ms = [](auto d) { return std::chrono::duration<double, std::milli>(d).count(); };
  profile_->record_ms += ms(submit_at - start_);
  profile_->wait_ms += ms(std::chrono::steady_clock::now() - submit_at);
  ++profile_->steps;
  if (!profiling_ || labels_.size() < 2) return;
  std::vector<std::uint64_t> stamps(labels_.size());
  if (vkGetQueryPoolResults(queue_.device().get(), model_.timestamps_.get(), 0, static_cast<std::uint32_t>(labels_.size()),
                            stamps.size() * 8, stamps.data(), 8, VK_QUERY_RESULT_64_BIT) != VK_SUCCESS) {
    return;
  }
  const double period_ms = features_.timestamp_period_ns / 1e6;
  for (std::size_t i = 1; i < labels_.size(); ++i) profile_->gpu_ms[labels_[i]] += (stamps[i] - stamps[i - 1]) * period_ms;
  // From the previous step's last op to this one's first: the GPU waited for the host's reading
  // of the result and its making of this step (the steps run one after the other).
  if (profile_->last_stamp != 0 && stamps.front() > profile_->last_stamp) {
    profile_->between_steps_ms += (stamps.front() - profile_->last_stamp) * period_ms;
  }
  profile_->last_stamp = stamps.back();
}

GpuModel::StepResult GpuModel::run(const StepBatch& batch, GpuKvCache& cache, StepOutput want, StepProfile* profile,
                                   const PendingTokens* tokens_from, std::vector<float>* hidden) {
  const auto n = static_cast<std::uint32_t>(batch.tokens.size());
  if (n == 0) {
    if (want == StepOutput::logits) return std::vector<float>{};
    return PendingTokens{};
  }
  if (tokens_from != nullptr && tokens_from->count != n) {
    throw std::invalid_argument("a step's tokens from the step before: " + std::to_string(tokens_from->count) +
                                " there, " + std::to_string(n) + " here");
  }
  if (batch.sampling && batch.sampling->masks_later && (want != StepOutput::in_flight || profile != nullptr)) {
    throw std::invalid_argument("a step whose masks come later is sent with submit_tokens, without a profile");
  }
  auto step = std::make_shared<Step>(*this, batch, cache, profile, tokens_from, hidden);
  step->record_embedding();
  for (std::uint32_t l = 0; l < config_.n_layers; ++l) {
    step->record_attention(l);
    step->record_feed_forward(l);
    step->end_layer(l);
  }
  StepResult result = step->record_output(want);
  if (step->holds_output()) std::get<PendingTokens>(result).held = std::move(step);
  return result;
}

void GpuModel::send_held(PendingTokens& pending, std::span<const std::uint32_t> mask) {
  if (!pending.held) throw std::logic_error("send_held: the step holds nothing back");
  pending.done_at = pending.held->send_held(mask);
  pending.held.reset();
}

}  // namespace mqlm::model
