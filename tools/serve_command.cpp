// `mqlm serve [MODEL.gguf]`: the server (of the bundled demo model when no model is named). Runs the executor, the scheduler and the gateway (and,
// with --http, the http actor: the OpenAI API) in this process, or some of them (--run) with the
// addresses of the others (--address), so the same deployment splits over processes or hosts by
// configuration alone. SIGINT or SIGTERM drains: the front ends refuse new requests, abort the
// running ones (or let them finish with --finish-running), and once none is open the actors stop
// in reverse order.
#include <algorithm>
#include <charconv>
#include <csignal>
#include <ctime>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <system_error>
#include <utility>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "actors/runtime/mailbox.hpp"
#include "actors/runtime/node.hpp"
#include "actors/registry.hpp"
#include "tools/command_options.hpp"
#include "tools/commands.hpp"

namespace mqlm::tools {

using namespace actors;

namespace {

constexpr const char* kServeMailbox = "serve";
constexpr const char* kDefaultHost = "127.0.0.1";
constexpr int kDefaultPort = 8080;
constexpr const char* kDefaultListen = "tcp://127.0.0.1:5555";
// Every kind serve runs, in start order: what others depend on first; stopping goes in reverse.
constexpr const char* kServeKinds[] = {"cache-writer", "executor", "enforcer", "scheduler", "gateway", "http"};
constexpr const char* kCacheWriter = "cache-writer";

struct ServeOptions {
  std::string model;
  std::string name;
  std::vector<std::string> models;   // -m/--model ID=PATH: the model pool (then `model` is not used)
                                     // or PATH: as the positional, when it is the only model named
  std::vector<std::string> preload;  // --preload ID
  std::vector<std::string> pinned;   // --pin ID
  std::vector<std::string> model_dirs;  // --models-dir DIR: every *.gguf in it, by file name
  std::vector<std::string> aliases;  // --alias NAME=ID
  std::vector<std::string> ttls;     // --ttl ID=SECONDS, or --ttl SECONDS for every model without one
  std::string memory_ceiling;        // bytes (8G, 8589934592), a fraction of the device (0.9, 90%); "": none
  double memory_soft = 0.85;         // fractions of the ceiling
  double memory_hard = 0.95;
  std::uint32_t pool_block_mib = 0;  // the executor's pool block size; 0: its default
  std::uint32_t log_steps_over_ms = 0;  // the executor profiles every step, logs the slower ones; 0: off
  std::string pipeline_cache;           // the executor's pipeline cache file; "": none
  std::string fail_release;          // fault injection for tests: this model's release throws midway
  std::uint32_t spill_piece_pages = 0;  // the executor's largest copy of spilled KV pages; 0: its default
  int mask_threads = -1;                 // threads walking response_format masks; -1: the executor's default
  // The KV prefix cache beyond the GPU (the cache-writer): its hot tier's budget ("0": no
  // cache-writer), its SSD tier ("": none), what Close and shutdown do with queued writes, and
  // the host memory above which the enforcer shrinks the hot tier.
  std::string hot_cache = "1G";
  std::string ssd_cache_dir;
  std::string ssd_cache = "16G";
  std::string cache_close = "drain";
  std::string host_memory_soft;
  bool fail_cache_writes = false;    // fault injection for tests: every SSD write fails
  std::string fail_cache_close;      // fault injection for tests: closing this model's cache throws
  std::string listen;   // the gateway's address; "": no gateway (unless --run names it)
  std::string http;     // HOST:PORT of the http actor (--http, or --host and --port)
  std::string host;     // --host, --port: the http actor's address the llama-server way
  int port = -1;        // -1: not given
  std::string api_key;  // both front ends'; "" : none
  std::vector<std::string> admin_api_keys;  // keys that may also load, unload and clear caches
  bool insecure = false;  // no warning for a front end beyond loopback without keys, ZeroMQ over tcp:// without CURVE
  std::string curve_key;      // the gateway's CURVE key pair file; "": none
  std::string curve_clients;  // the client keys it lets in (a file or a directory of *.pub); "": any
  std::string link_key;       // this process's CURVE key pair for tcp:// links to other processes; "": none
  std::vector<std::string> cors_origins;  // the http actor's CORS origins, or "*"; empty: no CORS
  std::uint32_t status_sample_ms = 0;     // the status page's sampling interval; 0: the http actor's default
  std::string pooling = "mean";  // how /v1/embeddings pools the final hidden states: mean or last
  std::string chat_template;     // --chat-template FILE: in place of every model's own; "": theirs
  std::vector<std::string> run;  // empty: the back end and the front ends asked for (choose_front_ends)
  std::vector<std::string> addresses;
  std::string device;
  std::uint32_t kv_pages = 1024;
  std::uint32_t page_size = 16;
  std::uint32_t ctx_size = 0;  // -c: tokens of KV cache, as pages of page_size; 0: kv_pages
  int gpu_layers = 0;          // -ngl: taken for llama-server's command lines, not used
  std::uint32_t max_sequences = 64;
  std::uint32_t token_budget = 512;
  std::uint32_t max_waiting = 4096;
  bool no_overlap = false;
  std::string speculate = "none";      // --speculate: none, or ngram (prompt lookup)
  std::uint32_t draft_max = 4;         // --draft-max: drafts a step with --speculate ngram
  std::uint32_t speculate_max_batch = 4;
  std::string trace;
  bool trace_without_blobs = false;
  bool finish_running = false;
  int drain_timeout_s = 60;
  int heartbeat_timeout_ms = 10000;
};

// A number of bytes, or with K, M, G or T: binary multiples; nothing if it is not one.
std::optional<std::uint64_t> size_in_bytes(const std::string& text) {
  std::uint64_t value = 0;
  const char* begin = text.data();
  const auto [end, error] = std::from_chars(begin, begin + text.size(), value);
  if (error != std::errc{} || text.empty()) return std::nullopt;
  const std::string_view suffix(end, static_cast<std::size_t>(begin + text.size() - end));
  static const std::map<std::string_view, int> kShifts = {{"", 0}, {"K", 10}, {"M", 20}, {"G", 30}, {"T", 40}};
  auto shift = kShifts.find(suffix);
  if (shift == kShifts.end() || (shift->second > 0 && value > (UINT64_MAX >> shift->second))) return std::nullopt;
  return value << shift->second;
}

// --memory-ceiling as the enforcer's option: ceiling_bytes=N for a size (a number of bytes, or
// with K, M, G or T: binary multiples), ceiling_fraction=F for a fraction of the device's memory
// (0.9, or 90%). "" and 0 mean no ceiling.
std::pair<std::string, std::string> ceiling_option(const std::string& text) {
  auto bad = [&] {
    return CommandFailed("--memory-ceiling " + text + ": give bytes (8589934592, 8G, 512M) or a fraction of the "
                         "device's memory (0.9 or 90%)", 2);
  };
  if (text.empty()) return {"ceiling_bytes", "0"};
  const bool percent = text.back() == '%';
  if (percent || text.find('.') != std::string::npos) {
    double value = 0;
    const std::string number = percent ? text.substr(0, text.size() - 1) : text;
    const auto [end, error] = std::from_chars(number.data(), number.data() + number.size(), value);
    if (error != std::errc{} || end != number.data() + number.size()) throw bad();
    if (percent) value /= 100.0;
    if (!(value > 0.0 && value <= 1.0)) throw bad();
    return {"ceiling_fraction", fmt::format("{}", value)};
  }
  const auto bytes = size_in_bytes(text);
  if (!bytes) throw bad();
  return {"ceiling_bytes", std::to_string(*bytes)};
}

// A size flag's bytes, or a usage error naming the flag.
std::string size_option(const std::string& flag, const std::string& text) {
  const auto bytes = size_in_bytes(text);
  if (!bytes) throw CommandFailed(flag + " " + text + ": give bytes (1073741824) or a size (1G, 512M)", 2);
  return std::to_string(*bytes);
}

// The id of a model pool entry ID=PATH.
std::string pool_id(const std::string& entry) { return entry.substr(0, entry.find('=')); }

// --model ID=PATH and every *.gguf of each --models-dir (its id: the file name without .gguf), in
// a stable order; an id given twice is refused.
std::vector<std::string> model_pool(const ServeOptions& o) {
  std::vector<std::string> pool = o.models;
  std::set<std::string> ids;
  for (const std::string& entry : o.models) ids.insert(pool_id(entry));
  for (const std::string& dir : o.model_dirs) {
    std::error_code error;
    std::vector<std::filesystem::path> files;
    for (std::filesystem::directory_iterator it(dir, error), end; !error && it != end; it.increment(error)) {
      if (it->path().extension() == ".gguf" && it->is_regular_file()) files.push_back(it->path());
    }
    if (error) throw CommandFailed("--models-dir " + dir + ": " + error.message(), 2);
    if (files.empty()) throw CommandFailed("--models-dir " + dir + " has no .gguf file", 2);
    std::sort(files.begin(), files.end());
    for (const auto& file : files) {
      const std::string id = file.stem().string();
      if (id.empty() || id.find_first_of("=;,") != std::string::npos) {
        throw CommandFailed("--models-dir " + dir + ": " + file.filename().string() +
                                " cannot be a model id (no '=', ';' or ','): rename it, or give it with --model ID=PATH",
                            2);
      }
      if (!ids.insert(id).second) {
        throw CommandFailed("model id '" + id + "' is given twice (" + file.string() +
                                "): give one of them another id with --model ID=PATH",
                            2);
      }
      pool.push_back(id + "=" + file.string());
    }
  }
  return pool;
}

// --ttl as the enforcer's ttl_s=ID=S;ID2=S: a plain --ttl SECONDS is every model's that --ttl ID=S
// does not name.
std::string ttl_option(const ServeOptions& o, const std::vector<std::string>& pool) {
  std::optional<std::string> every;
  std::map<std::string, std::string> ttls;
  for (const std::string& ttl : o.ttls) {
    const auto equals = ttl.find('=');
    if (equals == std::string::npos) {
      every = ttl;
    } else {
      ttls[ttl.substr(0, equals)] = ttl.substr(equals + 1);
    }
  }
  if (every) {
    for (const std::string& entry : pool) ttls.try_emplace(pool_id(entry), *every);
  }
  std::vector<std::string> pairs;
  for (const auto& [id, seconds] : ttls) pairs.push_back(id + "=" + seconds);
  return fmt::format("{}", fmt::join(pairs, ";"));
}

bool runs(const ServeOptions& o, const std::string& kind) {
  return std::find(o.run.begin(), o.run.end(), kind) != o.run.end();
}

// Whether a --model entry is ID=PATH rather than a path (which may hold a '=' after a '/').
bool is_pool_entry(const std::string& entry) {
  const auto equals = entry.find('=');
  return equals != std::string::npos && equals > 0 && entry.substr(0, equals).find('/') == std::string::npos;
}

// -m/--model PATH, as llama-server and vllm serve take it: the only model named is served as the
// positional one is (loaded at start, --name applies); beside other models it joins the pool under
// its file name. With no model named at all, the demo model.
void settle_models(ServeOptions& o) {
  std::vector<std::string> paths;
  std::erase_if(o.models, [&](const std::string& entry) {
    if (is_pool_entry(entry)) return false;
    paths.push_back(entry);
    return true;
  });
  for (const std::string& path : paths) {
    if (!std::filesystem::is_regular_file(path)) throw CommandFailed("--model " + path + ": no such file", 2);
  }
  if (paths.size() == 1 && o.models.empty() && o.model_dirs.empty()) {
    if (!o.model.empty()) throw CommandFailed("two models named (" + o.model + " and -m " + paths[0] +
                                              "): give one, or several as --model ID=PATH", 2);
    o.model = paths[0];
    return;
  }
  for (const std::string& path : paths) o.models.push_back(std::filesystem::path(path).stem().string() + "=" + path);
  if (o.models.empty() && o.model_dirs.empty()) o.model = resolve_model(o.model);
}

// Which front ends run, and where. Each is asked for by its flags: ZeroMQ by --listen, HTTP by
// --http, --host or --port; with neither, HTTP alone on 127.0.0.1:8080, as llama-server and vllm
// serve do, so that a second server on another --port does not collide on a ZeroMQ port it never
// asked for. An explicit --run decides for itself (plus http when --http is given), a front end it
// names listening at its default address when its flag is not given.
void choose_front_ends(ServeOptions& o) {
  if (!o.host.empty() || o.port >= 0) {
    o.http = (o.host.empty() ? std::string(kDefaultHost) : o.host) + ":" +
             std::to_string(o.port < 0 ? kDefaultPort : o.port);
  }
  const bool asked_http = !o.http.empty() || (o.listen.empty() && o.run.empty());
  if (o.run.empty()) {
    o.run = {kCacheWriter, "executor", "enforcer", "scheduler"};
    if (!o.listen.empty()) o.run.push_back("gateway");
  }
  if (asked_http && !runs(o, "http")) o.run.push_back("http");
  if (o.listen.empty()) o.listen = kDefaultListen;
  if (o.http.empty()) o.http = std::string(kDefaultHost) + ":" + std::to_string(kDefaultPort);
}

// Every kind --run names is one serve runs.
void check_run(const ServeOptions& o) {
  for (const auto& r : o.run) {
    if (std::find(std::begin(kServeKinds), std::end(kServeKinds), r) == std::end(kServeKinds)) {
      throw CommandFailed("--run takes cache-writer, executor, enforcer, scheduler, gateway and http, not '" + r + "'",
                          2);
    }
  }
}

// -c/--ctx-size as KV pages: enough pages of --page-size for that many tokens.
void settle_context(ServeOptions& o) {
  if (o.ctx_size > 0) o.kv_pages = (o.ctx_size + o.page_size - 1) / o.page_size;
}

// The gateway's and the http actor's: where they listen, their keys, CORS.
void add_front_end_options(const ServeOptions& o, std::map<std::string, ActorOptions>& options) {
  // A backend process that dies is noticed within about 0.6 s: clients hear within a second.
  options["gateway"] = {{"listen", o.listen}, {"heartbeat_ms", "100"}, {"unavailable_ms", "500"}};
  options["http"] = {{"listen", o.http}, {"heartbeat_ms", "100"}, {"unavailable_ms", "500"}};
  for (const char* kind : {"gateway", "http"}) {
    if (!o.api_key.empty()) options[kind]["api_key"] = o.api_key;
    if (!o.admin_api_keys.empty()) options[kind]["admin_api_keys"] = fmt::format("{}", fmt::join(o.admin_api_keys, ","));
  }
  if (!o.curve_key.empty()) options["gateway"]["curve_key"] = o.curve_key;
  if (!o.curve_clients.empty()) options["gateway"]["curve_clients"] = o.curve_clients;
  if (!o.cors_origins.empty()) options["http"]["cors_origins"] = fmt::format("{}", fmt::join(o.cors_origins, ","));
  if (o.status_sample_ms > 0) options["http"]["history_ms"] = std::to_string(o.status_sample_ms);
  options["http"]["pooling"] = o.pooling;
}

NodeConfig serve_config(const ServeOptions& o) {
  NodeConfig config;
  add_addresses(config.topology, o.addresses, "scheduler=ipc:///tmp/mqlm-scheduler");
  for (const char* name : {"gateway", "http", "scheduler", "executor", "enforcer", kCacheWriter, kServeMailbox}) {
    config.topology.add(name);
  }
  add_link_keys(config.topology, o.link_key, o.insecure);

  // The model pool: every actor of it gets the same list. One model named on the command line is
  // a pool of one, loaded at start.
  std::string preload = fmt::format("{}", fmt::join(o.preload, ","));
  std::vector<std::string> pool = model_pool(o);
  if (pool.empty()) {
    const std::string name = !o.name.empty() ? o.name : std::filesystem::path(o.model).stem().string();
    pool.push_back(name + "=" + o.model);
    preload = name;
  }
  const std::string models = fmt::format("{}", fmt::join(pool, ";"));
  const std::string aliases = fmt::format("{}", fmt::join(o.aliases, ";"));
  const std::string ttls = ttl_option(o, pool);
  std::map<std::string, ActorOptions> options;
  options["executor"] = {{"models", models}, {"kv_pages", std::to_string(o.kv_pages)},
                         {"page_size", std::to_string(o.page_size)}};
  if (!preload.empty()) options["executor"]["preload"] = preload;
  if (!o.device.empty()) options["executor"]["device"] = o.device;
  if (o.pool_block_mib > 0) options["executor"]["block_mib"] = std::to_string(o.pool_block_mib);
  if (o.log_steps_over_ms > 0) options["executor"]["log_steps_over_ms"] = std::to_string(o.log_steps_over_ms);
  if (!o.pipeline_cache.empty()) options["executor"]["pipeline_cache"] = o.pipeline_cache;
  if (!o.fail_release.empty()) options["executor"]["fail_release"] = o.fail_release;
  if (o.spill_piece_pages > 0) options["executor"]["spill_piece_pages"] = std::to_string(o.spill_piece_pages);
  if (o.mask_threads >= 0) options["executor"]["mask_threads"] = std::to_string(o.mask_threads);
  const auto [ceiling_key, ceiling_value] = ceiling_option(o.memory_ceiling);
  options["executor"][ceiling_key] = ceiling_value;  // its pool's blocks are sized by the ceiling
  options["enforcer"] = {{"models", models}, {"kv_pages", std::to_string(o.kv_pages)},
                         {"page_size", std::to_string(o.page_size)},
                         {ceiling_key, ceiling_value},
                         {"soft", fmt::format("{}", o.memory_soft)},
                         {"hard", fmt::format("{}", o.memory_hard)}};
  if (!preload.empty()) options["enforcer"]["preload"] = preload;
  if (!o.pinned.empty()) options["enforcer"]["pinned"] = fmt::format("{}", fmt::join(o.pinned, ","));
  if (!ttls.empty()) options["enforcer"]["ttl_s"] = ttls;
  if (!aliases.empty()) options["enforcer"]["aliases"] = aliases;  // admin requests may name a model by an alias
  options["scheduler"] = {{"models", models},
                          {"max_sequences", std::to_string(o.max_sequences)},
                          {"token_budget", std::to_string(o.token_budget)},
                          {"max_waiting", std::to_string(o.max_waiting)},
                          {"overlap", o.no_overlap ? "0" : "1"},
                          {"draft_max", o.speculate == "ngram" ? std::to_string(o.draft_max) : "0"},
                          {"speculate_max_batch", std::to_string(o.speculate_max_batch)}};
  if (!o.chat_template.empty()) options["scheduler"]["chat_template"] = o.chat_template;
  if (!aliases.empty()) options["scheduler"]["aliases"] = aliases;  // and so may generate requests
  // Without an enforcer here or at a given address, only the models loaded at start are served.
  const bool enforcer_elsewhere = std::any_of(o.addresses.begin(), o.addresses.end(),
                                              [](const std::string& a) { return a.starts_with("enforcer="); });
  if (runs(o, "enforcer") || enforcer_elsewhere) options["scheduler"]["enforcer"] = "enforcer";
  add_front_end_options(o, options);
  // Admin requests and the memory picture go to the enforcer.
  for (const char* kind : {"gateway", "http"}) {
    if (runs(o, "enforcer") || enforcer_elsewhere) options[kind]["enforcer"] = "enforcer";
  }
  // The cache-writer: pages the GPU gives up go to it from the executor, the scheduler asks it for
  // prefixes, the executor closes a model's pages in it, the enforcer samples it, front ends clear it.
  const bool cache_elsewhere = std::any_of(o.addresses.begin(), o.addresses.end(),
                                           [](const std::string& a) { return a.starts_with("cache-writer="); });
  const std::string hot_bytes = size_option("--hot-cache", o.hot_cache);
  if (hot_bytes != "0" && (runs(o, kCacheWriter) || cache_elsewhere)) {
    options[kCacheWriter] = {{"hot_bytes", hot_bytes}, {"close", o.cache_close}};
    if (!o.ssd_cache_dir.empty()) {
      // Stopping, the GPU's most recent prefix pages (a hot tier's worth) go to SSD too.
      if (o.cache_close == "drain") options["scheduler"]["stop_spill_bytes"] = hot_bytes;
      options[kCacheWriter]["ssd_dir"] = o.ssd_cache_dir;
      options[kCacheWriter]["ssd_bytes"] = size_option("--ssd-cache", o.ssd_cache);
    }
    if (o.fail_cache_writes) options[kCacheWriter]["fail_writes"] = "1";
    if (!o.fail_cache_close.empty()) options[kCacheWriter]["fail_close"] = o.fail_cache_close;
    for (const char* kind : {"scheduler", "executor", "enforcer", "gateway", "http"}) {
      options[kind]["cache_writer"] = kCacheWriter;
    }
    if (!o.host_memory_soft.empty()) {
      options["enforcer"]["host_soft_bytes"] = size_option("--host-memory-soft", o.host_memory_soft);
    }
  } else if (!o.ssd_cache_dir.empty()) {
    throw CommandFailed("--ssd-cache-dir needs the hot cache (--hot-cache above 0): pages reach the SSD through it", 2);
  }
  for (const char* kind : kServeKinds) {
    if (!runs(o, kind) || !options.contains(kind)) continue;
    ActorOptions actor_options = options[kind];
    try {
      if (std::string(kind) != "executor") make_actor(kind, actor_options);  // bad options fail now
    } catch (const std::invalid_argument& e) {
      throw CommandFailed(e.what(), 2);
    }
    config.actors.push_back({kind, [kind, actor_options] { return make_actor(kind, actor_options); }, {}});
  }
  config.trace_file = o.trace;
  config.topology.trace_blobs = !o.trace_without_blobs;
  // Loading a model takes a while inside on_start; the heartbeat must not call that a hang.
  config.supervisor.heartbeat_timeout = std::chrono::milliseconds(o.heartbeat_timeout_ms);
  return config;
}

// A start failure, with the flag to change when it names a front end's address: that address is
// most often taken by another server.
std::string start_failure_advice(const ServeOptions& o, const std::string& what) {
  if (runs(o, "gateway") && what.find(o.listen) != std::string::npos) {
    return what + "; give this server another --listen address, or leave --listen out to serve HTTP only";
  }
  if (runs(o, "http") && what.find(o.http) != std::string::npos) {
    return what + "; give this server another --port (or --http HOST:PORT)";
  }
  return what;
}

// An address other than loopback reaches beyond this machine: without keys, anyone there may
// generate, load, unload and clear. Said loudly at start unless --insecure.
void warn_if_open(const ServeOptions& o) {
  if (o.insecure || !o.api_key.empty() || !o.admin_api_keys.empty()) return;
  auto beyond_loopback = [](std::string_view host) {
    return !(host.starts_with("127.") || host == "localhost" || host == "::1" || host == "[::1]");
  };
  std::vector<std::string> open;
  if (runs(o, "http") && beyond_loopback(o.http.substr(0, o.http.rfind(':')))) open.push_back("http://" + o.http);
  // With --curve-clients only the clients listed may connect at all.
  if (runs(o, "gateway") && o.listen.starts_with("tcp://") && o.curve_clients.empty()) {
    const std::string host = o.listen.substr(6, o.listen.rfind(':') - 6);
    if (beyond_loopback(host)) open.push_back(o.listen);
  }
  if (open.empty()) return;
  spdlog::warn("WARNING: {} can be reached beyond this machine and takes no API key: anyone who can connect may "
               "generate, load and unload models and clear caches. Give --api-key (and --admin-api-key), or "
               "--insecure to serve so on purpose.",
               fmt::join(open, " and "));
}

// ZeroMQ over tcp:// goes encrypted and authenticated (CURVE) unless --insecure says otherwise;
// ipc:// is guarded by the file system's permissions.
void check_curve(const ServeOptions& o) {
  if (!o.curve_clients.empty() && o.curve_key.empty()) {
    throw CommandFailed("--curve-clients needs --curve-key (the server's key pair, from `mqlm keygen NAME`)", 2);
  }
  if (!runs(o, "gateway")) return;
  if (o.curve_key.empty()) {
    if (o.listen.starts_with("tcp://") && !o.insecure) {
      throw CommandFailed("ZeroMQ over tcp:// (" + o.listen + ") is encrypted and authenticated with CURVE: give "
                              "--curve-key FILE (make one with `mqlm keygen server`) and --curve-clients with the "
                              "clients' public keys, or --insecure to serve it in the clear to anyone who can "
                              "connect (docs/protocol.md, \"Security\")",
                          2);
    }
    return;
  }
  if (o.curve_clients.empty()) {
    spdlog::warn("WARNING: CURVE without --curve-clients: any client that knows this server's public key may connect "
                 "to {}; give --curve-clients FILE|DIR to let in only the keys listed there",
                 o.listen);
  }
}

void serve(ServeOptions o) {
  check_run(o);
  settle_models(o);
  choose_front_ends(o);
  check_curve(o);
  warn_if_open(o);
  settle_context(o);
  NodeConfig config = serve_config(o);
  std::vector<std::string> front_ends;
  for (const char* kind : {"gateway", "http"}) {
    if (runs(o, kind)) front_ends.push_back(kind);
  }

  sigset_t signals = block_stop_signals();

  Node node(std::move(config));
  Mailbox control(node.context(), node.topology(), kServeMailbox);
  try {
    node.start();
  } catch (const std::exception& e) {
    throw CommandFailed("could not start: " + start_failure_advice(o, e.what()), 1);
  }
  std::vector<std::string> listening;
  if (runs(o, "gateway")) listening.push_back(o.listen);
  if (runs(o, "http")) listening.push_back("http://" + o.http);
  if (!listening.empty()) {
    spdlog::info("serving {} on {}", o.model.empty() ? "the model pool" : o.model, fmt::join(listening, " and "));
    std::cout << "ready: listening on " << fmt::format("{}", fmt::join(listening, " and ")) << std::endl;
  } else {
    std::cout << "ready" << std::endl;
  }
  int signal = 0;
  sigwait(&signals, &signal);
  std::cout << "draining" << std::endl;
  if (!front_ends.empty()) {
    for (const auto& front_end : front_ends) control.send(front_end, messages::Drain{!o.finish_running});
    // A second signal stops at once; otherwise wait for each front end's last request to end.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(o.drain_timeout_s);
    std::size_t drained = 0;
    while (drained < front_ends.size() && std::chrono::steady_clock::now() < deadline) {
      if (auto message = control.receive(std::chrono::milliseconds(100))) {
        if (message->as<messages::Drained>() != nullptr) ++drained;
      }
      timespec none{0, 0};
      if (sigtimedwait(&signals, nullptr, &none) > 0) break;
    }
    if (drained < front_ends.size()) spdlog::warn("stopping with requests still open");
  }
  node.stop();
  std::cout << "stopped" << std::endl;
}

// The KV prefix cache beyond the GPU: its tiers and their faults for tests.
void add_cache_flags(CLI::App* cmd, ServeOptions& o) {
  cmd->add_option("--hot-cache", o.hot_cache,
                  "RAM for KV prefix pages the GPU gives up, shared by all models (bytes, or 1G, 512M); a returning "
                  "prompt prefix is restored from it instead of recomputed; 0: no cache-writer")
      ->capture_default_str();
  cmd->add_option("--ssd-cache-dir", o.ssd_cache_dir,
                  "keep pages leaving the hot cache in this folder too (kept across restarts, checked when read)");
  cmd->add_option("--ssd-cache", o.ssd_cache, "the SSD cache's size limit (bytes, or 16G, 512M)")->capture_default_str();
  cmd->add_option("--cache-close", o.cache_close,
                  "what unloading a model and stopping do with the pages still queued for the SSD: drain (write "
                  "them first) or drop")
      ->capture_default_str()
      ->check(CLI::IsMember({"drain", "drop"}));
  cmd->add_option("--host-memory-soft", o.host_memory_soft,
                  "resident memory (bytes, or 48G) above which the hot cache gives up its least recently used "
                  "pages (default: never)");
  cmd->add_flag("--fail-cache-writes", o.fail_cache_writes, "testing: every SSD cache write fails as on a full disk")
      ->group("Testing");
  cmd->add_option("--fail-cache-close", o.fail_cache_close,
                  "testing: closing this model's cached pages throws midway (they must still all be released)")
      ->group("Testing");
}

// Where clients connect: HTTP (llama-server's --host and --port, or --http) and ZeroMQ.
void add_front_end_flags(CLI::App* cmd, ServeOptions& o) {
  cmd->add_option("--listen", o.listen,
                  "serve the ZeroMQ client protocol (docs/protocol.md) at tcp://HOST:PORT or ipc://PATH; without "
                  "--http, --host or --port then no HTTP");
  auto* http = cmd->add_option("--http", o.http,
                               "serve the OpenAI API over HTTP at HOST:PORT (default 127.0.0.1:8080 unless --listen "
                               "is given)");
  cmd->add_option("--host", o.host, "the HTTP API's address (default 127.0.0.1)")->excludes(http);
  cmd->add_option("--port", o.port, "the HTTP API's port (default 8080)")->excludes(http)->check(CLI::Range(0, 65535));
  auto no_commas = [](const std::string& key) {
    if (key.find(',') != std::string::npos) throw CLI::ValidationError("an API key holds no commas");
  };
  cmd->add_option("--api-key", o.api_key,
                  "the server's key: HTTP clients send Authorization: Bearer KEY (every endpoint but /health, /ready "
                  "and /live), ZeroMQ clients \"api_key\"")
      ->envname("MQLM_API_KEY")
      ->each(no_commas);
  cmd->add_option("--admin-api-key", o.admin_api_keys,
                  "a key that may also load and unload models and clear caches (repeatable); once one is given, "
                  "only these may")
      ->each(no_commas);
  cmd->add_flag("--insecure", o.insecure,
                "serve beyond this machine (a --host or --listen address other than loopback) without API keys, "
                "and without the warning; and serve ZeroMQ over tcp:// (--listen, --address) without CURVE");
  cmd->add_option("--curve-key", o.curve_key,
                  "encrypt and authenticate ZeroMQ clients with CURVE, with this key pair file (NAME.key from "
                  "`mqlm keygen NAME`); required for a tcp:// --listen unless --insecure");
  cmd->add_option("--curve-clients", o.curve_clients,
                  "with --curve-key: let in only these clients' keys, a file of public keys (one per line, # "
                  "comments) or a directory of NAME.pub files (default: any client that knows the server's public "
                  "key)");
  cmd->add_option("--status-sample-ms", o.status_sample_ms,
                  "how often the status page at / samples the server (it plots the last 360; default 10000)")
      ->check(CLI::Range(10u, 3'600'000u));
  cmd->add_option("--cors-origin", o.cors_origins,
                  "let browser pages from this origin (such as http://localhost:3000) call the HTTP API; "
                  "repeatable, or * for any")
      ->each([](const std::string& origin) {
        if (origin.empty() || origin.find(',') != std::string::npos) {
          throw CLI::ValidationError("an origin is SCHEME://HOST[:PORT] or *, without commas");
        }
      });
  cmd->add_option("--pooling", o.pooling,
                  "how POST /v1/embeddings pools a model's final hidden states: mean (of every position) or last "
                  "(the last position's), as llama-server's --pooling")
      ->capture_default_str()
      ->check(CLI::IsMember({"mean", "last"}));
  cmd->add_option("--chat-template", o.chat_template,
                  "a Jinja chat template file that renders the messages of chat requests, in place of the models' own "
                  "(tokenizer.chat_template): for a model without one, or to fix one")
      ->check(CLI::ExistingFile);
}

// How much the server holds and computes at once: KV cache, sequences, step budget, queue.
void add_capacity_flags(CLI::App* cmd, ServeOptions& o) {
  auto* kv_pages = cmd->add_option("--kv-pages", o.kv_pages, "KV cache pages (or give -c)")
                      ->capture_default_str()
                      ->check(CLI::Range(1u, 1u << 24));
  cmd->add_option("--page-size", o.page_size, "tokens per KV page")->capture_default_str()->check(CLI::Range(1u, 4096u));
  cmd->add_option("-c,--ctx-size", o.ctx_size,
                  "tokens of KV cache, shared by the running sequences: the longest prompt plus max_tokens one "
                  "request may have (sets --kv-pages to this over --page-size, rounded up)")
      ->excludes(kv_pages)
      ->check(CLI::Range(1u, 1u << 30));
  cmd->add_option("--gpu-layers,--n-gpu-layers", o.gpu_layers,
                  "accepted for llama-server's command lines (-ngl) and ignored: every layer runs on the GPU");
  cmd->add_option("--max-sequences,--parallel,--max-num-seqs", o.max_sequences,
                  "sequences in a step at most (-np as llama-server's)")
      ->capture_default_str()
      ->check(CLI::Range(1u, 4096u));
  cmd->add_option("--token-budget", o.token_budget, "tokens computed per step at most (decode and prefill chunks)")
      ->capture_default_str()
      ->check(CLI::Range(1u, 1u << 20));
  cmd->add_flag("--no-overlap", o.no_overlap,
                "plan each step only once the one before is answered (default: the next step is planned while "
                "the GPU runs this one)");
  cmd->add_option("--speculate", o.speculate,
                  "speculative decoding: ngram drafts up to --draft-max tokens a step from an earlier occurrence "
                  "of the text's last words, verified in the step by the request's own draw (output unchanged, "
                  "greedy or sampled; not for requests with logprobs or a response_format); none: off")
      ->capture_default_str()
      ->check(CLI::IsMember({"none", "ngram"}));
  cmd->add_option("--draft-max", o.draft_max, "drafted tokens a step at most, with --speculate ngram")
      ->capture_default_str()
      ->check(CLI::Range(1u, 32u));
  cmd->add_option("--speculate-max-batch", o.speculate_max_batch,
                  "speculate only while at most this many sequences run (a larger batch keeps the GPU busy already)")
      ->capture_default_str()
      ->check(CLI::Range(0u, 4096u));
  cmd->add_option("--max-waiting", o.max_waiting, "queued requests before new ones are told busy")
      ->capture_default_str()
      ->check(CLI::Range(1u, 1u << 24));
}

}  // namespace

void add_serve_command(CLI::App& app) {
  auto o = std::make_shared<ServeOptions>();
  auto* cmd = app.add_subcommand("serve",
                                 "serve GGUF models over the OpenAI API (HTTP) and, with --listen, the ZeroMQ client "
                                 "protocol (docs/protocol.md)");
  add_model_positional(*cmd, o->model);
  cmd->add_option("--name,--served-model-name", o->name,
                  "the model's name for clients (default: the file name without .gguf)");
  cmd->add_option("-m,--model", o->models,
                  "PATH: the model to serve, as the positional MODEL; ID=PATH: serve several models (repeatable); "
                  "they load on their first request unless --preload names them, and the positional model is not "
                  "used");
  cmd->add_option("--preload", o->preload, "with --model: load this model at start (repeatable)");
  cmd->add_option("--pin", o->pinned, "with --model: never evict this model (repeatable)");
  cmd->add_option("--models-dir", o->model_dirs,
                  "serve every .gguf file in this folder, each with its file name without .gguf as its id "
                  "(repeatable; with or without --model)");
  cmd->add_option("--alias", o->aliases,
                  "NAME=ID: clients may call model ID by NAME too, in requests and admin calls (repeatable)");
  cmd->add_option("--ttl", o->ttls,
                  "ID=SECONDS: unload model ID after it has had no request for this long; SECONDS alone: every "
                  "model's that no ID=SECONDS names (repeatable; default: never)");
  cmd->add_option("--memory-ceiling", o->memory_ceiling,
                  "device memory the loaded models may take: bytes (8G, 512M, 8589934592) or a fraction of the "
                  "device's (0.9, 90%); a load beyond it evicts idle unpinned models first, or is refused (507) "
                  "(default: no ceiling)");
  cmd->add_option("--memory-soft", o->memory_soft,
                  "fraction of the ceiling above which the pool is trimmed and idle unpinned models are evicted")
      ->capture_default_str()->check(CLI::Range(0.01, 1.0));
  cmd->add_option("--memory-hard", o->memory_hard,
                  "fraction of the ceiling above which the largest busy unpinned model is evicted")
      ->capture_default_str()->check(CLI::Range(0.01, 1.0));
  cmd->add_option("--pool-block-mib", o->pool_block_mib,
                  "size of the device memory blocks the buffer pool takes from the driver (default: the executor's)")
      ->check(CLI::Range(1u, 65536u));
  cmd->add_option("--pipeline-cache", o->pipeline_cache,
                  "keep the GPU's compiled kernels in this file: read at start (if it was made by the same device and "
                  "driver), written after each model load, so a restart does not compile them again");
  cmd->add_option("--log-slow-steps", o->log_steps_over_ms,
                  "profile every step on the GPU and log each one slower than this many milliseconds, with where "
                  "its time went (a diagnostic: the timestamps cost a little)");
  cmd->add_option("--spill-piece-pages", o->spill_piece_pages,
                  "KV pages going to the host cache are copied in pieces of at most this many pages, each with "
                  "staging memory of its own (default: as many as half a pool block holds)")
      ->check(CLI::Range(1u, 1u << 30));
  cmd->add_option("--mask-threads", o->mask_threads,
                  "threads beside the executor's that work out response_format requests' allowed tokens each step "
                  "(default: half the cores, at most 8; 0: the executor's thread alone)")
      ->check(CLI::Range(0, 64));
  cmd->add_option("--fail-release", o->fail_release,
                  "testing: unloading this model throws midway through its release (the rest must still be freed "
                  "and the failure reported)")
      ->group("Testing");
  add_cache_flags(cmd, *o);
  add_front_end_flags(cmd, *o);
  cmd->add_option("--run", o->run,
                  "which actors this process runs (default: cache-writer executor enforcer scheduler, gateway with "
                  "--listen, http with --http, --host, --port or without --listen)")
      ->delimiter(',');
  add_address_flags(*cmd, o->addresses, o->link_key);
  cmd->add_option("--device", o->device, "Vulkan device: index or name substring (default MQLM_VULKAN_DEVICE)");
  add_capacity_flags(cmd, *o);
  cmd->add_option("--trace", o->trace, "record every message of this process's actors to this file");
  cmd->add_flag("--trace-without-blobs", o->trace_without_blobs, "record blob frames by size only");
  cmd->add_flag("--finish-running", o->finish_running, "on SIGINT / SIGTERM let running requests finish (default: abort them)");
  cmd->add_option("--drain-timeout-s", o->drain_timeout_s, "longest wait for open requests when stopping")
      ->capture_default_str()
      ->check(CLI::Range(0, 3600));
  cmd->callback([o] { serve(*o); });
}

}  // namespace mqlm::tools
