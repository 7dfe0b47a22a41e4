// Where the driver keeps the elements of cooperative-matrix fragments. GL_NV_cooperative_matrix
// leaves it to the implementation; the direct matmul (shaders/mul_mm_direct.comp) builds its
// fragments element by element, so it runs only where a probe (shaders/coopmat_layout.comp) found
// the layout it builds them in: the one NVIDIA's driver uses for 16x16x16 and 16x8x16 F16 tiles
// (H100, driver 580). Invocation l = 4 g + t of a subgroup holds
//   A (16 x 16, M x K), element e:  row g + 8 [e >= 4],      column 2t + e % 2 + 8 [e / 2 odd]
//   B (16 x 8,  K x N), element e:  row g + 8 [e >= 2],      column 2t + e % 2
//   accumulator (16 x 8, F32):      row g + 8 [e >= 2],      column 2t + e % 2
// (A and the accumulator as the PTX mma.m16n8k16 instruction holds them, in another order for A; B
// row-major like the accumulator, where mma holds it column-major.)
#pragma once

#include <cstddef>
#include <span>
#include <string>

#include "gpu/buffer_pool.hpp"
#include "gpu/compute_queue.hpp"
#include "gpu/kernel_library.hpp"

namespace mqlm::gpu {

// The probe's output (515 floats: A's 8 elements an invocation, B's 4, the accumulator's 4, then
// the three lengths), each element its row-major index in its matrix. "" when every element sits
// where the direct matmul expects it; otherwise the first difference, in words.
std::string fragment_layout_problem(std::span<const float> probe);
inline constexpr std::size_t fragment_probe_floats = 515;

// Runs the probe on the library's device (once: later calls return the recorded answer) and records
// in `lib` whether the direct matmul may run there (KernelLibrary::direct_fragments). False, without
// running anything, on devices without 16x8x16 F16 cooperative matrices in subgroups of 32.
bool probe_fragment_layout(KernelLibrary& lib, ComputeQueue& queue, BufferPool& pool);

}  // namespace mqlm::gpu
