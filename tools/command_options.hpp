// Flags that several subcommands share, defined once so they read the same everywhere.
#pragma once

#include <csignal>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "actors/runtime/curve_keys.hpp"
#include "actors/runtime/topology.hpp"
#include "tools/commands.hpp"
#include "model/sampling/sampling_params.hpp"

namespace mqlm::tools {

// -n, --temperature, --top-k, --top-p, --min-p, --repeat-penalty, --repeat-last-n,
// --presence-penalty, --frequency-penalty, --seed, --stop and --logit-bias, into `sampling`.
void add_sampling_flags(CLI::App& cmd, model::SamplingParams& sampling);
// One --logit-bias ID=BIAS; a malformed one is a CLI::ValidationError naming the flag. The
// range and repeats are model::validate's to check, as for every sampling flag.
// Inline, like add_logit_bias_flag: `bench serve` (mqlm_bench) takes the flag too and does not
// link this file's .cpp, which is the mqlm binary's.
inline model::TokenBias parse_logit_bias(const std::string& entry) {
  const std::string usage = "wants ID=BIAS (like 50256=-100), not '" + entry + "'";
  auto equals = entry.find('=');
  if (equals == std::string::npos) throw CLI::ValidationError("--logit-bias", usage);
  model::TokenBias bias;
  std::size_t id_end = 0, bias_end = 0;
  try {
    bias.token = std::stoi(entry.substr(0, equals), &id_end);
    bias.bias = std::stof(entry.substr(equals + 1), &bias_end);
  } catch (const std::exception&) {
    throw CLI::ValidationError("--logit-bias", usage);
  }
  if (id_end != equals || bias_end != entry.size() - equals - 1) throw CLI::ValidationError("--logit-bias", usage);
  return bias;
}

// --logit-bias ID=BIAS (repeatable), into `logit_bias`.
inline void add_logit_bias_flag(CLI::App& cmd, std::vector<model::TokenBias>& logit_bias) {
  cmd.add_option_function<std::vector<std::string>>(
         "--logit-bias",
         [&logit_bias](const std::vector<std::string>& entries) {
           for (const std::string& entry : entries) logit_bias.push_back(parse_logit_bias(entry));
         },
         "add BIAS, in [-100, 100], to token ID's logit (repeatable; -100 bans the token)")
      ->type_name("ID=BIAS");
}
// A client's CURVE flags: --curve-server-key FILE (the server's NAME.pub) and --curve-key FILE
// (the client's own NAME.key), or MQLM_CURVE_SERVER_KEY and MQLM_CURVE_KEY. Inline, like
// add_logit_bias_flag: `bench serve` takes them too.
struct CurveClientFlags {
  std::string server_key_file;
  std::string key_file;
};

inline void add_curve_client_flags(CLI::App& cmd, CurveClientFlags& flags) {
  cmd.add_option("--curve-server-key", flags.server_key_file,
                 "the server's CURVE public key (its NAME.pub), for a server that serves CURVE (--curve-key)")
      ->envname("MQLM_CURVE_SERVER_KEY");
  cmd.add_option("--curve-key", flags.key_file,
                 "this client's CURVE key pair (NAME.key from `mqlm keygen NAME`); the server must list NAME.pub in "
                 "its --curve-clients")
      ->envname("MQLM_CURVE_KEY");
}

// The keys the flags name, or none when neither is given; a CommandFailed (exit 2) for one
// without the other or for a file that will not do.
inline std::optional<actors::curve::ClientKeys> read_curve_client_flags(const CurveClientFlags& flags) {
  if (flags.server_key_file.empty() && flags.key_file.empty()) return std::nullopt;
  if (flags.server_key_file.empty() || flags.key_file.empty()) {
    throw CommandFailed("--curve-server-key and --curve-key go together: the server's NAME.pub and this client's own "
                        "NAME.key", 2);
  }
  auto keys = actors::curve::read_client_keys(flags.server_key_file, flags.key_file);
  if (auto* error = std::get_if<actors::curve::KeyError>(&keys)) {
    throw CommandFailed(error->message, 2);
  }
  return std::get<actors::curve::ClientKeys>(std::move(keys));
}

// --logprobs and --top-logprobs, into `sampling`; `where` says where they are printed.
void add_logprobs_flags(CLI::App& cmd, model::SamplingParams& sampling, const std::string& where);

// Blocks SIGINT and SIGTERM in this thread (and so in every thread it starts later) and returns
// them as a set for sigwait: a long-running command takes its stop signal synchronously.
sigset_t block_stop_signals();

// The GGUF model positional of commands that load one: optional, defaulting to the demo model
// (models/demo.gguf, tools/demo_model): installed under share/mqlm beside the binary's bin/, or in
// the source tree it was built from. Call resolve_model before use.
void add_model_positional(CLI::App& cmd, std::string& model);
// `model`, or the bundled demo model when it is empty; a CommandFailed (exit 2) if the file is not there.
std::string resolve_model(const std::string& model);

// --address NAME=ENDPOINT (repeatable; NAME=tcp://HOST:PORT@FILE.pub over tcp://) and --link-key
// FILE, as every command that runs actors takes them.
void add_address_flags(CLI::App& cmd, std::vector<std::string>& addresses, std::string& link_key);

// Adds each NAME=ENDPOINT of --address to the topology, and the public key of a
// NAME=tcp://HOST:PORT@FILE.pub; a malformed one, or a key file that will not do, is a
// CommandFailed (exit 2) whose message shows `example`.
void add_addresses(actors::Topology& topology, const std::vector<std::string>& addresses, const std::string& example);

// CURVE on the links between processes (docs/protocol.md): --link-key FILE, this process's key
// pair, into the topology. Every tcp:// address must then carry its process's public key; without
// --link-key a tcp:// address is refused (exit 2, saying what to give) unless `insecure`, which
// links in the clear. ipc:// and inproc:// take no keys.
void add_link_keys(actors::Topology& topology, const std::string& key_file, bool insecure);

}  // namespace mqlm::tools
