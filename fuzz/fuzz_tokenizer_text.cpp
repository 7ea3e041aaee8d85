// Fuzzes encoding of arbitrary bytes with the real tokenizers (OLMoE and Qwen3, loaded once), and decoding of
// arbitrary ids. The first input byte picks the tokenizer and flags; the rest is the text. Checked properties:
// every id is inside the vocabulary, and StreamingDecoder fed one id at a time (then flushed) reproduces
// decode() exactly, as its contract says. The same bytes read as int32 ids (out-of-range ones included) must
// decode without faults.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "tokenizer/tokenizer.h"

using namespace moecel;

namespace {

const Tokenizer& tokenizer(int which) {
  static const Tokenizer olmoe = Tokenizer::load(MOECEL_SHARED_DIR "/data/tokenizers/olmoe/tokenizer.json");
  static const Tokenizer qwen3 = Tokenizer::load(MOECEL_SHARED_DIR "/data/tokenizers/qwen3/tokenizer.json");
  return which == 0 ? olmoe : qwen3;
}

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "property violated: %s\n", what);
    std::abort();
  }
}

void check_stream(const Tokenizer& tok, const std::vector<int32_t>& ids, bool skip_special) {
  StreamingDecoder sd(tok, skip_special);
  std::string streamed;
  for (int32_t id : ids) streamed += sd.feed(id);
  streamed += sd.flush();
  check(streamed == tok.decode(ids, skip_special), "streaming decode == decode");
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  tokenizer(0);
  tokenizer(1);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const Tokenizer& tok = tokenizer(data[0] & 1);
  const bool add_special = data[0] & 2, skip_special = data[0] & 4;
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  try {
    std::vector<int32_t> ids = tok.encode(text, add_special);
    for (int32_t id : ids) check(id >= 0 && id < tok.vocab_size(), "encoded id inside the vocabulary");
    check_stream(tok, ids, skip_special);

    std::vector<int32_t> raw((size - 1) / 4);
    if (!raw.empty()) std::memcpy(raw.data(), data + 1, raw.size() * 4);
    for (int32_t& id : raw) {
      if (data[0] & 8) id = int32_t(uint32_t(id) % uint32_t(tok.vocab_size() + 8));  // mostly valid ids
    }
    check_stream(tok, raw, skip_special);
    for (int32_t id : raw) {
      auto t = tok.token(id);
      if (t) check(tok.find_token_id(*t).has_value(), "token(id) maps back to an id");
      (void)tok.token_bytes(id);
      (void)tok.is_special(id);
    }
  } catch (const Error&) {
  }
  return 0;
}
