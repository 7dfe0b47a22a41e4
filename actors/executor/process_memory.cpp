#include "actors/executor/process_memory.hpp"

#include <fstream>

#include <unistd.h>

namespace mqlm::actors {

std::uint64_t resident_set_bytes() {
  // statm counts pages: total program size, then resident, then more we do not need.
  std::ifstream statm("/proc/self/statm");
  std::uint64_t size_pages = 0, resident_pages = 0;
  if (!(statm >> size_pages >> resident_pages)) return 0;
  const long page_bytes = sysconf(_SC_PAGESIZE);
  return page_bytes > 0 ? resident_pages * static_cast<std::uint64_t>(page_bytes) : 0;
}

}  // namespace mqlm::actors
