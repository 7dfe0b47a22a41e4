#include "actors/scheduler/served_model.hpp"

#include <algorithm>
#include <fstream>
#include <stdexcept>

#include <xxhash.h>

#include "model/gguf/gguf_file.hpp"
#include "model/gguf/vocabulary_metadata.hpp"

namespace mqlm::actors {

namespace {

// The prefix cache's name for a model: its id, its file's size and a hash of samples of the file
// (the first MiB, where the metadata and tensor layout are, and 4 KiB at 64 places through the
// weights), so weights replaced under the same id never share pages with the old ones, even
// pages kept on SSD across a restart. Milliseconds for a file of gigabytes.
std::uint64_t model_identity(const std::string& name, const std::filesystem::path& path) {
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  XXH3_64bits_update(state, name.data(), name.size());
  std::ifstream file(path, std::ios::binary);
  const std::uint64_t size = std::filesystem::file_size(path);
  XXH3_64bits_update(state, &size, sizeof size);
  std::vector<char> sample(std::size_t{1} << 20);
  auto hash_at = [&](std::uint64_t offset, std::size_t bytes) {
    file.clear();
    file.seekg(static_cast<std::streamoff>(offset));
    file.read(sample.data(), static_cast<std::streamsize>(std::min<std::uint64_t>(bytes, size - std::min(size, offset))));
    XXH3_64bits_update(state, sample.data(), static_cast<std::size_t>(file.gcount()));
  };
  hash_at(0, sample.size());
  for (std::uint64_t i = 1; i <= 64; ++i) hash_at(size / 65 * i, 4096);
  const std::uint64_t identity = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return identity;
}

}  // namespace

std::unique_ptr<ServedModel> read_served_model(const std::string& name, const std::filesystem::path& path,
                                               const std::string& chat_template) {
  const std::string where = path.string();
  auto opened = model::gguf::GgufFile::open(path);
  if (auto* e = std::get_if<model::gguf::GgufError>(&opened)) throw std::invalid_argument(where + ": " + e->message());
  const auto& file = std::get<model::gguf::GgufFile>(opened);
  auto vocabulary = model::gguf::read_vocabulary(file);
  if (auto* e = std::get_if<model::gguf::GgufError>(&vocabulary)) {
    throw std::invalid_argument(where + ": " + e->message());
  }
  auto served = std::make_unique<ServedModel>();
  ServedModel& m = *served;
  m.vocabulary = std::get<model::Vocabulary>(std::move(vocabulary));
  auto tokenizer = model::Tokenizer::create(m.vocabulary);
  if (auto* e = std::get_if<model::TokenizerError>(&tokenizer)) throw std::invalid_argument(where + ": " + e->message);
  m.tokenizer = std::make_unique<model::Tokenizer>(std::get<model::Tokenizer>(std::move(tokenizer)));
  m.name = name;
  m.key = model_identity(m.name, path);
  m.n_vocab = static_cast<std::uint32_t>(m.tokenizer->size());
  if (const auto* arch = file.get<std::string>("general.architecture")) {
    if (const auto* ctx = file.get<std::uint32_t>(*arch + ".context_length")) m.n_ctx = *ctx;
  }
  auto chat = model::chat_template_for(m.vocabulary, chat_template);
  if (auto* t = std::get_if<model::ChatTemplate>(&chat)) {
    m.chat = *t;
    m.output = model::output_conventions(t->source());
    m.stop_tokens = t->end_of_turn_tokens(m.vocabulary);
  } else {
    m.chat_problem = std::get<model::ChatTemplateError>(chat).message;
    for (std::int32_t id : {m.tokenizer->eos(), m.tokenizer->eot()}) {
      if (id >= 0) m.stop_tokens.push_back(id);
    }
  }
  return served;
}

}  // namespace mqlm::actors
