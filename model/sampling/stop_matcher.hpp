// Stop conditions over a sequence's output stream: stop strings (found even when they span
// several tokens, and never emitted), stop tokens, and max_tokens.
//
// Text that could be the start of a stop string is held back until it either completes one
// (then it is dropped with everything after it) or cannot any more (then it is released). Which
// text is emitted does not depend on how the output was split into tokens: when several stop
// strings match, the one that ends first wins (the one a token-by-token stream would complete
// first), and of those the one that starts first.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "model/sampling/sampling_params.hpp"

namespace mqlm::model {

enum class FinishReason : std::uint8_t {
  stop,    // a stop string or a stop token
  length,  // max_tokens reached
};

struct StopStep {
  std::string text;                    // what may be shown now (empty while text is held back)
  std::optional<FinishReason> finish;  // set on the sequence's last step
  std::string stop_string;             // the stop string that ended it, if one did
  std::int32_t stop_token = -1;        // the stop token that ended it, if one did
};

class StopMatcher {
 public:
  // stop_strings: non-empty; max_tokens >= 1 (validate() checks both for requests).
  StopMatcher(std::vector<std::string> stop_strings, std::vector<std::int32_t> stop_tokens,
              std::int32_t max_tokens);
  // The request's stop strings, stop tokens and max_tokens, plus the model's own end tokens
  // (EOS, the chat family's end-of-turn) unless the request has ignore_eos.
  static StopMatcher for_request(const SamplingParams& params,
                                 std::span<const std::int32_t> model_stop_tokens);

  // One generated token and its decoded text (whole UTF-8 characters, as the tokenizer's
  // streaming decoder gives them; the text of a stop token is ignored). After a step that
  // finished, pushing more is a bug (std::logic_error).
  StopStep push(std::int32_t token, std::string_view text);

  // Gives up the held-back text when the sequence ends for another reason (aborted, context
  // full); nothing more may be pushed afterwards.
  std::string release();

  bool finished() const { return finished_; }
  std::size_t held_bytes() const { return pending_.size(); }

 private:
  struct Match {
    std::size_t start = 0;
    std::size_t end = 0;
    std::size_t which = 0;
  };
  std::optional<Match> first_match() const;
  std::size_t longest_held_suffix() const;

  std::vector<std::string> stop_strings_;
  std::vector<std::int32_t> stop_tokens_;
  std::int32_t max_tokens_;
  std::int32_t tokens_seen_ = 0;
  std::string pending_;  // text not yet emitted: a possible stop string's beginning
  bool finished_ = false;
};

}  // namespace mqlm::model
