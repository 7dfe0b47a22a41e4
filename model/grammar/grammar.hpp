// A context-free grammar over bytes, in the flat form the matcher walks (matcher.hpp): every
// alternative of every rule is a run of elements ending in an `end` element, and an element is a
// set of bytes to match or a reference to a rule. The JSON-schema compiler (json_schema.hpp)
// makes them; nothing here knows JSON.
//
// A grammar has no left recursion (a rule whose alternative can reach itself without consuming
// a byte): the compiler never makes one, and the matcher treats one as a bug.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string_view>
#include <vector>

namespace mqlm::model::grammar {

// 256 bits, bit b set = byte b matches.
struct ByteSet {
  std::array<std::uint64_t, 4> words{};
  bool has(std::uint8_t b) const { return ((words[b >> 6] >> (b & 63)) & 1u) != 0; }
  ByteSet& add(std::uint8_t b) {
    words[b >> 6] |= std::uint64_t{1} << (b & 63);
    return *this;
  }
  ByteSet& add_range(std::uint8_t first, std::uint8_t last) {
    for (unsigned b = first; b <= last; ++b) add(static_cast<std::uint8_t>(b));
    return *this;
  }
  ByteSet& add_all(std::string_view bytes) {
    for (char c : bytes) add(static_cast<std::uint8_t>(c));
    return *this;
  }
  bool operator==(const ByteSet&) const = default;
};

enum class ElementKind : std::uint8_t { end, bytes, rule };

struct Element {
  ElementKind kind = ElementKind::end;
  std::uint32_t value = 0;  // bytes: an index into Grammar::byte_sets; rule: a rule id
};

struct Grammar {
  std::vector<Element> elements;      // every alternative's run, each ending in an `end`
  std::vector<ByteSet> byte_sets;     // distinct sets, referenced by the elements
  std::vector<std::vector<std::uint32_t>> rules;  // rule id -> the element index each alternative starts at
  std::uint32_t root = 0;
};

// Builds a grammar rule by rule. A rule may be referenced before its alternatives are added
// (recursion); every rule must have at least one alternative when build() is called.
class GrammarBuilder {
 public:
  using Sequence = std::vector<Element>;  // an alternative's elements, without the end

  std::uint32_t new_rule();
  void add_alternative(std::uint32_t rule, const Sequence& sequence);
  // A new rule with these alternatives.
  std::uint32_t rule_of(const std::vector<Sequence>& alternatives);

  Element bytes(const ByteSet& set);
  Element byte(char c) { return bytes(ByteSet{}.add(static_cast<std::uint8_t>(c))); }
  static Element ref(std::uint32_t rule) { return {ElementKind::rule, rule}; }
  // Appends the bytes of `text`, one element each.
  void append_literal(Sequence& sequence, std::string_view text);
  Sequence literal(std::string_view text) {
    Sequence s;
    append_literal(s, text);
    return s;
  }

  std::size_t element_count() const { return grammar_.elements.size(); }
  std::size_t rule_count() const { return grammar_.rules.size(); }

  // Throws std::logic_error for a rule left without an alternative (a compiler bug).
  Grammar build(std::uint32_t root) &&;

 private:
  Grammar grammar_;
  std::map<std::array<std::uint64_t, 4>, std::uint32_t> set_ids_;  // each distinct set stored once
};

}  // namespace mqlm::model::grammar
