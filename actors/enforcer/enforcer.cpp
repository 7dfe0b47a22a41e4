#include "actors/enforcer/enforcer.hpp"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <limits>
#include <map>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <tuple>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "model/gguf/gguf_file.hpp"
#include "model/llama/gguf_model.hpp"

namespace mqlm::actors {

using namespace messages;

std::uint64_t kv_cache_bytes(std::uint32_t layers, std::uint32_t kv_heads, std::uint32_t head_dim,
                             std::uint32_t kv_pages, std::uint32_t page_size) {
  constexpr std::uint64_t kKeyAndValue = 2;
  constexpr std::uint64_t kF16Bytes = 2;
  return std::uint64_t{layers} * kv_pages * page_size * kv_heads * head_dim * kKeyAndValue * kF16Bytes;
}

std::variant<std::uint64_t, std::string> estimate_model_bytes(const std::filesystem::path& path,
                                                              std::uint32_t kv_pages, std::uint32_t page_size) {
  auto opened = model::gguf::GgufFile::open(path);
  if (const auto* error = std::get_if<model::gguf::GgufError>(&opened)) {
    return fmt::format("{}: {}", path.string(), error->message());
  }
  const auto& file = std::get<model::gguf::GgufFile>(opened);
  auto config = model::read_llama_config(file);
  if (const auto* problem = std::get_if<std::string>(&config)) return fmt::format("{}: {}", path.string(), *problem);
  const auto& c = std::get<model::LlamaConfig>(config);
  std::uint64_t tensor_bytes = 0;
  for (const auto& tensor : file.tensors()) tensor_bytes += tensor.bytes;
  return tensor_bytes + kv_cache_bytes(c.n_layers, c.n_head_kv, c.head_dim, kv_pages, page_size);
}

namespace {

constexpr std::uint32_t kSampleTimer = 1;
// Samples that pass with an ExecutorQuery unanswered before the enforcer asks again anyway: a
// restarted executor never answers what its dead instance took.
constexpr std::uint32_t kSamplesBeforeAskingAgain = 5;
constexpr std::uint64_t kMaxTtlSeconds = 365ULL * 24 * 3600;
constexpr std::uint64_t kMaxUint32 = std::numeric_limits<std::uint32_t>::max();
constexpr std::uint64_t kMaxSampleMs = 24ull * 3600 * 1000;

double mib(std::uint64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

std::string joined(const std::vector<std::string>& ids) {
  return ids.empty() ? std::string("none") : fmt::format("{}", fmt::join(ids, ", "));
}

// ---- options ---------------------------------------------------------------------------------

struct ConfiguredModel {
  std::filesystem::path path;
  std::uint64_t estimate = 0;  // estimate_model_bytes, read when the enforcer is built
  bool pinned = false;
  bool preload = false;
  std::vector<std::string> aliases;  // other names clients may use for it
  std::uint64_t ttl_s = 0;           // unloaded after this many seconds without a request; 0: never
};

struct EnforcerOptions {
  std::map<std::string, ConfiguredModel> models;
  std::map<std::string, std::string> aliases;  // alias -> id
  std::uint32_t kv_pages = 1024;
  std::uint32_t page_size = 16;
  std::uint64_t ceiling_bytes = 0;  // 0: no ceiling
  double ceiling_fraction = 0.0;    // > 0: the ceiling is this fraction of the device's memory
  double soft = 0.85;
  double hard = 0.95;
  std::string executor = "executor";
  std::string scheduler = "scheduler";
  std::uint64_t sample_ms = 1000;
  std::string cache_writer;         // "": no KV prefix cache beyond the GPU
  std::uint64_t host_soft_bytes = 0;  // resident set above which the hot tier is shrunk; 0: never
};

// The configured ids listed in option `key` (ID,ID2).
std::vector<std::string> parse_id_list(const ActorOptions& options, const std::string& key,
                                       const std::map<std::string, ConfiguredModel>& models) {
  std::vector<std::string> ids;
  auto it = options.find(key);
  if (it == options.end()) return ids;
  for (std::string_view id : split_option(it->second, ',')) {
    if (!models.contains(std::string(id))) {
      std::vector<std::string> configured;
      for (const auto& [known, model] : models) configured.push_back(known);
      throw std::invalid_argument(fmt::format("enforcer option {}= names model '{}', which is not configured "
                                              "(configured: {})",
                                              key, id, joined(configured)));
    }
    ids.emplace_back(id);
  }
  return ids;
}

std::string peer_option(const ActorOptions& options, const std::string& key) {
  std::string name = text_option(options, key, key);
  if (name.empty()) throw std::invalid_argument(fmt::format("enforcer option {}= is empty: name the actor", key));
  return name;
}

EnforcerOptions parse_options(const ActorOptions& options) {
  check_option_names("enforcer", options,
                     {"models", "pinned", "preload", "kv_pages", "page_size", "ceiling_bytes", "ceiling_fraction",
                      "soft", "hard", "aliases", "ttl_s",
                      "executor", "scheduler", "sample_ms", "cache_writer", "host_soft_bytes"});
  if (!options.contains("models")) {
    throw std::invalid_argument("actor enforcer needs option models=ID=PATH;ID2=PATH2 (the models it admits, "
                                "as the executor's)");
  }
  EnforcerOptions parsed;
  parsed.kv_pages = static_cast<std::uint32_t>(number_option("enforcer", options, "kv_pages", 1024, 1, kMaxUint32));
  parsed.page_size = static_cast<std::uint32_t>(number_option("enforcer", options, "page_size", 16, 1, kMaxUint32));
  parsed.ceiling_bytes = number_option("enforcer", options, "ceiling_bytes", 0);
  if (options.contains("ceiling_fraction")) {
    if (options.contains("ceiling_bytes")) {
      throw std::invalid_argument("enforcer options ceiling_bytes= and ceiling_fraction= both set the ceiling: give one");
    }
    parsed.ceiling_fraction = fraction_option("enforcer", options, "ceiling_fraction", 1.0);
  }
  parsed.soft = fraction_option("enforcer", options, "soft", parsed.soft);
  parsed.hard = fraction_option("enforcer", options, "hard", parsed.hard);
  if (parsed.soft > parsed.hard) {
    throw std::invalid_argument(fmt::format("enforcer options soft={} and hard={}: soft must not be above hard",
                                            parsed.soft, parsed.hard));
  }
  parsed.executor = peer_option(options, "executor");
  parsed.scheduler = peer_option(options, "scheduler");
  parsed.sample_ms = number_option("enforcer", options, "sample_ms", 1000, 1, kMaxSampleMs);
  parsed.cache_writer = text_option(options, "cache_writer", "");
  parsed.host_soft_bytes = number_option("enforcer", options, "host_soft_bytes", 0);
  const auto paths = parse_model_list("enforcer", options.at("models"));
  for (const auto& [id, path] : paths) {
    auto estimate = estimate_model_bytes(path, parsed.kv_pages, parsed.page_size);
    if (const auto* problem = std::get_if<std::string>(&estimate)) {
      throw std::invalid_argument(fmt::format("enforcer option models=: model '{}' cannot be read: {}", id, *problem));
    }
    ConfiguredModel model;
    model.path = path;
    model.estimate = std::get<std::uint64_t>(estimate);
    parsed.models.emplace(id, std::move(model));
  }
  for (const std::string& id : parse_id_list(options, "pinned", parsed.models)) parsed.models.at(id).pinned = true;
  for (const std::string& id : parse_id_list(options, "preload", parsed.models)) parsed.models.at(id).preload = true;
  parsed.aliases = aliases_option("enforcer", options, paths);
  for (const auto& [alias, id] : parsed.aliases) parsed.models.at(id).aliases.push_back(alias);
  for (const auto& [id, seconds] : pair_list_option("enforcer", options, "ttl_s")) {
    auto model = parsed.models.find(id);
    if (model == parsed.models.end()) {
      throw std::invalid_argument(fmt::format("enforcer option ttl_s= names model '{}', which is not configured", id));
    }
    model->second.ttl_s = parse_number_option("enforcer", "ttl_s", seconds, 0, kMaxTtlSeconds);
  }
  return parsed;
}

// ---- the models' states ----------------------------------------------------------------------

// Who sent a LoadRequest, to be answered when the load ends.
struct Asker {
  std::string from;
  std::uint64_t correlation_id = 0;
  std::uint64_t request_id = 0;
};

struct ModelEntry {
  std::string id;
  ConfiguredModel configured;
  ModelState state = ModelState::unloaded;
  std::uint64_t bytes = 0;  // measured while loaded (ModelLoaded, the pool's owners), else the estimate
  std::int64_t last_used_ns = 0;  // the scheduler's clock (ModelUsage): orders evictions
  std::int64_t idle_since_ns = 0;  // this actor's clock: loaded, or its last request ended (the ttl)
  std::uint32_t requests = 0;
  std::uint64_t loads = 0;
  std::uint64_t unloads = 0;
  std::string last_problem;

  // The unload chain (draining).
  bool unload_sent = false;  // ModelDrained came and UnloadModel is with the executor
  std::int64_t unload_started_ns = 0;   // AbortModel sent
  std::int64_t unload_sent_ns = 0;      // UnloadModel sent
  std::vector<Asker> unload_askers;     // told `unloaded` with the figures at the chain's end

  // A load: loading; or asked for and not admitted yet (load_wanted): while the model drains,
  // before the first sample has set a fractional ceiling, or while the only room it could have
  // is a load under way (evictable once loaded).
  std::vector<Asker> askers;
  bool load_wanted = false;
  std::vector<std::string> victims;  // evicted for it and not unloaded yet: LoadModel waits for them
  std::vector<std::string> evicted;  // every model evicted for it, for the LoadAnswer
  bool load_sent = false;            // LoadModel is with the executor
  std::uint64_t admitted = 0;        // admission order: loads waiting for memory start in turn

  bool holds_memory() const { return state == ModelState::loaded || state == ModelState::draining || load_sent; }
};

std::uint64_t owned_bytes(const PoolStatsWire& pool, const std::string& owner) {
  auto it = pool.active_by_owner.find(owner);
  return it == pool.active_by_owner.end() ? 0 : it->second;
}

// ---- the actor -------------------------------------------------------------------------------

class Enforcer final : public Actor {
 public:
  explicit Enforcer(EnforcerOptions options);

  void on_start(Context& ctx) override;
  void on_message(Context& ctx, Message& message) override;
  void on_stop(Context& ctx) override;

 private:
  void on_load_request(Context& ctx, const Message& message, const LoadRequest& request);
  void on_unload_request(Context& ctx, const Message& message, const UnloadRequest& request);
  void on_models_query(Context& ctx, const Message& message, const ModelsQuery& query);
  void on_usage(Context& ctx, const ModelUsage& usage);
  void unload_expired(Context& ctx);
  void on_drained(Context& ctx, const ModelDrained& drained);
  void on_unloaded(Context& ctx, const ModelUnloaded& unloaded);
  void on_loaded(Context& ctx, const ModelLoaded& loaded);
  void on_report(Context& ctx, const ExecutorReport& report);
  void on_cache_report(Context& ctx, const CacheReport& report);
  void on_timer(Context& ctx);

  void admit(Context& ctx, ModelEntry& entry);
  void admit_deferred(Context& ctx);
  void set_ceiling(std::uint64_t ceiling);
  bool ceiling_unknown() const { return options_.ceiling_fraction > 0.0 && options_.ceiling_bytes == 0; }
  void refuse_for_memory(Context& ctx, ModelEntry& entry, std::uint64_t needed,
                         const std::vector<std::string>& busy = {}, std::uint64_t busy_bytes = 0);
  void start_unload(Context& ctx, ModelEntry& model, const std::string& reason);
  void start_waiting_loads(Context& ctx);
  void answer_askers(Context& ctx, ModelEntry& entry, const LoadAnswer& answer);
  void review_pressure(Context& ctx);
  ModelEntry* pressure_victim(Pressure pressure);
  void ask_executor(Context& ctx, bool trim);

  ModelEntry* find(const std::string& id);
  std::uint64_t admitted_bytes() const;  // loaded and loading models: what admission counts
  std::uint64_t held_bytes() const;      // models whose memory the executor holds or is uploading
  bool any_draining() const;
  const ModelEntry* sole_loaded_model() const;
  Pressure pressure_of(std::uint64_t held) const;
  std::string configured_ids() const;

  EnforcerOptions options_;
  std::uint64_t soft_bytes_ = 0;
  std::uint64_t hard_bytes_ = 0;
  std::map<std::string, ModelEntry> models_;
  PoolStatsWire pool_;  // the executor's pool, as last heard of
  std::optional<CacheReport> cache_;  // the cache-writer's tiers, as last heard of
  std::uint64_t cache_shrinks_ = 0;
  std::uint64_t samples_ = 0, shrunk_at_sample_ = 0;  // one shrink per resident-set sample
  DeviceMemoryWire device_;  // the device's memory, as last sampled
  Pressure pressure_ = Pressure::none;
  std::string pressure_note_;
  bool note_logged_ = false;           // pressure_note_ was logged in this episode of pressure
  bool trimmed_this_sample_ = false;   // ExecutorQuery{true} was sent since the last sample
  bool query_unanswered_ = false;
  std::uint32_t samples_unanswered_ = 0;
  std::uint64_t admissions_ = 0;
};

Enforcer::Enforcer(EnforcerOptions options) : options_(std::move(options)) {
  set_ceiling(options_.ceiling_bytes);
  for (const auto& [id, configured] : options_.models) {
    ModelEntry entry;
    entry.id = id;
    entry.configured = configured;
    entry.bytes = configured.estimate;  // a preloaded model's real bytes come with the first ExecutorReport
    if (configured.preload) entry.state = ModelState::loaded;
    models_.emplace(id, std::move(entry));
  }
}

void Enforcer::set_ceiling(std::uint64_t ceiling) {
  options_.ceiling_bytes = ceiling;
  soft_bytes_ = static_cast<std::uint64_t>(static_cast<double>(ceiling) * options_.soft);
  hard_bytes_ = static_cast<std::uint64_t>(static_cast<double>(ceiling) * options_.hard);
}

void Enforcer::on_start(Context& ctx) {
  for (auto& [id, model] : models_) model.idle_since_ns = ctx.now_ns();  // the preloaded ones' ttl starts now
  ask_executor(ctx, false);  // learns the preloaded models' bytes and the pool at once
  ctx.set_timer(kSampleTimer, std::chrono::milliseconds(options_.sample_ms), true);
}

void Enforcer::on_message(Context& ctx, Message& message) {
  const std::string& from = message.envelope.from;
  const bool from_scheduler = from == options_.scheduler;
  const bool from_executor = from == options_.executor;
  if (const auto* load = message.as<LoadRequest>()) {
    on_load_request(ctx, message, *load);
  } else if (const auto* unload = message.as<UnloadRequest>()) {
    on_unload_request(ctx, message, *unload);
  } else if (const auto* query = message.as<ModelsQuery>()) {
    on_models_query(ctx, message, *query);
  } else if (const auto* usage = message.as<ModelUsage>(); usage != nullptr && from_scheduler) {
    on_usage(ctx, *usage);
  } else if (const auto* drained = message.as<ModelDrained>(); drained != nullptr && from_scheduler) {
    on_drained(ctx, *drained);
  } else if (const auto* unloaded = message.as<ModelUnloaded>(); unloaded != nullptr && from_executor) {
    on_unloaded(ctx, *unloaded);
  } else if (const auto* loaded = message.as<ModelLoaded>(); loaded != nullptr && from_executor) {
    on_loaded(ctx, *loaded);
  } else if (const auto* report = message.as<ExecutorReport>(); report != nullptr && from_executor) {
    on_report(ctx, *report);
  } else if (const auto* cache = message.as<CacheReport>(); cache != nullptr && from == options_.cache_writer) {
    on_cache_report(ctx, *cache);
  } else if (const auto* timer = message.as<Timer>(); timer != nullptr && timer->timer_id == kSampleTimer) {
    on_timer(ctx);
  } else {
    spdlog::debug("enforcer: ignored a {} from {}", kind_name(message.kind()), from);
  }
}

// Whoever still waits for a load is told the server is stopping, rather than never.
void Enforcer::on_stop(Context& ctx) {
  for (auto& [id, entry] : models_) {
    if (entry.askers.empty()) continue;
    LoadAnswer answer;
    answer.model = id;
    answer.outcome = static_cast<std::uint8_t>(LoadOutcome::shutting_down);
    answer.message = fmt::format("the server is stopping: model {} was not loaded", id);
    answer.ceiling_bytes = options_.ceiling_bytes;
    answer_askers(ctx, entry, answer);
  }
}

// ---- requests ----------------------------------------------------------------------------------

void Enforcer::on_load_request(Context& ctx, const Message& message, const LoadRequest& request) {
  ModelEntry* entry = find(request.model);
  if (entry == nullptr) {
    LoadAnswer answer;
    answer.model = request.model;
    answer.outcome = static_cast<std::uint8_t>(LoadOutcome::unknown_model);
    answer.message = fmt::format("no model '{}' is configured (configured: {})", request.model, configured_ids());
    ctx.reply(message, std::move(answer));
    return;
  }
  if (entry->state == ModelState::loaded) {
    if (entry->requests == 0) entry->idle_since_ns = ctx.now_ns();  // asked for again: its ttl starts over
    LoadAnswer answer;
    answer.model = entry->id;
    answer.outcome = static_cast<std::uint8_t>(LoadOutcome::loaded);
    answer.message = fmt::format("model {} is loaded", entry->id);
    answer.needed_bytes = entry->bytes;
    answer.ceiling_bytes = options_.ceiling_bytes;
    ctx.reply(message, std::move(answer));
    return;
  }
  entry->askers.push_back({message.envelope.from, message.envelope.correlation_id, message.envelope.request_id});
  if (ceiling_unknown()) {
    entry->load_wanted = true;  // admitted once the first sample has set the ceiling
  } else if (entry->state == ModelState::draining) {
    entry->load_wanted = true;  // admitted afresh once its ModelUnloaded has come
  } else if (entry->state == ModelState::unloaded) {
    admit(ctx, *entry);
  }  // loading: answered with the others when it ends
}

void Enforcer::on_unload_request(Context& ctx, const Message& message, const UnloadRequest& request) {
  UnloadAnswer answer;
  ModelEntry* entry = find(request.model);
  answer.model = entry != nullptr ? entry->id : request.model;
  if (entry == nullptr) {
    answer.outcome = static_cast<std::uint8_t>(UnloadOutcome::unknown_model);
    answer.message = fmt::format("no model '{}' is configured (configured: {})", request.model, configured_ids());
  } else if (entry->state == ModelState::unloaded) {
    answer.outcome = static_cast<std::uint8_t>(UnloadOutcome::not_loaded);
    answer.message = fmt::format("model {} is not loaded", entry->id);
  } else if (entry->state == ModelState::loading) {
    answer.outcome = static_cast<std::uint8_t>(UnloadOutcome::not_loaded);
    answer.message = fmt::format("model {} is still loading: unload it once it is loaded", entry->id);
  } else if (entry->state == ModelState::draining) {
    // An unload under way (an eviction, another admin) is joined: this asker hears its end too.
    entry->unload_askers.push_back({message.envelope.from, message.envelope.correlation_id, message.envelope.request_id});
    answer.outcome = static_cast<std::uint8_t>(UnloadOutcome::draining);
    answer.message = fmt::format("model {} is already draining: its memory is freed next", entry->id);
  } else if (request.if_idle && entry->requests > 0) {
    answer.outcome = static_cast<std::uint8_t>(UnloadOutcome::busy);
    answer.message = fmt::format("model {} has {} open requests; unload it without if_idle to abort them",
                                 entry->id, entry->requests);
  } else {
    start_unload(ctx, *entry, fmt::format("model {} is unloaded (admin)", entry->id));
    entry->unload_askers.push_back({message.envelope.from, message.envelope.correlation_id, message.envelope.request_id});
    answer.outcome = static_cast<std::uint8_t>(UnloadOutcome::draining);
    answer.message = fmt::format("model {} is draining: its requests end, then its memory is freed", entry->id);
  }
  ctx.reply(message, std::move(answer));
}

void Enforcer::on_models_query(Context& ctx, const Message& message, const ModelsQuery& query) {
  ModelsReport report;
  for (const auto& [id, entry] : models_) {
    if (!query.model.empty() && find(query.model) != &entry) continue;
    ModelStatus status;
    status.id = id;
    status.path = entry.configured.path.string();
    status.pinned = entry.configured.pinned;
    status.state = static_cast<std::uint8_t>(entry.state);
    status.bytes = entry.bytes;
    status.estimated_bytes = entry.configured.estimate;
    status.last_used_ns = entry.last_used_ns;
    status.requests = entry.requests;
    status.loads = entry.loads;
    status.unloads = entry.unloads;
    status.last_problem = entry.last_problem;
    status.aliases = entry.configured.aliases;
    status.ttl_s = entry.configured.ttl_s;
    report.models.push_back(std::move(status));
  }
  report.ceiling_bytes = options_.ceiling_bytes;
  report.soft_bytes = soft_bytes_;
  report.hard_bytes = hard_bytes_;
  report.used_bytes = admitted_bytes();
  report.pressure = static_cast<std::uint8_t>(pressure_);
  report.pressure_note = pressure_note_;
  report.pool = pool_;
  report.device = device_;
  report.ceiling_fraction = options_.ceiling_fraction;
  report.has_cache = cache_.has_value();
  if (cache_) report.cache = *cache_;
  report.host_soft_bytes = options_.host_soft_bytes;
  report.cache_shrinks = cache_shrinks_;
  ctx.reply(message, std::move(report));
}

void Enforcer::on_usage(Context& ctx, const ModelUsage& usage) {
  ModelEntry* entry = find(usage.model);
  if (entry == nullptr) {
    spdlog::debug("enforcer: ignored the usage of unknown model '{}'", usage.model);
    return;
  }
  entry->requests = usage.requests;
  entry->last_used_ns = usage.last_used_ns;
  if (usage.requests == 0) entry->idle_since_ns = ctx.now_ns();
}

// Loaded models idle for longer than their ttl are unloaded, one sample at a time like evictions.
void Enforcer::unload_expired(Context& ctx) {
  const std::int64_t now = ctx.now_ns();
  for (auto& [id, model] : models_) {
    if (model.configured.ttl_s == 0 || model.state != ModelState::loaded || model.requests > 0) continue;
    const std::int64_t idle_ns = now - model.idle_since_ns;
    if (idle_ns < static_cast<std::int64_t>(model.configured.ttl_s) * 1'000'000'000) continue;
    start_unload(ctx, model,
                 fmt::format("model {} is unloaded: idle for {:.0f} s, its ttl is {} s", id,
                             static_cast<double>(idle_ns) / 1e9, model.configured.ttl_s));
  }
}

// ---- admission -------------------------------------------------------------------------------

// Admits an unloaded model whose askers are waiting: at once, after evictions, or not at all.
void Enforcer::admit(Context& ctx, ModelEntry& entry) {
  if (ceiling_unknown()) {
    entry.load_wanted = true;  // the first sample sets the ceiling, then admits it
    return;
  }
  const std::uint64_t needed = entry.configured.estimate;
  const std::uint64_t used = admitted_bytes();
  const std::uint64_t ceiling = options_.ceiling_bytes;
  std::vector<ModelEntry*> victims;
  if (ceiling > 0 && used + needed > ceiling) {
    // An operator's load (an admin request) may evict busy models, whose clients then get their
    // final event; a load that a request set off evicts only idle ones, so that one client's
    // request never ends another's.
    const bool may_evict_busy = std::any_of(entry.askers.begin(), entry.askers.end(),
                                            [&](const Asker& asker) { return asker.from != options_.scheduler; });
    std::vector<ModelEntry*> candidates;
    std::vector<std::string> busy;   // kept for their requests
    std::uint64_t busy_bytes = 0;
    std::uint64_t evictable = 0;
    std::uint64_t evictable_later = 0;  // unpinned models still loading: evictable once loaded
    for (auto& [id, model] : models_) {
      if (model.configured.pinned) continue;
      if (model.state == ModelState::loaded && model.requests > 0 && !may_evict_busy) {
        busy.push_back(id);
        busy_bytes += model.bytes;
      } else if (model.state == ModelState::loaded) {
        candidates.push_back(&model);
        evictable += model.bytes;
      } else if (model.state == ModelState::loading) {
        evictable_later += model.bytes;
      }
    }
    if (used - evictable - evictable_later + needed > ceiling) {
      refuse_for_memory(ctx, entry, needed, busy, busy_bytes);
      return;
    }
    if (used - evictable + needed > ceiling) {
      entry.load_wanted = true;  // admitted again when a load under way has ended
      return;
    }
    // Idle before busy, then the least recently used; ids break ties, so the choice is replayable.
    std::sort(candidates.begin(), candidates.end(), [](const ModelEntry* a, const ModelEntry* b) {
      return std::make_tuple(a->requests > 0, a->last_used_ns, a->id) <
             std::make_tuple(b->requests > 0, b->last_used_ns, b->id);
    });
    std::uint64_t freed = 0;
    for (ModelEntry* candidate : candidates) {
      if (used - freed + needed <= ceiling) break;
      victims.push_back(candidate);
      freed += candidate->bytes;
    }
  }
  entry.state = ModelState::loading;
  entry.load_wanted = false;  // admitted: whatever deferred it is settled
  entry.bytes = needed;
  entry.load_sent = false;
  entry.admitted = ++admissions_;
  entry.victims.clear();
  entry.evicted.clear();
  for (ModelEntry* victim : victims) {
    entry.victims.push_back(victim->id);
    entry.evicted.push_back(victim->id);
    start_unload(ctx, *victim, fmt::format("model {} is unloaded to make room for {}", victim->id, entry.id));
  }
  start_waiting_loads(ctx);
}

// Loads that waited (for the first sample's ceiling, or for a load under way that they could
// evict once it ends): tried again now.
void Enforcer::admit_deferred(Context& ctx) {
  for (auto& [id, model] : models_) {
    if (model.state != ModelState::unloaded || !model.load_wanted || ceiling_unknown()) continue;
    model.load_wanted = false;
    admit(ctx, model);
  }
}

void Enforcer::refuse_for_memory(Context& ctx, ModelEntry& entry, std::uint64_t needed,
                                 const std::vector<std::string>& busy, std::uint64_t busy_bytes) {
  std::uint64_t kept = busy_bytes;  // what no eviction for it can free: busy models it may not evict,
                                    // and pinned models, loaded or loading
  std::vector<std::string> pinned;
  for (const auto& [id, model] : models_) {
    if (!model.configured.pinned) continue;
    if (model.state == ModelState::loading || model.state == ModelState::loaded) {
      kept += model.bytes;
      pinned.push_back(id);
    }
  }
  const std::uint64_t ceiling = options_.ceiling_bytes;
  LoadAnswer answer;
  answer.model = entry.id;
  answer.outcome = static_cast<std::uint8_t>(LoadOutcome::insufficient_memory);
  answer.needed_bytes = needed;
  answer.available_bytes = ceiling > kept ? ceiling - kept : 0;
  answer.ceiling_bytes = ceiling;
  answer.pinned = pinned;
  answer.message = fmt::format("model {} needs {:.1f} MiB, but at most {:.1f} MiB of the {:.1f} MiB ceiling can be "
                               "made free for it (pinned: {}): unload or unpin a model, or raise the ceiling "
                               "(--memory-ceiling)",
                               entry.id, mib(needed), mib(answer.available_bytes), mib(ceiling), joined(pinned));
  if (!busy.empty()) {
    answer.message += fmt::format("; or try again when {} (serving requests now) {} idle", joined(busy),
                                  busy.size() == 1 ? "is" : "are");
  }
  spdlog::warn("enforcer: {}", answer.message);
  answer_askers(ctx, entry, answer);
}

// Sends LoadModel for admitted loads, in the order they were admitted, once their victims are
// unloaded and, while a model is still draining, only if what is held leaves room for them.
void Enforcer::start_waiting_loads(Context& ctx) {
  std::vector<ModelEntry*> waiting;
  for (auto& [id, model] : models_) {
    if (model.state == ModelState::loading && !model.load_sent && model.victims.empty()) waiting.push_back(&model);
  }
  std::sort(waiting.begin(), waiting.end(),
            [](const ModelEntry* a, const ModelEntry* b) { return a->admitted < b->admitted; });
  for (ModelEntry* model : waiting) {
    if (options_.ceiling_bytes > 0 && any_draining() &&
        held_bytes() + model->configured.estimate > options_.ceiling_bytes) {
      continue;  // the next ModelUnloaded tries again
    }
    model->load_sent = true;
    ctx.send(options_.executor, LoadModel{model->id});
  }
}

void Enforcer::answer_askers(Context& ctx, ModelEntry& entry, const LoadAnswer& answer) {
  for (const Asker& asker : entry.askers) {
    ctx.send(asker.from, answer, SendOptions{asker.correlation_id, asker.request_id, {}});
  }
  entry.askers.clear();
}

// ---- the chains ------------------------------------------------------------------------------

void Enforcer::start_unload(Context& ctx, ModelEntry& model, const std::string& reason) {
  spdlog::info("enforcer: {}", reason);
  model.state = ModelState::draining;
  model.unload_sent = false;
  model.unload_started_ns = ctx.now_ns();
  ctx.send(options_.scheduler, AbortModel{model.id, reason});
}

void Enforcer::on_drained(Context& ctx, const ModelDrained& drained) {
  ModelEntry* model = find(drained.model);
  if (model == nullptr || model->state != ModelState::draining || model->unload_sent) {
    spdlog::warn("enforcer: ignored ModelDrained for model '{}', which is not waiting to drain", drained.model);
    return;
  }
  // The KV cache writer's Close for this model goes here, once there is one: its pages are written
  // out before the executor frees them.
  model->unload_sent = true;
  model->unload_sent_ns = ctx.now_ns();
  ctx.send(options_.executor, UnloadModel{model->id});
}

void Enforcer::on_unloaded(Context& ctx, const ModelUnloaded& unloaded) {
  ModelEntry* model = find(unloaded.model);
  if (model == nullptr || model->state != ModelState::draining || !model->unload_sent) {
    spdlog::warn("enforcer: ignored ModelUnloaded for model '{}', which was not being unloaded", unloaded.model);
    return;
  }
  model->state = ModelState::unloaded;
  model->unload_sent = false;
  model->bytes = model->configured.estimate;
  ++model->unloads;
  if (!unloaded.was_loaded) spdlog::warn("enforcer: model {} was not loaded in the executor", model->id);
  for (const std::string& problem : unloaded.problems) {
    spdlog::warn("enforcer: unloading model {}: {}", model->id, problem);
  }
  if (!unloaded.problems.empty()) {
    model->last_problem = fmt::format("unloading failed in part: {}", fmt::join(unloaded.problems, "; "));
  }
  pool_ = unloaded.pool;
  ctx.send(options_.scheduler, unloaded);  // the scheduler drops the model's page table
  UnloadAnswer answer;
  answer.model = model->id;
  answer.outcome = static_cast<std::uint8_t>(UnloadOutcome::unloaded);
  answer.model_bytes = unloaded.model_bytes;
  answer.freed_bytes = unloaded.freed_bytes;
  answer.held_after = unloaded.held_after;
  answer.problems = unloaded.problems;
  answer.unload_ns = ctx.now_ns() - model->unload_sent_ns;
  answer.total_ns = ctx.now_ns() - model->unload_started_ns;
  answer.message = fmt::format("model {} is unloaded: {:.1f} MiB freed{}", model->id, mib(unloaded.freed_bytes),
                               unloaded.problems.empty() ? "" : " (its release failed in part)");
  for (const Asker& asker : model->unload_askers) {
    ctx.send(asker.from, answer, SendOptions{asker.correlation_id, asker.request_id, {}});
  }
  model->unload_askers.clear();
  for (auto& [id, waiting] : models_) std::erase(waiting.victims, model->id);
  if (model->load_wanted) {
    model->load_wanted = false;
    admit(ctx, *model);
  }
  // Whether or not that admitted it (it may wait for a load under way), the loads that waited
  // for this memory go now.
  start_waiting_loads(ctx);
  admit_deferred(ctx);
  review_pressure(ctx);
}

void Enforcer::on_loaded(Context& ctx, const ModelLoaded& loaded) {
  ModelEntry* model = find(loaded.model);
  if (model == nullptr || model->state != ModelState::loading || !model->load_sent) {
    spdlog::warn("enforcer: ignored ModelLoaded for model '{}', which was not being loaded", loaded.model);
    return;
  }
  model->load_sent = false;
  pool_ = loaded.pool;
  LoadAnswer answer;
  answer.model = model->id;
  answer.needed_bytes = model->configured.estimate;
  answer.ceiling_bytes = options_.ceiling_bytes;
  answer.evicted = model->evicted;
  if (loaded.ok) {
    model->state = ModelState::loaded;
    model->idle_since_ns = ctx.now_ns();
    if (loaded.bytes > 0) model->bytes = loaded.bytes;
    ++model->loads;
    answer.outcome = static_cast<std::uint8_t>(LoadOutcome::loaded);
    answer.message = fmt::format("model {} is loaded ({:.1f} MiB)", model->id, mib(model->bytes));
    spdlog::info("enforcer: {} (estimated {:.1f} MiB)", answer.message, mib(model->configured.estimate));
  } else {
    model->state = ModelState::unloaded;
    model->bytes = model->configured.estimate;
    model->last_problem = loaded.error;
    answer.outcome = static_cast<std::uint8_t>(LoadOutcome::failed);
    answer.message = loaded.error;
    spdlog::warn("enforcer: model {} failed to load: {}", model->id, loaded.error);
  }
  model->evicted.clear();
  ctx.send(options_.scheduler, loaded);  // it serves the model, or fails the requests that waited for it
  answer_askers(ctx, *model, answer);
  start_waiting_loads(ctx);
  admit_deferred(ctx);
}

// ---- sampling and pressure -------------------------------------------------------------------

void Enforcer::ask_executor(Context& ctx, bool trim) {
  query_unanswered_ = true;
  ctx.send(options_.executor, ExecutorQuery{trim});
}

void Enforcer::on_timer(Context& ctx) {
  trimmed_this_sample_ = false;
  unload_expired(ctx);
  if (!options_.cache_writer.empty()) ctx.send(options_.cache_writer, CacheQuery{});
  if (query_unanswered_ && ++samples_unanswered_ < kSamplesBeforeAskingAgain) return;
  samples_unanswered_ = 0;
  ask_executor(ctx, false);
}

void Enforcer::on_report(Context& ctx, const ExecutorReport& report) {
  query_unanswered_ = false;
  samples_unanswered_ = 0;
  pool_ = report.pool;
  device_ = report.memory;
  ++samples_;
  if (ceiling_unknown() && device_.total_bytes > 0) {
    set_ceiling(static_cast<std::uint64_t>(static_cast<double>(device_.total_bytes) * options_.ceiling_fraction));
    spdlog::info("enforcer: the ceiling is {:.0f}% of the device's {:.1f} MiB: {:.1f} MiB",
                 options_.ceiling_fraction * 100, mib(device_.total_bytes), mib(options_.ceiling_bytes));
    admit_deferred(ctx);  // the loads that waited for the ceiling
  }
  // The executor labels each model's pool memory "weights:ID" and "kv:ID": the measured bytes of
  // loaded models, the preloaded ones' first of all.
  for (auto& [id, model] : models_) {
    if (model.state != ModelState::loaded) continue;
    const std::uint64_t owned = owned_bytes(pool_, "weights:" + id) + owned_bytes(pool_, "kv:" + id);
    if (owned > 0) model.bytes = owned;
  }
  review_pressure(ctx);
}

// The hot tier is host memory the enforcer counts: when the executor's resident set is above
// host_soft_bytes, the hot tier gives up the excess (least recently used pages first).
void Enforcer::on_cache_report(Context& ctx, const CacheReport& report) {
  cache_ = report;
  const std::uint64_t rss = device_.process_rss_bytes;
  if (options_.host_soft_bytes == 0 || rss <= options_.host_soft_bytes || report.hot_bytes == 0) return;
  if (shrunk_at_sample_ == samples_) return;  // the resident set has not been measured since the last shrink
  shrunk_at_sample_ = samples_;
  const std::uint64_t excess = rss - options_.host_soft_bytes;
  const std::uint64_t target = report.hot_bytes > excess ? report.hot_bytes - excess : 0;
  ++cache_shrinks_;
  spdlog::info("enforcer: resident set {:.1f} MiB is above the host soft mark {:.1f} MiB: the hot cache shrinks "
               "from {:.1f} to {:.1f} MiB",
               mib(rss), mib(options_.host_soft_bytes), mib(report.hot_bytes), mib(target));
  ctx.send(options_.cache_writer, ShrinkCache{target});
}

void Enforcer::review_pressure(Context& ctx) {
  const Pressure now = pressure_of(pool_.held_bytes);
  if (now == Pressure::none) {
    if (pressure_ != Pressure::none) spdlog::info("enforcer: memory pressure is over");
    pressure_ = Pressure::none;
    pressure_note_.clear();
    note_logged_ = false;
    return;
  }
  pressure_ = now;
  if (!trimmed_this_sample_) {
    // Trimming first: what the pool caches may be all the excess. The trimmed sample that answers
    // decides whether a model must go.
    trimmed_this_sample_ = true;
    ask_executor(ctx, true);
    return;
  }
  if (any_draining()) return;  // one at a time: the next is chosen once this one's memory is back
  const char* limit = now == Pressure::hard ? "hard" : "soft";
  const std::uint64_t mark = now == Pressure::hard ? hard_bytes_ : soft_bytes_;
  const ModelEntry* sole = sole_loaded_model();
  if (sole != nullptr) {
    // Evicting the only model would be reloaded by its next request, over the mark again: a loop.
    // The ceiling is too small for it, and the operator is told so.
    pressure_note_ = fmt::format("model {} alone holds the pool above the {} limit ({:.1f} MiB of {:.1f} MiB): "
                                 "give it a higher --memory-ceiling or fewer --kv-pages",
                                 sole->id, limit, mib(pool_.held_bytes), mib(mark));
    if (!note_logged_) {
      note_logged_ = true;
      spdlog::warn("enforcer: {}", pressure_note_);
    }
    return;
  }
  if (ModelEntry* victim = pressure_victim(now)) {
    pressure_note_.clear();
    start_unload(ctx, *victim,
                 fmt::format("model {} is unloaded: the pool holds {:.1f} MiB, above the {} limit of {:.1f} MiB",
                             victim->id, mib(pool_.held_bytes), limit, mib(mark)));
    return;
  }
  bool any_unpinned = false;
  for (const auto& [id, model] : models_) {
    any_unpinned = any_unpinned || (model.state == ModelState::loaded && !model.configured.pinned);
  }
  pressure_note_ = any_unpinned ? "every unpinned loaded model is busy: nothing idle to evict below the hard limit"
                                : "every loaded model is pinned: nothing to evict";
  if (!note_logged_) {
    note_logged_ = true;
    spdlog::warn("enforcer: the pool holds {:.1f} MiB, above the {} limit, and {}", mib(pool_.held_bytes), limit,
                 pressure_note_);
  }
}

// The one model that holds memory, when only one does (loaded, loading or draining).
const ModelEntry* Enforcer::sole_loaded_model() const {
  const ModelEntry* sole = nullptr;
  for (const auto& [id, model] : models_) {
    if (!model.holds_memory()) continue;
    if (sole != nullptr) return nullptr;
    sole = &model;
  }
  return sole;
}

// The idle unpinned loaded model used least recently; above the hard limit, failing that, the
// largest busy one.
ModelEntry* Enforcer::pressure_victim(Pressure pressure) {
  ModelEntry* idle = nullptr;
  ModelEntry* largest = nullptr;
  for (auto& [id, model] : models_) {
    if (model.state != ModelState::loaded || model.configured.pinned) continue;
    if (model.requests == 0) {
      if (idle == nullptr || model.last_used_ns < idle->last_used_ns) idle = &model;
    } else if (largest == nullptr || model.bytes > largest->bytes) {
      largest = &model;
    }
  }
  if (idle != nullptr) return idle;
  return pressure == Pressure::hard ? largest : nullptr;
}

// ---- figures ---------------------------------------------------------------------------------

// By id or alias.
ModelEntry* Enforcer::find(const std::string& name) {
  auto alias = options_.aliases.find(name);
  auto it = models_.find(alias != options_.aliases.end() ? alias->second : name);
  return it == models_.end() ? nullptr : &it->second;
}

std::uint64_t Enforcer::admitted_bytes() const {
  std::uint64_t used = 0;
  for (const auto& [id, model] : models_) {
    if (model.state == ModelState::loaded || model.state == ModelState::loading) used += model.bytes;
  }
  return used;
}

std::uint64_t Enforcer::held_bytes() const {
  std::uint64_t held = 0;
  for (const auto& [id, model] : models_) {
    if (model.holds_memory()) held += model.bytes;
  }
  return held;
}

bool Enforcer::any_draining() const {
  return std::any_of(models_.begin(), models_.end(),
                     [](const auto& entry) { return entry.second.state == ModelState::draining; });
}

Pressure Enforcer::pressure_of(std::uint64_t held) const {
  if (options_.ceiling_bytes == 0) return Pressure::none;
  if (held > hard_bytes_) return Pressure::hard;
  if (held > soft_bytes_) return Pressure::soft;
  return Pressure::none;
}

std::string Enforcer::configured_ids() const {
  std::vector<std::string> ids;
  for (const auto& [id, model] : models_) ids.push_back(id);
  return joined(ids);
}

}  // namespace

std::unique_ptr<Actor> make_enforcer(const ActorOptions& options) {
  return std::make_unique<Enforcer>(parse_options(options));
}

}  // namespace mqlm::actors
