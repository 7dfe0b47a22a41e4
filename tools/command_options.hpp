// Flags that several subcommands share, defined once so they read the same everywhere.
#pragma once

#include <csignal>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "actors/runtime/topology.hpp"
#include "model/sampling/sampling_params.hpp"

namespace mqlm::tools {

// -n, --temperature, --top-k, --top-p, --min-p, --repeat-penalty, --repeat-last-n,
// --presence-penalty, --frequency-penalty, --seed and --stop, into `sampling`.
void add_sampling_flags(CLI::App& cmd, model::SamplingParams& sampling);
// --logprobs and --top-logprobs, into `sampling`; `where` says where they are printed.
void add_logprobs_flags(CLI::App& cmd, model::SamplingParams& sampling, const std::string& where);

// Blocks SIGINT and SIGTERM in this thread (and so in every thread it starts later) and returns
// them as a set for sigwait: a long-running command takes its stop signal synchronously.
sigset_t block_stop_signals();

// The GGUF model positional of commands that load one: optional, defaulting to the demo model
// bundled in the source tree (models/demo.gguf, tools/demo_model). Call resolve_model before use.
void add_model_positional(CLI::App& cmd, std::string& model);
// `model`, or the bundled demo model when it is empty; a CommandFailed (exit 2) if the file is not there.
std::string resolve_model(const std::string& model);

// Adds each NAME=ENDPOINT of --address to the topology; a malformed one is a CommandFailed
// (exit 2) whose message shows `example`.
void add_addresses(actors::Topology& topology, const std::vector<std::string>& addresses, const std::string& example);

}  // namespace mqlm::tools
