#include "actors/executor/executor_options.hpp"

#include <algorithm>
#include <limits>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace mqlm::actors {

namespace {

constexpr std::uint64_t kMaxUint32 = std::numeric_limits<std::uint32_t>::max();

std::uint64_t parse_number(std::string_view key, std::string_view text, std::uint64_t max) {
  return parse_number_option("executor", key, text, 1, max);
}

std::set<std::uint64_t> parse_step_list(std::string_view key, std::string_view text) {
  std::set<std::uint64_t> steps;
  for (std::string_view step : split_option(text, ',')) {
    steps.insert(parse_number(key, step, std::numeric_limits<std::uint64_t>::max()));
  }
  return steps;
}

// The id named in option `key`, checked against the configured models.
std::string configured_id(const ExecutorOptions& parsed, std::string_view key, std::string_view id) {
  if (!parsed.models.contains(std::string(id))) {
    throw std::invalid_argument(fmt::format("executor option {}= names model '{}', which is not configured "
                                            "(configured: {})",
                                            key, id, configured_ids(parsed)));
  }
  return std::string(id);
}

}  // namespace

ExecutorOptions parse_executor_options(const ActorOptions& options) {
  check_option_names("executor", options,
                     {"model", "name", "models", "preload", "device", "kv_pages", "page_size", "block_mib",
                      "ceiling_bytes", "ceiling_fraction", "fail_steps", "fail_release", "cache_writer",
                      "log_steps_over_ms", "warm_up", "pipeline_cache", "spill_piece_pages", "mask_threads"});
  ExecutorOptions parsed;
  const std::string model = text_option(options, "model", "");
  if (options.contains("models")) {
    if (options.contains("model") || options.contains("name")) {
      throw std::invalid_argument("executor options model= (and name=) and models= do not go together: give one "
                                  "model as model=PATH name=ID, or several as models=ID=PATH;ID2=PATH2");
    }
    parsed.models = parse_model_list("executor", options.at("models"));
  } else if (!model.empty()) {
    std::string name = text_option(options, "name", "");
    if (options.contains("name") && name.empty()) {
      throw std::invalid_argument("executor option name= is empty: give the model a name");
    }
    if (name.empty()) {
      const std::filesystem::path file = std::filesystem::path(model).filename();
      name = file.extension() == ".gguf" ? file.stem().string() : file.string();
    }
    parsed.models.emplace(name, model);
    parsed.preload = {name};  // the one model is served from the start, unless preload= says otherwise
  } else {
    throw std::invalid_argument("actor executor needs option model=PATH (a GGUF file) or "
                                "models=ID=PATH;ID2=PATH2 (the models it may load)");
  }
  if (auto it = options.find("preload"); it != options.end()) {
    parsed.preload.clear();
    for (std::string_view id : split_option(it->second, ',')) {
      std::string checked = configured_id(parsed, "preload", id);
      if (std::find(parsed.preload.begin(), parsed.preload.end(), checked) == parsed.preload.end()) {
        parsed.preload.push_back(std::move(checked));
      }
    }
  }
  if (auto it = options.find("fail_release"); it != options.end()) {
    parsed.fail_release = configured_id(parsed, "fail_release", it->second);
  }
  parsed.device = text_option(options, "device", "");
  parsed.cache_writer = text_option(options, "cache_writer", "");
  parsed.pipeline_cache = text_option(options, "pipeline_cache", "");
  parsed.kv_pages = static_cast<std::uint32_t>(number_option("executor", options, "kv_pages", 1024, 1, kMaxUint32));
  parsed.page_size = static_cast<std::uint32_t>(number_option("executor", options, "page_size", 16, 1, kMaxUint32));
  parsed.block_mib = number_option("executor", options, "block_mib", 0, 1, 1 << 20);  // 0: sized by the ceiling
  parsed.ceiling_bytes = number_option("executor", options, "ceiling_bytes", 0);
  parsed.ceiling_fraction = fraction_option("executor", options, "ceiling_fraction", 0.0);
  parsed.log_steps_over_ms = number_option("executor", options, "log_steps_over_ms", 0);
  parsed.spill_piece_pages = number_option("executor", options, "spill_piece_pages", 0);
  if (options.contains("mask_threads")) {
    parsed.mask_threads = static_cast<int>(number_option("executor", options, "mask_threads", 0, 0, 64));
  }
  if (options.contains("warm_up")) parsed.warm_up = static_cast<int>(number_option("executor", options, "warm_up", 0, 0, 1));
  if (auto it = options.find("fail_steps"); it != options.end()) {
    parsed.fail_steps = parse_step_list(it->first, it->second);
  }
  // The GPU addresses a cache row as page * page_size + offset in 32 bits.
  if (std::uint64_t{parsed.kv_pages} * parsed.page_size > kMaxUint32) {
    throw std::invalid_argument(fmt::format("executor options kv_pages={} and page_size={} make more than 2^32 "
                                            "cache rows; use fewer or smaller pages",
                                            parsed.kv_pages, parsed.page_size));
  }
  return parsed;
}

std::string joined_ids(const std::vector<std::string_view>& ids) {
  return ids.empty() ? std::string("none") : fmt::format("{}", fmt::join(ids, ", "));
}

std::string configured_ids(const ExecutorOptions& options) {
  std::vector<std::string_view> ids;
  for (const auto& [id, path] : options.models) ids.push_back(id);
  return joined_ids(ids);
}

}  // namespace mqlm::actors
