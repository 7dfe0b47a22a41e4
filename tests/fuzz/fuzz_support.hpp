// What the fuzz targets and their seeders share: how a target reports a broken contract, and how
// a seeder writes its corpus.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string_view>

namespace mqlm::fuzz {

// A broken contract is a finding like a crash: abort, so libFuzzer keeps the input.
[[noreturn]] inline void contract_broken(std::string_view target, std::string_view what) {
  std::fprintf(stderr, "%.*s contract broken: %.*s\n", static_cast<int>(target.size()), target.data(),
               static_cast<int>(what.size()), what.data());
  std::abort();
}

// A seeder's corpus folder, from its one argument (created); empty after a usage message.
inline std::filesystem::path seed_dir(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s SEED_DIR\n", argv[0]);
    return {};
  }
  std::filesystem::create_directories(argv[1]);
  return argv[1];
}

// Writes one seed file; false (after saying so) when it cannot.
inline bool write_seed(const std::filesystem::path& dir, std::string_view name, std::string_view bytes) {
  const std::filesystem::path path = dir / std::filesystem::path(name);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    return false;
  }
  return true;
}

}  // namespace mqlm::fuzz
