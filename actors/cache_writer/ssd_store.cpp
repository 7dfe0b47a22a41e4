#include "actors/cache_writer/ssd_store.hpp"

#include <atomic>
#include <thread>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <new>
#include <stdexcept>
#include <string_view>
#include <tuple>
#include <utility>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <xxhash.h>

namespace mqlm::actors {

namespace {

// A page file: the fixed part (magic through data_bytes), the model id, the tokens, the hash
// (XXH3-64 of everything before it, then of the data), then the data. Host byte order: the files
// never leave the machine that wrote them.
constexpr char kMagic[8] = {'M', 'Q', 'L', 'M', 'K', 'V', 'P', '1'};
constexpr std::uint32_t kVersion = 1;
constexpr std::size_t kFixedBytes = 8 + 4 + 4 + 8 + 8 + 8 + 4 + 4 + 8;
constexpr std::size_t kHashBytes = 8;
constexpr std::uint32_t kMaxModelBytes = 256;
constexpr std::string_view kPageSuffix = ".kvpage";
constexpr std::string_view kTemporarySuffix = ".tmp";

std::string system_error(const char* what, const std::filesystem::path& path, int error) {
  return fmt::format("cannot {} {}: {}", what, path.string(), std::strerror(error));
}

struct Descriptor {
  int fd;
  explicit Descriptor(int opened) : fd(opened) {}
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  ~Descriptor() {
    if (fd >= 0) ::close(fd);
  }
};

template <typename T>
void put(std::vector<std::byte>& out, const T& value) {
  auto bytes = std::as_bytes(std::span(&value, 1));
  out.insert(out.end(), bytes.begin(), bytes.end());
}

template <typename T>
T take(std::span<const std::byte>& in) {  // callers have checked there is room
  T value;
  std::memcpy(&value, in.data(), sizeof(T));
  in = in.subspan(sizeof(T));
  return value;
}

std::uint64_t page_hash(std::span<const std::byte> header, std::span<const std::byte> data) {
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> state(XXH3_createState(), &XXH3_freeState);
  if (!state) throw std::bad_alloc();
  XXH3_64bits_reset(state.get());
  XXH3_64bits_update(state.get(), header.data(), header.size());
  XXH3_64bits_update(state.get(), data.data(), data.size());
  return XXH3_64bits_digest(state.get());
}

// Everything before the hash.
std::vector<std::byte> encode_header(const StoredPage& page, std::uint64_t data_bytes) {
  std::vector<std::byte> out;
  out.reserve(kFixedBytes + page.model.size() + page.tokens.size() * sizeof(std::int32_t) + kHashBytes);
  put(out, kMagic);
  put(out, kVersion);
  put(out, static_cast<std::uint32_t>(page.model.size()));
  put(out, page.model_key);
  put(out, page.key);
  put(out, page.parent);
  put(out, page.page_size);
  put(out, static_cast<std::uint32_t>(page.tokens.size()));
  put(out, data_bytes);
  auto model = std::as_bytes(std::span(page.model));
  auto tokens = std::as_bytes(std::span(page.tokens));
  out.insert(out.end(), model.begin(), model.end());
  out.insert(out.end(), tokens.begin(), tokens.end());
  return out;
}

// Reads until `out` is full or the file ends; the count read, or -1 with errno set.
ssize_t read_full(int fd, std::span<std::byte> out) {
  std::size_t done = 0;
  while (done < out.size()) {
    ssize_t n = ::read(fd, out.data() + done, out.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return -1;
    if (n == 0) break;
    done += static_cast<std::size_t>(n);
  }
  return static_cast<ssize_t>(done);
}

// 0, or the errno of the first failed write; loops over short writes.
int write_full(int fd, std::span<const std::byte> bytes) {
  while (!bytes.empty()) {
    ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return n < 0 ? errno : EIO;
    bytes = bytes.subspan(static_cast<std::size_t>(n));
  }
  return 0;
}

struct Header {
  StoredPage page;
  std::vector<std::byte> bytes;  // everything before the hash, which it covers
  std::uint64_t hash = 0;
  std::string problem;  // why the header is unusable (the file is corrupt)
  int io_error = 0;     // reading it failed (the file may be fine)
};

// Reads the header of an open page file of `file_bytes` bytes. Every length in it is checked
// against the file's size before anything is allocated from it, so a hostile or truncated file
// costs at most the header's own bounded size.
Header read_header(int fd, std::uint64_t file_bytes) {
  Header h;
  auto fail = [&](std::string problem) {
    h.problem = std::move(problem);
    return std::move(h);
  };
  auto fill = [&](std::span<std::byte> out) {  // false (and why set) unless `out` was filled
    ssize_t n = read_full(fd, out);
    if (n < 0) h.io_error = errno;
    if (n >= 0 && static_cast<std::size_t>(n) < out.size()) h.problem = "the file ends inside its header";
    return h.io_error == 0 && h.problem.empty();
  };
  if (file_bytes < kFixedBytes + kHashBytes) return fail(fmt::format("{} bytes, shorter than a header", file_bytes));
  h.bytes.resize(kFixedBytes);
  if (!fill(h.bytes)) return h;
  std::span<const std::byte> in(h.bytes);
  if (std::memcmp(in.data(), kMagic, sizeof(kMagic)) != 0) return fail("not a page file (bad magic)");
  in = in.subspan(sizeof(kMagic));
  if (auto version = take<std::uint32_t>(in); version != kVersion) return fail(fmt::format("format version {}", version));
  auto model_bytes = take<std::uint32_t>(in);
  h.page.model_key = take<std::uint64_t>(in);
  h.page.key = take<std::uint64_t>(in);
  h.page.parent = take<std::uint64_t>(in);
  h.page.page_size = take<std::uint32_t>(in);
  auto token_count = take<std::uint32_t>(in);
  h.page.data_bytes = take<std::uint64_t>(in);
  if (model_bytes > kMaxModelBytes) return fail(fmt::format("a model id of {} bytes", model_bytes));
  // No overflow: both counts are 32-bit.
  const std::uint64_t header_bytes = kFixedBytes + model_bytes + std::uint64_t{token_count} * sizeof(std::int32_t) + kHashBytes;
  if (header_bytes > file_bytes || file_bytes - header_bytes != h.page.data_bytes) {
    return fail(fmt::format("the header says {} + {} bytes, the file has {}", header_bytes, h.page.data_bytes, file_bytes));
  }
  h.bytes.resize(header_bytes);
  if (!fill(std::span(h.bytes).subspan(kFixedBytes))) return h;
  in = std::span(h.bytes).subspan(kFixedBytes);
  h.page.model.assign(reinterpret_cast<const char*>(in.data()), model_bytes);
  in = in.subspan(model_bytes);
  h.page.tokens.resize(token_count);
  std::memcpy(h.page.tokens.data(), in.data(), token_count * sizeof(std::int32_t));
  in = in.subspan(token_count * sizeof(std::int32_t));
  h.hash = take<std::uint64_t>(in);
  h.bytes.resize(header_bytes - kHashBytes);
  return h;
}

}  // namespace

SsdStore::SsdStore(std::filesystem::path directory, std::uint64_t max_bytes)
    : directory_(std::move(directory)), max_bytes_(max_bytes) {
  scan();
}

std::filesystem::path SsdStore::page_path(std::uint64_t key) const {
  return directory_ / fmt::format("{:016x}{}", key, kPageSuffix);
}

const StoredPage* SsdStore::find(std::uint64_t key) const {
  auto it = index_.find(key);
  return it == index_.end() ? nullptr : &it->second.page;
}

void SsdStore::scan() {
  std::error_code ec;
  std::filesystem::create_directories(directory_, ec);
  if (ec) throw std::runtime_error(fmt::format("cannot create {}: {}", directory_.string(), ec.message()));
  // Names first, deletions after: unlinking while readdir walks the directory is best avoided.
  std::vector<std::filesystem::path> names;
  for (std::filesystem::directory_iterator it(directory_, ec), end; !ec && it != end; it.increment(ec)) {
    names.push_back(it->path());
  }
  if (ec) throw std::runtime_error(fmt::format("cannot list {}: {}", directory_.string(), ec.message()));

  struct Found {
    timespec mtime;
    StoredPage page;
    std::uint64_t file_bytes;
  };
  std::vector<Found> found;
  for (const auto& path : names) {
    const std::string name = path.filename().string();
    if (name.ends_with(kTemporarySuffix)) {  // a write that a crash interrupted
      ::unlink(path.c_str());
      continue;
    }
    if (!name.ends_with(kPageSuffix)) continue;  // not ours: leave it be
    Descriptor file(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    struct stat info {};
    if (file.fd < 0 || ::fstat(file.fd, &info) != 0 || !S_ISREG(info.st_mode)) continue;
    Header h = read_header(file.fd, static_cast<std::uint64_t>(info.st_size));
    if (h.problem.empty() && h.io_error == 0 && path != page_path(h.page.key)) {
      h.problem = fmt::format("holds the page {:016x}", h.page.key);
    }
    if (!h.problem.empty() || h.io_error != 0) {
      spdlog::warn("ssd cache: deleting {}: {}", path.string(), h.io_error != 0 ? std::strerror(h.io_error) : h.problem);
      ::unlink(path.c_str());
      continue;
    }
    found.push_back({info.st_mtim, std::move(h.page), static_cast<std::uint64_t>(info.st_size)});
  }
  std::sort(found.begin(), found.end(), [](const Found& a, const Found& b) {
    return std::tie(a.mtime.tv_sec, a.mtime.tv_nsec, a.page.key) < std::tie(b.mtime.tv_sec, b.mtime.tv_nsec, b.page.key);
  });
  for (auto& f : found) insert(std::move(f.page), f.file_bytes);
  // The limit may have shrunk since the files were written.
  while (bytes_ > max_bytes_) {
    const std::uint64_t oldest = recency_.front();
    ::unlink(page_path(oldest).c_str());
    forget(oldest);
  }
}

SsdStore::WriteResult SsdStore::write(const StoredPage& page, std::span<const std::byte> data) {
  WriteResult result;
  const std::filesystem::path path = page_path(page.key);
  if (page.model.size() > kMaxModelBytes) {
    result.error = fmt::format("cannot write {}: a model id of {} bytes (at most {})", path.string(), page.model.size(), kMaxModelBytes);
    return result;
  }
  std::vector<std::byte> header = encode_header(page, data.size());
  put(header, page_hash(header, data));
  result.file_bytes = header.size() + data.size();
  if (result.file_bytes > max_bytes_) {
    result.error = fmt::format("cannot write {}: {} bytes is more than the whole SSD tier ({})", path.string(), result.file_bytes, max_bytes_);
    return result;
  }

  // The old file of a key being replaced is no eviction candidate: the rename frees its bytes,
  // and a failed write leaves it in place.
  const bool replacing = contains(page.key);
  const std::uint64_t replaced = replacing ? index_.at(page.key).file_bytes : 0;
  for (auto it = recency_.begin(); bytes_ - replaced + result.file_bytes > max_bytes_;) {
    const std::uint64_t victim = *it++;  // advanced before forget() erases it
    if (victim == page.key) continue;
    const std::filesystem::path victim_path = page_path(victim);
    if (::unlink(victim_path.c_str()) != 0 && errno != ENOENT) {
      result.error = system_error("evict", victim_path, errno);
      return result;
    }
    ++result.evicted_pages;
    result.evicted_bytes += index_.at(victim).file_bytes;
    forget(victim);
  }

  // No fsync: this is a cache. After a power loss a torn or empty file fails its hash check on
  // read (or its header check at scan), is deleted and the page is recomputed, which costs less
  // than syncing every page.
  std::filesystem::path temporary = path;
  temporary.replace_extension(kTemporarySuffix);
  auto fail = [&](std::string error) {
    ::unlink(temporary.c_str());
    result.error = std::move(error);
    return result;
  };
  int error = 0;
  {
    Descriptor file(::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (file.fd < 0) return fail(system_error("create", temporary, errno));
    error = write_full(file.fd, header);
    if (error == 0) error = write_full(file.fd, data);
    // close() can report a delayed write error (NFS, quota), so its result counts too.
    if (::close(std::exchange(file.fd, -1)) != 0 && error == 0) error = errno;
  }
  if (error != 0) return fail(system_error("write", temporary, error));
  if (::rename(temporary.c_str(), path.c_str()) != 0) {
    error = errno;
    return fail(fmt::format("cannot rename {} to {}: {}", temporary.string(), path.string(), std::strerror(error)));
  }
  if (replacing) forget(page.key);
  StoredPage stored = page;
  stored.data_bytes = data.size();
  insert(std::move(stored), result.file_bytes);
  result.ok = true;
  return result;
}

// What reading one page's file found, before the index hears of it: touches only the file, so
// several run at once.
struct SsdStore::FileRead {
  enum class Outcome { ok, gone, corrupt, failed } outcome = Outcome::failed;
  StoredPage page;
  std::vector<std::byte> data;
  std::string error;
};

SsdStore::FileRead SsdStore::read_file(std::uint64_t key, std::uint64_t expected_bytes) const {
  FileRead read;
  const std::filesystem::path path = page_path(key);
  auto fail = [&](FileRead::Outcome outcome, std::string error) {
    read.outcome = outcome;
    read.error = std::move(error);
    read.data.clear();
    return std::move(read);
  };
  Descriptor file(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (file.fd < 0 && errno == ENOENT) return fail(FileRead::Outcome::gone, {});  // deleted behind our back
  if (file.fd < 0) return fail(FileRead::Outcome::failed, system_error("open", path, errno));
  struct stat info {};
  if (::fstat(file.fd, &info) != 0) return fail(FileRead::Outcome::failed, system_error("stat", path, errno));
  // Bounds the data allocation too: the index's size is at most max_bytes.
  const auto file_bytes = static_cast<std::uint64_t>(info.st_size);
  if (file_bytes != expected_bytes) {
    return fail(FileRead::Outcome::corrupt, fmt::format("{} bytes, {} when written", file_bytes, expected_bytes));
  }
  Header h = read_header(file.fd, file_bytes);
  if (h.io_error != 0) return fail(FileRead::Outcome::failed, system_error("read", path, h.io_error));
  if (!h.problem.empty()) return fail(FileRead::Outcome::corrupt, std::move(h.problem));
  if (h.page.key != key) return fail(FileRead::Outcome::corrupt, fmt::format("holds the page {:016x}", h.page.key));
  read.data.resize(h.page.data_bytes);
  ssize_t n = read_full(file.fd, read.data);
  if (n < 0) return fail(FileRead::Outcome::failed, system_error("read", path, errno));
  if (static_cast<std::uint64_t>(n) != h.page.data_bytes) return fail(FileRead::Outcome::corrupt, "the file ends inside its data");
  if (page_hash(h.bytes, read.data) != h.hash) return fail(FileRead::Outcome::corrupt, "hash mismatch");
  // Recency lives in memory and in the mtime, so that a restart's scan orders pages the same way
  // (best effort: a page that keeps an old mtime is only evicted sooner after a restart).
  ::futimens(file.fd, nullptr);
  read.outcome = FileRead::Outcome::ok;
  read.page = std::move(h.page);
  return read;
}

// What the index makes of a file read: a corrupt file is deleted and forgotten, a vanished one
// forgotten, a good one becomes the most recently used.
SsdStore::ReadResult SsdStore::settle(std::uint64_t key, FileRead read) {
  ReadResult result;
  switch (read.outcome) {
    case FileRead::Outcome::gone:
      forget(key);
      return result;
    case FileRead::Outcome::corrupt:
      return corrupt(key, std::move(read.error));
    case FileRead::Outcome::failed:
      result.status = ReadStatus::failed;
      result.error = std::move(read.error);
      return result;
    case FileRead::Outcome::ok:
      break;
  }
  auto entry = index_.find(key);
  if (entry != index_.end()) recency_.splice(recency_.end(), recency_, entry->second.recency);
  result.status = ReadStatus::ok;
  result.page = std::move(read.page);
  result.data = std::move(read.data);
  return result;
}

SsdStore::ReadResult SsdStore::read(std::uint64_t key) {
  auto entry = index_.find(key);
  if (entry == index_.end()) return {};
  return settle(key, read_file(key, entry->second.file_bytes));
}

std::vector<SsdStore::ReadResult> SsdStore::read_run(std::span<const std::uint64_t> keys, unsigned threads) {
  // The run the index has, from the first key: only those files are read.
  std::vector<std::uint64_t> expected;
  for (std::uint64_t key : keys) {
    auto entry = index_.find(key);
    if (entry == index_.end()) break;
    expected.push_back(entry->second.file_bytes);
  }
  std::vector<FileRead> reads(expected.size());
  std::atomic<std::size_t> next{0};
  auto work = [&] {
    for (std::size_t i = next++; i < reads.size(); i = next++) reads[i] = read_file(keys[i], expected[i]);
  };
  {
    std::vector<std::jthread> helpers;
    for (unsigned t = 1; t < std::min<std::size_t>(threads, reads.size()); ++t) helpers.emplace_back(work);
    work();
  }
  std::vector<ReadResult> results;
  for (std::size_t i = 0; i < reads.size(); ++i) {
    results.push_back(settle(keys[i], std::move(reads[i])));
    if (results.back().status != ReadStatus::ok) break;
  }
  // The files after the first that failed were read for nothing, but their pages are fine: they
  // stay in the index as they were.
  if (results.size() < keys.size() && (results.empty() || results.back().status == ReadStatus::ok)) {
    results.emplace_back();  // the first key the index lacks: missing
  }
  return results;
}

std::uint64_t SsdStore::clear() {
  std::uint64_t released = 0;
  for (auto it = recency_.begin(); it != recency_.end();) {
    const std::uint64_t key = *it++;
    const std::filesystem::path path = page_path(key);
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) {  // still there: still counted
      spdlog::warn("ssd cache: {}", system_error("delete", path, errno));
      continue;
    }
    released += index_.at(key).file_bytes;
    forget(key);
  }
  return released;
}

void SsdStore::insert(StoredPage page, std::uint64_t file_bytes) {
  const std::uint64_t key = page.key;
  recency_.push_back(key);
  index_.insert_or_assign(key, Entry{std::move(page), file_bytes, std::prev(recency_.end())});
  bytes_ += file_bytes;
}

void SsdStore::forget(std::uint64_t key) {
  auto it = index_.find(key);
  if (it == index_.end()) return;
  bytes_ -= it->second.file_bytes;
  recency_.erase(it->second.recency);
  index_.erase(it);
}

SsdStore::ReadResult SsdStore::corrupt(std::uint64_t key, std::string reason) {
  const std::filesystem::path path = page_path(key);
  spdlog::warn("ssd cache: deleting {}: {}", path.string(), reason);
  ::unlink(path.c_str());
  forget(key);
  ReadResult result;
  result.status = ReadStatus::corrupt;
  result.error = fmt::format("{}: {}", path.string(), reason);
  return result;
}

}  // namespace mqlm::actors
