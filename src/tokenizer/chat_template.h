// Chat templates of HuggingFace tokenizers: reads the Jinja `chat_template` and the special tokens of a model
// folder and renders conversations exactly as transformers' apply_chat_template(tokenize=False) does
// (same variables, same message normalisation, jinja2 semantics via tokenizer/jinja.h).
#pragma once
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tokenizer/jinja.h"

namespace moecel {

struct ChatMessage {
  std::string role;
  std::string content;
};

class ChatTemplate {
 public:
  // PATH is a tokenizer_config.json or the model folder holding one. The template is the folder's
  // chat_template.jinja if present, else tokenizer_config's `chat_template` (a string, or a list of
  // {name, template} of which "default" is used, "tool_use" when tools are passed), else the folder's
  // chat_template.json. Special tokens (bos_token, eos_token, unk/sep/pad/cls/mask_token) given as strings or
  // {"content": ...} objects become template variables. Throws moecel::Error naming the file when there is no
  // template, the JSON is malformed, or the template does not parse.
  static ChatTemplate from_tokenizer_config(const std::string& path);
  // A template given as text. `special_tokens` maps variable names such as "bos_token" to their text;
  // `origin` names the template in error messages.
  static ChatTemplate from_string(const std::string& source, std::map<std::string, std::string> special_tokens = {},
                                  const std::string& origin = "chat template");
  // Whether the model folder DIR (or a tokenizer_config.json path) has a chat template. Never throws.
  static bool available(const std::string& dir);

  // Renders the conversation. `extra` holds further template variables (e.g. {"enable_thinking": false},
  // "tools": [...], "documents": [...]); they override the special tokens. Throws moecel::Error
  // "<origin>: template line N: ..." on template errors, and jinja::RaisedError (a moecel::Error whose message
  // is exactly the template's) when the template calls raise_exception(), e.g. for unsupported roles.
  std::string render(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                     const nlohmann::json& extra = {}) const;
  // The same with messages as JSON objects, for fields beyond role/content (tool_calls, reasoning_content,
  // content lists, ...). ordered_json keeps object keys in their given order, which `tojson` output shows;
  // nlohmann::json (the overload above) sorts them.
  std::string render_json(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                          const nlohmann::ordered_json& extra = nlohmann::ordered_json::object()) const;

  const std::string& source() const;  // text of the default template
  const std::map<std::string, std::string>& special_tokens() const { return special_tokens_; }
  std::string bos_token() const;  // "" when the tokenizer has none
  std::string eos_token() const;

 private:
  struct Named {
    std::string name;
    std::string source;
    std::shared_ptr<const jinja::Template> tmpl;
  };
  std::string render_value(const jinja::Value& messages, bool add_generation_prompt, const jinja::Value& extra) const;
  const Named& pick(bool has_tools) const;

  std::vector<Named> templates_;
  std::map<std::string, std::string> special_tokens_;
  std::string origin_;
};

}  // namespace moecel
