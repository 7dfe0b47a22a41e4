// What the scheduler knows of one configured model: enough to turn prompts into tokens and tokens
// into text, and, while it is loaded, its KV page table.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "actors/scheduler/kv_page_table.hpp"
#include "messages/models.hpp"
#include "model/chat/chat_template.hpp"
#include "model/chat/output_parser.hpp"
#include "model/tokenizer/tokenizer.hpp"

namespace mqlm::actors {

struct ServedModel {
  std::string name;
  // Mixed into prefix-cache keys, so models never share pages: the id and the file's identity, so a
  // page on SSD is never restored into other weights served under the same id.
  std::uint64_t key = 0;
  std::uint64_t page_bytes = 0;      // a KV page on the host (the executor's figure)
  model::Vocabulary vocabulary;
  std::unique_ptr<model::Tokenizer> tokenizer;
  std::optional<model::ChatTemplate> chat;
  std::string chat_problem;  // without `chat`: why (no template, or one that does not parse)
  model::OutputConventions output;  // what its chat template says it writes: <think>, its tool call format
  std::vector<std::int32_t> stop_tokens;  // EOS, EOT and the end-of-turn tokens its chat template writes
  std::uint32_t n_ctx = 0;
  std::uint32_t n_vocab = 0;  // ids that may appear in a prompt or be sampled

  messages::ModelState state = messages::ModelState::unloaded;
  std::optional<KvPageTable> pages;  // while loaded: made from the executor's figures
  std::uint32_t kv_capacity_tokens = 0;
  std::uint32_t open_requests = 0;   // in the request table
  bool load_requested = false;       // a LoadRequest to the enforcer awaits its answer
  bool drain_pending = false;        // AbortModel came: ModelDrained goes once no step of it is in flight
  messages::ModelOutcomes outcomes;  // its requests' ends, for /health and /metrics

  bool served() const { return state == messages::ModelState::loaded && pages.has_value(); }
};

// Reads what the scheduler needs of the GGUF file at `path` (vocabulary, chat template, context
// length, the file's identity); done when the scheduler is built, never in a handler (the replay
// rule). `chat_template`, when not empty, replaces the file's own. Throws std::invalid_argument
// saying what is wrong with the file (a chat template that does not parse only fails chat requests).
std::unique_ptr<ServedModel> read_served_model(const std::string& name, const std::filesystem::path& path,
                                               const std::string& chat_template = {});

}  // namespace mqlm::actors
