// Byte-level BPE: merge table, merge loop and word cache (see bpe.h). The merge order reproduces HuggingFace's
// Word::merge_all: repeatedly apply the adjacent pair of lowest merge rank, the leftmost one on ties.
#include "tokenizer/bpe.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <queue>

#include "core/error.h"
#include "tokenizer/unicode.h"

namespace moecel::tok {

namespace {

struct ByteTable {
  std::array<char32_t, 256> to_char{};
  std::array<int16_t, 324> to_byte{};  // every mapped character is below U+0144
  ByteTable() {
    to_byte.fill(-1);
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      char32_t c = printable ? char32_t(b) : char32_t(256 + extra++);
      to_char[b] = c;
      to_byte[c] = int16_t(b);
    }
  }
};
const ByteTable kBytes;

}  // namespace

uint64_t hash_bytes(std::string_view s) {
  // Multiply-mix over 8-byte loads; short words (the common case) take one or two overlapping loads.
  const char* p = s.data();
  const size_t n = s.size();
  auto load64 = [](const char* q) {
    uint64_t v;
    std::memcpy(&v, q, 8);
    return v;
  };
  auto load32 = [](const char* q) {
    uint32_t v;
    std::memcpy(&v, q, 4);
    return uint64_t(v);
  };
  auto mix = [](uint64_t h, uint64_t v) {
    h = (h ^ v) * 0xBF58476D1CE4E5B9ull;
    return h ^ (h >> 31);
  };
  uint64_t h = 0x9E3779B97F4A7C15ull ^ (uint64_t(n) * 0x94D049BB133111EBull);
  if (n >= 8) {
    size_t i = 0;
    for (; i + 8 < n; i += 8) h = mix(h, load64(p + i));
    h = mix(h, load64(p + n - 8));
  } else if (n >= 4) {
    h = mix(h, (load32(p) << 32) | load32(p + n - 4));
  } else if (n > 0) {
    h = mix(h, (uint64_t(uint8_t(p[0])) << 16) | (uint64_t(uint8_t(p[n / 2])) << 8) | uint8_t(p[n - 1]));
  }
  h *= 0x94D049BB133111EBull;
  h ^= h >> 32;
  return h | 1;  // 0 marks an empty slot
}

namespace {

constexpr uint32_t kNoMerge = 0xFFFFFFFFu;
constexpr size_t kSmallWord = 48;       // words up to this many symbols use the scanning merge loop
constexpr size_t kMaxCachedBytes = 96;  // longer words are rare and not worth caching
constexpr size_t kMaxCacheEntries = 1 << 16;

}  // namespace

int32_t TokenMap::find(std::string_view key) const {
  if (slots_.empty()) return -1;
  const uint64_t h = hash_bytes(key);
  for (size_t i = (h >> 1) & mask_;; i = (i + 1) & mask_) {
    const Slot& s = slots_[i];
    if (s.hash == 0) return -1;
    if (s.hash == h && s.len == key.size() && std::memcmp(keys_.data() + s.off, key.data(), key.size()) == 0)
      return s.id;
  }
}

void TokenMap::place(const Slot& s) {
  size_t i = (s.hash >> 1) & mask_;  // bit 0 is always set
  while (slots_[i].hash != 0) i = (i + 1) & mask_;
  slots_[i] = s;
}

void TokenMap::reserve(size_t n) {
  size_t cap = 16;
  while (cap < 2 * n) cap <<= 1;
  if (cap <= slots_.size()) return;
  std::vector<Slot> old = std::move(slots_);
  slots_.assign(cap, Slot{0, 0, 0, 0});
  mask_ = cap - 1;
  for (const Slot& s : old)
    if (s.hash != 0) place(s);
}

void TokenMap::set(std::string_view key, int32_t id) {
  if (2 * (count_ + 1) > slots_.size()) reserve(std::max<size_t>(count_ + 1, 2 * count_));
  const uint64_t h = hash_bytes(key);
  for (size_t i = (h >> 1) & mask_;; i = (i + 1) & mask_) {
    Slot& s = slots_[i];
    if (s.hash == 0) {
      s = Slot{h, uint32_t(keys_.size()), uint32_t(key.size()), id};
      keys_.append(key);
      ++count_;
      return;
    }
    if (s.hash == h && s.len == key.size() && std::memcmp(keys_.data() + s.off, key.data(), key.size()) == 0) {
      s.id = id;
      return;
    }
  }
}

char32_t byte_to_char(uint8_t b) {
  return kBytes.to_char[b];
}
int char_to_byte(char32_t c) {
  return c < kBytes.to_byte.size() ? kBytes.to_byte[c] : -1;
}

// Open-addressing map (left id, right id) -> (rank, merged id).
struct BpeModel::MergeTable {
  struct Slot {
    uint64_t key;  // (left << 32 | right) + 1; 0 = empty
    uint32_t rank;
    int32_t id;
  };
  std::vector<Slot> slots;
  uint64_t mask = 0;

  explicit MergeTable(size_t n) {
    size_t cap = 16;
    while (cap < 2 * n) cap <<= 1;
    slots.assign(cap, Slot{0, 0, 0});
    mask = cap - 1;
  }
  static uint64_t key_of(int32_t a, int32_t b) { return ((uint64_t(uint32_t(a)) << 32) | uint32_t(b)) + 1; }
  size_t home(uint64_t key) const { return size_t((key * 0x9E3779B97F4A7C15ull) >> 20) & mask; }
  // Later duplicates overwrite earlier ones, as HF's HashMap collect does.
  void insert(int32_t a, int32_t b, uint32_t rank, int32_t id) {
    uint64_t key = key_of(a, b);
    for (size_t i = home(key);; i = (i + 1) & mask) {
      if (slots[i].key == 0 || slots[i].key == key) {
        slots[i] = Slot{key, rank, id};
        return;
      }
    }
  }
  const Slot* find(int32_t a, int32_t b) const {
    uint64_t key = key_of(a, b);
    for (size_t i = home(key);; i = (i + 1) & mask) {
      if (slots[i].key == key) return &slots[i];
      if (slots[i].key == 0) return nullptr;
    }
  }
};

// Open-addressing cache word -> ids with append-only storage; it stops growing at kMaxCacheEntries.
class BpeModel::Cache {
 public:
  const int32_t* find(std::string_view word, uint64_t h, uint32_t& n) const {
    if (slots_.empty()) return nullptr;
    for (size_t i = (h >> 1) & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.hash == 0) return nullptr;
      if (s.hash == h && s.key_len == word.size() &&
          std::memcmp(keys_.data() + s.key_off, word.data(), word.size()) == 0) {
        n = s.n_ids;
        return ids_.data() + s.ids_off;
      }
    }
  }
  void insert(std::string_view word, uint64_t h, const int32_t* ids, uint32_t n) {
    if (count_ >= kMaxCacheEntries) return;
    if (2 * (count_ + 1) > slots_.size()) grow();
    Slot s{h, uint32_t(keys_.size()), uint32_t(word.size()), uint32_t(ids_.size()), n};
    keys_.append(word);
    ids_.insert(ids_.end(), ids, ids + n);
    place(s);
    ++count_;
  }

 private:
  struct Slot {
    uint64_t hash;
    uint32_t key_off, key_len, ids_off, n_ids;
  };
  void place(const Slot& s) {
    size_t i = (s.hash >> 1) & mask_;  // bit 0 is always set
    while (slots_[i].hash != 0) i = (i + 1) & mask_;
    slots_[i] = s;
  }
  void grow() {
    std::vector<Slot> old = std::move(slots_);
    size_t cap = old.empty() ? 4096 : old.size() * 2;
    slots_.assign(cap, Slot{0, 0, 0, 0, 0});
    mask_ = cap - 1;
    for (const Slot& s : old)
      if (s.hash != 0) place(s);
  }
  std::vector<Slot> slots_;
  size_t mask_ = 0;
  size_t count_ = 0;
  std::string keys_;
  std::vector<int32_t> ids_;
};

BpeModel::BpeModel(TokenMap vocab, const std::vector<std::pair<std::string, std::string>>& merges, BpeOptions options,
                   const std::string& origin)
    : vocab_(std::move(vocab)), options_(std::move(options)), cache_(std::make_unique<Cache>()) {
  std::string buf;
  for (int b = 0; b < 256; ++b) {
    buf.clear();
    unicode::append_utf8(buf, byte_to_char(uint8_t(b)));
    byte_ids_[b] = vocab_.find(buf);
    if (byte_ids_[b] < 0 && options_.byte_fallback) {
      // HF falls back to <0xXX> tokens for each UTF-8 byte of the missing character, all or nothing.
      std::vector<int32_t> ids;
      for (unsigned char c : buf) {
        int32_t f = vocab_.find(fmt::format("<0x{:02X}>", c));
        if (f < 0) {
          ids.clear();
          break;
        }
        ids.push_back(f);
      }
      byte_fallback_ids_[b] = std::move(ids);
    }
  }
  if (options_.unk_token) {
    unk_id_ = vocab_.find(*options_.unk_token);
  }
  merges_ = std::make_unique<MergeTable>(merges.size());
  std::string joined;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [a, b] = merges[rank];
    const int32_t ia = vocab_.find(a), ib = vocab_.find(b);
    if (ia < 0 || ib < 0)
      fail("{}: field 'model.merges[{}]': token '{}' of merge '{} {}' is not in model.vocab", origin, rank,
           ia < 0 ? a : b, a, b);
    joined.assign(a).append(b);
    const int32_t im = vocab_.find(joined);
    if (im < 0) fail("{}: field 'model.merges[{}]': merged token '{}{}' is not in model.vocab", origin, rank, a, b);
    merges_->insert(ia, ib, uint32_t(rank), im);
  }
  if (options_.ignore_merges) {
    vocab_.for_each([&](std::string_view token, int32_t id) {
      std::string raw;
      bool ok = true;
      for (size_t i = 0; i < token.size() && ok;) {
        int byte = char_to_byte(unicode::next_codepoint(token, i));
        if (byte < 0) ok = false;
        raw.push_back(char(byte));
      }
      if (ok) raw_vocab_.set(raw, id);
    });
  }
}

BpeModel::~BpeModel() = default;

void BpeModel::initial_symbols(std::string_view word, std::vector<int32_t>& syms) const {
  syms.clear();
  // HF's merge_word, one byte-level character per byte: missing characters become byte-fallback tokens, else
  // <unk> (fused when fuse_unk), else they are dropped.
  int32_t pending_unk = -1;
  for (unsigned char b : word) {
    int32_t id = byte_ids_[b];
    if (id >= 0) {
      if (pending_unk >= 0) syms.push_back(pending_unk);
      pending_unk = -1;
      syms.push_back(id);
      continue;
    }
    if (!byte_fallback_ids_[b].empty()) {
      syms.insert(syms.end(), byte_fallback_ids_[b].begin(), byte_fallback_ids_[b].end());
      continue;
    }
    if (options_.unk_token) {
      if (unk_id_ < 0) fail("tokenizer: unk_token '{}' is not in the vocabulary", *options_.unk_token);
      if (pending_unk >= 0 && !options_.fuse_unk) syms.push_back(pending_unk);
      pending_unk = unk_id_;
    }
  }
  if (pending_unk >= 0) syms.push_back(pending_unk);
}

void BpeModel::merge_symbols(std::vector<int32_t>& syms) const {
  const size_t n0 = syms.size();
  if (n0 < 2) return;
  if (n0 <= kSmallWord) {
    // Short words: keep the rank of every adjacent pair and rescan for the minimum after each merge.
    uint32_t rank[kSmallWord];
    int32_t merged[kSmallWord];
    int32_t* s = syms.data();
    size_t n = n0;
    for (size_t i = 0; i + 1 < n; ++i) {
      const MergeTable::Slot* m = merges_->find(s[i], s[i + 1]);
      rank[i] = m ? m->rank : kNoMerge;
      merged[i] = m ? m->id : 0;
    }
    for (;;) {
      size_t best = 0;
      uint32_t best_rank = kNoMerge;
      for (size_t i = 0; i + 1 < n; ++i) {
        if (rank[i] < best_rank) {
          best_rank = rank[i];
          best = i;
        }
      }
      if (best_rank == kNoMerge) break;
      s[best] = merged[best];
      // Drop symbol best+1 and the pair that started there.
      std::memmove(s + best + 1, s + best + 2, (n - best - 2) * sizeof(int32_t));
      if (best + 3 < n) {
        const size_t tail = n - best - 3;  // pairs after the removed one
        std::memmove(rank + best + 1, rank + best + 2, tail * sizeof(uint32_t));
        std::memmove(merged + best + 1, merged + best + 2, tail * sizeof(int32_t));
      }
      --n;
      for (size_t i = best > 0 ? best - 1 : 0; i <= best && i + 1 < n; ++i) {
        const MergeTable::Slot* m = merges_->find(s[i], s[i + 1]);
        rank[i] = m ? m->rank : kNoMerge;
        merged[i] = m ? m->id : 0;
      }
    }
    syms.resize(n);
    return;
  }
  // Long words: HF's algorithm, a priority queue of candidate merges over a linked list, stale entries skipped.
  struct Sym {
    int32_t id;
    int32_t prev, next;
    bool alive;
  };
  struct Cand {
    uint32_t rank;
    int32_t pos;
    int32_t id;
    bool operator<(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::vector<Sym> sy(n0);
  for (size_t i = 0; i < n0; ++i) sy[i] = Sym{syms[i], int32_t(i) - 1, i + 1 < n0 ? int32_t(i + 1) : -1, true};
  std::vector<Cand> heap_store;
  heap_store.reserve(n0);
  std::priority_queue<Cand> heap(std::less<Cand>(), std::move(heap_store));
  for (size_t i = 0; i + 1 < n0; ++i)
    if (const MergeTable::Slot* m = merges_->find(sy[i].id, sy[i + 1].id)) heap.push(Cand{m->rank, int32_t(i), m->id});
  while (!heap.empty()) {
    Cand top = heap.top();
    heap.pop();
    Sym& cur = sy[top.pos];
    if (!cur.alive || cur.next < 0) continue;
    Sym& right = sy[cur.next];
    const MergeTable::Slot* m = merges_->find(cur.id, right.id);
    if (!m || m->id != top.id) continue;
    cur.id = top.id;
    right.alive = false;
    cur.next = right.next;
    if (cur.next >= 0) sy[cur.next].prev = top.pos;
    if (cur.prev >= 0)
      if (const MergeTable::Slot* p = merges_->find(sy[cur.prev].id, cur.id)) heap.push(Cand{p->rank, cur.prev, p->id});
    if (cur.next >= 0)
      if (const MergeTable::Slot* q = merges_->find(cur.id, sy[cur.next].id)) heap.push(Cand{q->rank, top.pos, q->id});
  }
  syms.clear();
  for (const Sym& s : sy)
    if (s.alive) syms.push_back(s.id);
}

void BpeModel::encode_word(std::string_view word, std::vector<int32_t>& out, bool cache_locked) const {
  if (word.empty()) return;
  if (word.size() == 1 && byte_ids_[uint8_t(word[0])] >= 0) {
    out.push_back(byte_ids_[uint8_t(word[0])]);
    return;
  }
  if (options_.ignore_merges) {
    if (int32_t id = raw_vocab_.find(word); id >= 0) {
      out.push_back(id);
      return;
    }
  }
  const bool use_cache = cache_locked && word.size() <= kMaxCachedBytes;
  uint64_t h = 0;
  if (use_cache) {
    h = hash_bytes(word);
    uint32_t n = 0;
    if (const int32_t* ids = cache_->find(word, h, n)) {
      if (n == 1)
        out.push_back(ids[0]);
      else
        out.insert(out.end(), ids, ids + n);
      return;
    }
  }
  thread_local std::vector<int32_t> syms;
  initial_symbols(word, syms);
  merge_symbols(syms);
  if (use_cache) cache_->insert(word, h, syms.data(), uint32_t(syms.size()));
  out.insert(out.end(), syms.begin(), syms.end());
}

}  // namespace moecel::tok
