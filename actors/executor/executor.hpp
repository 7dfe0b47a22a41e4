// The executor: the one actor that touches the GPU. It owns the Vulkan device, the buffer pool
// and the kernels, the models loaded on them (each with its weights and its own paged KV cache
// in the shared pool), and keeps a sampler per sequence between steps, remembering the model
// each sequence runs on.
//
// Messages:
//   StepPlan -> StepResult        one step of the plan's model (plan.model; empty means the only
//                                 loaded model): one sampled token per sequence that asked for
//                                 output (an embedding's, started with pooling: its pooled
//                                 vector), or an error that fails the step's sequences (internal,
//                                 naming the model, when it is not loaded). A plan with no starts
//                                 and no sequences only releases, whatever its model.
//   ExecutorQuery -> ExecutorReport  every loaded model's shape (none at all is a valid answer)
//                                 and the pool's figures.
//   LoadModel -> ModelLoaded      uploads a configured model (its path comes from the options,
//                                 never from the message), then trims the upload's staging memory.
//                                 Synchronous. Idempotent: an already loaded model answers ok with
//                                 its figures and load_ns 0. A failed load leaves nothing of it.
//   UnloadModel -> ModelUnloaded  drops the model's sequences, frees its KV cache and weights and
//                                 trims the pool, each part on its own: a part that fails is
//                                 logged and listed in problems, and the rest still goes.
// Everything else (which tokens at which positions, which cache pages) comes in each plan, and
// is checked as input from another process: a bad plan is answered with an error, never a crash.
//
// Options (ActorOptions, as `mqlm node` passes them):
//   model=PATH       one model: its GGUF file, loaded at start
//   name=ID          that model's id in plans and reports (default: the file name without .gguf)
//   models=ID=PATH;ID2=PATH2   instead of model=: the models LoadModel may load (ids not empty,
//                    without '=' or ';'); none is loaded at start unless preload= names it
//   preload=ID,ID2   the models loaded at start (default: the model of model=PATH; none with
//                    models=). An executor with no model loaded serves nothing until a LoadModel.
//   device=SEL       Vulkan device index or name substring (default: as gpu::DeviceOptions picks)
//   kv_pages=N       pages in each model's KV cache (default 1024)
//   page_size=N      tokens per page (default 16)
//   block_mib=N      the buffer pool's block size in MiB (default 256): memory goes back to the
//                    driver a whole block at a time, so smaller blocks give back more of an
//                    unloaded model whose last block another model shares
//   fail_steps=A,B   fault injection for tests: the A-th and B-th plans that reach the GPU with
//                    sequences fail as if the GPU step had thrown (counted from 1; plans refused
//                    by validation do not count)
//   fail_release=ID  fault injection for tests: unloading model ID throws after its KV cache is
//                    freed and before its weights are (which are freed all the same)
//
// In the pool, model ID's weights are owned by "weights:ID" and its KV cache by "kv:ID".
//
// Construction only parses the options; on_start creates the device and uploads the preloaded
// models (seconds for a real model), and throws what went wrong.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>

#include "actors/runtime/actor.hpp"
#include "actors/runtime/actor_options.hpp"

namespace mqlm::actors {

// Throws std::invalid_argument naming a missing, unknown or malformed option.
std::unique_ptr<Actor> make_executor(const ActorOptions& options);

// How long after the last trim a step that releases sequences trims the pool again, given the
// sequences held when it began: 2 s for one, 100 ms from 64 on, geometric in between.
std::chrono::milliseconds trim_interval(std::size_t slots);

}  // namespace mqlm::actors
