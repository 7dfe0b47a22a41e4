// mqlm: an LLM inference server whose parts are actors talking over ZeroMQ.
#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <sys/resource.h>

#include <spdlog/cfg/env.h>
#include <spdlog/spdlog.h>

#include "tools/commands.hpp"

namespace {

// The arguments as CLI::App::parse takes a vector (last first, without the program's name), with
// llama-server's multi-letter short flags, which CLI11 cannot declare, as their long names.
std::vector<std::string> arguments_for_parse(int argc, char** argv) {
  static const std::map<std::string_view, const char*> kLongNames = {{"-np", "--parallel"},
                                                                     {"-ngl", "--n-gpu-layers"}};
  std::vector<std::string> arguments;
  for (int i = argc - 1; i > 0; --i) {
    auto long_name = kLongNames.find(argv[i]);
    arguments.emplace_back(long_name != kLongNames.end() ? long_name->second : argv[i]);
  }
  return arguments;
}

// Every HTTP connection and ZeroMQ socket takes a file descriptor, and many systems start
// processes with a soft limit of 1,024 where the hard limit allows far more: a server takes what
// it is allowed.
void raise_open_file_limit() {
  constexpr rlim_t kEnough = 1 << 20;
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur >= std::min(limit.rlim_max, kEnough)) return;
  limit.rlim_cur = std::min(limit.rlim_max, kEnough);
  if (setrlimit(RLIMIT_NOFILE, &limit) != 0) spdlog::debug("the open file limit stays where it was");
}

}  // namespace

int main(int argc, char** argv) {
  spdlog::set_pattern("%H:%M:%S.%e %^%l%$ %v");
  spdlog::set_level(spdlog::level::warn);
  spdlog::cfg::load_env_levels();  // SPDLOG_LEVEL=debug and the like
  raise_open_file_limit();

  CLI::App app{"mqlm: an LLM inference server built from actors that talk over ZeroMQ"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "mqlm " MQLM_VERSION " (" MQLM_GIT_COMMIT ")");
  std::string log_level;
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "off"}))
      ->each([](const std::string& level) { spdlog::set_level(spdlog::level::from_str(level)); });

  mqlm::tools::add_demo_command(app);
  mqlm::tools::add_node_command(app);
  mqlm::tools::add_trace_command(app);
  mqlm::tools::add_make_model_command(app);
  mqlm::tools::add_generate_command(app);
  mqlm::tools::add_client_command(app);
  mqlm::tools::add_serve_command(app);
  mqlm::tools::add_keygen_command(app);
  auto* bench = app.add_subcommand("bench", "benchmarks (figures that matter are measured on the H100)");
  bench->require_subcommand(1);
  mqlm::tools::add_runtime_bench(*bench);
  mqlm::tools::add_kernel_bench(*bench);
  mqlm::tools::add_serve_bench(*bench);

  try {
    app.name(argv[0]);
    std::vector<std::string> arguments = arguments_for_parse(argc, argv);
    app.parse(arguments);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const mqlm::tools::CommandFailed& e) {
    std::cerr << "mqlm: " << e.what() << "\n";
    return e.code;
  } catch (const std::exception& e) {
    std::cerr << "mqlm: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
