#include "actors/scheduler/kv_page_table.hpp"

#include <cstring>
#include <stdexcept>

#include <xxhash.h>

namespace mqlm::actors {

KvPageTable::KvPageTable(std::uint32_t pages, std::uint32_t page_size) : page_size_(page_size), pages_(pages) {
  if (pages == 0 || page_size == 0) throw std::invalid_argument("a KV page table needs pages of at least one token");
  free_.reserve(pages);
  for (std::uint32_t p = pages; p > 0; --p) free_.push_back(p - 1);  // page 0 is taken first
}

std::uint64_t KvPageTable::chain(std::uint64_t previous, std::uint64_t model,
                                 std::span<const std::int32_t> page_tokens) const {
  // The key of this page is the hash of the previous page's key, the model and its tokens.
  std::vector<std::int32_t> words(4 + page_tokens.size());
  std::memcpy(words.data(), &previous, 8);
  std::memcpy(words.data() + 2, &model, 8);
  std::copy(page_tokens.begin(), page_tokens.end(), words.begin() + 4);
  return XXH3_64bits(words.data(), words.size() * sizeof(std::int32_t));
}

std::uint32_t KvPageTable::begin(std::uint64_t sequence, std::uint64_t model, std::span<const std::int32_t> tokens) {
  if (sequences_.contains(sequence)) throw std::logic_error("sequence begun twice");
  Sequence& seq = sequences_[sequence];
  seq.model = model;
  if (tokens.empty()) return 0;
  // Full pages strictly before the last token: the last token is always computed.
  const std::size_t shareable = (tokens.size() - 1) / page_size_;
  std::uint64_t key = 0;
  for (std::size_t i = 0; i < shareable; ++i) {
    key = chain(key, model, tokens.subspan(i * page_size_, page_size_));
    auto it = by_key_.find(key);
    if (it == by_key_.end()) break;
    Page& page = pages_[it->second];
    if (page.references++ == 0) cached_.erase(page.lru);
    seq.pages.push_back(it->second);
    seq.keys.push_back(key);
    ++prefix_hits_;
  }
  return static_cast<std::uint32_t>(seq.pages.size() * page_size_);
}

std::optional<std::uint32_t> KvPageTable::take_page() {
  if (!free_.empty()) {
    std::uint32_t p = free_.back();
    free_.pop_back();
    return p;
  }
  if (cached_.empty()) return std::nullopt;
  std::uint32_t p = cached_.front();  // the least recently used prefix page gives way
  cached_.pop_front();
  Page& page = pages_[p];
  by_key_.erase(*page.key);
  if (record_evictions_) evicted_.push_back({p, {*page.key, page.parent, std::move(page.tokens)}});
  page.key.reset();
  page.tokens.clear();
  ++evictions_;
  return p;
}

std::uint32_t KvPageTable::available() const {
  return static_cast<std::uint32_t>(free_.size() + cached_.size());
}

bool KvPageTable::reserve(std::uint64_t sequence, std::uint32_t tokens) {
  Sequence& seq = sequences_.at(sequence);
  const std::size_t needed = (tokens + page_size_ - 1) / page_size_;
  if (needed <= seq.pages.size()) return true;
  if (needed - seq.pages.size() > available()) return false;
  while (seq.pages.size() < needed) {
    std::uint32_t p = *take_page();
    pages_[p].references = 1;
    seq.pages.push_back(p);
  }
  return true;
}

void KvPageTable::computed(std::uint64_t sequence, std::span<const std::int32_t> history) {
  Sequence& seq = sequences_.at(sequence);
  const std::size_t full = std::min(history.size() / page_size_, seq.pages.size());
  for (std::size_t i = seq.keys.size(); i < full; ++i) {
    std::uint64_t key = chain(i == 0 ? 0 : seq.keys[i - 1], seq.model, history.subspan(i * page_size_, page_size_));
    seq.keys.push_back(key);
    Page& page = pages_[seq.pages[i]];
    // Another sequence may have published the same prefix first: keep that one, ours stays private.
    if (!page.key && !by_key_.contains(key)) {
      publish(seq.pages[i], key, i == 0 ? 0 : seq.keys[i - 1], history.subspan(i * page_size_, page_size_));
    }
  }
}

void KvPageTable::publish(std::uint32_t p, std::uint64_t key, std::uint64_t parent,
                          std::span<const std::int32_t> tokens) {
  Page& page = pages_[p];
  page.key = key;
  page.parent = parent;
  page.tokens.assign(tokens.begin(), tokens.end());
  by_key_[key] = p;
}

std::vector<std::uint64_t> KvPageTable::prefix_keys(std::uint64_t model, std::span<const std::int32_t> tokens) const {
  std::vector<std::uint64_t> keys;
  if (tokens.empty()) return keys;
  const std::size_t shareable = (tokens.size() - 1) / page_size_;
  std::uint64_t key = 0;
  for (std::size_t i = 0; i < shareable; ++i) {
    key = chain(key, model, tokens.subspan(i * page_size_, page_size_));
    keys.push_back(key);
  }
  return keys;
}

std::size_t KvPageTable::held_prefix(std::span<const std::uint64_t> keys) const {
  std::size_t n = 0;
  while (n < keys.size() && by_key_.contains(keys[n])) ++n;
  return n;
}

std::optional<std::uint32_t> KvPageTable::adopt(std::uint64_t sequence, const messages::KvPageId& id,
                                                std::span<const std::int32_t> tokens) {
  Sequence& seq = sequences_.at(sequence);
  if (seq.keys.size() != seq.pages.size() || tokens.size() != page_size_ ||
      !std::equal(tokens.begin(), tokens.end(), id.tokens.begin(), id.tokens.end())) {
    return std::nullopt;
  }
  const std::uint64_t parent = seq.keys.empty() ? 0 : seq.keys.back();
  if (id.parent != parent || id.key != chain(parent, seq.model, tokens) || by_key_.contains(id.key)) {
    return std::nullopt;
  }
  std::optional<std::uint32_t> p = take_page();
  if (!p) return std::nullopt;
  pages_[*p].references = 1;
  publish(*p, id.key, parent, tokens);
  seq.pages.push_back(*p);
  seq.keys.push_back(id.key);
  return p;
}

std::vector<EvictedPage> KvPageTable::cached_pages(std::size_t most) const {
  std::vector<EvictedPage> pages;
  auto it = cached_.end();
  for (std::size_t n = std::min(most, cached_.size()); n > 0; --n) --it;  // the `most` most recent
  for (; it != cached_.end(); ++it) {
    const Page& page = pages_[*it];
    pages.push_back({*it, {*page.key, page.parent, page.tokens}});
  }
  return pages;
}

void KvPageTable::forget(std::uint32_t p) {
  Page& page = pages_.at(p);
  if (!page.key) return;
  by_key_.erase(*page.key);
  page.key.reset();
  page.tokens.clear();
  if (page.references == 0) {
    cached_.erase(page.lru);
    free_.push_back(p);
  }
}

void KvPageTable::unreference(std::uint32_t p) {
  Page& page = pages_[p];
  if (page.references == 0) throw std::logic_error("page released more often than taken");
  if (--page.references > 0) return;
  if (page.key) {
    page.lru = cached_.insert(cached_.end(), p);  // most recently used at the back
  } else {
    free_.push_back(p);
  }
}

void KvPageTable::release(std::uint64_t sequence) {
  auto it = sequences_.find(sequence);
  if (it == sequences_.end()) return;
  // Later pages first, so a prefix's head outlives its tail in the LRU order.
  for (auto p = it->second.pages.rbegin(); p != it->second.pages.rend(); ++p) unreference(*p);
  sequences_.erase(it);
}

void KvPageTable::truncate(std::uint64_t sequence, std::uint32_t tokens) {
  Sequence& seq = sequences_.at(sequence);
  if (tokens < seq.keys.size() * page_size_) throw std::logic_error("truncate would cut a computed full page");
  const std::size_t needed = (tokens + page_size_ - 1) / page_size_;
  while (seq.pages.size() > needed) {
    unreference(seq.pages.back());
    seq.pages.pop_back();
  }
}

const std::vector<std::uint32_t>& KvPageTable::block_table(std::uint64_t sequence) const {
  return sequences_.at(sequence).pages;
}

PageTableStats KvPageTable::stats() const {
  PageTableStats s;
  s.total = static_cast<std::uint32_t>(pages_.size());
  s.free = static_cast<std::uint32_t>(free_.size());
  s.cached = static_cast<std::uint32_t>(cached_.size());
  for (const Page& p : pages_) {
    s.references += p.references;
    if (p.references > 0) ++s.in_use;
  }
  s.prefix_hits = prefix_hits_;
  s.evictions = evictions_;
  return s;
}

}  // namespace mqlm::actors
