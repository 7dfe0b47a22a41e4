// mqlm: an LLM inference server whose parts are actors talking over ZeroMQ.
#include <cstdlib>
#include <iostream>

#include <spdlog/cfg/env.h>
#include <spdlog/spdlog.h>

#include "tools/commands.hpp"

int main(int argc, char** argv) {
  spdlog::set_pattern("%H:%M:%S.%e %^%l%$ %v");
  spdlog::set_level(spdlog::level::warn);
  spdlog::cfg::load_env_levels();  // SPDLOG_LEVEL=debug and the like

  CLI::App app{"mqlm: an LLM inference server built from actors that talk over ZeroMQ"};
  app.require_subcommand(1);
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
  auto* bench = app.add_subcommand("bench", "benchmarks (figures that matter are measured on the H100)");
  bench->require_subcommand(1);
  mqlm::tools::add_runtime_bench(*bench);
  mqlm::tools::add_kernel_bench(*bench);
  mqlm::tools::add_serve_bench(*bench);

  try {
    app.parse(argc, argv);
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
