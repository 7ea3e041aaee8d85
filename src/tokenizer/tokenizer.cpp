// Encode/decode pipeline of the Tokenizer, in HuggingFace's order: added tokens on the raw text, normalizer,
// added tokens on the normalized text, pre-tokenizer splits, byte-level BPE per word, post-processor. Decoding maps
// ids to bytes (ByteLevel decoder) and repairs broken UTF-8 like Rust's from_utf8_lossy.
#include "tokenizer/tokenizer.h"

#include <deque>

#include "core/error.h"
#include "tokenizer/tokenizer_impl.h"

namespace moecel {

std::string_view Tokenizer::Impl::normalize(std::string_view s, std::string& storage) const {
  std::string_view cur = s;
  std::string next;
  for (const NormalizerStep& step : normalizer) {
    switch (step.kind) {
      case NormalizerStep::Kind::kForm:
        if (unicode::is_quick_normalized(cur, step.form)) continue;
        next = unicode::normalize(cur, step.form);
        break;
      case NormalizerStep::Kind::kPrepend:
        if (cur.empty()) continue;
        next = step.text + std::string(cur);
        break;
      case NormalizerStep::Kind::kReplace: {
        if (step.text.empty() || cur.find(step.text) == std::string_view::npos) continue;
        next.clear();
        size_t prev = 0;
        for (size_t pos = cur.find(step.text); pos != std::string_view::npos; pos = cur.find(step.text, prev)) {
          next.append(cur.substr(prev, pos - prev));
          next += step.replacement;
          prev = pos + step.text.size();
        }
        next.append(cur.substr(prev));
        break;
      }
      case NormalizerStep::Kind::kStrip: {
        size_t b = 0, e = cur.size();
        if (step.strip_left) {
          while (b < e) {
            size_t j = b;
            if (!unicode::is_space(unicode::next_codepoint(cur, j))) break;
            b = j;
          }
        }
        if (step.strip_right) {
          while (e > b) {
            size_t j = e - 1;
            while (j > b && (static_cast<unsigned char>(cur[j]) & 0xC0) == 0x80) --j;
            size_t k = j;
            if (!unicode::is_space(unicode::next_codepoint(cur, k))) break;
            e = j;
          }
        }
        cur = cur.substr(b, e - b);  // a view of the same text: no copy needed
        continue;
      }
    }
    storage = std::move(next);
    cur = storage;
  }
  return cur;
}

void Tokenizer::Impl::encode_text(std::string_view s, std::vector<int32_t>& ids, bool cache_locked) const {
  if (fast_split) {
    for (size_t i = 0; i < s.size();) {
      size_t e = fast_split->match_end(s, i);
      model->encode_word(s.substr(i, e - i), ids, cache_locked);
      i = e;
    }
    return;
  }
  std::vector<std::string_view> cur{s}, next;
  std::deque<std::string> store;  // prefixed copies (stable addresses)
  for (const PreTokenizerStep& step : pre_tokenizer) {
    next.clear();
    for (std::string_view p : cur) {
      if (step.split) {
        step.split->split(p, next);
      } else if (!p.empty() && p[0] == ' ') {
        next.push_back(p);
      } else {
        store.push_back(" " + std::string(p));
        next.push_back(store.back());
      }
    }
    std::swap(cur, next);
  }
  for (std::string_view w : cur) model->encode_word(w, ids, cache_locked);
}

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  const Impl& im = *impl_;
  std::string repaired;
  if (!unicode::is_valid_utf8(text)) {
    repaired = unicode::to_valid_utf8(text);
    text = repaired;
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  auto lock = im.model->lock_cache();
  const bool cached = lock.owns_lock();

  std::vector<tok::AddedPiece> raw_pieces, norm_pieces;
  if (im.raw_added.empty()) {
    if (!text.empty()) raw_pieces.push_back({0, uint32_t(text.size()), -1});
  } else {
    im.raw_added.split(text, raw_pieces);
  }
  for (const tok::AddedPiece& rp : raw_pieces) {
    if (rp.id >= 0) {
      ids.push_back(rp.id);
      continue;
    }
    std::string storage;
    const std::string_view ns = im.normalize(text.substr(rp.start, rp.end - rp.start), storage);
    norm_pieces.clear();
    if (im.normalized_added.empty()) {
      if (!ns.empty()) norm_pieces.push_back({0, uint32_t(ns.size()), -1});
    } else {
      im.normalized_added.split(ns, norm_pieces);
    }
    for (const tok::AddedPiece& np : norm_pieces) {
      if (np.id >= 0)
        ids.push_back(np.id);
      else
        im.encode_text(ns.substr(np.start, np.end - np.start), ids, cached);
    }
  }

  if (add_special_tokens) {
    for (const std::vector<PostItem>& pass : im.post) {
      std::vector<int32_t> out;
      for (const PostItem& item : pass) {
        const std::vector<int32_t>& src = item.is_sequence ? ids : item.ids;
        out.insert(out.end(), src.begin(), src.end());
      }
      ids = std::move(out);
    }
  }
  return ids;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  std::string bytes;
  for (int32_t id : ids) {
    if (id < 0 || id >= impl_->vocab_size) continue;
    uint8_t f = impl_->flags[id];
    if (!(f & Impl::kHasToken) || (skip_special_tokens && (f & Impl::kSpecial))) continue;
    bytes += token_bytes(id);
  }
  if (unicode::is_valid_utf8(bytes)) return bytes;
  return unicode::to_valid_utf8(bytes);
}

std::optional<int32_t> Tokenizer::find_token_id(std::string_view token) const {
  if (int32_t id = impl_->added_ids.find(token); id >= 0) return id;
  if (int32_t id = impl_->model->vocab().find(token); id >= 0) return id;
  return std::nullopt;
}

int32_t Tokenizer::token_id(std::string_view token) const {
  std::optional<int32_t> id = find_token_id(token);
  if (!id) fail("{}: token '{}' is not in the vocabulary", impl_->origin, token);
  return *id;
}

std::optional<std::string_view> Tokenizer::token(int32_t id) const {
  if (id < 0 || id >= impl_->vocab_size || !(impl_->flags[id] & Impl::kHasToken)) return std::nullopt;
  return std::string_view(impl_->tokens[id]);
}

std::string_view Tokenizer::token_bytes(int32_t id) const {
  if (id < 0 || id >= impl_->vocab_size) return {};
  uint32_t b = impl_->decoded_off[id], e = impl_->decoded_off[id + 1];
  return std::string_view(impl_->decoded).substr(b, e - b);
}

int32_t Tokenizer::vocab_size() const {
  return impl_->vocab_size;
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && id < impl_->vocab_size && (impl_->flags[id] & Impl::kSpecial);
}

const std::string& Tokenizer::origin() const {
  return impl_->origin;
}

StreamingDecoder::StreamingDecoder(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(&tokenizer), skip_special_tokens_(skip_special_tokens) {}

std::string StreamingDecoder::feed(int32_t id) {
  if (skip_special_tokens_ && tokenizer_->is_special(id)) return {};
  pending_ += tokenizer_->token_bytes(id);
  std::string out;
  size_t i = 0;
  while (i < pending_.size()) {
    unicode::Utf8Step st = unicode::utf8_step(pending_, i);
    if (st.truncated) break;  // the rest of this character may come with the next token
    if (st.valid)
      out.append(pending_, i, st.length);
    else
      out += "\xEF\xBF\xBD";
    i += st.length;
  }
  pending_.erase(0, i);
  return out;
}

std::string StreamingDecoder::flush() {
  std::string out = unicode::to_valid_utf8(pending_);
  pending_.clear();
  return out;
}

}  // namespace moecel
