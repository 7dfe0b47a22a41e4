// Every `mqlm` subcommand registers itself on the application here; main.cpp calls them all.
#pragma once

#include <CLI/CLI.hpp>

namespace mqlm::tools {

void add_demo_command(CLI::App& app);
void add_node_command(CLI::App& app);
void add_trace_command(CLI::App& app);
void add_make_model_command(CLI::App& app);
void add_generate_command(CLI::App& app);
void add_client_command(CLI::App& app);
void add_serve_command(CLI::App& app);
void add_keygen_command(CLI::App& app);
// `mqlm bench NAME`: each benchmark adds itself to the bench subcommand (code in bench/).
void add_runtime_bench(CLI::App& bench);
void add_kernel_bench(CLI::App& bench);
void add_serve_bench(CLI::App& bench);

// A command's failure: the message goes to stderr and the process exits with code.
struct CommandFailed : std::runtime_error {
  CommandFailed(const std::string& what, int code = 1) : std::runtime_error(what), code(code) {}
  int code;
};

}  // namespace mqlm::tools
