// Added tokens (special and not) of a tokenizer.json: found in the text before the model sees it, with
// HuggingFace's rules: leftmost-longest matching, single_word, lstrip and rstrip.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace moecel::tok {

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool special = false;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = true;
};

// A piece of text after added-token extraction: an added token (id >= 0) or text for the model (id == -1).
struct AddedPiece {
  uint32_t start;
  uint32_t end;
  int32_t id;
};

// Matches one set of added tokens (HF keeps two: raw and normalized) in a string.
class AddedTokenMatcher {
 public:
  // patterns[k] is what tokens[k] matches (its content, normalized for the normalized set).
  AddedTokenMatcher(std::vector<AddedToken> tokens, const std::vector<std::string>& patterns);
  AddedTokenMatcher();

  bool empty() const { return tokens_.empty(); }
  // Appends the pieces covering s (valid UTF-8); empty pieces are left out.
  void split(std::string_view s, std::vector<AddedPiece>& out) const;

 private:
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> children;  // sorted by byte
    int32_t token = -1;                                 // index into tokens_ ending here
  };
  int32_t child(int32_t node, uint8_t b) const;
  // Longest token starting at s[i]: its index and end, or -1.
  int32_t longest_at(std::string_view s, size_t i, size_t& end) const;

  std::vector<AddedToken> tokens_;
  std::vector<Node> nodes_;
  int32_t root_[256];  // children of the root, by byte (-1: none)
  // Quick filter: can a token start here? Single-byte tokens by byte, longer ones by their first two bytes.
  bool single_[256] = {};
  std::vector<uint64_t> pairs_ = std::vector<uint64_t>(1024, 0);
};

}  // namespace moecel::tok
