// Internal state of a loaded Tokenizer, shared by tokenizer_load.cpp (which builds it from tokenizer.json) and
// tokenizer.cpp (which runs the encode/decode pipeline). Not part of the public interface.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tokenizer/added_vocab.h"
#include "tokenizer/bpe.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace moecel {

// One normalizer of a (flattened) normalizer Sequence.
struct NormalizerStep {
  enum class Kind { kForm, kPrepend, kReplace, kStrip };
  Kind kind = Kind::kForm;
  unicode::NormalForm form = unicode::NormalForm::kNFC;
  std::string text;         // Prepend: the prefix; Replace: the pattern
  std::string replacement;  // Replace
  bool strip_left = false, strip_right = false;
};

// One pre-tokenizer step: a Split, or the prefix space of a ByteLevel pre-tokenizer (its regex, when used, is a
// separate Split step with the GPT-2 pattern).
struct PreTokenizerStep {
  std::unique_ptr<tok::SplitStep> split;  // null: prefix-space step
};

// One item of the post-processor's single-sequence template: fixed ids, or the encoded sequence itself.
struct PostItem {
  bool is_sequence = false;
  std::vector<int32_t> ids;
};

struct Tokenizer::Impl {
  std::string origin;

  std::vector<NormalizerStep> normalizer;
  std::vector<PreTokenizerStep> pre_tokenizer;
  // Set when the pre-tokenizer is exactly one isolated split by a hand-written pattern.
  const tok::CoverMatcher* fast_split = nullptr;
  std::unique_ptr<tok::BpeModel> model;

  tok::AddedTokenMatcher raw_added;         // added tokens with normalized == false, matched on the input
  tok::AddedTokenMatcher normalized_added;  // the others, matched on normalized text
  tok::TokenMap added_ids;                  // added token content -> id

  // Post-processing passes (Sequence post-processors apply each in turn); empty: nothing to add.
  std::vector<std::vector<PostItem>> post;

  // Per id: token string, decoded bytes, flags.
  int32_t vocab_size = 0;
  std::vector<std::string> tokens;
  std::string decoded;                // bytes of all ids back to back
  std::vector<uint32_t> decoded_off;  // (vocab_size + 1) offsets into `decoded`
  std::vector<uint8_t> flags;         // kHasToken | kSpecial

  static constexpr uint8_t kHasToken = 1, kSpecial = 2;

  // The normalized text: s itself when nothing changes, else a view of `storage`.
  std::string_view normalize(std::string_view s, std::string& storage) const;
  void encode_text(std::string_view s, std::vector<int32_t>& ids, bool cache_locked) const;
};

}  // namespace moecel
