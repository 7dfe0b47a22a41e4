// The regex that cuts text into words before byte-level BPE merges them, chosen by the
// vocabulary's `tokenizer.ggml.pre` name. The regexes are those of the models' tokenizer.json
// files as llama.cpp runs them (a list for some: each cuts the words of the one before), run by
// PCRE2 with Unicode properties (\p{L}, \p{N}, \s under PCRE2_UCP).
//
// The words cover the text exactly: bytes no alternative matches (only invalid UTF-8 can be
// such) become words of their own, so no byte is ever lost.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

struct pcre2_real_code_8;  // pcre2.h stays out of this header

namespace mqlm::model {

struct PreTokenizerError {
  std::string message;
};

class PreTokenizer {
 public:
  // An unknown name is an error value that lists the known ones: a wrong regex would give token
  // ids the model was not trained on, which degrades it silently.
  static std::variant<PreTokenizer, PreTokenizerError> create(std::string_view name);

  // The names create() accepts.
  static std::span<const std::string_view> known_names();

  // Appends the words of `text`, in order, as views into `text`.
  void split(std::string_view text, std::vector<std::string_view>& words) const;

  // Llama 3's tokenizer takes a word whole when it is in the vocabulary, before any merge.
  bool ignore_merges() const { return ignore_merges_; }

 private:
  PreTokenizer(std::vector<std::shared_ptr<const pcre2_real_code_8>> codes, bool ignore_merges)
      : codes_(std::move(codes)), ignore_merges_(ignore_merges) {}
  static void split_by(const pcre2_real_code_8& code, std::string_view text, std::vector<std::string_view>& words);

  // One or more (read-only once compiled: shared by copies); each cuts the words of the one before.
  std::vector<std::shared_ptr<const pcre2_real_code_8>> codes_;
  bool ignore_merges_ = false;
};

}  // namespace mqlm::model
