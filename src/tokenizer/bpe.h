// Byte-level BPE model: vocabulary, ranked merges and the merge loop of HuggingFace's BPE (lowest rank first,
// leftmost on ties), with a cache of already-tokenized words. Words arrive as raw UTF-8 bytes; the GPT-2 byte-to-
// character table maps them onto the vocabulary's alphabet.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace moecel::tok {

// GPT-2's reversible byte <-> character table used by ByteLevel pre-tokenizers and decoders.
char32_t byte_to_char(uint8_t b);
// The byte that character c stands for, or -1 when c is not part of the table.
int char_to_byte(char32_t c);

uint64_t hash_bytes(std::string_view s);

// String -> id map with flat open addressing and one arena for the keys (vocabularies have 50k-250k entries;
// this loads and looks up several times faster than std::unordered_map<std::string, int>).
class TokenMap {
 public:
  // The id of key, or -1.
  int32_t find(std::string_view key) const;
  // Inserts or overwrites.
  void set(std::string_view key, int32_t id);
  size_t size() const { return count_; }
  void reserve(size_t n);
  // fn(std::string_view key, int32_t id) for every entry, in no particular order.
  template <class Fn>
  void for_each(Fn&& fn) const {
    for (const Slot& s : slots_)
      if (s.hash != 0) fn(std::string_view(keys_).substr(s.off, s.len), s.id);
  }

 private:
  struct Slot {
    uint64_t hash;  // 0 = empty
    uint32_t off, len;
    int32_t id;
  };
  void place(const Slot& s);
  std::vector<Slot> slots_;
  size_t mask_ = 0;
  size_t count_ = 0;
  std::string keys_;
};

struct BpeOptions {
  bool ignore_merges = false;
  bool fuse_unk = false;
  bool byte_fallback = false;
  std::optional<std::string> unk_token;
};

class BpeModel {
 public:
  // vocab: token (in the byte-level alphabet) -> id; merges: token pairs, highest priority first. `origin` names the
  // file for error messages.
  BpeModel(TokenMap vocab, const std::vector<std::pair<std::string, std::string>>& merges, BpeOptions options,
           const std::string& origin);
  ~BpeModel();
  BpeModel(const BpeModel&) = delete;
  BpeModel& operator=(const BpeModel&) = delete;

  // Holds the word cache for one encode() call; when another thread holds it the lock is empty and words are
  // tokenized without the cache (same result, slower).
  std::unique_lock<std::mutex> lock_cache() const {
    return std::unique_lock<std::mutex>(cache_mutex_, std::try_to_lock);
  }
  // Appends the ids of one pre-tokenized word (raw bytes); `cache_locked` says whether the caller holds the cache.
  void encode_word(std::string_view word, std::vector<int32_t>& out, bool cache_locked) const;

  const TokenMap& vocab() const { return vocab_; }

 private:
  struct MergeTable;
  class Cache;
  void initial_symbols(std::string_view word, std::vector<int32_t>& syms) const;
  void merge_symbols(std::vector<int32_t>& syms) const;

  TokenMap vocab_;
  TokenMap raw_vocab_;  // raw bytes -> id, only for ignore_merges
  std::array<int32_t, 256> byte_ids_{};
  // Per byte whose character is not in the vocabulary: ids of its <0xXX> byte-fallback tokens (empty: none).
  std::array<std::vector<int32_t>, 256> byte_fallback_ids_;
  int32_t unk_id_ = -1;
  BpeOptions options_;
  std::unique_ptr<MergeTable> merges_;
  std::unique_ptr<Cache> cache_;
  mutable std::mutex cache_mutex_;
};

}  // namespace moecel::tok
