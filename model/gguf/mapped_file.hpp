// A whole file mapped read-only into memory: the mapping lives exactly as long as the object.
#pragma once

#include <cstddef>
#include <filesystem>
#include <span>
#include <string>
#include <variant>

namespace mqlm::model::gguf {

class MappedFile {
 public:
  // The error is a sentence for the user (what failed, on which path, and the system's reason).
  static std::variant<MappedFile, std::string> open(const std::filesystem::path& path);

  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  std::span<const std::byte> bytes() const { return {data_, size_}; }

 private:
  MappedFile(const std::byte* data, std::size_t size) : data_(data), size_(size) {}
  void unmap();

  const std::byte* data_ = nullptr;  // nullptr for an empty file (nothing to map)
  std::size_t size_ = 0;
};

}  // namespace mqlm::model::gguf
