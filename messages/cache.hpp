// The KV prefix cache beyond the GPU: what the scheduler, the executor, the memory enforcer and
// the front ends say to the cache-writer, which keeps evicted prefix pages in a hot tier (RAM)
// and an SSD tier (docs/architecture.md, "The KV prefix cache beyond the GPU").
//
//   scheduler ──StepPlan (spill: pages it gives to other contents)──▶ executor
//   executor ──KvPagesSpilled (one blob per page)──▶ cache-writer
//   scheduler ──PrefixLookup──▶ cache-writer ──CachedPrefix (one blob per page)──▶ scheduler
//   scheduler ──StepPlan (restore: pages and their blobs)──▶ executor
//   enforcer ──CloseModelCache──▶ cache-writer ──ModelCacheClosed──▶ enforcer
//   enforcer ──CacheQuery / ShrinkCache──▶ cache-writer ──CacheReport──▶ enforcer, front ends
//   front end ──ClearCache──▶ cache-writer ──CacheCleared──▶ front end
//
// A page's blob is its K and V for every layer: layer 0's K rows, layer 0's V rows, layer 1's
// ..., F16, exactly the executor's page_bytes. Blobs are frames beside the struct, never fields.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <msgpack.hpp>

namespace mqlm::messages {

// The most pages one lookup asks for (and so the most blobs of one message): 64k tokens in pages
// of 16.
inline constexpr std::uint32_t kMaxPrefixPages = 4096;

// A full KV page's identity: its chained prefix key (the model and every token up to the page's
// end), the key of the page before it (0 for a prompt's first page) and its own tokens, so a
// page is matched token by token, not by hash alone.
struct KvPageId {
  std::uint64_t key = 0;
  std::uint64_t parent = 0;
  std::vector<std::int32_t> tokens;
  MSGPACK_DEFINE(key, parent, tokens);
};

// In a StepPlan: a prefix page the scheduler gives to other contents, to be copied out before
// the step writes it.
struct SpillPage {
  std::uint32_t page = 0;  // the slot in the model's KV cache
  KvPageId id;
  MSGPACK_DEFINE(page, id);
};

// executor -> cache-writer: pages evicted from the GPU; blob i holds pages[i].
struct KvPagesSpilled {
  std::string model;
  std::uint64_t model_key = 0;   // the weights' identity (see PrefixLookup)
  std::uint32_t page_size = 0;   // tokens per page
  std::uint64_t page_bytes = 0;  // each blob's size
  std::vector<KvPageId> pages;
  MSGPACK_DEFINE(model, model_key, page_size, page_bytes, pages);
};

// scheduler -> cache-writer: the full pages of a prompt past those the GPU holds, in order
// (keys[0]'s parent is the last page the GPU has). Answered with CachedPrefix under the same
// correlation id. model_key names the weights (the model's id and its file's identity), so a
// page from other weights under the same id is never restored; page_size and page_bytes must
// match the stored page's.
struct PrefixLookup {
  std::string model;
  std::uint64_t model_key = 0;
  std::uint32_t page_size = 0;
  std::uint64_t page_bytes = 0;
  std::vector<std::uint64_t> keys;
  MSGPACK_DEFINE(model, model_key, page_size, page_bytes, keys);
};

enum class CacheTier : std::uint8_t { hot = 1, ssd = 2 };

// cache-writer -> scheduler: the longest run of the lookup's keys, from the first, that it holds
// (none is an answer); blob i holds pages[i], tiers[i] says where it was found.
struct CachedPrefix {
  std::string model;
  std::vector<KvPageId> pages;
  std::vector<std::uint8_t> tiers;  // CacheTier
  MSGPACK_DEFINE(model, pages, tiers);
};

// enforcer -> cache-writer when a model is unloaded (and the cache-writer itself at shutdown):
// drop (or, with drain, finish) the model's queued SSD writes and release every hot entry of it.
// Always answered, whatever failed on the way.
struct CloseModelCache {
  std::string model;
  bool drain_writes = true;  // false: queued writes of the model are dropped, not written
  MSGPACK_DEFINE(model, drain_writes);
};

struct ModelCacheClosed {
  std::string model;
  std::uint64_t released_bytes = 0;   // hot-tier bytes of the model, counted before the release
  std::uint32_t released_pages = 0;
  std::uint32_t writes_drained = 0;   // queued writes finished before answering
  std::uint32_t writes_dropped = 0;   // queued writes dropped
  std::vector<std::string> problems;  // what failed on the way (the release went on)
  MSGPACK_DEFINE(model, released_bytes, released_pages, writes_drained, writes_dropped, problems);
};

// front end -> cache-writer (admin): empty a tier, whatever model its pages belong to, loaded
// or not. Answered with CacheCleared.
struct ClearCache {
  std::uint8_t tier = 1;  // CacheTier
  MSGPACK_DEFINE(tier);
};

struct CacheCleared {
  std::uint8_t tier = 1;
  std::uint64_t released_bytes = 0;  // counted before the release
  std::uint32_t released_pages = 0;
  std::vector<std::string> problems;
  MSGPACK_DEFINE(tier, released_bytes, released_pages, problems);
};

// Asks for a CacheReport.
struct CacheQuery {
  MSGPACK_DEFINE();
};

// enforcer -> cache-writer under host-memory pressure: bring the hot tier down to target_bytes
// (least recently used pages first, written to SSD where there is one). Answered with a
// CacheReport.
struct ShrinkCache {
  std::uint64_t target_bytes = 0;
  MSGPACK_DEFINE(target_bytes);
};

struct CacheReport {
  std::uint64_t hot_bytes = 0;          // page bytes held in RAM (queued writes included; the
                                        // budget bounds the rest)
  std::uint64_t hot_budget_bytes = 0;
  std::uint32_t hot_pages = 0;
  std::uint64_t queued_write_bytes = 0; // of hot_bytes: waiting to be written to SSD
  std::uint64_t ssd_bytes = 0;
  std::uint64_t ssd_limit_bytes = 0;    // 0: no SSD tier
  std::uint32_t ssd_pages = 0;
  std::uint64_t hot_hits = 0, ssd_hits = 0, misses = 0;  // pages asked for, by where found
  std::uint64_t spilled = 0;            // pages received from the executor
  std::uint64_t writes = 0, write_failures = 0;
  std::uint64_t corrupt = 0;            // SSD files that failed their check (deleted, recomputed)
  std::uint64_t dropped = 0;            // pages let go without being written (no SSD, no room, closed)
  std::map<std::string, std::uint64_t> hot_bytes_by_model;
  MSGPACK_DEFINE(hot_bytes, hot_budget_bytes, hot_pages, queued_write_bytes, ssd_bytes, ssd_limit_bytes, ssd_pages,
                 hot_hits, ssd_hits, misses, spilled, writes, write_failures, corrupt, dropped, hot_bytes_by_model);
};

}  // namespace mqlm::messages
