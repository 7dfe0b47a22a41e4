#include "model/gguf/gguf_file.hpp"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <numeric>
#include <stdexcept>

#include <fmt/format.h>

namespace mqlm::model::gguf {

static_assert(std::endian::native == std::endian::little, "the GGUF reader maps little-endian files as they are");

namespace {

constexpr std::uint64_t kMaxDimension = std::numeric_limits<std::int64_t>::max();  // ggml's int64 sizes

// Names and keys come from the file: show them printable and bounded.
std::string printable(std::string_view text) {
  std::string out = "'";
  for (std::size_t i = 0; i < text.size() && i < 80; ++i) {
    auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x20 || c == 0x7F || c == '\'' || c == '\\') {
      out += fmt::format("\\x{:02x}", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  if (text.size() > 80) out += "...";
  return out + "'";
}

// The minimum bytes one array element of this type takes in the file.
std::uint64_t min_element_bytes(ValueType type) {
  switch (type) {
    case ValueType::u8:
    case ValueType::i8:
    case ValueType::boolean: return 1;
    case ValueType::u16:
    case ValueType::i16: return 2;
    case ValueType::u32:
    case ValueType::i32:
    case ValueType::f32: return 4;
    case ValueType::string:
    case ValueType::u64:
    case ValueType::i64:
    case ValueType::f64: return 8;
    case ValueType::array: return 12;  // element type and count
  }
  return 1;
}

std::string describe(const MetadataValue& value) {
  if (const auto* array = std::get_if<MetadataArray>(&value)) {
    return fmt::format("an array of {}", value_type_name(array->element_type()));
  }
  return fmt::format("a {}", value_type_name(type_of(value)));
}

}  // namespace

// One pass over the bytes, front to back; the first failure stops it and is the result.
class GgufParser {
 public:
  explicit GgufParser(GgufFile& file) : file_(file), bytes_(file.bytes_) {}

  std::optional<GgufError> run() {
    std::uint64_t tensor_count = 0, metadata_count = 0;
    if (!read_header(tensor_count, metadata_count)) return error_;
    if (!read_metadata(metadata_count)) return error_;
    if (!read_alignment()) return error_;
    if (!read_tensor_infos(tensor_count)) return error_;
    file_.data_offset_ = (at_ + file_.alignment_ - 1) / file_.alignment_ * file_.alignment_;
    if (!check_tensor_data()) return error_;
    return std::nullopt;
  }

 private:
  std::uint64_t left() const { return bytes_.size() - at_; }

  bool fail(std::uint64_t at, std::string detail) {
    if (!error_) error_ = GgufError{at, std::move(detail)};
    return false;
  }

  template <typename T>
  bool read(T& out, std::string_view what) {
    if (left() < sizeof(T)) {
      return fail(at_, fmt::format("file ends inside {} ({} bytes needed, {} left)", what, sizeof(T), left()));
    }
    std::memcpy(&out, bytes_.data() + at_, sizeof(T));
    at_ += sizeof(T);
    return true;
  }

  bool read_string(std::string& out, std::string_view what) {
    std::uint64_t at = at_, length = 0;
    if (!read(length, what)) return false;
    if (length > left()) {
      return fail(at, fmt::format("{} declares {} bytes but only {} are left in the file", what, length, left()));
    }
    out.assign(reinterpret_cast<const char*>(bytes_.data() + at_), length);
    at_ += length;
    return true;
  }

  bool read_count(std::uint64_t& count, std::uint64_t min_bytes, std::string_view what) {
    std::uint64_t at = at_;
    if (!read(count, what)) return false;
    if (count > left() / min_bytes) {
      return fail(at, fmt::format("{} is {}, but the {} bytes left hold at most {} (each takes at least {} bytes)",
                                  what, count, left(), left() / min_bytes, min_bytes));
    }
    return true;
  }

  bool read_value_type(ValueType& type, std::string_view what) {
    std::uint64_t at = at_;
    std::uint32_t id = 0;
    if (!read(id, what)) return false;
    if (id >= kValueTypeCount) return fail(at, fmt::format("{} {} is not a GGUF value type (0 to 12)", what, id));
    type = static_cast<ValueType>(id);
    return true;
  }

  bool read_bool(bool& out) {
    std::uint64_t at = at_;
    std::uint8_t byte = 0;
    if (!read(byte, "a bool value")) return false;
    if (byte > 1) return fail(at, fmt::format("bool value {} is neither 0 nor 1", byte));
    out = byte == 1;
    return true;
  }

  template <typename T>
  bool read_scalar(MetadataValue& out) {
    T value{};
    if (!read(value, value_type_name(type_of(MetadataValue{T{}})))) return false;
    out = value;
    return true;
  }

  bool read_value(ValueType type, MetadataValue& out) {
    switch (type) {
      case ValueType::u8: return read_scalar<std::uint8_t>(out);
      case ValueType::i8: return read_scalar<std::int8_t>(out);
      case ValueType::u16: return read_scalar<std::uint16_t>(out);
      case ValueType::i16: return read_scalar<std::int16_t>(out);
      case ValueType::u32: return read_scalar<std::uint32_t>(out);
      case ValueType::i32: return read_scalar<std::int32_t>(out);
      case ValueType::f32: return read_scalar<float>(out);
      case ValueType::u64: return read_scalar<std::uint64_t>(out);
      case ValueType::i64: return read_scalar<std::int64_t>(out);
      case ValueType::f64: return read_scalar<double>(out);
      case ValueType::boolean: {
        bool value = false;
        if (!read_bool(value)) return false;
        out = value;
        return true;
      }
      case ValueType::string: {
        std::string value;
        if (!read_string(value, "a string value's length")) return false;
        out = std::move(value);
        return true;
      }
      case ValueType::array: {
        MetadataArray value;
        if (!read_array(value, 1)) return false;
        out = std::move(value);
        return true;
      }
    }
    return fail(at_, "unreachable value type");
  }

  // Fixed-size elements: the count was checked against the bytes left, so one copy does it.
  template <typename T>
  bool read_fixed_elements(ArrayElements& out, std::uint64_t count) {
    std::vector<T> values(count);
    if (count > 0) std::memcpy(values.data(), bytes_.data() + at_, count * sizeof(T));
    at_ += count * sizeof(T);
    out = std::move(values);
    return true;
  }

  bool read_array(MetadataArray& out, int depth) {
    std::uint64_t at = at_;
    if (depth > kMaxArrayDepth) {
      return fail(at, fmt::format("arrays nested deeper than {} levels", kMaxArrayDepth));
    }
    ValueType type{};
    std::uint64_t count = 0;
    if (!read_value_type(type, "array element type")) return false;
    if (!read_count(count, min_element_bytes(type), "array element count")) return false;
    switch (type) {
      case ValueType::u8: return read_fixed_elements<std::uint8_t>(out.elements, count);
      case ValueType::i8: return read_fixed_elements<std::int8_t>(out.elements, count);
      case ValueType::u16: return read_fixed_elements<std::uint16_t>(out.elements, count);
      case ValueType::i16: return read_fixed_elements<std::int16_t>(out.elements, count);
      case ValueType::u32: return read_fixed_elements<std::uint32_t>(out.elements, count);
      case ValueType::i32: return read_fixed_elements<std::int32_t>(out.elements, count);
      case ValueType::f32: return read_fixed_elements<float>(out.elements, count);
      case ValueType::u64: return read_fixed_elements<std::uint64_t>(out.elements, count);
      case ValueType::i64: return read_fixed_elements<std::int64_t>(out.elements, count);
      case ValueType::f64: return read_fixed_elements<double>(out.elements, count);
      case ValueType::boolean: {
        std::vector<bool> values(count);
        for (std::uint64_t i = 0; i < count; ++i) {
          bool value = false;
          if (!read_bool(value)) return false;
          values[i] = value;
        }
        out.elements = std::move(values);
        return true;
      }
      case ValueType::string: {
        std::vector<std::string> values(count);
        for (auto& value : values) {
          if (!read_string(value, "a string element's length")) return false;
        }
        out.elements = std::move(values);
        return true;
      }
      case ValueType::array: {
        std::vector<MetadataArray> values(count);
        for (auto& value : values) {
          if (!read_array(value, depth + 1)) return false;
        }
        out.elements = std::move(values);
        return true;
      }
    }
    return fail(at, "unreachable array element type");
  }

  bool read_header(std::uint64_t& tensor_count, std::uint64_t& metadata_count) {
    std::uint32_t magic = 0, version = 0;
    if (!read(magic, "the GGUF magic")) return false;
    if (magic != kMagic) {
      return fail(0, fmt::format("not a GGUF file: it starts with {:02x} {:02x} {:02x} {:02x}, not \"GGUF\"",
                                 magic & 0xFF, (magic >> 8) & 0xFF, (magic >> 16) & 0xFF, magic >> 24));
    }
    if (!read(version, "the GGUF version")) return false;
    if (version == 1) return fail(4, "GGUF version 1 is not supported (only 2 and 3): convert the file anew");
    if (version == 0x02000000u || version == 0x03000000u) {
      return fail(4, "big-endian GGUF file: only little-endian files are supported");
    }
    if (version != 2 && version != 3) return fail(4, fmt::format("unsupported GGUF version {} (expected 2 or 3)", version));
    file_.version_ = version;
    if (!read(tensor_count, "the tensor count")) return false;
    if (!read_count(metadata_count, 13, "the metadata entry count")) return false;
    if (tensor_count > left() / 24) {
      return fail(8, fmt::format("the tensor count is {}, but the {} bytes left hold at most {} tensor infos",
                                 tensor_count, left(), left() / 24));
    }
    return true;
  }

  bool read_metadata(std::uint64_t count) {
    file_.metadata_.reserve(count);
    for (std::uint64_t i = 0; i < count; ++i) {
      MetadataEntry entry;
      entry.offset = at_;
      ValueType type{};
      if (!read_string(entry.key, "a metadata key's length")) return false;
      if (file_.metadata_index_.contains(entry.key)) {
        return fail(entry.offset, fmt::format("metadata key {} appears twice", printable(entry.key)));
      }
      if (!read_value_type(type, "value type of " + printable(entry.key))) return false;
      if (!read_value(type, entry.value)) return false;
      file_.metadata_index_.emplace(entry.key, file_.metadata_.size());
      file_.metadata_.push_back(std::move(entry));
    }
    return true;
  }

  bool read_alignment() {
    const MetadataEntry* entry = file_.find(kAlignmentKey);
    if (entry == nullptr) return true;
    const auto* alignment = std::get_if<std::uint32_t>(&entry->value);
    if (alignment == nullptr) {
      return fail(entry->offset, fmt::format("general.alignment is {}, expected a u32", describe(entry->value)));
    }
    if (*alignment == 0 || !std::has_single_bit(*alignment)) {
      return fail(entry->offset, fmt::format("general.alignment {} is not a power of two", *alignment));
    }
    file_.alignment_ = *alignment;
    return true;
  }

  bool read_dims(TensorInfo& tensor) {
    std::uint64_t at = at_;
    std::uint32_t n_dims = 0;
    if (!read(n_dims, "a tensor's dimension count")) return false;
    if (n_dims == 0 || n_dims > kMaxDims) {
      return fail(at, fmt::format("tensor {} has {} dimensions (1 to {} allowed)", printable(tensor.name), n_dims, kMaxDims));
    }
    tensor.dims.resize(n_dims);
    std::uint64_t elements = 1;
    for (auto& dim : tensor.dims) {
      std::uint64_t dim_at = at_;
      if (!read(dim, "a tensor dimension")) return false;
      if (dim > kMaxDimension || (dim != 0 && elements > kMaxDimension / dim)) {
        return fail(dim_at, fmt::format("tensor {} has dimension {}: its size overflows", printable(tensor.name), dim));
      }
      elements *= dim;
    }
    return true;
  }

  bool read_tensor_type(TensorInfo& tensor) {
    std::uint64_t at = at_;
    std::uint32_t id = 0;
    if (!read(id, "a tensor type")) return false;
    const TensorTypeTraits* traits = tensor_type_traits(id);
    if (traits == nullptr) return fail(at, fmt::format("tensor {} has unknown type id {}", printable(tensor.name), id));
    tensor.type = traits->type;
    if (tensor.dims[0] % traits->block_elements != 0) {
      return fail(at, fmt::format("tensor {} has rows of {} elements, not a whole number of {} blocks of {}",
                                  printable(tensor.name), tensor.dims[0], traits->name, traits->block_elements));
    }
    std::uint64_t blocks = tensor.elements() / traits->block_elements;
    if (blocks > bytes_.size() / traits->block_bytes) {  // also keeps blocks * block_bytes from overflowing
      return fail(tensor.info_offset, fmt::format("tensor {} of {} {} blocks is larger than the whole file ({} bytes)",
                                                  printable(tensor.name), blocks, traits->name, bytes_.size()));
    }
    tensor.bytes = blocks * traits->block_bytes;
    return true;
  }

  bool read_tensor_infos(std::uint64_t count) {
    file_.tensors_.reserve(count);
    offset_fields_.reserve(count);
    for (std::uint64_t i = 0; i < count; ++i) {
      TensorInfo tensor;
      tensor.info_offset = at_;
      if (!read_string(tensor.name, "a tensor name's length")) return false;
      if (tensor.name.empty()) return fail(tensor.info_offset, "a tensor has an empty name");
      if (file_.tensor_index_.contains(tensor.name)) {
        return fail(tensor.info_offset, fmt::format("tensor {} appears twice", printable(tensor.name)));
      }
      if (!read_dims(tensor) || !read_tensor_type(tensor)) return false;
      offset_fields_.push_back(at_);
      if (!read(tensor.offset, "a tensor data offset")) return false;
      file_.tensor_index_.emplace(tensor.name, file_.tensors_.size());
      file_.tensors_.push_back(std::move(tensor));
    }
    return true;
  }

  bool check_tensor_data() {
    const auto& tensors = file_.tensors_;
    std::uint64_t data_bytes = bytes_.size() > file_.data_offset_ ? bytes_.size() - file_.data_offset_ : 0;
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      const TensorInfo& t = tensors[i];
      if (t.offset % file_.alignment_ != 0) {
        return fail(offset_fields_[i], fmt::format("tensor {} data offset {} is not a multiple of the alignment {}",
                                                   printable(t.name), t.offset, file_.alignment_));
      }
      if (t.offset > data_bytes || t.bytes > data_bytes - t.offset) {
        return fail(offset_fields_[i],
                    fmt::format("tensor {} data [{}, +{}) runs past the end of the file (the data section at byte "
                                "{} has {} bytes)",
                                printable(t.name), t.offset, t.bytes, file_.data_offset_, data_bytes));
      }
    }
    std::vector<std::size_t> order(tensors.size());
    std::iota(order.begin(), order.end(), 0);
    std::erase_if(order, [&](std::size_t i) { return tensors[i].bytes == 0; });
    std::stable_sort(order.begin(), order.end(),
                     [&](std::size_t a, std::size_t b) { return tensors[a].offset < tensors[b].offset; });
    for (std::size_t k = 1; k < order.size(); ++k) {
      const TensorInfo& before = tensors[order[k - 1]];
      const TensorInfo& t = tensors[order[k]];
      if (before.offset + before.bytes > t.offset) {
        return fail(offset_fields_[order[k]],
                    fmt::format("tensor {} data [{}, +{}) overlaps tensor {} data [{}, +{})", printable(t.name), t.offset,
                                t.bytes, printable(before.name), before.offset, before.bytes));
      }
    }
    return true;
  }

  GgufFile& file_;
  std::span<const std::byte> bytes_;
  std::uint64_t at_ = 0;
  std::vector<std::uint64_t> offset_fields_;  // per tensor: where its data offset field is
  std::optional<GgufError> error_;
};

std::uint64_t TensorInfo::elements() const {
  return std::accumulate(dims.begin(), dims.end(), std::uint64_t{1}, std::multiplies<>());
}

std::uint64_t TensorInfo::rows() const { return row_length() == 0 ? 0 : elements() / row_length(); }

namespace {

// "F32, F16, Q4_0, ... and BF16": the types mqlm computes with, in the order of GGUF's type ids.
std::string computed_type_names() {
  std::vector<TensorType> types;
  for (gpu::WeightType type : gpu::all_weight_types) types.push_back(to_tensor_type(type));
  std::ranges::sort(types);
  std::string names;
  for (std::size_t i = 0; i < types.size(); ++i) {
    names += i == 0 ? "" : i + 1 == types.size() ? " and " : ", ";
    names += tensor_type_name(types[i]);
  }
  return names;
}

}  // namespace

GgufResult<gpu::WeightType> weight_type(const TensorInfo& tensor) {
  if (auto type = to_weight_type(tensor.type)) return *type;
  return GgufError{tensor.info_offset,
                   fmt::format("tensor {} has type {}, which mqlm does not compute with (it computes with {}): "
                               "quantize the model to one of those (llama-quantize's Q4_K_M, for one)",
                               printable(tensor.name), tensor_type_name(tensor.type), computed_type_names())};
}

GgufResult<GgufFile> GgufFile::open(const std::filesystem::path& path) {
  auto mapped = MappedFile::open(path);
  if (auto* error = std::get_if<std::string>(&mapped)) return GgufError{0, std::move(*error)};
  GgufFile file;
  file.storage_ = std::get<MappedFile>(std::move(mapped));
  file.bytes_ = std::get<MappedFile>(file.storage_).bytes();
  if (auto error = GgufParser(file).run()) return std::move(*error);
  return file;
}

GgufResult<GgufFile> GgufFile::parse(std::vector<std::byte> bytes) {
  GgufFile file;
  file.storage_ = std::move(bytes);
  file.bytes_ = std::get<std::vector<std::byte>>(file.storage_);
  if (auto error = GgufParser(file).run()) return std::move(*error);
  return file;
}

const MetadataEntry* GgufFile::find(std::string_view key) const {
  auto it = metadata_index_.find(key);
  return it == metadata_index_.end() ? nullptr : &metadata_[it->second];
}

std::optional<std::uint64_t> GgufFile::get_uint(std::string_view key) const {
  const MetadataEntry* entry = find(key);
  if (entry == nullptr) return std::nullopt;
  return std::visit(
      [](const auto& value) -> std::optional<std::uint64_t> {
        using T = std::decay_t<decltype(value)>;
        if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
          if (value < 0) return std::nullopt;
          return static_cast<std::uint64_t>(value);
        }
        return std::nullopt;
      },
      entry->value);
}

std::optional<std::int64_t> GgufFile::get_int(std::string_view key) const {
  const MetadataEntry* entry = find(key);
  if (entry == nullptr) return std::nullopt;
  return std::visit(
      [](const auto& value) -> std::optional<std::int64_t> {
        using T = std::decay_t<decltype(value)>;
        if constexpr (std::is_same_v<T, std::uint64_t>) {
          if (value > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) return std::nullopt;
          return static_cast<std::int64_t>(value);
        } else if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
          return static_cast<std::int64_t>(value);
        }
        return std::nullopt;
      },
      entry->value);
}

std::optional<double> GgufFile::get_float(std::string_view key) const {
  if (const auto* value = get<float>(key)) return *value;
  if (const auto* value = get<double>(key)) return *value;
  return std::nullopt;
}

std::optional<std::string_view> GgufFile::get_string(std::string_view key) const {
  if (const auto* value = get<std::string>(key)) return std::string_view(*value);
  return std::nullopt;
}

std::optional<bool> GgufFile::get_bool(std::string_view key) const {
  if (const auto* value = get<bool>(key)) return *value;
  return std::nullopt;
}

GgufError GgufFile::key_error(std::string_view key, std::string_view expected) const {
  const MetadataEntry* entry = find(key);
  if (entry == nullptr) return GgufError{24, fmt::format("metadata key {} is missing", printable(key))};
  return GgufError{entry->offset,
                   fmt::format("metadata key {} is {}, expected {}", printable(key), describe(entry->value), expected)};
}

const TensorInfo* GgufFile::tensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

std::span<const std::byte> GgufFile::data(const TensorInfo& tensor) const {
  if (tensor.bytes == 0) return {};  // an empty tensor may sit where the padding would end, past the file
  if (data_offset_ > bytes_.size() || tensor.offset > bytes_.size() - data_offset_ ||
      tensor.bytes > bytes_.size() - data_offset_ - tensor.offset) {
    throw std::out_of_range("GgufFile::data: tensor " + tensor.name + " is not one of this file's");
  }
  return bytes_.subspan(data_offset_ + tensor.offset, tensor.bytes);
}

}  // namespace mqlm::model::gguf
