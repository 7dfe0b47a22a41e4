#include "gpu/fragment_layout.hpp"

#include <cstdint>
#include <exception>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "gpu/transfer.hpp"
#include "gpu/weight_formats.hpp"

namespace mqlm::gpu {

namespace {

// Element e of invocation l = 4 g + t, as a row-major index (the layout in fragment_layout.hpp).
std::uint32_t a_index(std::uint32_t l, std::uint32_t e) {  // 16 x 16, A: M x K
  const std::uint32_t g = l / 4, t = l % 4;
  return (g + 8 * (e >> 2)) * 16 + 2 * t + (e & 1u) + 8 * ((e >> 1) & 1u);
}
// B (16 x 8, K x N) and the accumulator (16 x 8, M x N) alike.
std::uint32_t b_or_c_index(std::uint32_t l, std::uint32_t e) {
  const std::uint32_t g = l / 4, t = l % 4;
  return (g + 8 * (e >> 1)) * 8 + 2 * t + (e & 1u);
}

}  // namespace

std::string fragment_layout_problem(std::span<const float> probe) {
  if (probe.size() < fragment_probe_floats) return fmt::format("{} probe values, not {}", probe.size(), fragment_probe_floats);
  if (probe[512] != 8 || probe[513] != 4 || probe[514] != 4) {
    return fmt::format("fragments of {}, {} and {} elements an invocation, not 8, 4 and 4", probe[512], probe[513],
                       probe[514]);
  }
  struct Part {
    const char* name;
    std::size_t at;
    std::uint32_t elements;
    std::uint32_t (*index)(std::uint32_t, std::uint32_t);
  };
  for (const Part& part : {Part{"A", 0, 8, a_index}, Part{"B", 256, 4, b_or_c_index},
                          Part{"the accumulator", 384, 4, b_or_c_index}}) {
    for (std::uint32_t l = 0; l < 32; ++l) {
      for (std::uint32_t e = 0; e < part.elements; ++e) {
        const float got = probe[part.at + l * part.elements + e];
        if (got != float(part.index(l, e))) {
          return fmt::format("{}: invocation {} holds element {} as its element {}, not {}", part.name, l, got, e,
                             part.index(l, e));
        }
      }
    }
  }
  return "";
}

bool probe_fragment_layout(KernelLibrary& lib, ComputeQueue& queue, BufferPool& pool) {
  if (auto known = lib.direct_fragments()) return *known;
  const DeviceFeatures& features = lib.device().features();
  if (!features.cooperative_matrix_16x8 || features.subgroup_size != 32) {
    lib.set_direct_fragments(false);
    return false;
  }
  std::vector<std::uint16_t> src16(256);
  std::vector<float> src32(128);
  for (std::uint32_t i = 0; i < 256; ++i) src16[i] = float_to_half(float(i));
  for (std::uint32_t i = 0; i < 128; ++i) src32[i] = float(i);
  std::string problem;
  try {
    PoolBuffer a = upload_new<std::uint16_t>(queue, pool, src16, "scratch");
    PoolBuffer c = upload_new<float>(queue, pool, src32, "scratch");
    PoolBuffer out = pool.allocate(fragment_probe_floats * 4, "scratch");
    Recording rec = queue.begin();
    rec.dispatch(lib.get({"coopmat_layout", 3, 0, {}, 32}), {a.range(), c.range(), out.range()},
                 static_cast<const void*>(nullptr), 1);
    queue.submit_and_wait(rec);
    problem = fragment_layout_problem(download<float>(queue, pool, out, fragment_probe_floats));
  } catch (const std::exception& e) {  // a driver that cannot run the probe: the staged kernel, not a failed load
    problem = fmt::format("the probe failed: {}", e.what());
  }
  if (!problem.empty()) {
    spdlog::info("cooperative-matrix fragments are laid out otherwise than the direct matmul builds them ({}): it stays off",
                 problem);
  }
  lib.set_direct_fragments(problem.empty());
  return problem.empty();
}

}  // namespace mqlm::gpu
