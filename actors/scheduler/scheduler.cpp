#include "actors/scheduler/scheduler.hpp"

#include <chrono>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace mqlm::actors {

using namespace messages;

namespace {

constexpr std::uint32_t kWatchdogTimer = 1;
constexpr auto kWatchdogInterval = std::chrono::milliseconds(500);

// The policy's sends, made as it makes them.
class ContextOutput final : public PolicyOutput {
 public:
  explicit ContextOutput(Context& ctx) : ctx_(ctx) {}
  SendStatus send(const std::string& to, Payload payload, SendOptions options) override {
    return ctx_.send(to, std::move(payload), std::move(options));
  }

 private:
  Context& ctx_;
};

}  // namespace

namespace {

std::string read_chat_template(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  std::stringstream text;
  text << file.rdbuf();
  if (!file) throw std::invalid_argument("scheduler: chat_template=" + path + " cannot be read");
  if (text.str().find_first_not_of(" \t\r\n") == std::string::npos) {
    throw std::invalid_argument("scheduler: chat_template=" + path + " is empty");
  }
  return text.str();
}

// Unix time minus the steady clock, in ns: measured now (the config is read at the edge, before
// the actor runs) unless the option gives it.
std::int64_t clock_offset_option(const ActorOptions& options) {
  if (auto given = options.find("unix_clock_offset_ns"); given != options.end()) {
    try {
      return std::stoll(given->second);
    } catch (const std::exception&) {
      throw std::invalid_argument("scheduler option unix_clock_offset_ns=" + given->second + " is not an integer");
    }
  }
  auto since_epoch = [](auto now) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(now.time_since_epoch()).count();
  };
  return since_epoch(std::chrono::system_clock::now()) - since_epoch(std::chrono::steady_clock::now());
}

}  // namespace

SchedulerConfig scheduler_config(const ActorOptions& options) {
  check_option_names("scheduler", options,
                     {"model", "name", "models", "aliases", "default_model", "executor", "enforcer", "max_sequences",
                      "token_budget", "max_waiting", "step_timeout_ms", "cache_writer", "lookup_timeout_ms", "stop_spill_bytes",
                      "overlap", "chat_template", "unix_clock_offset_ns", "draft_max", "speculate_max_batch"});
  SchedulerConfig c;
  auto model = options.find("model");
  auto models = options.find("models");
  if (models != options.end()) {
    if (model != options.end() || options.contains("name")) {
      throw std::invalid_argument("scheduler: model= (and name=) and models= do not go together");
    }
    c.models = parse_model_list("scheduler", models->second);
  } else {
    if (model == options.end() || model->second.empty()) {
      throw std::invalid_argument("scheduler: model=PATH (a GGUF file) or models=ID=PATH;... is required");
    }
    const std::filesystem::path path = model->second;
    std::string name = text_option(options, "name", path.stem().string());
    if (name.empty()) throw std::invalid_argument("scheduler option name= is empty: give the model an id");
    c.models.emplace(name, path);
  }
  c.aliases = aliases_option("scheduler", options, c.models);
  c.default_model = text_option(options, "default_model", c.models.begin()->first);
  if (!c.models.contains(c.default_model)) {
    throw std::invalid_argument("scheduler option default_model=" + c.default_model + " is not one of models=");
  }
  c.executor = text_option(options, "executor", c.executor);
  c.enforcer = text_option(options, "enforcer", c.enforcer);
  auto count = [&](const std::string& key, std::uint32_t fallback, std::uint32_t low, std::uint32_t high) {
    return static_cast<std::uint32_t>(number_option("scheduler", options, key, fallback, low, high));
  };
  c.max_sequences = count("max_sequences", c.max_sequences, 1, 4096);
  c.token_budget = count("token_budget", c.token_budget, 1, 1 << 20);
  c.max_waiting = count("max_waiting", c.max_waiting, 1, 1 << 24);
  c.step_timeout_ms = count("step_timeout_ms", c.step_timeout_ms, 10, 3'600'000);
  c.cache_writer = text_option(options, "cache_writer", c.cache_writer);
  c.lookup_timeout_ms = count("lookup_timeout_ms", c.lookup_timeout_ms, 1, 3'600'000);
  c.stop_spill_bytes = number_option("scheduler", options, "stop_spill_bytes", 0);
  c.overlap = count("overlap", c.overlap ? 1 : 0, 0, 1) == 1;
  c.draft_max = count("draft_max", c.draft_max, 0, messages::kMaxDraftTokens);
  c.speculate_max_batch = count("speculate_max_batch", c.speculate_max_batch, 0, 4096);
  if (auto file = options.find("chat_template"); file != options.end()) c.chat_template = read_chat_template(file->second);
  c.unix_clock_offset_ns = clock_offset_option(options);
  return c;
}

std::unique_ptr<Actor> make_scheduler(const ActorOptions& options) {
  return std::make_unique<Scheduler>(scheduler_config(options));
}

void Scheduler::on_start(Context& ctx) {
  ContextOutput out(ctx);
  policy_.start(out);
  ctx.set_timer(kWatchdogTimer, kWatchdogInterval, true);
}

void Scheduler::on_message(Context& ctx, Message& message) {
  ContextOutput out(ctx);
  policy_.handle(out, message, ctx.now_ns(), ctx.self());
  // The step log's handling time: the policy reads no clock (the replay rule); the actor may.
  if (message.as<StepResult>() != nullptr) policy_.add_handling_time(monotonic_ns() - ctx.now_ns());
}

void Scheduler::on_stop(Context& ctx) {
  ContextOutput out(ctx);
  policy_.stop(out, ctx.now_ns(), ctx.self());
}

}  // namespace mqlm::actors
