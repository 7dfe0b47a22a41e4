#include "actors/cache_writer/cache_writer.hpp"

#include <list>
#include <map>
#include <optional>
#include <stdexcept>
#include <unordered_map>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "actors/cache_writer/cache_io.hpp"

namespace mqlm::actors {

using namespace messages;

namespace {

constexpr std::uint32_t kIoWatch = 1;

struct CacheWriterConfig {
  std::uint64_t hot_bytes = std::uint64_t{1} << 30;
  std::filesystem::path ssd_dir;  // empty: no SSD tier
  std::uint64_t ssd_bytes = std::uint64_t{16} << 30;
  std::uint64_t queue_bytes = std::uint64_t{256} << 20;  // RAM of pages on their way to SSD
  std::uint64_t answer_bytes = std::uint64_t{2} << 30;   // pages one lookup's answer holds at most
  bool drain = true;              // close=drain: queued writes are finished, not dropped
  bool fail_writes = false;
  std::string fail_close;
};

CacheWriterConfig cache_writer_config(const ActorOptions& options) {
  check_option_names("cache-writer", options, {"hot_bytes", "ssd_dir", "ssd_bytes", "queue_bytes", "answer_bytes", "close",
                                                      "fail_writes", "fail_close"});
  CacheWriterConfig c;
  c.hot_bytes = number_option("cache-writer", options, "hot_bytes", c.hot_bytes);
  c.ssd_dir = text_option(options, "ssd_dir", "");
  c.ssd_bytes = number_option("cache-writer", options, "ssd_bytes", c.ssd_bytes, 1);
  c.queue_bytes = number_option("cache-writer", options, "queue_bytes", c.queue_bytes, 1);
  c.answer_bytes = number_option("cache-writer", options, "answer_bytes", c.answer_bytes, 1);
  const std::string close = text_option(options, "close", "drain");
  if (close != "drain" && close != "drop") {
    throw std::invalid_argument("cache-writer option close=" + close + ": expected drain or drop");
  }
  c.drain = close == "drain";
  c.fail_writes = number_option("cache-writer", options, "fail_writes", 0, 0, 1) == 1;
  c.fail_close = text_option(options, "fail_close", "");
  return c;
}

// A frame that shares `frame`'s bytes (ZeroMQ counts references to a long message's content).
zmq::message_t share(zmq::message_t& frame) {
  zmq::message_t copy;
  copy.copy(frame);
  return copy;
}

class CacheWriter final : public Actor {
 public:
  explicit CacheWriter(CacheWriterConfig config) : config_(std::move(config)) {}

  void on_start(Context& ctx) override {
    if (config_.ssd_dir.empty()) {
      spdlog::info("cache-writer: hot tier of {} bytes, no SSD tier", config_.hot_bytes);
      return;
    }
    zmq::context_t* context = ctx.zmq_context();
    if (context == nullptr) throw std::runtime_error("the cache-writer needs a live ZeroMQ context (it cannot be replayed)");
    const std::string endpoint = fmt::format("inproc://mqlm-cache-io/{}/{}", ctx.self(), static_cast<const void*>(this));
    notify_ = zmq::socket_t(*context, zmq::socket_type::pair);
    notify_.set(zmq::sockopt::linger, 0);
    notify_.bind(endpoint);
    ctx.watch(notify_, kIoWatch);
    io_ = std::make_unique<CacheIo>(CacheIoOptions{config_.ssd_dir, config_.ssd_bytes, config_.fail_writes}, *context,
                                    endpoint);
    ssd_bytes_ = io_->ssd_bytes();
    ssd_pages_ = io_->ssd_pages();
    spdlog::info("cache-writer: hot tier of {} bytes, SSD tier {} of {} bytes", config_.hot_bytes,
                 config_.ssd_dir.string(), config_.ssd_bytes);
  }

  void on_stop(Context& ctx) override {
    const std::uint64_t bytes = hot_bytes_;
    if (io_) {
      if (config_.drain) {
        for (std::uint64_t key : std::vector<std::uint64_t>(lru_.begin(), lru_.end())) queue_write(key);
      }
      io_->stop(config_.drain);
      take_io_results(ctx);
      io_.reset();
      ctx.unwatch(kIoWatch);
      notify_.close();
    }
    release_all();
    spdlog::info("cache-writer stopped: {} hot bytes released ({}), {} SSD writes, {} failed", bytes,
                 config_.drain ? "queued writes finished" : "queued writes dropped", report_.writes,
                 report_.write_failures);
  }

  void on_readable(Context& ctx, std::uint32_t watch_id) override {
    if (watch_id != kIoWatch || !notify_) return;
    zmq::message_t byte;
    while (notify_.recv(byte, zmq::recv_flags::dontwait)) {
    }
    take_io_results(ctx);
  }

  void on_message(Context& ctx, Message& message) override {
    if (const auto* spilled = message.as<KvPagesSpilled>()) {
      on_spilled(*spilled, message.blobs);
    } else if (const auto* lookup = message.as<PrefixLookup>()) {
      on_lookup(ctx, message, *lookup);
    } else if (const auto* close = message.as<CloseModelCache>()) {
      on_close(ctx, message, *close);
    } else if (const auto* clear = message.as<ClearCache>()) {
      on_clear(ctx, message, *clear);
    } else if (const auto* shrink = message.as<ShrinkCache>()) {
      shrink_to(shrink->target_bytes);
      ctx.reply(message, report());
    } else if (message.as<CacheQuery>() != nullptr) {
      ctx.reply(message, report());
    } else if (const auto* error = message.as<Error>()) {
      spdlog::warn("{}: {} answered an error: {}", ctx.self(), message.envelope.from, error->message);
    }
  }

 private:
  struct HotPage {
    std::string model;
    std::uint64_t model_key = 0;
    std::uint32_t page_size = 0;
    KvPageId id;
    zmq::message_t blob;
    bool queued = false;                    // handed to the I/O thread to be written
    std::list<std::uint64_t>::iterator lru;  // its place in lru_ while not queued
  };

  // One page of a lookup's answer: from the hot tier (its frame shared) or to be read from SSD.
  struct Slot {
    std::uint64_t key = 0;
    CacheTier tier = CacheTier::hot;
    KvPageId id;
    zmq::message_t blob;
  };
  struct PendingLookup {
    std::string to;
    std::uint64_t correlation_id = 0;
    PrefixLookup lookup;
    std::vector<Slot> slots;
  };
  struct PendingAnswer {
    std::string to;
    std::uint64_t correlation_id = 0;
    std::variant<ModelCacheClosed, CacheCleared> answer;
  };

  // ---- the hot tier ---------------------------------------------------------------------------

  void on_spilled(const KvPagesSpilled& spilled, Frames& blobs) {
    const bool shaped = blobs.size() == spilled.pages.size() && spilled.page_bytes > 0 &&
                        std::all_of(blobs.begin(), blobs.end(), [&](const auto& b) { return b.size() == spilled.page_bytes; }) &&
                        std::all_of(spilled.pages.begin(), spilled.pages.end(),
                                    [&](const KvPageId& id) { return id.tokens.size() == spilled.page_size; });
    report_.spilled += spilled.pages.size();
    if (!shaped) {
      spdlog::warn("cache-writer: {} spilled pages of model {} do not match their {} blobs of {} bytes: dropped",
                   spilled.pages.size(), spilled.model, blobs.size(), spilled.page_bytes);
      report_.dropped += spilled.pages.size();
      return;
    }
    for (std::size_t i = 0; i < blobs.size(); ++i) {
      HotPage page{spilled.model, spilled.model_key, spilled.page_size, spilled.pages[i], std::move(blobs[i]), false, {}};
      insert(std::move(page));
    }
  }

  // Pages in RAM not yet handed to the writer: what the budget bounds.
  std::uint64_t resident_bytes() const { return hot_bytes_ - queued_bytes_; }

  void insert(HotPage page) {
    const std::uint64_t key = page.id.key;
    if (hot_.contains(key)) release(key);  // newer contents for the same prefix
    const std::uint64_t size = page.blob.size();
    shrink_to(config_.hot_bytes > size ? config_.hot_bytes - size : 0);
    hot_bytes_ += size;
    by_model_[page.model] += size;
    auto [it, inserted] = hot_.emplace(key, std::move(page));
    it->second.lru = lru_.insert(lru_.end(), key);
    if (resident_bytes() > config_.hot_bytes) leave_hot(key);  // a budget smaller than a page
  }

  // Least recently used pages leave the budget until `target` bytes are left.
  void shrink_to(std::uint64_t target) {
    while (resident_bytes() > target && !lru_.empty()) leave_hot(lru_.front());
  }

  // A page leaves the budget: to the SSD writer if there is one with room in its queue, else gone.
  void leave_hot(std::uint64_t key) {
    if (io_ && queued_bytes_ + hot_.at(key).blob.size() <= config_.queue_bytes) {
      queue_write(key);
    } else {
      ++report_.dropped;
      release(key);
    }
  }

  void queue_write(std::uint64_t key) {
    auto it = hot_.find(key);
    if (it == hot_.end() || it->second.queued) return;
    HotPage& page = it->second;
    lru_.erase(page.lru);
    page.queued = true;
    queued_bytes_ += page.blob.size();
    StoredPage stored{page.model, page.model_key, page.id.key, page.id.parent, page.page_size, page.id.tokens,
                      page.blob.size()};
    io_->write(WriteJob{std::move(stored), share(page.blob)});
  }

  void release(std::uint64_t key) {
    auto it = hot_.find(key);
    if (it == hot_.end()) return;
    HotPage& page = it->second;
    const std::uint64_t size = page.blob.size();
    if (page.queued) {
      queued_bytes_ -= size;
    } else {
      lru_.erase(page.lru);
    }
    hot_bytes_ -= size;
    if (auto m = by_model_.find(page.model); m != by_model_.end() && (m->second -= size) == 0) by_model_.erase(m);
    hot_.erase(it);
  }

  // Cannot fail: what a Close that threw still does.
  void release_model(const std::string& model) {
    std::vector<std::uint64_t> keys;
    for (const auto& [key, page] : hot_) {
      if (page.model == model) keys.push_back(key);
    }
    for (std::uint64_t key : keys) release(key);
  }

  void release_all() {
    hot_.clear();
    lru_.clear();
    by_model_.clear();
    hot_bytes_ = queued_bytes_ = 0;
  }

  // ---- lookups ----------------------------------------------------------------------------------

  void on_lookup(Context& ctx, const Message& message, const PrefixLookup& lookup) {
    PendingLookup pending{message.envelope.from, message.envelope.correlation_id, lookup, {}};
    bool needs_ssd = false;
    // An answer is held in RAM whole (read from SSD, then in flight): a prompt longer than
    // answer_bytes of pages gets its first pages back and computes the rest.
    const std::uint64_t most = lookup.page_bytes > 0 ? config_.answer_bytes / lookup.page_bytes : 0;
    for (std::uint64_t key : lookup.keys) {
      if (pending.slots.size() >= most) break;
      auto it = hot_.find(key);
      if (it != hot_.end() && fits(lookup, it->second.model_key, it->second.page_size, it->second.blob.size())) {
        HotPage& page = it->second;
        if (!page.queued) lru_.splice(lru_.end(), lru_, page.lru);  // most recently used
        pending.slots.push_back({key, CacheTier::hot, page.id, share(page.blob)});
      } else if (io_) {
        pending.slots.push_back({key, CacheTier::ssd, {}, {}});
        needs_ssd = true;
      } else {
        break;
      }
    }
    if (!needs_ssd) {
      answer_lookup(ctx, pending);
      return;
    }
    ReadJob job{next_job_++, {}};
    for (const Slot& slot : pending.slots) {
      if (slot.tier == CacheTier::ssd) job.keys.push_back(slot.key);
    }
    lookups_.emplace(job.lookup, std::move(pending));
    io_->read(std::move(job));
  }

  static bool fits(const PrefixLookup& lookup, std::uint64_t model_key, std::uint32_t page_size, std::uint64_t bytes) {
    return model_key == lookup.model_key && page_size == lookup.page_size && bytes == lookup.page_bytes;
  }

  void on_read(Context& ctx, ReadDone& done) {
    auto it = lookups_.find(done.lookup);
    if (it == lookups_.end()) return;
    PendingLookup pending = std::move(it->second);
    lookups_.erase(it);
    std::size_t next = 0;  // the read results fill the SSD slots in order
    for (std::size_t i = 0; i < pending.slots.size(); ++i) {
      Slot& slot = pending.slots[i];
      if (slot.tier != CacheTier::ssd) continue;
      SsdStore::ReadResult* read = next < done.pages.size() ? &done.pages[next++] : nullptr;
      const bool ok = read != nullptr && read->status == SsdStore::ReadStatus::ok &&
                      fits(pending.lookup, read->page.model_key, read->page.page_size, read->data.size()) &&
                      read->page.tokens.size() == read->page.page_size;
      if (read != nullptr && read->status == SsdStore::ReadStatus::corrupt) {
        ++report_.corrupt;
        spdlog::warn("cache-writer: SSD page {:016x} failed its check and was deleted: {}", slot.key, read->error);
      } else if (read != nullptr && read->status == SsdStore::ReadStatus::failed) {
        spdlog::warn("cache-writer: SSD page {:016x} could not be read: {}", slot.key, read->error);
      }
      if (!ok) {
        pending.slots.resize(i);  // the prefix ends before the first page it cannot have
        break;
      }
      slot.id = KvPageId{read->page.key, read->page.parent, std::move(read->page.tokens)};
      auto bytes = std::make_shared<std::vector<std::byte>>(std::move(read->data));
      slot.blob = shared_frame(std::shared_ptr<const std::vector<std::byte>>(bytes));
    }
    answer_lookup(ctx, pending);
  }

  void answer_lookup(Context& ctx, PendingLookup& pending) {
    CachedPrefix answer{pending.lookup.model, {}, {}};
    Frames blobs;
    for (Slot& slot : pending.slots) {
      answer.pages.push_back(std::move(slot.id));
      answer.tiers.push_back(static_cast<std::uint8_t>(slot.tier));
      blobs.push_back(std::move(slot.blob));
      ++(slot.tier == CacheTier::hot ? report_.hot_hits : report_.ssd_hits);
    }
    report_.misses += pending.lookup.keys.size() - answer.pages.size();
    ctx.send(pending.to, answer, {pending.correlation_id, 0, std::move(blobs)});
  }

  // ---- close, clear ---------------------------------------------------------------------------

  void on_close(Context& ctx, const Message& message, const CloseModelCache& close) {
    ModelCacheClosed answer{close.model, by_model_bytes(close.model), 0, 0, 0, {}};
    for (const auto& [key, page] : hot_) answer.released_pages += page.model == close.model ? 1 : 0;
    const bool drain = close.drain_writes && config_.drain && io_;
    try {
      if (!drain && io_) answer.writes_dropped = io_->drop_writes(close.model);
      if (config_.fail_close == close.model) throw std::runtime_error("injected failure while closing (fail_close)");
      if (drain) {
        // Its pages are written first, and freed as each is; the answer waits for the last.
        std::vector<std::uint64_t> keys;
        for (const auto& [key, page] : hot_) {
          if (page.model == close.model && !page.queued) keys.push_back(key);
        }
        for (std::uint64_t key : keys) queue_write(key);
        answer.writes_drained = answer.released_pages;
        const std::uint64_t id = next_job_++;
        answers_.emplace(id, PendingAnswer{message.envelope.from, message.envelope.correlation_id, std::move(answer)});
        io_->barrier(BarrierJob{id});
        return;
      }
    } catch (const std::exception& e) {
      spdlog::error("cache-writer: closing model {}: {}; its pages are released all the same", close.model, e.what());
      answer.problems.push_back(e.what());
      if (io_) answer.writes_dropped += io_->drop_writes(close.model);
    }
    release_model(close.model);
    spdlog::info("cache-writer: model {} closed: {} hot bytes in {} pages released", close.model,
                 answer.released_bytes, answer.released_pages);
    ctx.reply(message, answer);
  }

  void on_clear(Context& ctx, const Message& message, const ClearCache& clear) {
    if (static_cast<CacheTier>(clear.tier) == CacheTier::hot) {
      CacheCleared answer{clear.tier, hot_bytes_, static_cast<std::uint32_t>(hot_.size()), {}};
      if (io_) io_->drop_writes(std::nullopt);
      release_all();
      spdlog::info("cache-writer: hot tier cleared: {} bytes in {} pages", answer.released_bytes, answer.released_pages);
      ctx.reply(message, answer);
      return;
    }
    if (!io_) {
      ctx.reply(message, CacheCleared{clear.tier, 0, 0, {"this server has no SSD tier (--ssd-cache-dir)"}});
      return;
    }
    const std::uint64_t id = next_job_++;
    answers_.emplace(id, PendingAnswer{message.envelope.from, message.envelope.correlation_id, CacheCleared{clear.tier, 0, 0, {}}});
    io_->clear(ClearJob{id});
  }

  // ---- the I/O thread's results -----------------------------------------------------------------

  void take_io_results(Context& ctx) {
    if (!io_) return;
    for (IoResult& result : io_->take_results()) {
      ssd_bytes_ = result.ssd_bytes;
      ssd_pages_ = result.ssd_pages;
      if (auto* write = std::get_if<WriteDone>(&result.done)) {
        on_written(*write);
      } else if (auto* read = std::get_if<ReadDone>(&result.done)) {
        on_read(ctx, *read);
      } else if (auto* cleared = std::get_if<ClearDone>(&result.done)) {
        finish_answer(ctx, cleared->id, [&](auto& answer) {
          if constexpr (std::is_same_v<std::decay_t<decltype(answer)>, CacheCleared>) {
            answer.released_bytes = cleared->bytes;
            answer.released_pages = cleared->pages;
            if (!cleared->error.empty()) answer.problems.push_back(cleared->error);
            spdlog::info("cache-writer: SSD tier cleared: {} bytes in {} pages", cleared->bytes, cleared->pages);
          }
        });
      } else if (auto* barrier = std::get_if<BarrierDone>(&result.done)) {
        finish_answer(ctx, barrier->id, [&](auto& answer) {
          if constexpr (std::is_same_v<std::decay_t<decltype(answer)>, ModelCacheClosed>) {
            release_model(answer.model);  // what the writes did not free (a failed write frees its page too)
            spdlog::info("cache-writer: model {} closed: {} hot bytes in {} pages released, {} writes finished",
                         answer.model, answer.released_bytes, answer.released_pages, answer.writes_drained);
          }
        });
      }
    }
  }

  void on_written(const WriteDone& done) {
    if (done.ok) {
      ++report_.writes;
    } else {
      ++report_.write_failures;
      ++report_.dropped;
      // The first failures and then one in a hundred: a full disk fails every write.
      if (report_.write_failures <= 10 || report_.write_failures % 100 == 0) {
        spdlog::warn("cache-writer: SSD write {} failed (page {:016x} of {} dropped; serving goes on): {}",
                     report_.write_failures, done.key, done.model, done.error);
      }
    }
    auto it = hot_.find(done.key);
    if (it != hot_.end() && it->second.queued) release(done.key);
  }

  template <typename Fill>
  void finish_answer(Context& ctx, std::uint64_t id, Fill fill) {
    auto it = answers_.find(id);
    if (it == answers_.end()) return;
    PendingAnswer pending = std::move(it->second);
    answers_.erase(it);
    std::visit([&](auto& answer) {
      fill(answer);
      ctx.send(pending.to, answer, {pending.correlation_id, 0, {}});
    }, pending.answer);
  }

  std::uint64_t by_model_bytes(const std::string& model) const {
    auto it = by_model_.find(model);
    return it == by_model_.end() ? 0 : it->second;
  }

  CacheReport report() const {
    CacheReport r = report_;
    r.hot_bytes = hot_bytes_;
    r.hot_budget_bytes = config_.hot_bytes;
    r.hot_pages = static_cast<std::uint32_t>(hot_.size());
    r.queued_write_bytes = queued_bytes_;
    r.ssd_bytes = ssd_bytes_;
    r.ssd_limit_bytes = io_ ? config_.ssd_bytes : 0;
    r.ssd_pages = ssd_pages_;
    r.hot_bytes_by_model = by_model_;
    return r;
  }

  CacheWriterConfig config_;
  std::unordered_map<std::uint64_t, HotPage> hot_;
  std::list<std::uint64_t> lru_;  // keys of pages not queued; front = least recently used
  std::map<std::string, std::uint64_t> by_model_;
  std::uint64_t hot_bytes_ = 0, queued_bytes_ = 0;
  std::uint64_t ssd_bytes_ = 0;
  std::uint32_t ssd_pages_ = 0;
  CacheReport report_;  // the counters; the figures are filled by report()

  std::unique_ptr<CacheIo> io_;
  zmq::socket_t notify_;
  std::uint64_t next_job_ = 1;
  std::map<std::uint64_t, PendingLookup> lookups_;
  std::map<std::uint64_t, PendingAnswer> answers_;
};

}  // namespace

std::unique_ptr<Actor> make_cache_writer(const ActorOptions& options) {
  return std::make_unique<CacheWriter>(cache_writer_config(options));
}

}  // namespace mqlm::actors
