// `mqlm generate MODEL -p TEXT`: loads a GGUF model on the GPU, prefills the prompt in one step,
// decodes token by token, prints the text as it comes, then prefill and decode speed. With --json
// it prints instead one JSON line shaped like the server's final event: the token ids, the text,
// the finish reason and, with --logprobs, each token's logprob and top alternatives.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "gpu/buffer_pool.hpp"
#include "gpu/compute_queue.hpp"
#include "gpu/device.hpp"
#include "gpu/kernel_library.hpp"
#include "model/gguf/gguf_file.hpp"
#include "model/gguf/vocabulary_metadata.hpp"
#include "model/llama/gguf_model.hpp"
#include "model/llama/gpu_model.hpp"
#include "model/sampling/sampler.hpp"
#include "model/sampling/stop_matcher.hpp"
#include "model/tokenizer/tokenizer.hpp"
#include "tools/command_options.hpp"
#include "tools/commands.hpp"
#include "tools/kernel_flags.hpp"

namespace mqlm::tools {

namespace {

using Clock = std::chrono::steady_clock;

struct GenerateOptions {
  std::string model;
  std::string prompt;
  model::SamplingParams sampling;
  bool parse_special = false;
  bool quiet = false;
  bool json = false;
  bool profile = false;
  bool warmup = false;
  std::string device;
  std::uint32_t page_size = 16;
  std::uint32_t batch = 1;
  std::string matvec_shape;  // the vector kernel's workgroup, for measuring others than the tuned one
  bool experts_f16 = false;  // KernelChoice::experts_f16, for measuring it against the default
  bool experts_separate = false;  // KernelChoice::experts_fused off, for measuring the fused decode against it
};

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// Where the GPU time of `per` steps went, by kind of op, largest first.
void report(const char* what, const model::StepProfile& p, double per) {
  double gpu_total = 0;
  for (const auto& [label, ms] : p.gpu_ms) gpu_total += ms;
  std::cerr << fmt::format("{} (per {}): host records {:.3f} ms, waits {:.3f} ms; GPU {:.3f} ms:\n", what,
                           per == 1 ? "step" : "token", p.record_ms / per, p.wait_ms / per, gpu_total / per);
  if (p.steps > 1) {
    std::cerr << fmt::format("  GPU idle between steps {:.3f} ms a step; the host's first part {:.3f} ms\n",
                             p.between_steps_ms / static_cast<double>(p.steps - 1), p.first_part_ms / per);
  }
  std::vector<std::pair<double, std::string>> rows;
  for (const auto& [label, ms] : p.gpu_ms) rows.emplace_back(ms, label);
  std::sort(rows.rbegin(), rows.rend());
  for (const auto& [ms, label] : rows) {
    std::cerr << fmt::format("  {:<18} {:8.3f} ms  {:5.1f}%\n", label, ms / per, 100 * ms / gpu_total);
  }
}

// --batch: `batch` copies of the prompt decoded greedily side by side, as a server's batch of
// sequences is, for max_tokens steps: the aggregate rate, and with --profile where a batched step's
// time goes. Prints sequence 0's text (every copy computes the same).
void generate_batched(const GenerateOptions& o, model::GpuModel& gpu_model, model::GpuContext& ctx,
                      const model::LlamaConfig& config, const model::Tokenizer& tokenizer,
                      const std::vector<std::int32_t>& prompt) {
  const std::uint32_t b = o.batch;
  const std::uint64_t total = prompt.size() + static_cast<std::uint64_t>(o.sampling.max_tokens);
  const auto pages = static_cast<std::uint32_t>((total + o.page_size - 1) / o.page_size);
  model::GpuKvCache cache(ctx, config, pages * b, o.page_size);
  model::StepBatch batch;
  for (std::uint32_t s = 0; s < b; ++s) {
    batch.block_tables.emplace_back();
    for (std::uint32_t p = 0; p < pages; ++p) batch.block_tables[s].push_back(s * pages + p);
    for (std::uint32_t i = 0; i < prompt.size(); ++i) batch.tokens.push_back({s, i, prompt[i], i + 1 == prompt.size()});
  }
  auto decode_batch = [&](const std::vector<std::int32_t>& next, std::uint32_t position) {
    model::StepBatch step{{}, batch.block_tables, {}};
    for (std::uint32_t s = 0; s < b; ++s) step.tokens.push_back({s, position, next[s], true});
    return step;
  };
  if (o.warmup) {
    auto first = gpu_model.forward_argmax(batch, cache);
    gpu_model.forward_argmax(decode_batch(first, static_cast<std::uint32_t>(prompt.size())), cache);
  }
  model::StepProfile prefill_profile, decode_profile;
  auto prefill_start = Clock::now();
  std::vector<std::int32_t> next = gpu_model.forward_argmax(batch, cache, o.profile ? &prefill_profile : nullptr);
  const double prefill_s = seconds(Clock::now() - prefill_start);
  model::StreamDecoder decoder(tokenizer, {false, false});
  auto decode_start = Clock::now();
  std::uint32_t steps = 0;
  for (auto position = static_cast<std::uint32_t>(prompt.size()); steps + 1 < static_cast<std::uint32_t>(o.sampling.max_tokens);
       ++position, ++steps) {
    if (!o.quiet) std::cout << decoder.push(next[0]) << std::flush;
    next = gpu_model.forward_argmax(decode_batch(next, position), cache, o.profile ? &decode_profile : nullptr);
  }
  const double decode_s = seconds(Clock::now() - decode_start);
  if (!o.quiet) std::cout << decoder.push(next[0]) << decoder.finish() << "\n";
  std::cerr << fmt::format(
      "prefill: {} sequences of {} tokens in {:.1f} ms, {:.1f} tokens/s\n"
      "decode: {} steps of {} sequences in {:.1f} ms, {:.2f} ms per step, {:.1f} tokens/s in all\n",
      b, prompt.size(), prefill_s * 1e3, b * prompt.size() / prefill_s, steps, b, decode_s * 1e3,
      steps ? decode_s * 1e3 / steps : 0.0, steps ? b * steps / decode_s : 0.0);
  if (!o.profile) return;
  report("prefill", prefill_profile, 1);
  report("decode", decode_profile, std::max<double>(1, static_cast<double>(decode_profile.steps)));
}

// The prompt's tokens, once the request fits: the model's context, the sampling limits, --batch's.
std::vector<std::int32_t> checked_prompt(const GenerateOptions& o, const model::LlamaConfig& config,
                                         const model::Tokenizer& tokenizer) {
  std::vector<std::int32_t> prompt = tokenizer.encode(o.prompt, {true, o.parse_special});
  if (prompt.empty()) throw CommandFailed("the prompt is empty", 2);
  const std::uint64_t total = prompt.size() + static_cast<std::uint64_t>(o.sampling.max_tokens);
  if (total > config.n_ctx_train) {
    throw CommandFailed(fmt::format("{} prompt tokens and {} to generate exceed the model's context of {}",
                                    prompt.size(), o.sampling.max_tokens, config.n_ctx_train), 2);
  }
  if (auto error = model::validate(o.sampling, {static_cast<std::int32_t>(config.n_vocab), o.sampling.max_tokens})) {
    throw CommandFailed(error->field + ": " + error->message, 2);
  }
  const model::SamplingParams& sp = o.sampling;
  if (o.batch > 1 && !(model::plain_greedy(sp) && sp.stop.empty())) {
    throw CommandFailed("--batch decodes greedily: give --temperature 0 and no penalties, logit_bias, stop strings or "
                        "logprobs", 2);
  }
  if (o.batch > 1 && o.json) throw CommandFailed("--batch prints text and figures, not --json", 2);
  return prompt;
}

// What one sequence's generation gave, and its figures.
struct Generation {
  std::vector<std::int32_t> tokens;
  nlohmann::json logprobs = nlohmann::json::array();
  std::string text;  // all of it, for --json
  std::string finish = "length";
  double prefill_s = 0, decode_s = 0;
  model::StepProfile prefill_profile, decode_profile;
};

// The tokens as they come: printed (unless quiet or --json), kept with their logprobs, and
// matched against the stop conditions.
class TokenOutput {
 public:
  TokenOutput(const GenerateOptions& o, const model::Tokenizer& tokenizer, Generation& out)
      : o_(o), tokenizer_(tokenizer), out_(out), stops_(model::StopMatcher::for_request(o.sampling, stop_tokens(tokenizer))),
        decoder_(tokenizer, {false, false}) {}

  // Whether the generation ends with this token.
  bool push(const model::SampledToken& next) {
    out_.tokens.push_back(next.token);
    if (next.logprob) {
      nlohmann::json top = nlohmann::json::array();
      for (const auto& alternative : next.top_logprobs) top.push_back({alternative.token, alternative.logprob});
      out_.logprobs.push_back({{"token", next.token}, {"logprob", *next.logprob}, {"top", std::move(top)}});
    }
    std::string piece = tokenizer_.ends_generation(next.token) ? std::string{} : decoder_.push(next.token);
    model::StopStep step = stops_.push(next.token, piece);
    out_.text += step.text;
    if (!o_.quiet && !o_.json) std::cout << step.text << std::flush;
    if (!step.finish) return false;
    out_.finish = *step.finish == model::FinishReason::stop ? "stop" : "length";
    return true;
  }

 private:
  static std::vector<std::int32_t> stop_tokens(const model::Tokenizer& tokenizer) {
    std::vector<std::int32_t> ids;
    for (std::int32_t id : {tokenizer.eos(), tokenizer.eot()}) {
      if (id >= 0) ids.push_back(id);
    }
    return ids;
  }

  const GenerateOptions& o_;
  const model::Tokenizer& tokenizer_;
  Generation& out_;
  model::StopMatcher stops_;
  model::StreamDecoder decoder_;
};

// One sequence: the prompt in one step, then a token a step, every token chosen on the GPU: the
// argmax for plain greedy decoding (which needs no history and sees no padding rows), else the
// sampler's draw (pending: the token before it is the step in flight's, not yet accepted).
Generation generate_one(const GenerateOptions& o, model::GpuModel& gpu_model, model::GpuContext ctx,
                        const model::Tokenizer& tokenizer, const std::vector<std::int32_t>& prompt) {
  const model::LlamaConfig& config = gpu_model.config();
  const std::uint64_t total = prompt.size() + static_cast<std::uint64_t>(o.sampling.max_tokens);
  const auto pages = static_cast<std::uint32_t>((total + o.page_size - 1) / o.page_size);
  model::GpuKvCache cache(ctx, config, pages, o.page_size);
  model::StepBatch batch;
  batch.block_tables.push_back({});
  for (std::uint32_t p = 0; p < pages; ++p) batch.block_tables[0].push_back(p);
  for (std::uint32_t i = 0; i < prompt.size(); ++i) batch.tokens.push_back({0, i, prompt[i], i + 1 == prompt.size()});

  const model::SamplingParams& sp = o.sampling;
  model::Sampler sampler(sp, prompt);
  const bool plain_greedy = model::plain_greedy(sp) && tokenizer.size() == config.n_vocab;
  // The batch with its row's draw as the sampler now describes it (none for the argmax).
  auto sampled = [&](model::StepBatch& b, bool pending) -> const model::StepBatch& {
    b.sampling.reset();
    if (!plain_greedy) {
      model::add_sampling_row(b.sampling.emplace(), sampler.gpu_row(pending), static_cast<std::uint32_t>(tokenizer.size()),
                              pending ? std::optional<std::uint32_t>(0) : std::nullopt);
    }
    return b;
  };
  if (o.warmup) {
    // The first steps build the GPU pipelines; one untimed pass over the prompt (and one decode
    // step) leaves the timed ones measuring the model alone. The cache is overwritten after.
    gpu_model.forward_sampled(sampled(batch, false), cache);
    model::StepBatch one = batch;
    one.tokens = {{0, static_cast<std::uint32_t>(prompt.size()), prompt.back(), true}};
    gpu_model.forward_sampled(sampled(one, false), cache);
  }
  Generation out;
  TokenOutput output(o, tokenizer, out);
  auto prefill_start = Clock::now();
  model::SampledToken next =
      gpu_model.forward_sampled(sampled(batch, false), cache, o.profile ? &out.prefill_profile : nullptr).at(0);
  out.prefill_s = seconds(Clock::now() - prefill_start);
  auto decode_start = Clock::now();
  auto position = static_cast<std::uint32_t>(prompt.size());
  // Steps go to the GPU one ahead: the step after the current one is sent before the current one's
  // token is read, its token taken on the GPU from the current one's choice, so the GPU goes from
  // step to step without waiting for the host (not with --profile, which reads each step's
  // timestamps). A step sent ahead of a stop is computed and dropped.
  std::optional<model::GpuModel::PendingTokens> ahead;
  while (true) {
    if (!plain_greedy) sampler.accept(next.token);
    if (output.push(next)) break;
    batch.tokens = {{0, position++, next.token, true}};
    if (o.profile) {
      next = gpu_model.forward_sampled(sampled(batch, false), cache, &out.decode_profile).at(0);
      continue;
    }
    model::GpuModel::PendingTokens current = ahead ? std::move(*ahead) : gpu_model.submit_tokens(sampled(batch, false), cache);
    ahead.reset();
    if (out.tokens.size() + 2 <= static_cast<std::size_t>(o.sampling.max_tokens)) {
      model::StepBatch after{{{0, position, 0, true}}, batch.block_tables, {}};
      ahead = gpu_model.submit_tokens(sampled(after, true), cache, &current);
    }
    next = gpu_model.collect_sampled(current).at(0);
  }
  out.decode_s = seconds(Clock::now() - decode_start);
  if (ahead) gpu_model.collect(*ahead);  // sent ahead of the stop: its token is not wanted
  return out;
}

// The final JSON line (--json), then the figures on stderr.
void report_generation(const GenerateOptions& o, const model::gguf::GgufFile& file, const model::LlamaConfig& config,
                       const std::string& device, double load_s, std::size_t prompt_tokens, Generation& g) {
  // The stop matcher ended the output (it releases held-back text at max_tokens); as in the
  // server, a character's first bytes still in the decoder are not text.
  if (o.json) {
    nlohmann::json out{{"event", "final"}, {"tokens", g.tokens}, {"text", g.text}, {"finish_reason", g.finish}};
    if (o.sampling.logprobs) out["logprobs"] = std::move(g.logprobs);
    std::cout << out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n" << std::flush;
  } else if (!o.quiet) {
    std::cout << "\n";
  }
  // What a decode step reads: every weight but the embedding table, of which it reads one row
  // (unless the output is tied to it, when all of it is read as the output matrix), and of the
  // experts only the ones a token goes through.
  std::uint64_t weight_bytes = 0;
  for (const auto& t : file.tensors()) {
    if (t.name.ends_with("_exps.weight") && config.moe()) {
      weight_bytes += t.bytes / config.n_expert * config.n_expert_used;
    } else if (t.name != "token_embd.weight" || config.tied_output) {
      weight_bytes += t.bytes;
    }
  }
  const std::size_t generated = g.tokens.size();
  const double decode_rate = generated > 1 ? static_cast<double>(generated - 1) / g.decode_s : 0.0;
  std::cerr << fmt::format(
      "model: {} ({} layers, {} hidden, {:.2f} GB of weights read per token), loaded in {:.1f} s on {}\n"
      "prefill: {} tokens in {:.1f} ms, {:.1f} tokens/s\n"
      "decode: {} tokens in {:.1f} ms, {:.2f} tokens/s, {:.0f} GB/s of weights read (finish: {})\n",
      o.model, config.n_layers, config.n_embd, weight_bytes / 1e9, load_s, device, prompt_tokens, g.prefill_s * 1e3,
      prompt_tokens / g.prefill_s, generated, g.decode_s * 1e3, decode_rate, decode_rate * weight_bytes / 1e9, g.finish);
  if (!o.profile) return;
  report("prefill", g.prefill_profile, 1);
  report("decode", g.decode_profile, std::max<double>(1, static_cast<double>(g.decode_profile.steps)));
}

void generate(const GenerateOptions& o) {
  auto opened = model::gguf::GgufFile::open(o.model);
  if (auto* e = std::get_if<model::gguf::GgufError>(&opened)) throw CommandFailed(o.model + ": " + e->message(), 2);
  const auto& file = std::get<model::gguf::GgufFile>(opened);
  auto config_or = model::read_llama_config(file);
  if (auto* e = std::get_if<std::string>(&config_or)) throw CommandFailed(o.model + ": " + *e, 2);
  const model::LlamaConfig config = std::get<model::LlamaConfig>(config_or);
  auto vocabulary = model::gguf::read_vocabulary(file);
  if (auto* e = std::get_if<model::gguf::GgufError>(&vocabulary)) throw CommandFailed(o.model + ": " + e->message(), 2);
  auto tokenizer_or = model::Tokenizer::create(std::get<model::Vocabulary>(vocabulary));
  if (auto* e = std::get_if<model::TokenizerError>(&tokenizer_or)) throw CommandFailed(o.model + ": " + e->message, 2);
  const model::Tokenizer& tokenizer = std::get<model::Tokenizer>(tokenizer_or);
  const std::vector<std::int32_t> prompt = checked_prompt(o, config, tokenizer);

  gpu::Device device(gpu::DeviceOptions{o.device, false});
  gpu::ComputeQueue queue(device);
  gpu::BufferPool pool(queue);
  gpu::KernelLibrary kernels(device);
  model::GpuContext ctx{queue, pool, kernels};
  auto load_start = Clock::now();
  model::GpuModel gpu_model(ctx, config, model::gguf_tensor_source(file), "weights:" + o.model);
  gpu::ops::KernelChoice choice;
  if (!o.matvec_shape.empty()) choice.matvec_shape = parse_matvec_shape(o.matvec_shape);
  choice.experts_f16 = o.experts_f16;
  choice.experts_fused = !o.experts_separate;
  gpu_model.set_kernel_choice(choice);
  const double load_s = seconds(Clock::now() - load_start);
  if (o.batch > 1) {
    generate_batched(o, gpu_model, ctx, config, tokenizer, prompt);
    return;
  }
  Generation generation = generate_one(o, gpu_model, ctx, tokenizer, prompt);
  report_generation(o, file, config, device.features().name, load_s, prompt.size(), generation);
}

}  // namespace

void add_generate_command(CLI::App& app) {
  auto o = std::make_shared<GenerateOptions>();
  auto* cmd = app.add_subcommand("generate", "generate text from a GGUF model on the GPU");
  add_model_positional(*cmd, o->model);
  cmd->add_option("-p,--prompt", o->prompt, "the prompt")->required();
  add_sampling_flags(*cmd, o->sampling);
  cmd->add_flag("--parse-special", o->parse_special, "recognise special tokens written in the prompt");
  add_logprobs_flags(*cmd, o->sampling, "in the --json output");
  cmd->add_flag("-q,--quiet", o->quiet, "print only the figures");
  cmd->add_flag("--json", o->json,
                "print the output as one JSON line, as the server's final event: tokens, text, finish_reason, logprobs");
  cmd->add_flag("--warmup", o->warmup, "run the prompt once untimed first, so pipeline creation is not timed");
  cmd->add_flag("--profile", o->profile, "GPU time per kind of op and host time per step (timestamp queries)");
  cmd->add_option("--device", o->device, "Vulkan device: index or name substring (default MQLM_VULKAN_DEVICE)");
  cmd->add_option("--matvec-shape", o->matvec_shape,
                  "the decode products' workgroup, THREADSxROWS (e.g. 64x4), instead of the tuned one")
      ->type_name("TxR");
  cmd->add_flag("--experts-separate", o->experts_separate,
                "a mixture of experts' decode in four dispatches after the router (moe_route, gate+up, silu, "
                "down+sum), not the fused two, for comparison");
  cmd->add_option("--batch", o->batch, "decode this many copies of the prompt side by side (greedy), as a server's batch")
      ->capture_default_str()
      ->check(CLI::Range(1u, 1024u));
  cmd->add_flag("--experts-f16", o->experts_f16,
                "a mixture of experts' wide steps on the tensor cores: decode every expert's quantized matrix to F16 "
                "first, not the weights in each tile, for comparison");
  cmd->callback([o] {
    o->model = resolve_model(o->model);
    generate(*o);
  });
}

}  // namespace mqlm::tools
