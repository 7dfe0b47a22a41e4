// `mqlm node`: runs some of a deployment's actors in this process, with the addresses of all of
// them, until SIGINT or SIGTERM. Several nodes make one deployment across processes or hosts.
#include <csignal>
#include <iostream>

#include "actors/runtime/node.hpp"
#include "actors/registry.hpp"
#include "tools/command_options.hpp"
#include "tools/commands.hpp"

namespace mqlm::tools {

using namespace actors;

namespace {

struct NodeOptions {
  std::vector<std::string> actors;     // NAME or NAME=KIND
  std::vector<std::string> addresses;  // NAME=ENDPOINT
  std::vector<std::string> settings;   // NAME.KEY=VALUE
  std::string link_key;                // this process's CURVE key pair for tcp:// links; "": none
  bool insecure = false;               // tcp:// links in the clear
  std::string trace;
  bool trace_without_blobs = false;
  std::string report_to;
  int heartbeat_ms = 1000;
  int heartbeat_timeout_ms = 5000;
  bool restart = false;
};

NodeConfig node_config(const NodeOptions& o) {
  NodeConfig config;
  add_addresses(config.topology, o.addresses, "echo=tcp://127.0.0.1:5601@echo-node.pub");
  add_link_keys(config.topology, o.link_key, o.insecure);
  std::map<std::string, ActorOptions> settings;
  for (const auto& s : o.settings) {
    std::string key, value;
    auto dot = s.find('.');
    if (dot == std::string::npos || !parse_option(s.substr(dot + 1), key, value)) {
      throw CommandFailed("--set wants NAME.KEY=VALUE (like prober.rounds=100), not '" + s + "'", 2);
    }
    settings[s.substr(0, dot)][key] = value;
  }
  for (const auto& a : o.actors) {
    std::string name = a, kind = a;
    if (auto eq = a.find('='); eq != std::string::npos) {
      name = a.substr(0, eq);
      kind = a.substr(eq + 1);
    }
    ActorOptions options = settings[name];
    make_actor(kind, options);  // fails now, with a clear message, rather than in the supervisor
    RestartPolicy restart{o.restart, 3};
    config.actors.push_back({name, [kind, options] { return make_actor(kind, options); }, restart});
  }
  config.trace_file = o.trace;
  config.topology.trace_blobs = !o.trace_without_blobs;
  config.supervisor.heartbeat_interval = std::chrono::milliseconds(o.heartbeat_ms);
  config.supervisor.heartbeat_timeout = std::chrono::milliseconds(o.heartbeat_timeout_ms);
  config.supervisor.report_to = o.report_to;
  return config;
}

}  // namespace

void add_node_command(CLI::App& app) {
  auto o = std::make_shared<NodeOptions>();
  auto* cmd = app.add_subcommand("node", "run actors in this process until SIGINT or SIGTERM");
  cmd->add_option("--actor", o->actors, "an actor to run here: NAME or NAME=KIND (kinds: echo, prober)")
      ->required();
  add_address_flags(*cmd, o->addresses, o->link_key);
  cmd->add_flag("--insecure", o->insecure, "link over tcp:// without CURVE: in the clear, to anyone who can connect");
  cmd->add_option("--set", o->settings, "an actor option: NAME.KEY=VALUE");
  cmd->add_option("--trace", o->trace, "record every message of this process's actors to this file");
  cmd->add_flag("--trace-without-blobs", o->trace_without_blobs, "record blob frames by size only");
  cmd->add_option("--report-to", o->report_to, "who hears about actors that die or stop answering");
  cmd->add_option("--heartbeat-ms", o->heartbeat_ms, "supervisor heartbeat interval")->check(CLI::Range(10, 600000));
  cmd->add_option("--heartbeat-timeout-ms", o->heartbeat_timeout_ms, "silence before an actor is reported")
      ->check(CLI::Range(10, 3600000));
  cmd->add_flag("--restart", o->restart, "restart an actor whose thread died (up to 3 times)");
  cmd->callback([o] {
    NodeConfig config;
    try {
      config = node_config(*o);
    } catch (const std::invalid_argument& e) {
      throw CommandFailed(e.what(), 2);
    }
    sigset_t signals = block_stop_signals();

    Node node(std::move(config));
    node.start();
    std::cout << "ready" << std::endl;
    int signal = 0;
    sigwait(&signals, &signal);
    node.stop();
    std::cout << "stopped" << std::endl;
  });
}

}  // namespace mqlm::tools
