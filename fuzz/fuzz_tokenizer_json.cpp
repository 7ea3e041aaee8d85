// Fuzzes tokenizer.json loading (model, added tokens, normalizer, pre-tokenizer, post-processor, decoder): any
// text must load or be rejected with moecel::Error. A tokenizer that loads then encodes and decodes a few fixed
// strings (ids must stay inside its vocabulary) and decodes every id it has.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/error.h"
#include "tokenizer/tokenizer.h"

using namespace moecel;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    Tokenizer tok = Tokenizer::from_json(text, "tokenizer.json");
    const int32_t vocab = tok.vocab_size();
    for (const char* s : {"Hello world!  It's 2024.\n\n\tok", "<|endoftext|>ab  cd", "\xc3\xa9\xe4\xb8\xad\xff\xfe x",
                          "<|im_start|>user\nhi<|im_end|>"}) {
      for (bool special : {false, true}) {
        std::vector<int32_t> ids = tok.encode(s, special);
        for (int32_t id : ids) {
          // A TemplateProcessing post-processor inserts its configured ids verbatim (as HF does), so only ids
          // from the text itself are bound to the vocabulary.
          if (id < 0 || (!special && id >= vocab)) {
            std::fprintf(stderr, "encoded id %d outside [0, %d)\n", id, vocab);
            std::abort();
          }
        }
        (void)tok.decode(ids, special);
      }
    }
    std::vector<int32_t> all;
    for (int32_t id = -2; id < std::min(vocab, 4096) + 2; ++id) all.push_back(id);
    (void)tok.decode(all, false);
    StreamingDecoder sd(tok);
    for (int32_t id : all) (void)sd.feed(id);
    (void)sd.flush();
  } catch (const Error&) {
  }
  return 0;
}
