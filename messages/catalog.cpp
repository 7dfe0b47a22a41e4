#include "messages/catalog.hpp"

#include <array>

namespace mqlm::messages {
namespace {

struct KindInfo {
  bool known = false;
  std::string_view name = "unknown";
  std::uint8_t version = 0;
  WhenFull when_full = WhenFull::drop;
};

constexpr std::array<KindInfo, 256> make_kind_table() {
  std::array<KindInfo, 256> table{};
#define MQLM_TABLE_ROW(byte, type, ver, policy) table[byte] = KindInfo{true, #type, ver, policy};
  MQLM_MESSAGE_CATALOG(MQLM_TABLE_ROW)
#undef MQLM_TABLE_ROW
  return table;
}

constexpr std::array<KindInfo, 256> kKinds = make_kind_table();

}  // namespace

bool is_known_kind(std::uint8_t kind) { return kKinds[kind].known; }
std::string_view kind_name(Kind kind) { return kKinds[static_cast<std::uint8_t>(kind)].name; }
std::uint8_t schema_version(Kind kind) { return kKinds[static_cast<std::uint8_t>(kind)].version; }
WhenFull when_full(Kind kind) { return kKinds[static_cast<std::uint8_t>(kind)].when_full; }

Kind kind_of(const Payload& payload) {
  return std::visit(
      [](const auto& p) -> Kind {
        using T = std::decay_t<decltype(p)>;
        if constexpr (std::is_same_v<T, std::monostate>) {
          return Kind{0};
        } else {
          return MessageTraits<T>::kind;
        }
      },
      payload);
}

std::vector<Kind> all_kinds() {
  std::vector<Kind> kinds;
#define MQLM_LIST_KIND(byte, type, ver, policy) kinds.push_back(Kind::type);
  MQLM_MESSAGE_CATALOG(MQLM_LIST_KIND)
#undef MQLM_LIST_KIND
  return kinds;
}

bool kind_from_name(std::string_view name, Kind& out) {
  for (Kind k : all_kinds()) {
    if (kind_name(k) == name) {
      out = k;
      return true;
    }
  }
  return false;
}

}  // namespace mqlm::messages
