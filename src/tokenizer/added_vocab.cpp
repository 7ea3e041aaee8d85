// Added-token extraction (see added_vocab.h); mirrors AddedVocabulary::find_matches of HuggingFace tokenizers.
#include "tokenizer/added_vocab.h"

#include <algorithm>

#include "tokenizer/unicode.h"

namespace moecel::tok {

namespace {

// Start of the code point that ends just before byte position i (i > 0).
size_t prev_char_start(std::string_view s, size_t i) {
  do {
    --i;
  } while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80);
  return i;
}

char32_t char_before(std::string_view s, size_t i) {
  size_t j = prev_char_start(s, i);
  return unicode::next_codepoint(s, j);
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher() {
  nodes_.emplace_back();
  std::fill(std::begin(root_), std::end(root_), -1);
}

AddedTokenMatcher::AddedTokenMatcher(std::vector<AddedToken> tokens, const std::vector<std::string>& patterns)
    : AddedTokenMatcher() {
  tokens_ = std::move(tokens);
  for (size_t k = 0; k < patterns.size(); ++k) {
    const std::string& p = patterns[k];
    if (p.empty()) continue;
    if (p.size() == 1) {
      single_[static_cast<unsigned char>(p[0])] = true;
    } else {
      const unsigned pair = unsigned(static_cast<unsigned char>(p[0])) << 8 | static_cast<unsigned char>(p[1]);
      pairs_[pair >> 6] |= uint64_t(1) << (pair & 63);
    }
    int32_t node = 0;
    for (unsigned char b : p) {
      int32_t next = child(node, b);
      if (next < 0) {
        next = int32_t(nodes_.size());
        nodes_.emplace_back();
        if (node == 0) {
          root_[b] = next;
        } else {
          auto& ch = nodes_[node].children;
          ch.insert(std::lower_bound(ch.begin(), ch.end(), std::make_pair(b, int32_t(-1))), {b, next});
        }
      }
      node = next;
    }
    // The first of equal patterns wins, like the aho-corasick automaton HF builds.
    if (nodes_[node].token < 0) nodes_[node].token = int32_t(k);
  }
}

int32_t AddedTokenMatcher::child(int32_t node, uint8_t b) const {
  if (node == 0) return root_[b];
  for (const auto& [byte, next] : nodes_[node].children)  // few children: a scan beats a search
    if (byte == b) return next;
  return -1;
}

int32_t AddedTokenMatcher::longest_at(std::string_view s, size_t i, size_t& end) const {
  int32_t found = -1;
  int32_t node = root_[static_cast<uint8_t>(s[i])];
  if (node >= 0 && nodes_[node].token >= 0) {
    found = nodes_[node].token;
    end = i + 1;
  }
  for (size_t j = i + 1; node >= 0 && j < s.size(); ++j) {
    node = child(node, static_cast<uint8_t>(s[j]));
    if (node < 0) break;
    if (nodes_[node].token >= 0) {
      found = nodes_[node].token;
      end = j + 1;
    }
  }
  return found;
}

void AddedTokenMatcher::split(std::string_view s, std::vector<AddedPiece>& out) const {
  const size_t n = s.size();
  size_t start_offset = 0;
  size_t pos = 0;
  const auto* u = reinterpret_cast<const unsigned char*>(s.data());
  while (pos < n) {
    // Nearly every position fails this filter, so the branch is well predicted (unlike a test on the first byte
    // alone, which every space would pass in a tokenizer with whitespace-run tokens).
    const unsigned pair = pos + 1 < n ? unsigned(u[pos]) << 8 | u[pos + 1] : 0;
    if (!single_[u[pos]] && !((pairs_[pair >> 6] >> (pair & 63)) & 1)) {
      ++pos;
      continue;
    }
    size_t match_end = 0;
    int32_t k = longest_at(s, pos, match_end);
    if (k < 0) {
      ++pos;
      continue;
    }
    const AddedToken& tok = tokens_[k];
    size_t start = pos, stop = match_end;
    pos = match_end;  // matches never overlap; the search resumes after this one whatever happens to it
    if (tok.single_word) {
      bool start_space = start == 0 || !unicode::is_word(char_before(s, start));
      size_t j = stop;
      bool stop_space = stop == n || !unicode::is_word(unicode::next_codepoint(s, j));
      if (!start_space || !stop_space) continue;
    }
    if (tok.lstrip) {
      size_t new_start = start;
      while (new_start > 0 && unicode::is_space(char_before(s, new_start))) new_start = prev_char_start(s, new_start);
      start = std::max(new_start, start_offset);
    }
    if (tok.rstrip) {
      size_t j = stop;
      while (j < n) {
        size_t k2 = j;
        if (!unicode::is_space(unicode::next_codepoint(s, k2))) break;
        j = k2;
      }
      stop = j;
    }
    if (start_offset < start) out.push_back({uint32_t(start_offset), uint32_t(start), -1});
    out.push_back({uint32_t(start), uint32_t(stop), tok.id});
    start_offset = stop;
  }
  if (start_offset < n) out.push_back({uint32_t(start_offset), uint32_t(n), -1});
}

}  // namespace moecel::tok
