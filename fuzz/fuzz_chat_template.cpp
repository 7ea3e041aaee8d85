// Fuzzes the chat-template engine: the input is a Jinja template, parsed and rendered with a fixed
// conversation (system, user, assistant with tool calls, tool result), tools, special tokens and the variables
// of the jinja snippet goldens (the seeds), as transformers' apply_chat_template would call it. Parse and render
// errors must be moecel::Error; the engine promises no crash, hang or memory blow-up whatever the template does
// (scripts/fuzz.sh runs it with -timeout and -rss_limit_mb).
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"
#include "tokenizer/chat_template.h"

using namespace moecel;

namespace {

const nlohmann::ordered_json& messages() {
  static const nlohmann::ordered_json m = nlohmann::ordered_json::parse(R"([
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "What is 2+2? <b>&amp;</b>"},
    {"role": "assistant", "content": "", "tool_calls": [
      {"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 2}}}]},
    {"role": "tool", "content": "4"},
    {"role": "assistant", "content": "4", "reasoning_content": "easy"},
    {"role": "user", "content": [{"type": "text", "text": "thanks \u00e9\u4e2d"}]}
  ])");
  return m;
}

const nlohmann::ordered_json& extra() {
  static const nlohmann::ordered_json e = nlohmann::ordered_json::parse(R"({
    "tools": [{"type": "function", "function": {"name": "add", "description": "adds",
               "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}}],
    "enable_thinking": false, "documents": [{"title": "t", "text": "d"}],
    "n": 7, "f": 2.5, "s": "Hello, World", "u": "h\u00e9llo w\u00f6rld \u00df", "e": "", "z": null, "t": true,
    "lst": [3, 1, 2], "words": ["b", "A", "c", "a"], "d": {"b": 1, "a": 2, "c": null},
    "nested": {"x": {"y": [10, 20, {"z": "deep"}]}}, "big": 12345678901234, "neg": -3, "tiny": 1e-07,
    "objs": [{"name": "x", "v": 2, "on": true}, {"name": "y", "v": 1, "on": false}, {"name": "z", "v": 3}]
  })");
  return e;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string source(reinterpret_cast<const char*>(data), size);
  try {
    ChatTemplate t = ChatTemplate::from_string(source, {{"bos_token", "<s>"}, {"eos_token", "</s>"}}, "fuzz");
    (void)t.render_json(messages(), true, extra());
    (void)t.render({{"user", "hi"}, {"assistant", "hello"}}, false);
  } catch (const Error&) {
  }
  return 0;
}
