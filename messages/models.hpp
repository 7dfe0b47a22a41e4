// The model pool's messages: loading and unloading models, and the memory enforcer's chain that
// makes an unload give its memory back before anything else is loaded (docs/architecture.md,
// "Models and memory"). Listed in the catalog (messages/catalog.hpp) like every other message.
//
//   admin (gateway, http) ──LoadRequest / UnloadRequest / ModelsQuery──▶ enforcer
//   scheduler ──LoadRequest (a request for a model that is not loaded), ModelUsage──▶ enforcer
//   enforcer ──AbortModel──▶ scheduler ──ModelDrained──▶ enforcer ──UnloadModel──▶ executor
//   executor ──ModelUnloaded (bytes really freed)──▶ enforcer ──ModelUnloaded──▶ scheduler
//   enforcer ──LoadModel──▶ executor ──ModelLoaded──▶ enforcer ──ModelLoaded──▶ scheduler
//   enforcer ──LoadAnswer / UnloadAnswer / ModelsReport──▶ whoever asked
//
// Models are named by their id in the server's configuration; every actor knows the same list
// (ids, paths, pinned) from its options, so a path never travels in a message and a hostile
// message cannot make the executor open a file.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <msgpack.hpp>

#include "messages/cache.hpp"
#include "messages/serving.hpp"

namespace mqlm::messages {

enum class ModelState : std::uint8_t {
  unloaded = 1,  // known, not in device memory (the state every configured model starts in)
  loading = 2,   // admitted; the executor is uploading it
  loaded = 3,    // served
  draining = 4,  // being unloaded: its requests are ending, then the executor frees it
};

// ---- enforcer <-> executor ----------------------------------------------------------------------

// Upload the weights of the configured model `model` and make its KV cache. Answered by
// ModelLoaded to the sender.
struct LoadModel {
  std::string model;
  MSGPACK_DEFINE(model);
};

struct ModelLoaded {
  std::string model;
  bool ok = false;
  std::string error;          // when !ok: what failed (the executor holds nothing of it then)
  ModelInfo info;             // when ok: its KV cache's shape, context and vocabulary
  std::uint64_t bytes = 0;    // device bytes the model owns: weights and KV cache
  PoolStatsWire pool;         // the pool after the load
  std::int64_t load_ns = 0;   // the upload's duration
  MSGPACK_DEFINE(model, ok, error, info, bytes, pool, load_ns);
};

// Free everything of `model`: its sequences' state, KV cache and weights, then trim the pool and
// measure. Always answered with ModelUnloaded, whatever fails on the way.
struct UnloadModel {
  std::string model;
  MSGPACK_DEFINE(model);
};

struct ModelUnloaded {
  std::string model;
  bool was_loaded = false;          // false: it was not loaded (nothing to free)
  std::uint64_t model_bytes = 0;    // device bytes the model owned before the unload
  std::uint64_t held_before = 0;    // bytes the pool held from the driver before
  std::uint64_t held_after = 0;     // and after the release and trim
  std::uint64_t freed_bytes = 0;    // held_before - held_after: given back to the driver
  std::vector<std::string> problems;  // parts whose release failed (logged; the rest went on)
  PoolStatsWire pool;               // after
  std::int64_t unload_ns = 0;
  // The cache-writer's part (when there is one): the model's hot-tier bytes it released. Its
  // problems are among `problems`.
  std::uint64_t cache_released_bytes = 0;
  MSGPACK_DEFINE(model, was_loaded, model_bytes, held_before, held_after, freed_bytes, problems, pool, unload_ns,
                 cache_released_bytes);
};

// ---- enforcer <-> scheduler ---------------------------------------------------------------------

// End every request of `model` now (each client gets a final event: finish abort, `reason`), stop
// planning it, release its executor slots, and answer ModelDrained once no step of it is in flight.
struct AbortModel {
  std::string model;
  std::string reason;
  MSGPACK_DEFINE(model, reason);
};

struct ModelDrained {
  std::string model;
  std::uint32_t aborted = 0;  // requests it ended
  MSGPACK_DEFINE(model, aborted);
};

// A model's requests went from none to some or back (sent on those edges only): what the enforcer
// needs to tell idle models from busy ones and the least recently used.
struct ModelUsage {
  std::string model;
  std::uint32_t requests = 0;     // open now
  std::int64_t last_used_ns = 0;  // the scheduler's clock when this changed
  MSGPACK_DEFINE(model, requests, last_used_ns);
};

// ---- admin and first requests -> enforcer --------------------------------------------------------

// Load `model` (an id or alias) if it is not loaded: answered by LoadAnswer once it is loaded,
// or at once when it cannot be.
struct LoadRequest {
  std::string model;
  MSGPACK_DEFINE(model);
};

enum class LoadOutcome : std::uint8_t {
  loaded = 1,            // it is loaded (now, or it was already)
  unknown_model = 2,     // no such id in the configuration
  insufficient_memory = 3,  // it cannot fit under the ceiling even after every allowed eviction (HTTP 507)
  failed = 4,            // the executor could not load it (message says why)
  shutting_down = 5,
};

struct LoadAnswer {
  std::string model;
  std::uint8_t outcome = 0;  // LoadOutcome
  std::string message;
  std::uint64_t needed_bytes = 0;     // what the model needs (weights and KV cache)
  std::uint64_t available_bytes = 0;  // under the ceiling, after the evictions allowed
  std::uint64_t ceiling_bytes = 0;
  std::vector<std::string> pinned;    // loaded models that could not be evicted for it
  std::vector<std::string> evicted;   // models unloaded to make room
  MSGPACK_DEFINE(model, outcome, message, needed_bytes, available_bytes, ceiling_bytes, pinned, evicted);
};

// Unload `model`: answered at once with UnloadAnswer (draining, or why not); once the executor
// has freed it, the asker is sent a second UnloadAnswer, unloaded, with the bytes really freed.
// An unload already under way (an eviction, another admin) is joined: draining, then unloaded.
// if_idle: only when no request uses it.
struct UnloadRequest {
  std::string model;
  bool if_idle = false;
  MSGPACK_DEFINE(model, if_idle);
};

enum class UnloadOutcome : std::uint8_t {
  draining = 1,       // accepted: its requests end, then it is freed
  not_loaded = 2,     // nothing to do (unloaded already, or being unloaded)
  unknown_model = 3,
  busy = 4,           // if_idle, and requests are using it
  unloaded = 5,       // the second answer to a draining one: the memory is freed (figures below)
};

struct UnloadAnswer {
  std::string model;
  std::uint8_t outcome = 0;  // UnloadOutcome
  std::string message;
  // unloaded: the executor's ModelUnloaded figures
  std::uint64_t model_bytes = 0;
  std::uint64_t freed_bytes = 0;
  std::uint64_t held_after = 0;
  std::vector<std::string> problems;
  std::int64_t unload_ns = 0;       // UnloadModel to ModelUnloaded
  std::int64_t total_ns = 0;        // the request (or the chain's start) to the end: draining included
  MSGPACK_DEFINE(model, outcome, message, model_bytes, freed_bytes, held_after, problems, unload_ns, total_ns);
};

struct ModelsQuery {
  std::string model;  // "": every model; else only this one
  MSGPACK_DEFINE(model);
};

struct ModelStatus {
  std::string id;
  std::string path;
  bool pinned = false;
  std::uint8_t state = 1;          // ModelState
  std::uint64_t bytes = 0;         // device bytes it owns (measured when loaded, estimated otherwise)
  std::uint64_t estimated_bytes = 0;  // what admission counts for it
  std::int64_t last_used_ns = 0;   // 0: never
  std::uint32_t requests = 0;      // open requests (the scheduler's count, as last reported)
  std::uint64_t loads = 0, unloads = 0;
  std::string last_problem;        // the last load or release failure
  std::vector<std::string> aliases;  // other names clients may use for it
  std::uint64_t ttl_s = 0;         // unloaded after this long idle; 0: never
  MSGPACK_DEFINE(id, path, pinned, state, bytes, estimated_bytes, last_used_ns, requests, loads, unloads,
                 last_problem, aliases, ttl_s);
};

enum class Pressure : std::uint8_t { none = 0, soft = 1, hard = 2 };

struct ModelsReport {
  std::vector<ModelStatus> models;
  std::uint64_t ceiling_bytes = 0;   // 0: no ceiling
  std::uint64_t soft_bytes = 0;      // above: trim and evict idle unpinned models
  std::uint64_t hard_bytes = 0;      // above: abort the newest requests of the largest model
  std::uint64_t used_bytes = 0;      // what admission counts as taken (loaded and loading models)
  std::uint8_t pressure = 0;         // Pressure
  std::string pressure_note;         // e.g. "every loaded model is pinned"
  PoolStatsWire pool;                // the executor's pool, as last sampled
  DeviceMemoryWire device;           // the device's memory and the executor's resident set, as last sampled
  // ceiling_fraction > 0: the ceiling is that fraction of the device's memory, set from the first
  // sample (ceiling_bytes is 0 until then, and loads wait for it).
  double ceiling_fraction = 0.0;
  // The KV prefix cache's hot (RAM) and SSD tiers, as the cache-writer last reported them (when
  // there is one), and how often the enforcer shrank the hot tier for host-memory pressure.
  bool has_cache = false;
  CacheReport cache;
  std::uint64_t host_soft_bytes = 0;  // the executor's resident set above this shrinks the hot tier; 0: never
  std::uint64_t cache_shrinks = 0;
  MSGPACK_DEFINE(models, ceiling_bytes, soft_bytes, hard_bytes, used_bytes, pressure, pressure_note, pool, device,
                 ceiling_fraction, has_cache, cache, host_soft_bytes, cache_shrinks);
};

}  // namespace mqlm::messages
