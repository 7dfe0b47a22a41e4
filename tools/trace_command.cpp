// `mqlm trace show FILE` prints a recorded trace; `mqlm trace replay FILE --actor NAME` reruns
// one actor on its recorded inbox and exits 1 if what it sends differs from the recording.
#include <iostream>

#include <fmt/format.h>

#include "actors/registry.hpp"
#include "actors/runtime/replay.hpp"
#include "actors/runtime/trace.hpp"
#include "tools/commands.hpp"

namespace mqlm::tools {

using namespace actors;

namespace {

std::vector<TraceRecord> load(const std::string& file) {
  auto read = read_trace(file);
  if (auto* e = std::get_if<TraceReadError>(&read)) {
    throw CommandFailed(fmt::format("{}: at byte {}: {}", file, e->offset, e->detail), 2);
  }
  return std::get<std::vector<TraceRecord>>(std::move(read));
}

void show(const std::string& file, const std::string& actor, const std::string& kind, std::uint64_t request) {
  messages::Kind wanted{};
  if (!kind.empty() && !messages::kind_from_name(kind, wanted)) {
    throw CommandFailed("no message kind named '" + kind + "'", 2);
  }
  auto records = load(file);
  // The recorder takes records in arrival order; people read them in time order.
  std::stable_sort(records.begin(), records.end(),
                   [](const TraceRecord& a, const TraceRecord& b) { return a.at_ns < b.at_ns; });
  std::int64_t origin = records.empty() ? 0 : records.front().at_ns;
  for (const auto& r : records) origin = std::min(origin, r.at_ns);
  for (const auto& r : records) {
    if (!actor.empty() && r.actor != actor && r.peer != actor) continue;
    if (!kind.empty() && r.kind != static_cast<std::uint8_t>(wanted)) continue;
    if (request != 0 && r.request_id != request) continue;
    if (r.frames.empty()) {
      std::cout << fmt::format("{:>12.6f}  {} started\n", (r.at_ns - origin) / 1e9, r.actor);
      continue;
    }
    bool in = r.dir() == Direction::in;
    std::string line = fmt::format("{:>12.6f}  {} {} {}", (r.at_ns - origin) / 1e9, in ? r.peer : r.actor,
                                   "->", in ? r.actor : r.peer);
    std::cout << fmt::format("{:<40} {}  {}\n", line, in ? "in " : "out", describe_record(r));
  }
}

}  // namespace

void add_trace_command(CLI::App& app) {
  auto* trace = app.add_subcommand("trace", "show or replay a recorded message trace");
  trace->require_subcommand(1);

  struct ShowOptions {
    std::string file, actor, kind;
    std::uint64_t request = 0;
  };
  auto s = std::make_shared<ShowOptions>();
  auto* show_cmd = trace->add_subcommand("show", "print a trace, one message per line");
  show_cmd->add_option("file", s->file, "trace file")->required();
  show_cmd->add_option("--actor", s->actor, "only messages to or from this actor");
  show_cmd->add_option("--kind", s->kind, "only this message kind (e.g. Ping)");
  show_cmd->add_option("--request", s->request, "only this request id");
  show_cmd->callback([s] { show(s->file, s->actor, s->kind, s->request); });

  struct ReplayOptions {
    std::string file, actor, as;
    std::vector<std::string> settings;
  };
  auto r = std::make_shared<ReplayOptions>();
  auto* replay_cmd = trace->add_subcommand(
      "replay", "rerun one actor on its recorded inbox and compare what it sends (exit 1 on a difference)");
  replay_cmd->add_option("file", r->file, "trace file")->required();
  replay_cmd->add_option("--actor", r->actor, "the recorded actor's name")->required();
  replay_cmd->add_option("--as", r->as, "its kind, if not its name (kinds: echo, prober)");
  replay_cmd->add_option("--set", r->settings, "an option the recorded actor was built with: KEY=VALUE");
  replay_cmd->callback([r] {
    ActorOptions options;
    for (const auto& setting : r->settings) {
      std::string key, value;
      if (!parse_option(setting, key, value)) throw CommandFailed("--set wants KEY=VALUE, not '" + setting + "'", 2);
      options[key] = value;
    }
    auto records = load(r->file);
    std::unique_ptr<Actor> actor;
    try {
      actor = make_actor(r->as.empty() ? r->actor : r->as, options);
    } catch (const std::invalid_argument& e) {
      throw CommandFailed(e.what(), 2);
    }
    ReplayReport report = replay_actor(records, r->actor, *actor);
    if (report.inbox_messages == 0) throw CommandFailed("the trace holds no message to " + r->actor, 2);
    std::cout << fmt::format("{}: replayed {} inbox messages; recorded {} sends, replayed {}\n", r->actor,
                             report.inbox_messages, report.recorded_sends, report.replayed_sends);
    for (const auto& d : report.differences) std::cout << d << "\n";
    if (!report.same()) throw CommandFailed(fmt::format("{} differences", report.difference_count), 1);
    std::cout << "no difference\n";
  });
}

}  // namespace mqlm::tools
