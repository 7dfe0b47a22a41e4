// The cache-writer actor: the KV prefix cache beyond the GPU (docs/architecture.md, "The KV
// prefix cache beyond the GPU"; messages/cache.hpp).
//
// - Hot tier: the pages the executor copied out when the scheduler gave them up (KvPagesSpilled),
//   kept as the frames they arrived in, under one byte budget for every model, each page knowing
//   its owner model. Least recently used pages leave first: queued for the SSD tier when there is
//   one (the queue's RAM is bounded apart, queue_bytes), else dropped; a page that finds the queue
//   full is dropped (counted).
// - SSD tier: written and read by the I/O thread (cache_io.hpp) through SsdStore (one checked
//   file per page, the directory its index), so the actor never waits on a disk.
// - PrefixLookup: the longest run of the asked pages it has, hot or from SSD, as CachedPrefix.
// - CloseModelCache (from the executor, after it freed the model, so it follows every spill of
//   the model): drains or drops the model's queued writes and releases all of its hot pages,
//   and answers whatever failed on the way. ClearCache (admin) empties a tier, whatever models
//   its pages belong to, and answers the bytes released, counted before the release. ShrinkCache
//   (the memory enforcer) brings the hot tier under a target. CacheQuery: a CacheReport.
// - Stopping drains or drops the write queue (close=) and releases everything.
//
// Options: hot_bytes=N (the hot tier's budget, default 1 GiB), ssd_dir=PATH (default: no SSD
// tier), ssd_bytes=N (the SSD tier's limit, default 16 GiB), queue_bytes=N (pages on their way to
// SSD, default 256 MiB), answer_bytes=N (the most one lookup's answer holds, default 2 GiB: it is
// in RAM whole), close=drain|drop
// (what Close and shutdown do with queued writes, default drain), fail_writes=1 (tests: every
// SSD write fails as on a full disk), fail_close=ID (tests: closing model ID throws midway).
//
// It watches the I/O thread's socket, so like the http actor it needs a live ZeroMQ context and
// is not replayed.
#pragma once

#include <memory>

#include "actors/runtime/actor.hpp"
#include "actors/runtime/actor_options.hpp"

namespace mqlm::actors {

// Throws std::invalid_argument naming a bad option.
std::unique_ptr<Actor> make_cache_writer(const ActorOptions& options);

}  // namespace mqlm::actors
