// Byte-level BPE tokenizer loaded from a HuggingFace tokenizer.json (GPT-NeoX/OLMoE, Qwen2/Qwen3, Llama 3 style).
// encode() and decode() reproduce HuggingFace `tokenizers` exactly (checked against its output in the tests);
// StreamingDecoder turns ids into text one at a time without ever splitting a UTF-8 character.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace moecel {

class Tokenizer {
 public:
  // Reads a tokenizer.json. Malformed or unsupported content throws moecel::Error naming the file and the field.
  static Tokenizer load(const std::string& tokenizer_json_path);
  // Same from the file's text; `origin` names it in error messages.
  static Tokenizer from_json(std::string_view json_text, const std::string& origin);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // Text -> ids. Added tokens in the text (e.g. "<|im_end|>") become their ids. add_special_tokens applies the
  // post-processor (bos/eos of a TemplateProcessing; ByteLevel adds nothing). Invalid UTF-8 is first repaired with
  // U+FFFD, as decoding the bytes lossily would.
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = false) const;
  // Ids -> text. Ids without a token are skipped (as HF does); invalid UTF-8 from split characters becomes U+FFFD.
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;

  // The id of a token string (an added token's content or a vocabulary entry in byte-level form, e.g. "Ġthe").
  std::optional<int32_t> find_token_id(std::string_view token) const;
  // Same, but a missing token throws moecel::Error.
  int32_t token_id(std::string_view token) const;
  // The token string of an id, if the id has one.
  std::optional<std::string_view> token(int32_t id) const;
  // The bytes an id decodes to (empty for ids without a token).
  std::string_view token_bytes(int32_t id) const;

  // One past the largest id (50280 for OLMoE, 151669 for Qwen3).
  int32_t vocab_size() const;
  // Whether id is a special added token (skipped by skip_special_tokens).
  bool is_special(int32_t id) const;
  const std::string& origin() const;

  struct Impl;

 private:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Incremental detokenizer: feed ids one at a time and get the text that is complete so far. Bytes of a character
// split across tokens are held back until the character is whole; bytes that can never form a character come out
// as U+FFFD. The concatenation of all feed() results and flush() equals tokenizer.decode(all ids).
class StreamingDecoder {
 public:
  explicit StreamingDecoder(const Tokenizer& tokenizer, bool skip_special_tokens = false);
  std::string feed(int32_t id);
  // Text for the held-back bytes of an unfinished character (U+FFFD), then resets.
  std::string flush();
  // Bytes currently held back.
  size_t pending() const { return pending_.size(); }

 private:
  const Tokenizer* tokenizer_;
  bool skip_special_tokens_;
  std::string pending_;
};

}  // namespace moecel
