#include "actors/executor/pipeline_cache.hpp"

#include <fstream>
#include <system_error>

#include <spdlog/spdlog.h>

namespace mqlm::actors {

std::vector<std::uint8_t> read_pipeline_cache(const std::filesystem::path& path) {
  constexpr std::uintmax_t kMaxBytes = std::uintmax_t{1} << 30;
  std::error_code ec;
  if (path.empty() || !std::filesystem::exists(path, ec)) return {};
  const std::uintmax_t size = std::filesystem::file_size(path, ec);
  if (ec || size > kMaxBytes) {
    spdlog::warn("executor: pipeline cache {} not read ({})", path.string(), ec ? ec.message() : "larger than 1 GiB");
    return {};
  }
  std::vector<std::uint8_t> data(size);
  std::ifstream in(path, std::ios::binary);
  if (!in.read(reinterpret_cast<char*>(data.data()), static_cast<std::streamsize>(size))) {
    spdlog::warn("executor: pipeline cache {} could not be read", path.string());
    return {};
  }
  return data;
}

void write_pipeline_cache(const std::filesystem::path& path, const std::vector<std::uint8_t>& data) {
  std::filesystem::path partial = path;
  partial += ".partial";
  {
    std::ofstream out(partial, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
    out.flush();
    if (!out) {
      std::error_code ignored;
      std::filesystem::remove(partial, ignored);
      spdlog::warn("executor: could not write the pipeline cache to {}", partial.string());
      return;
    }
  }
  std::error_code ec;
  std::filesystem::rename(partial, path, ec);
  if (ec) spdlog::warn("executor: could not put the pipeline cache in place at {}: {}", path.string(), ec.message());
}

}  // namespace mqlm::actors
