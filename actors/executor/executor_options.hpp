// The executor's options as `mqlm node` passes them (ActorOptions), parsed and checked once at
// construction; executor.hpp lists them with their meaning.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "actors/runtime/actor_options.hpp"

namespace mqlm::actors {

struct ExecutorOptions {
  std::map<std::string, std::filesystem::path> models;  // id -> its GGUF file: what LoadModel may load
  std::vector<std::string> preload;                     // ids loaded at start, in this order
  std::string device;
  std::uint32_t kv_pages = 1024;  // every model's KV cache
  std::uint32_t page_size = 16;
  std::uint64_t block_mib = 0;  // the buffer pool's block size; 0: gpu::default_block_size, capped by the ceiling
  std::uint64_t ceiling_bytes = 0;   // the memory ceiling (as the enforcer's), to size the blocks by
  double ceiling_fraction = 0.0;     // or the ceiling as a fraction of the device's memory
  std::set<std::uint64_t> fail_steps;  // GPU steps (counted from 1) that fail on purpose
  std::string fail_release;            // the model whose release throws midway, on purpose
  std::string cache_writer;            // where evicted prefix pages go; "": nowhere
  std::uint64_t spill_piece_pages = 0;  // pages a spill's copy takes at most; 0: half a pool block's worth
  std::uint64_t log_steps_over_ms = 0;  // profile every step, log those slower than this; 0: off
  int warm_up = -1;  // run every batch shape once at load (1), or not (0); -1: on a discrete GPU
  std::filesystem::path pipeline_cache;  // read at start, written after each load; "": none
  // Threads beside the executor's that walk constrained rows' masks (grammar::MaskWorkers); -1:
  // MaskWorkers::default_threads(), 0: the executor's thread alone.
  int mask_threads = -1;
};

// Throws std::invalid_argument naming a missing, unknown or malformed option.
ExecutorOptions parse_executor_options(const ActorOptions& options);

// "a, b, c", or "none" for no ids: how messages and logs list models.
std::string joined_ids(const std::vector<std::string_view>& ids);
// The configured models' ids, as joined_ids lists them.
std::string configured_ids(const ExecutorOptions& options);

}  // namespace mqlm::actors
