#include "actors/cache_writer/ssd_store.hpp"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace mqlm::actors {
namespace {

namespace fs = std::filesystem;
using ReadStatus = SsdStore::ReadStatus;

constexpr std::uint32_t kPageSize = 16;
// The file layout the damage tests aim at: the fixed header part is 56 bytes, then the model id.
constexpr std::size_t kFixedHeaderBytes = 56;
constexpr std::size_t kDataBytesField = 48;  // offset of data_bytes in the header
const std::string kModel = "llama-test";

StoredPage make_page(std::uint64_t key, std::uint64_t parent = 0) {
  StoredPage page;
  page.model = kModel;
  page.model_key = 0xfeedface;
  page.key = key;
  page.parent = parent;
  page.page_size = kPageSize;
  for (std::uint32_t i = 0; i < kPageSize; ++i) page.tokens.push_back(static_cast<std::int32_t>(key * 31 + i));
  return page;
}

std::vector<std::byte> make_data(std::size_t bytes, unsigned seed) {
  std::vector<std::byte> data(bytes);
  for (std::size_t i = 0; i < bytes; ++i) data[i] = static_cast<std::byte>((i * 131 + seed * 7) & 0xff);
  return data;
}

void expect_same_page(const StoredPage& got, const StoredPage& want, std::uint64_t data_bytes) {
  EXPECT_EQ(got.model, want.model);
  EXPECT_EQ(got.model_key, want.model_key);
  EXPECT_EQ(got.key, want.key);
  EXPECT_EQ(got.parent, want.parent);
  EXPECT_EQ(got.page_size, want.page_size);
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_EQ(got.data_bytes, data_bytes);
}

// Every file in the directory, sorted by name.
std::vector<std::string> file_names(const fs::path& directory) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(directory)) names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

void flip_byte(const fs::path& path, std::size_t offset) {
  std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
  file.seekg(static_cast<std::streamoff>(offset));
  char byte = 0;
  file.read(&byte, 1);
  byte = static_cast<char>(~byte);
  file.seekp(static_cast<std::streamoff>(offset));
  file.write(&byte, 1);
  ASSERT_TRUE(file.good()) << path;
}

void overwrite(const fs::path& path, std::size_t offset, std::uint64_t value) {
  std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
  file.seekp(static_cast<std::streamoff>(offset));
  file.write(reinterpret_cast<const char*>(&value), sizeof(value));
  ASSERT_TRUE(file.good()) << path;
}

class SsdStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string test = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    directory_ = fs::temp_directory_path() / ("mqlm_ssd_store_" + std::to_string(::getpid()) + "_" + test);
    fs::remove_all(directory_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::permissions(directory_, fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(directory_, ec);
  }

  fs::path directory_;
};

TEST_F(SsdStoreTest, WriteThenReadReturnsTheSamePage) {
  SsdStore store(directory_ / "nested", 1 << 20);
  EXPECT_TRUE(fs::is_directory(directory_ / "nested"));
  EXPECT_EQ(store.pages(), 0u);
  const std::vector<std::uint64_t> keys = {0x0123456789abcdef, 2, 3};
  std::uint64_t total = 0;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    auto data = make_data(10000 + i * 1000, static_cast<unsigned>(i));
    auto written = store.write(make_page(keys[i], i == 0 ? 0 : keys[i - 1]), data);
    ASSERT_TRUE(written.ok) << written.error;
    EXPECT_EQ(written.file_bytes, fs::file_size(store.page_path(keys[i])));
    EXPECT_EQ(written.evicted_pages, 0u);
    total += written.file_bytes;
  }
  EXPECT_EQ(file_names(directory_ / "nested"),
            (std::vector<std::string>{"0000000000000002.kvpage", "0000000000000003.kvpage", "0123456789abcdef.kvpage"}));
  EXPECT_EQ(store.pages(), 3u);
  EXPECT_EQ(store.bytes(), total);
  for (std::size_t i = 0; i < keys.size(); ++i) {
    SCOPED_TRACE(i);
    const StoredPage want = make_page(keys[i], i == 0 ? 0 : keys[i - 1]);
    const auto data = make_data(10000 + i * 1000, static_cast<unsigned>(i));
    EXPECT_TRUE(store.contains(keys[i]));
    ASSERT_NE(store.find(keys[i]), nullptr);
    expect_same_page(*store.find(keys[i]), want, data.size());
    auto read = store.read(keys[i]);
    ASSERT_EQ(read.status, ReadStatus::ok) << read.error;
    expect_same_page(read.page, want, data.size());
    EXPECT_EQ(read.data, data);
  }
  EXPECT_FALSE(store.contains(99));
  EXPECT_EQ(store.find(99), nullptr);
  EXPECT_EQ(store.read(99).status, ReadStatus::missing);
}

TEST_F(SsdStoreTest, ReplacingAKeyKeepsOneFile) {
  SsdStore store(directory_, 1 << 20);
  ASSERT_TRUE(store.write(make_page(7), make_data(5000, 1)).ok);
  auto second = store.write(make_page(7), make_data(3000, 2));
  ASSERT_TRUE(second.ok) << second.error;
  EXPECT_EQ(store.pages(), 1u);
  EXPECT_EQ(store.bytes(), second.file_bytes);
  auto read = store.read(7);
  ASSERT_EQ(read.status, ReadStatus::ok) << read.error;
  EXPECT_EQ(read.data, make_data(3000, 2));
}

TEST_F(SsdStoreTest, RestartFindsThePages) {
  std::uint64_t bytes = 0;
  {
    SsdStore store(directory_, 1 << 20);
    for (std::uint64_t key = 1; key <= 3; ++key) ASSERT_TRUE(store.write(make_page(key), make_data(4096 * key, 3)).ok);
    bytes = store.bytes();
  }
  // A write a crash interrupted, and a file that is not the store's.
  std::ofstream(directory_ / "0000000000000009.tmp") << "half a page";
  std::ofstream(directory_ / "notes.txt") << "not a page";

  SsdStore store(directory_, 1 << 20);
  EXPECT_EQ(store.pages(), 3u);
  EXPECT_EQ(store.bytes(), bytes);
  EXPECT_FALSE(fs::exists(directory_ / "0000000000000009.tmp"));
  EXPECT_TRUE(fs::exists(directory_ / "notes.txt"));
  for (std::uint64_t key = 1; key <= 3; ++key) {
    ASSERT_NE(store.find(key), nullptr);
    expect_same_page(*store.find(key), make_page(key), 4096 * key);
    auto read = store.read(key);
    ASSERT_EQ(read.status, ReadStatus::ok) << read.error;
    EXPECT_EQ(read.data, make_data(4096 * key, 3));
  }
}

struct Damage {
  const char* name;
  bool found_at_scan;  // a restart's header scan notices it (otherwise only the hash does)
  void (*apply)(const fs::path& path);
};

const Damage kDamages[] = {
    {"truncated", true, [](const fs::path& p) { fs::resize_file(p, fs::file_size(p) - 5); }},
    {"zero length", true, [](const fs::path& p) { fs::resize_file(p, 0); }},
    {"flipped data byte", false, [](const fs::path& p) { flip_byte(p, fs::file_size(p) - 100); }},
    {"flipped token byte in the header", false,
     [](const fs::path& p) { flip_byte(p, kFixedHeaderBytes + kModel.size() + 5); }},
    {"flipped magic", true, [](const fs::path& p) { flip_byte(p, 2); }},
    {"huge data size in the header", true, [](const fs::path& p) { overwrite(p, kDataBytesField, ~std::uint64_t{0} >> 1); }},
};

TEST_F(SsdStoreTest, DamagedFilesAreCorruptOnRead) {
  SsdStore store(directory_, 1 << 20);
  std::uint64_t key = 100;
  for (const Damage& damage : kDamages) {
    SCOPED_TRACE(damage.name);
    ++key;
    ASSERT_TRUE(store.write(make_page(key), make_data(4096, 5)).ok);
    damage.apply(store.page_path(key));
    auto read = store.read(key);
    EXPECT_EQ(read.status, ReadStatus::corrupt);
    EXPECT_NE(read.error.find(store.page_path(key).string()), std::string::npos) << read.error;
    EXPECT_TRUE(read.data.empty());
    EXPECT_FALSE(fs::exists(store.page_path(key)));
    EXPECT_FALSE(store.contains(key));
    EXPECT_EQ(store.pages(), 0u);
    EXPECT_EQ(store.bytes(), 0u);
  }
}

// A run read on several threads answers as reads one after the other would: every page up to the
// first that is missing or damaged (that one included), the damaged file deleted, the pages after
// it untouched.
TEST_F(SsdStoreTest, ARunReadOnSeveralThreadsEndsAtItsFirstBadPage) {
  SsdStore store(directory_, 1 << 22);
  std::vector<std::uint64_t> keys;
  for (std::uint64_t key = 1; key <= 12; ++key) {
    keys.push_back(key);
    ASSERT_TRUE(store.write(make_page(key, key - 1), make_data(4096 + key, static_cast<unsigned>(key))).ok);
  }
  auto whole = store.read_run(keys, 4);
  ASSERT_EQ(whole.size(), keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) {
    ASSERT_EQ(whole[i].status, ReadStatus::ok);
    EXPECT_EQ(whole[i].data, make_data(4096 + keys[i], static_cast<unsigned>(keys[i])));
  }
  std::vector<std::uint64_t> longer = keys;
  longer.push_back(99);  // not stored
  auto missing = store.read_run(longer, 4);
  ASSERT_EQ(missing.size(), longer.size());
  EXPECT_EQ(missing.back().status, ReadStatus::missing);

  kDamages[0].apply(store.page_path(6));
  auto cut = store.read_run(keys, 4);
  ASSERT_EQ(cut.size(), 6u);
  EXPECT_EQ(cut[4].status, ReadStatus::ok);
  EXPECT_EQ(cut[5].status, ReadStatus::corrupt);
  EXPECT_FALSE(store.contains(6));
  EXPECT_FALSE(fs::exists(store.page_path(6)));
  for (std::uint64_t key = 7; key <= 12; ++key) EXPECT_EQ(store.read(key).status, ReadStatus::ok) << key;
}

TEST_F(SsdStoreTest, DamagedFilesAreDroppedAfterRestart) {
  std::uint64_t key = 100;
  for (const Damage& damage : kDamages) {
    SCOPED_TRACE(damage.name);
    ++key;
    {
      SsdStore store(directory_, 1 << 20);
      ASSERT_TRUE(store.write(make_page(key), make_data(4096, 5)).ok);
      damage.apply(store.page_path(key));
    }
    SsdStore store(directory_, 1 << 20);
    if (damage.found_at_scan) {
      EXPECT_FALSE(store.contains(key));
    } else {
      ASSERT_TRUE(store.contains(key));
      EXPECT_EQ(store.read(key).status, ReadStatus::corrupt);
      EXPECT_FALSE(store.contains(key));
    }
    EXPECT_FALSE(fs::exists(store.page_path(key)));
    EXPECT_EQ(store.bytes(), 0u);
  }
}

TEST_F(SsdStoreTest, AFileUnderAnotherKeysNameIsDroppedAtScan) {
  fs::path wrong;
  {
    SsdStore store(directory_, 1 << 20);
    ASSERT_TRUE(store.write(make_page(1), make_data(100, 1)).ok);
    wrong = store.page_path(2);
    fs::rename(store.page_path(1), wrong);
  }
  SsdStore store(directory_, 1 << 20);
  EXPECT_EQ(store.pages(), 0u);
  EXPECT_FALSE(fs::exists(wrong));
}

TEST_F(SsdStoreTest, EvictsTheLeastRecentlyUsed) {
  const auto data = make_data(4096, 9);
  const std::uint64_t file_bytes = SsdStore(directory_, 1 << 20).write(make_page(1), data).file_bytes;
  SsdStore store(directory_, 3 * file_bytes + 100);  // room for three pages
  ASSERT_EQ(store.pages(), 1u);
  ASSERT_TRUE(store.write(make_page(2), data).ok);
  ASSERT_TRUE(store.write(make_page(3), data).ok);
  ASSERT_EQ(store.read(1).status, ReadStatus::ok);  // 2 is now the least recently used

  auto fourth = store.write(make_page(4), data);
  ASSERT_TRUE(fourth.ok) << fourth.error;
  EXPECT_EQ(fourth.evicted_pages, 1u);
  EXPECT_EQ(fourth.evicted_bytes, file_bytes);
  EXPECT_FALSE(store.contains(2));
  EXPECT_FALSE(fs::exists(store.page_path(2)));
  EXPECT_TRUE(store.contains(1));
  EXPECT_LE(store.bytes(), store.max_bytes());

  // Replacing a stored key in a full tier evicts nothing: its old file makes the room.
  auto replaced = store.write(make_page(3), data);
  ASSERT_TRUE(replaced.ok) << replaced.error;
  EXPECT_EQ(replaced.evicted_pages, 0u);
  EXPECT_EQ(store.pages(), 3u);

  // Twice the size: two go, least recently used first (1, then 4; 3 was just written).
  auto big = store.write(make_page(5), make_data(2 * 4096, 9));
  ASSERT_TRUE(big.ok) << big.error;
  EXPECT_EQ(big.evicted_pages, 2u);
  EXPECT_TRUE(store.contains(3));
  EXPECT_TRUE(store.contains(5));
  EXPECT_LE(store.bytes(), store.max_bytes());
  EXPECT_EQ(file_names(directory_), (std::vector<std::string>{"0000000000000003.kvpage", "0000000000000005.kvpage"}));
}

TEST_F(SsdStoreTest, RestartOrdersByModificationTimeAndHonoursASmallerLimit) {
  const auto data = make_data(4096, 4);
  std::uint64_t file_bytes = 0;
  {
    SsdStore store(directory_, 1 << 20);
    for (std::uint64_t key = 1; key <= 4; ++key) file_bytes = store.write(make_page(key), data).file_bytes;
    // Oldest first: 3, 1, 4, 2.
    const auto now = fs::file_time_type::clock::now();
    const std::uint64_t order[] = {3, 1, 4, 2};
    for (int i = 0; i < 4; ++i) fs::last_write_time(store.page_path(order[i]), now - std::chrono::hours(4 - i));
  }
  SsdStore store(directory_, 2 * file_bytes);
  EXPECT_EQ(store.pages(), 2u);
  EXPECT_TRUE(store.contains(4));
  EXPECT_TRUE(store.contains(2));
  EXPECT_LE(store.bytes(), store.max_bytes());
  EXPECT_EQ(file_names(directory_), (std::vector<std::string>{"0000000000000002.kvpage", "0000000000000004.kvpage"}));
}

TEST_F(SsdStoreTest, RefusesAPageLargerThanTheTier) {
  SsdStore store(directory_, 8192);
  auto written = store.write(make_page(1), make_data(16384, 1));
  EXPECT_FALSE(written.ok);
  EXPECT_FALSE(written.error.empty());
  EXPECT_EQ(store.pages(), 0u);
  EXPECT_TRUE(file_names(directory_).empty());

  StoredPage long_name = make_page(2);
  long_name.model.assign(300, 'm');
  written = store.write(long_name, make_data(10, 1));
  EXPECT_FALSE(written.ok);
  EXPECT_TRUE(file_names(directory_).empty());
}

// The child process exits with the number of the first check that failed (0: all passed), so that
// the file-size limit and the ignored SIGXFSZ never touch the test runner itself.
int write_past_the_file_size_limit(const fs::path& directory) {
  rlimit limit{};
  if (::getrlimit(RLIMIT_FSIZE, &limit) != 0) return 1;
  limit.rlim_cur = 64 * 1024;
  if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) return 2;
  ::signal(SIGXFSZ, SIG_IGN);
  SsdStore store(directory, 16 << 20);
  auto written = store.write(make_page(1), make_data(1 << 20, 1));
  std::fprintf(stderr, "expected failure: %s\n", written.error.c_str());
  if (written.ok) return 3;
  if (written.error.find("File too large") == std::string::npos) return 4;
  if (written.error.find(directory.string()) == std::string::npos) return 5;
  if (!file_names(directory).empty() || store.pages() != 0 || store.bytes() != 0) return 6;
  written = store.write(make_page(2), make_data(4096, 2));
  if (!written.ok) return 7;
  auto read = store.read(2);
  if (read.status != SsdStore::ReadStatus::ok || read.data != make_data(4096, 2)) return 8;
  return 0;
}

TEST_F(SsdStoreTest, DiskFullFailsCleanly) {
  fs::create_directories(directory_);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    int code = 99;
    try {
      code = write_past_the_file_size_limit(directory_);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "threw: %s\n", e.what());
    }
    std::fflush(stderr);
    ::_exit(code);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << "the child died of signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the check that failed, numbered in write_past_the_file_size_limit";
  EXPECT_EQ(file_names(directory_), std::vector<std::string>{"0000000000000002.kvpage"});
}

TEST_F(SsdStoreTest, UnwritableDirectoryFailsWithoutThrowing) {
  if (::geteuid() == 0) GTEST_SKIP() << "root ignores directory permissions";
  SsdStore store(directory_, 3 * 5000);
  ASSERT_TRUE(store.write(make_page(1), make_data(4096, 1)).ok);
  ASSERT_TRUE(store.write(make_page(2), make_data(4096, 1)).ok);
  fs::permissions(directory_, fs::perms::owner_read | fs::perms::owner_exec);

  SsdStore::WriteResult written;
  EXPECT_NO_THROW(written = store.write(make_page(3), make_data(1000, 1)));
  EXPECT_FALSE(written.ok);
  EXPECT_NE(written.error.find("Permission denied"), std::string::npos) << written.error;
  // Full: making room means deleting, which fails too, and the page that could not go stays.
  EXPECT_NO_THROW(written = store.write(make_page(4), make_data(8000, 1)));
  EXPECT_FALSE(written.ok);
  EXPECT_NE(written.error.find("Permission denied"), std::string::npos) << written.error;
  EXPECT_EQ(store.pages(), 2u);
  EXPECT_EQ(store.read(1).status, ReadStatus::ok);
  EXPECT_EQ(file_names(directory_), (std::vector<std::string>{"0000000000000001.kvpage", "0000000000000002.kvpage"}));
}

TEST_F(SsdStoreTest, ClearReleasesEveryFile) {
  SsdStore store(directory_, 1 << 20);
  std::uint64_t sizes = 0;
  for (std::uint64_t key = 1; key <= 4; ++key) {
    ASSERT_TRUE(store.write(make_page(key), make_data(1000 * key + 7, 1)).ok);
    sizes += fs::file_size(store.page_path(key));
  }
  std::ofstream(directory_ / "notes.txt") << "not a page";
  EXPECT_EQ(store.clear(), sizes);
  EXPECT_EQ(store.pages(), 0u);
  EXPECT_EQ(store.bytes(), 0u);
  EXPECT_EQ(file_names(directory_), std::vector<std::string>{"notes.txt"});
  EXPECT_TRUE(store.write(make_page(1), make_data(10, 1)).ok);  // still usable
}

TEST_F(SsdStoreTest, ADirectoryThatCannotBeCreatedThrows) {
  fs::create_directories(directory_);
  std::ofstream(directory_ / "a_file") << "x";
  try {
    SsdStore store(directory_ / "a_file" / "cache", 1 << 20);
    FAIL() << "expected std::runtime_error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("a_file"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace mqlm::actors
