// Whether a value the front ends send on (a Submit) reads back from msgpack as it was written.
#pragma once

#include <string_view>

#include <msgpack.hpp>

namespace mqlm::fuzz {

template <typename T>
bool survives_msgpack(const T& value) {
  msgpack::sbuffer first;
  msgpack::pack(first, value);
  msgpack::object_handle handle = msgpack::unpack(first.data(), first.size());
  msgpack::sbuffer second;
  msgpack::pack(second, handle.get().as<T>());
  return std::string_view(first.data(), first.size()) == std::string_view(second.data(), second.size());
}

}  // namespace mqlm::fuzz
