#include "model/grammar/grammar.hpp"

#include <stdexcept>
#include <string>

namespace mqlm::model::grammar {

std::uint32_t GrammarBuilder::new_rule() {
  grammar_.rules.emplace_back();
  return static_cast<std::uint32_t>(grammar_.rules.size() - 1);
}

void GrammarBuilder::add_alternative(std::uint32_t rule, const Sequence& sequence) {
  grammar_.rules.at(rule).push_back(static_cast<std::uint32_t>(grammar_.elements.size()));
  grammar_.elements.insert(grammar_.elements.end(), sequence.begin(), sequence.end());
  grammar_.elements.push_back({ElementKind::end, 0});
}

std::uint32_t GrammarBuilder::rule_of(const std::vector<Sequence>& alternatives) {
  const std::uint32_t rule = new_rule();
  for (const Sequence& alternative : alternatives) add_alternative(rule, alternative);
  return rule;
}

Element GrammarBuilder::bytes(const ByteSet& set) {
  auto [it, inserted] = set_ids_.try_emplace(set.words, static_cast<std::uint32_t>(grammar_.byte_sets.size()));
  if (inserted) grammar_.byte_sets.push_back(set);
  return {ElementKind::bytes, it->second};
}

void GrammarBuilder::append_literal(Sequence& sequence, std::string_view text) {
  for (char c : text) sequence.push_back(byte(c));
}

Grammar GrammarBuilder::build(std::uint32_t root) && {
  for (std::size_t r = 0; r < grammar_.rules.size(); ++r) {
    if (grammar_.rules[r].empty()) throw std::logic_error("grammar: rule " + std::to_string(r) + " has no alternative");
  }
  grammar_.root = root;
  return std::move(grammar_);
}

}  // namespace mqlm::model::grammar
