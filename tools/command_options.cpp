#include "tools/command_options.hpp"

#include <filesystem>

#include "tools/commands.hpp"

namespace mqlm::tools {

void add_sampling_flags(CLI::App& cmd, model::SamplingParams& sampling) {
  cmd.add_option("-n,--max-tokens", sampling.max_tokens, "tokens to generate")->capture_default_str();
  cmd.add_option("--temperature", sampling.temperature, "0 is greedy")->capture_default_str();
  cmd.add_option("--top-k", sampling.top_k, "0 is off");
  cmd.add_option("--top-p", sampling.top_p, "1 is off");
  cmd.add_option("--min-p", sampling.min_p, "0 is off");
  cmd.add_option("--repeat-penalty", sampling.repetition_penalty, "1 is off");
  cmd.add_option("--repeat-last-n", sampling.repetition_last_n, "tokens the penalty looks back over");
  cmd.add_option("--presence-penalty", sampling.presence_penalty);
  cmd.add_option("--frequency-penalty", sampling.frequency_penalty);
  cmd.add_option("--seed", sampling.seed, "the same seed and prompt give the same text");
  cmd.add_option("--stop", sampling.stop, "a stop string (repeatable)");
  add_logit_bias_flag(cmd, sampling.logit_bias);
}

void add_logprobs_flags(CLI::App& cmd, model::SamplingParams& sampling, const std::string& where) {
  cmd.add_flag("--logprobs", sampling.logprobs, "the chosen tokens' logprobs (" + where + ")");
  cmd.add_option("--top-logprobs", sampling.top_logprobs, "and this many alternatives (needs --logprobs)");
}

sigset_t block_stop_signals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  return signals;
}

void add_addresses(actors::Topology& topology, const std::vector<std::string>& addresses, const std::string& example) {
  for (const auto& a : addresses) {
    std::string name, endpoint;
    if (!actors::parse_address(a, name, endpoint)) {
      throw CommandFailed("--address wants NAME=ENDPOINT (like " + example + "), not '" + a + "'", 2);
    }
    topology.add(name, endpoint);
  }
}

namespace {

// Where the demo model is: installed, under share/mqlm beside the binary's bin/ (found from the
// binary's own path, so the install may be moved). Only the binary the build wrote, where it
// wrote it, falls back to the source tree's: a copy elsewhere must not depend on the build tree.
std::filesystem::path demo_model_path() {
  std::error_code error;
  const std::filesystem::path binary = std::filesystem::read_symlink("/proc/self/exe", error);
  if (error) return MQLM_DEFAULT_MODEL;
  const std::filesystem::path installed = binary.parent_path().parent_path() / "share/mqlm/demo.gguf";
  if (std::filesystem::is_regular_file(installed, error)) return installed;
  if (std::filesystem::equivalent(binary, MQLM_BUILT_AT, error)) return MQLM_DEFAULT_MODEL;
  return installed;
}

}  // namespace

void add_model_positional(CLI::App& cmd, std::string& model) {
  cmd.add_option("model", model, "GGUF file (default: the demo model, " + demo_model_path().string() + ")")
      ->check(CLI::ExistingFile);
}

std::string resolve_model(const std::string& model) {
  if (!model.empty()) return model;
  const std::filesystem::path demo = demo_model_path();
  if (!std::filesystem::exists(demo)) {
    throw CommandFailed("no model given, and the demo model is not at " + demo.string() +
                            ": name a model (a GGUF file)",
                        2);
  }
  return demo.string();
}

}  // namespace mqlm::tools
