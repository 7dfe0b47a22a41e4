#include "tools/command_options.hpp"

#include <filesystem>

#include "actors/runtime/links.hpp"
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

void add_address_flags(CLI::App& cmd, std::vector<std::string>& addresses, std::string& link_key) {
  cmd.add_option("--address", addresses,
                 "NAME=ENDPOINT where an actor's inbox is, here or in another process (default inproc://mqlm/NAME); "
                 "over tcp:// NAME=tcp://HOST:PORT@FILE.pub, FILE.pub the public key of the process that binds it");
  cmd.add_option("--link-key", link_key,
                 "this process's CURVE key pair (NAME.key from `mqlm keygen NAME`) for its links over tcp:// to "
                 "the deployment's other processes: required with a tcp:// --address unless --insecure");
}

void add_addresses(actors::Topology& topology, const std::vector<std::string>& addresses, const std::string& example) {
  for (const auto& a : addresses) {
    std::string name, endpoint, key_file;
    if (!actors::parse_address(a, name, endpoint, key_file)) {
      throw CommandFailed(
          "--address wants NAME=ENDPOINT (like " + example + "), or NAME=tcp://HOST:PORT@FILE.pub, not '" + a + "'", 2);
    }
    topology.add(name, endpoint);
    topology.inbox_keys.erase(name);
    if (key_file.empty()) continue;
    auto key = actors::curve::read_public_key(key_file);
    if (auto* error = std::get_if<actors::curve::KeyError>(&key)) {
      throw CommandFailed("--address " + a + ": " + error->message, 2);
    }
    topology.inbox_keys[name] = std::get<std::string>(std::move(key));
  }
}

void add_link_keys(actors::Topology& topology, const std::string& key_file, bool insecure) {
  const std::string usage =
      "give --link-key FILE (this process's key pair: `mqlm keygen NAME`) and each tcp:// address the public key of "
      "the process that binds it (--address NAME=tcp://HOST:PORT@OTHER.pub)";
  if (!key_file.empty()) {
    if (!actors::curve::available()) {
      throw CommandFailed("this libzmq was built without CURVE (libsodium), so --link-key cannot be used", 2);
    }
    auto pair = actors::curve::read_key_pair(key_file);
    if (auto* error = std::get_if<actors::curve::KeyError>(&pair)) throw CommandFailed(error->message, 2);
    topology.link_keys = std::get<actors::curve::KeyPair>(std::move(pair));
  } else if (!topology.inbox_keys.empty()) {
    throw CommandFailed("--address " + topology.inbox_keys.begin()->first + "=...@KEY names a public key, so the " +
                            "links are CURVE: " + usage,
                        2);
  }
  for (const auto& [name, endpoint] : topology.endpoints) {
    if (!actors::is_tcp_endpoint(endpoint) || topology.inbox_keys.contains(name)) continue;
    if (topology.link_keys) {
      throw CommandFailed(
          "--address " + name + "=" + endpoint + " has no public key, and the links are CURVE: " + usage, 2);
    }
    if (!insecure) {
      throw CommandFailed("links over tcp:// (" + name + "=" + endpoint +
                              ") are encrypted and authenticated with CURVE: " + usage +
                              ", or --insecure to link in the clear (docs/protocol.md, \"Security\")",
                          2);
    }
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
