// The executor: the one actor that touches the GPU. It owns the Vulkan device, the loaded model,
// its paged KV cache and the buffer pool, and keeps a sampler per sequence between steps. It
// answers the scheduler's StepPlan with a StepResult (one sampled token per sequence that asked
// for output, or an error that fails the step's sequences) and ExecutorQuery with an
// ExecutorReport (the model's shape, the pool's figures). Everything else (which tokens at
// which positions, which cache pages) comes in each plan, and is checked as input from another
// process: a bad plan is answered with an error, never a crash.
//
// Options (ActorOptions, as `mqlm node` passes them):
//   model=PATH       the GGUF file (required)
//   name=NAME        the model's name in plans and reports (default: the file name without .gguf)
//   device=SEL       Vulkan device index or name substring (default: as gpu::DeviceOptions picks)
//   kv_pages=N       pages in the KV cache (default 1024)
//   page_size=N      tokens per page (default 16)
//   fail_steps=A,B   fault injection for tests: the A-th and B-th plans that reach the GPU with
//                    sequences fail as if the GPU step had thrown (counted from 1; plans refused
//                    by validation do not count)
//
// Construction only parses the options; on_start opens the file, creates the device and uploads
// the weights (seconds for a real model), and throws what went wrong.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>

#include "actors/actor.hpp"
#include "actors/actor_options.hpp"

namespace mqlm::actors {

// Throws std::invalid_argument naming a missing, unknown or malformed option.
std::unique_ptr<Actor> make_executor(const ActorOptions& options);

// How long after the last trim a step that releases sequences trims the pool again, given the
// sequences held when it began: 2 s for one, 100 ms from 64 on, geometric in between.
std::chrono::milliseconds trim_interval(std::size_t slots);

}  // namespace mqlm::actors
