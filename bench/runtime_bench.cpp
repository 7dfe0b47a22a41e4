// `mqlm bench runtime`: messages per second and round-trip latency between two actors (a
// prober and an echo) over inproc, ipc and tcp (plain, and CURVE as split deployments link), for
// small messages and 1 MiB blob frames.
// Latency is measured with one ping in flight; throughput with a window of pings in flight.
#include <chrono>
#include <ctime>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <sys/utsname.h>

#include "actors/runtime/probe_actors.hpp"
#include "tools/commands.hpp"

namespace mqlm::tools {

using namespace actors;

namespace {

// A transport, and whether its links are CURVE.
struct Link {
  const char* name;
  Transport transport;
  bool curve;
};

messages::ProbeReport probe(Link link, std::uint64_t rounds, std::uint64_t window, std::uint64_t blob) {
  auto report = run_probe({link.transport, ProberConfig{"echo", "bench", rounds, window, blob, 7}, {}, true,
                           std::chrono::minutes(5), link.curve});
  if (!report) throw CommandFailed("a probe run did not report within 5 minutes");
  if (report->pongs != rounds || report->mismatches != 0) {
    throw CommandFailed(fmt::format("a probe run lost or changed messages: {} of {} pongs, {} mismatched",
                                    report->pongs, rounds, report->mismatches));
  }
  return *report;
}

std::string host_line() {
  utsname u{};
  uname(&u);
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line, cpu = "unknown cpu";
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("model name", 0) == 0) {
      cpu = line.substr(line.find(':') + 2);
      break;
    }
  }
  return fmt::format("{} ({} {}), {} logical cpus", cpu, u.sysname, u.release, std::thread::hardware_concurrency());
}

}  // namespace

void add_runtime_bench(CLI::App& bench) {
  struct Options {
    std::uint64_t small_rounds = 20000;
    std::uint64_t large_rounds = 500;
    std::uint64_t window = 32;
    std::string out;
  };
  auto o = std::make_shared<Options>();
  auto* runtime = bench.add_subcommand("runtime", "actor-to-actor messages/s and round-trip latency per transport");
  runtime->add_option("--small-rounds", o->small_rounds, "round trips per small-message run")
      ->check(CLI::Range(10, 10'000'000));
  runtime->add_option("--large-rounds", o->large_rounds, "round trips per 1 MiB run")->check(CLI::Range(10, 1'000'000));
  runtime->add_option("--window", o->window, "pings in flight in the throughput runs")->check(CLI::Range(1, 512));
  runtime->add_option("--out", o->out, "also write the table, with date, host and command, to this file");
  runtime->callback([o] {
    std::ostringstream table;
    table << "| transport | payload | round trips/s | messages/s | blob MB/s | RTT p50 us | RTT p99 us |\n"
          << "|---|---|---|---|---|---|---|\n";
    for (Link link : {Link{"inproc", Transport::inproc, false}, Link{"ipc", Transport::ipc, false},
                      Link{"tcp", Transport::tcp, false}, Link{"tcp, CURVE", Transport::tcp, true}}) {
      for (std::uint64_t blob : {std::uint64_t{0}, std::uint64_t{1} << 20}) {
        std::uint64_t rounds = blob == 0 ? o->small_rounds : o->large_rounds;
        auto latency = probe(link, rounds, 1, blob);
        auto throughput = probe(link, rounds, o->window, blob);
        double per_second = throughput.pongs / (throughput.elapsed_ns / 1e9);
        std::string row = fmt::format(
            "| {} | {} | {:.0f} | {:.0f} | {:.0f} | {:.1f} | {:.1f} |\n", link.name,
            blob == 0 ? "small (~40 B)" : "1 MiB blob", per_second, 2 * per_second, per_second * blob / 1e6,
            latency.rtt_p50_ns / 1e3, latency.rtt_p99_ns / 1e3);
        table << row;
        std::cerr << row << std::flush;
      }
    }
    std::cout << table.str();
    if (!o->out.empty()) {
      std::time_t now = std::time(nullptr);
      char date[32];
      std::strftime(date, sizeof(date), "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
      std::ofstream file(o->out);
      file << "# Runtime benchmark\n\n"
           << "- date: " << date << "\n- host: " << host_line() << "\n"
           << fmt::format("- command: mqlm bench runtime --small-rounds {} --large-rounds {} --window {}\n",
                          o->small_rounds, o->large_rounds, o->window)
           << "- latency: one ping in flight; throughput: " << o->window
           << " pings in flight; a round trip is a Ping and its Pong (two messages); the 1 MiB blob rides "
              "with the Ping, sent without copying, and the echo reads all of it (xxh3) to answer\n\n"
           << table.str();
      if (!file) throw CommandFailed("cannot write " + o->out);
    }
  });
}

}  // namespace mqlm::tools
