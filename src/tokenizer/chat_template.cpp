// Chat templates of HuggingFace tokenizers (see chat_template.h). The rendering context mirrors transformers
// 5.x apply_chat_template: messages (keys whose value is None dropped, reasoning fields aliased), tools and
// documents (None unless given), add_generation_prompt, the special tokens, then the caller's extra variables.
#include "tokenizer/chat_template.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "io/json_parse.h"

namespace moecel {
namespace {

namespace fs = std::filesystem;
using jinja::Dict;
using jinja::Value;

const char* const kSpecialTokenKeys[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                         "pad_token", "cls_token", "mask_token"};

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  MOECEL_CHECK(f, "{}: cannot open", p.string());
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

nlohmann::json read_json(const fs::path& p) {
  try {
    return nlohmann::json::parse(read_file(p));
  } catch (const nlohmann::json::exception& e) {
    fail("{}: invalid JSON: {}", p.string(), json_error_message(e));
  }
}

struct Sources {
  std::vector<std::pair<std::string, std::string>> templates;  // (name, text)
  std::map<std::string, std::string> special_tokens;
  std::string origin;
};

void add_config_templates(const nlohmann::json& t, const std::string& where, Sources& out) {
  if (t.is_string()) {
    out.templates.emplace_back("default", t.get<std::string>());
  } else if (t.is_array()) {
    for (const auto& item : t) {
      MOECEL_CHECK(item.is_object() && item.contains("name") && item["name"].is_string() && item.contains("template") &&
                       item["template"].is_string(),
                   "{}: chat_template list entries must be objects with string 'name' and 'template'", where);
      out.templates.emplace_back(item["name"].get<std::string>(), item["template"].get<std::string>());
    }
  } else if (!t.is_null()) {
    fail("{}: chat_template must be a string or a list of {{name, template}}, got {}", where, t.type_name());
  }
}

// Finds the template text(s) and special tokens of a model folder or tokenizer_config.json path.
Sources find_sources(const std::string& path) {
  fs::path p(path);
  fs::path dir = fs::is_directory(p) ? p : p.parent_path();
  fs::path config = fs::is_directory(p) ? p / "tokenizer_config.json" : p;
  Sources s;
  s.origin = config.string();
  nlohmann::json cfg = nlohmann::json::object();
  if (fs::exists(config)) {
    cfg = read_json(config);
    MOECEL_CHECK(cfg.is_object(), "{}: expected a JSON object", config.string());
  } else {
    MOECEL_CHECK(fs::is_directory(p), "{}: no such file", config.string());
  }
  for (const char* key : kSpecialTokenKeys) {
    if (!cfg.contains(key)) continue;
    const auto& v = cfg[key];
    if (v.is_string())
      s.special_tokens[key] = v.get<std::string>();
    else if (v.is_object() && v.contains("content") && v["content"].is_string())
      s.special_tokens[key] = v["content"].get<std::string>();
  }
  // transformers prefers a chat_template.jinja file next to the config over the config's own entry.
  if (!dir.empty() && fs::exists(dir / "chat_template.jinja")) {
    s.templates.emplace_back("default", read_file(dir / "chat_template.jinja"));
    s.origin = (dir / "chat_template.jinja").string();
    return s;
  }
  if (cfg.contains("chat_template")) add_config_templates(cfg["chat_template"], config.string(), s);
  if (s.templates.empty() && !dir.empty() && fs::exists(dir / "chat_template.json")) {
    nlohmann::json j = read_json(dir / "chat_template.json");
    MOECEL_CHECK(j.is_object() && j.contains("chat_template"), "{}: expected an object with 'chat_template'",
                 (dir / "chat_template.json").string());
    s.origin = (dir / "chat_template.json").string();
    add_config_templates(j["chat_template"], s.origin, s);
  }
  return s;
}

// Messages as apply_chat_template hands them to the template.
Value normalize_messages(const Value& messages, const std::string& origin) {
  MOECEL_CHECK(messages.is_list(), "{}: messages must be a list, got {}", origin, jinja::type_name(messages));
  MOECEL_CHECK(!messages.items().empty(), "{}: cannot apply a chat template to an empty conversation", origin);
  std::vector<Value> out;
  for (const Value& m : messages.items()) {
    MOECEL_CHECK(m.is_dict(), "{}: chat messages must be objects, got {}", origin, jinja::type_name(m));
    Dict d;
    for (const auto& [k, v] : m.as_dict().items)
      if (!v.is_none()) d.items.emplace_back(k, v);  // "content": null and friends are dropped
    // Reasoning under any of its names is exposed as both `thinking` (first) and `reasoning_content` (last).
    const Value* reasoning = nullptr;
    for (const char* key : {"reasoning_content", "thinking", "reasoning"})
      if (!reasoning) reasoning = d.find(key);
    if (reasoning) {
      Value r = *reasoning;
      Dict aliased;
      aliased.items.emplace_back("thinking", r);
      for (auto& kv : d.items) aliased.set(kv.first, kv.second);
      aliased.set("reasoning_content", r);
      d = std::move(aliased);
    }
    out.push_back(Value::dict(std::move(d)));
  }
  return Value::list(std::move(out));
}

}  // namespace

ChatTemplate ChatTemplate::from_string(const std::string& source, std::map<std::string, std::string> special_tokens,
                                       const std::string& origin) {
  ChatTemplate t;
  t.origin_ = origin;
  t.special_tokens_ = std::move(special_tokens);
  try {
    t.templates_.push_back({"default", source, std::make_shared<const jinja::Template>(source)});
  } catch (const Error& e) {
    fail("{}: {}", origin, e.what());
  }
  return t;
}

ChatTemplate ChatTemplate::from_tokenizer_config(const std::string& path) {
  Sources s = find_sources(path);
  MOECEL_CHECK(!s.templates.empty(),
               "{}: no chat template (no 'chat_template' entry, chat_template.jinja or "
               "chat_template.json); pass the prompt without one",
               s.origin);
  ChatTemplate t;
  t.origin_ = s.origin;
  t.special_tokens_ = std::move(s.special_tokens);
  for (auto& [name, text] : s.templates) {
    try {
      t.templates_.push_back({name, text, std::make_shared<const jinja::Template>(text)});
    } catch (const Error& e) {
      fail("{}: chat template '{}': {}", s.origin, name, e.what());
    }
  }
  return t;
}

bool ChatTemplate::available(const std::string& dir) {
  try {
    return !find_sources(dir).templates.empty();
  } catch (...) {
    return false;
  }
}

const std::string& ChatTemplate::source() const {
  MOECEL_CHECK(!templates_.empty(), "{}: no chat template", origin_);
  return pick(false).source;
}

std::string ChatTemplate::bos_token() const {
  auto it = special_tokens_.find("bos_token");
  return it == special_tokens_.end() ? "" : it->second;
}

std::string ChatTemplate::eos_token() const {
  auto it = special_tokens_.find("eos_token");
  return it == special_tokens_.end() ? "" : it->second;
}

const ChatTemplate::Named& ChatTemplate::pick(bool has_tools) const {
  MOECEL_CHECK(!templates_.empty(), "{}: no chat template", origin_);
  if (templates_.size() == 1) return templates_[0];
  const Named* def = nullptr;
  for (const Named& n : templates_) {
    if (has_tools && n.name == "tool_use") return n;
    if (n.name == "default") def = &n;
  }
  MOECEL_CHECK(def, "{}: the tokenizer has several chat templates and none is named 'default'", origin_);
  return *def;
}

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                                 const nlohmann::json& extra) const {
  std::vector<Value> msgs;
  msgs.reserve(messages.size());
  for (const ChatMessage& m : messages) {
    Dict d;
    d.items.emplace_back("role", Value::string(m.role));
    d.items.emplace_back("content", Value::string(m.content));
    msgs.push_back(Value::dict(std::move(d)));
  }
  return render_value(Value::list(std::move(msgs)), add_generation_prompt,
                      extra.is_null() ? Value::dict({}) : Value::from_json(extra));
}

std::string ChatTemplate::render_json(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                      const nlohmann::ordered_json& extra) const {
  return render_value(Value::from_json(messages), add_generation_prompt,
                      extra.is_null() ? Value::dict({}) : Value::from_json(extra));
}

std::string ChatTemplate::render_value(const Value& messages, bool add_generation_prompt, const Value& extra) const {
  MOECEL_CHECK(extra.is_dict(), "{}: extra template variables must be a JSON object, got {}", origin_,
               jinja::type_name(extra));
  const Dict& ex = extra.as_dict();
  for (const char* reserved : {"messages", "add_generation_prompt"})
    MOECEL_CHECK(!ex.find(reserved), "{}: '{}' cannot be passed as an extra template variable", origin_, reserved);
  const Value* tools = ex.find("tools");
  const Value* documents = ex.find("documents");
  Dict ctx;
  ctx.set("messages", normalize_messages(messages, origin_));
  ctx.set("tools", tools ? *tools : Value::none());
  ctx.set("documents", documents ? *documents : Value::none());
  ctx.set("add_generation_prompt", Value::boolean(add_generation_prompt));
  for (const auto& [k, v] : special_tokens_) ctx.set(k, Value::string(v));
  for (const auto& [k, v] : ex.items)
    if (k != "tools" && k != "documents") ctx.set(k, v);
  const Named& t = pick(tools && !tools->is_none());
  try {
    return t.tmpl->render(Value::dict(std::move(ctx)));
  } catch (const jinja::RaisedError&) {
    throw;
  } catch (const Error& e) {
    fail("{}: {}", origin_, e.what());
  }
}

}  // namespace moecel
