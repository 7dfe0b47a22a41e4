// `mqlm demo`: the most end-to-end thing there is until models arrive: a prober actor pings an
// echo actor through the runtime (over inproc, ipc or tcp), with blob frames, and reports.
#include <chrono>
#include <iostream>

#include <fmt/format.h>

#include "actors/runtime/probe_actors.hpp"
#include "tools/commands.hpp"

namespace mqlm::tools {

using namespace actors;

void add_demo_command(CLI::App& app) {
  struct Options {
    std::uint64_t rounds = 20;
    std::uint64_t blob_bytes = 4096;
    std::string transport = "inproc";
    std::string trace;
    bool trace_without_blobs = false;
  };
  auto options = std::make_shared<Options>();
  auto* cmd = app.add_subcommand("demo", "ping an echo actor through the runtime and report what came back");
  cmd->add_option("--rounds", options->rounds, "pings to send")->check(CLI::Range(1, 10'000'000));
  cmd->add_option("--blob-bytes", options->blob_bytes, "a zero-copy blob frame of this size rides with each ping")
      ->check(CLI::Range(0, 1 << 30));
  cmd->add_option("--transport", options->transport, "inproc, ipc or tcp")
      ->check(CLI::IsMember({"inproc", "ipc", "tcp"}));
  cmd->add_option("--trace", options->trace, "record every message to this trace file");
  cmd->add_flag("--trace-without-blobs", options->trace_without_blobs, "record blob frames by size only");
  cmd->callback([options] {
    Transport transport{};
    parse_transport(options->transport, transport);
    auto report = run_probe({transport, ProberConfig{"echo", "demo", options->rounds, 1, options->blob_bytes, 1},
                             options->trace, !options->trace_without_blobs, std::chrono::seconds(60)});
    if (!report) throw CommandFailed("no report from the prober within 60 s");
    const auto& r = *report;
    std::cout << fmt::format(
        "prober -> echo over {}: {} pings with {} B blobs, {} pongs, {} mismatched\n"
        "round trip: p50 {:.1f} us, p99 {:.1f} us, max {:.1f} us\n",
        options->transport, options->rounds, options->blob_bytes, r.pongs, r.mismatches, r.rtt_p50_ns / 1e3,
        r.rtt_p99_ns / 1e3, r.rtt_max_ns / 1e3);
    if (!options->trace.empty()) {
      std::cout << fmt::format("trace: {0}  (mqlm trace show {0}; mqlm trace replay {0} --actor echo)\n",
                               options->trace);
    }
    if (r.pongs != options->rounds || r.mismatches != 0) throw CommandFailed("the conversation lost or changed messages");
  });
}

}  // namespace mqlm::tools
