// The memory enforcer: the one actor that decides which configured models may be in device memory.
// It admits loads under a ceiling, chooses what to evict for them, and runs the unload chain that
// gives a model's memory back before anything else is loaded (messages/models.hpp):
//
//   enforcer ──AbortModel──▶ scheduler ──ModelDrained──▶ enforcer ──UnloadModel──▶ executor
//   executor ──ModelUnloaded──▶ enforcer ──ModelUnloaded──▶ scheduler, then the loads that waited
//   enforcer ──LoadModel──▶ executor ──ModelLoaded──▶ enforcer ──ModelLoaded──▶ scheduler
//
// Messages:
//   LoadRequest -> LoadAnswer      at once when the model is loaded, unknown or cannot fit even
//                                  after every allowed eviction (insufficient_memory); otherwise
//                                  once its load (after its evictions) has ended.
//   UnloadRequest -> UnloadAnswer  at once: draining (the chain has started), or why not.
//   ModelsQuery -> ModelsReport    every model's state and bytes, the ceiling and the pressure.
//   ModelUsage (scheduler)         which models are busy, and the least recently used.
//   ExecutorReport (executor)      sampled every sample_ms: the pool's held bytes set the pressure.
// Messages of these kinds from a peer that should not send them, and messages that do not fit
// the model's state (a ModelDrained twice), are logged and ignored.
//
// Admission counts each loaded or loading model's bytes (measured once loaded, else estimated:
// its GGUF tensors plus its KV cache). A load that needs evictions is sent to the executor only
// after every victim's ModelUnloaded, never on a timer; so is any load while a model is draining,
// unless the memory still held leaves room for it.
//
// Pressure (ceiling_bytes > 0): the pool's held bytes above soft * ceiling make the enforcer ask
// the executor to trim (once per sample) and evict idle unpinned models, least recently used
// first, one at a time; above hard * ceiling, with no idle model left, the largest busy unpinned
// model is evicted (its requests are aborted). When nothing can be evicted the report says so
// (pressure_note), logged once per episode.
//
// Options (ActorOptions):
//   models=ID=PATH;ID2=PATH2   the configured models (as the executor's option); required
//   pinned=ID,ID2              never evicted
//   preload=ID,ID2             loaded by the executor at its start: counted loaded from the start
//   kv_pages=N, page_size=N    every model's KV cache, as the executor's (defaults 1024, 16)
//   ceiling_bytes=N            device bytes the models may take (0, the default: no ceiling)
//   ceiling_fraction=F         or this fraction (0 < F <= 1) of the device's memory (its device-local
//                              heaps), set from the executor's first report; loads wait for it
//   soft=F, hard=F             fractions of the ceiling (defaults 0.85, 0.95; 0 < soft <= hard <= 1)
//   executor=NAME, scheduler=NAME   its peers (defaults "executor", "scheduler")
//   sample_ms=N                how often the executor's pool is sampled (default 1000)
//   cache_writer=NAME          the KV prefix cache's hot and SSD tiers: sampled with the executor
//                              (CacheQuery), shown in ModelsReport
//   host_soft_bytes=N          the executor's resident set above this has the hot tier shrink by
//                              the excess, once per sample (ShrinkCache; default 0: never)
//
// It follows the replay rule (docs/architecture.md): the GGUF headers are read when it is built,
// and its handlers take time only from ctx.now_ns().
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <variant>

#include "actors/runtime/actor.hpp"
#include "actors/runtime/actor_options.hpp"

namespace mqlm::actors {

// Throws std::invalid_argument naming a missing, unknown or malformed option, or a model file
// that cannot be read.
std::unique_ptr<Actor> make_enforcer(const ActorOptions& options);

// The executor's paged KV cache of a model: K and V, F16, for every layer.
std::uint64_t kv_cache_bytes(std::uint32_t layers, std::uint32_t kv_heads, std::uint32_t head_dim,
                             std::uint32_t kv_pages, std::uint32_t page_size);

// What admission counts for the model in `path` before it is loaded: every tensor's bytes plus
// its KV cache; or what makes the file unusable.
std::variant<std::uint64_t, std::string> estimate_model_bytes(const std::filesystem::path& path,
                                                              std::uint32_t kv_pages, std::uint32_t page_size);

}  // namespace mqlm::actors
