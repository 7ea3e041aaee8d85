// ChatTemplate: byte-identical renders against jinja2/transformers goldens (tests/golden/chat_template,
// written by tools/reference/chat_template_goldens.py) for Qwen3's real template, OLMoE-Instruct's and
// several others, plus tokenizer_config.json loading and error handling.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>

#include "tokenizer/chat_template.h"

namespace moecel {
namespace {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

const fs::path kGoldenDir = fs::path(MOECEL_SOURCE_DIR) / "tests" / "golden" / "chat_template";
const fs::path kSharedDir = fs::path(MOECEL_SHARED_DIR);

ojson load_cases() {
  std::ifstream f(kGoldenDir / "chat_cases.json");
  if (!f) return ojson();
  return ojson::parse(f);
}

std::string read_text(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// Messages that are plain {role, content: string} can also go through the ChatMessage overload.
bool plain_messages(const ojson& msgs, std::vector<ChatMessage>* out) {
  for (const auto& m : msgs) {
    if (m.size() != 2 || !m.contains("role") || !m.contains("content") || !m["content"].is_string()) return false;
    out->push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
  }
  return true;
}

class ChatTemplateGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(ChatTemplateGolden, MatchesJinja2) {
  const ojson all = load_cases();
  ASSERT_FALSE(all.is_null()) << "missing " << (kGoldenDir / "chat_cases.json").string();
  const std::string name = GetParam();
  const ojson& meta = all["templates"][name];
  ChatTemplate tmpl;
  if (meta.contains("tokenizer_config")) {
    fs::path config = kSharedDir / meta["tokenizer_config"].get<std::string>();
    if (!fs::exists(config)) GTEST_SKIP() << "shared tokenizer config not found: " << config.string();
    tmpl = ChatTemplate::from_tokenizer_config(config.string());
    for (const auto& [k, v] : meta["special_tokens"].items())
      EXPECT_EQ(tmpl.special_tokens().at(k), v.get<std::string>());
    EXPECT_EQ(tmpl.special_tokens().size(), meta["special_tokens"].size());
  } else {
    std::map<std::string, std::string> tokens;
    for (const auto& [k, v] : meta["special_tokens"].items()) tokens[k] = v.get<std::string>();
    tmpl = ChatTemplate::from_string(read_text(kGoldenDir / meta["file"].get<std::string>()), tokens, name);
  }
  int n = 0;
  for (const ojson& c : all["cases"]) {
    if (c["template"] != name) continue;
    ++n;
    const std::string label =
        name + "/" + c["name"].get<std::string>() + (c["add_generation_prompt"].get<bool>() ? " +gen" : "");
    const bool agp = c["add_generation_prompt"].get<bool>();
    const ojson& msgs = c["messages"];
    const ojson& extra = c["extra"];
    if (c.contains("expected")) {
      std::string got;
      try {
        got = tmpl.render_json(msgs, agp, extra);
      } catch (const std::exception& e) {
        ADD_FAILURE() << label << ": threw " << e.what();
        continue;
      }
      EXPECT_EQ(got, c["expected"].get<std::string>()) << label;
      // nlohmann::json sorts object keys, so only flat extras give the same tojson output through it.
      bool flat_extra = std::none_of(extra.begin(), extra.end(), [](const ojson& v) { return v.is_structured(); });
      std::vector<ChatMessage> plain;
      if (flat_extra && plain_messages(msgs, &plain)) {
        nlohmann::json ex = nlohmann::json::parse(extra.dump());
        EXPECT_EQ(tmpl.render(plain, agp, ex), c["expected"].get<std::string>()) << label << " (ChatMessage overload)";
      }
    } else if (c.contains("raises")) {
      try {
        tmpl.render_json(msgs, agp, extra);
        ADD_FAILURE() << label << ": expected raise_exception(" << c["raises"] << ")";
      } catch (const jinja::RaisedError& e) {
        EXPECT_EQ(std::string(e.what()), c["raises"].get<std::string>()) << label;
      }
    } else {
      try {
        tmpl.render_json(msgs, agp, extra);
        ADD_FAILURE() << label << ": expected an error like jinja2's " << c["error"];
      } catch (const jinja::RaisedError& e) {
        ADD_FAILURE() << label << ": raise_exception instead of an error: " << e.what();
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("template line"), std::string::npos) << label << ": " << e.what();
      }
    }
  }
  EXPECT_GT(n, 20) << name;
}

INSTANTIATE_TEST_SUITE_P(Templates, ChatTemplateGolden,
                         ::testing::Values("qwen3", "olmoe_instruct", "mixtral_instruct", "llama2_chat", "chatml",
                                           "zephyr", "llama31_tools", "features"));

TEST(ChatTemplate, GoldenCoversEveryTemplate) {
  const ojson all = load_cases();
  ASSERT_FALSE(all.is_null());
  std::set<std::string> names;
  for (const auto& c : all["cases"]) names.insert(c["template"].get<std::string>());
  EXPECT_EQ(names.size(), 8u);
}

// Hand-checked renders of the OLMoE-Instruct (Tulu) template, independent of the golden file.
TEST(ChatTemplate, OlmoeInstructByHand) {
  ChatTemplate t = ChatTemplate::from_string(read_text(kGoldenDir / "olmoe_instruct.jinja"),
                                             {{"bos_token", "<|endoftext|>"}, {"eos_token", "<|endoftext|>"}});
  EXPECT_EQ(t.render({{"user", "Hi"}}, true), "<|endoftext|><|user|>\nHi\n<|assistant|>\n");
  EXPECT_EQ(t.render({{"system", "S"}, {"user", "Q"}, {"assistant", "A"}, {"user", "Q2"}}, false),
            "<|endoftext|><|system|>\nS\n<|user|>\nQ\n<|assistant|>\nA<|endoftext|>\n<|user|>\nQ2\n");
  EXPECT_EQ(t.render({{"user", "Q"}, {"assistant", "A"}}, false),
            "<|endoftext|><|user|>\nQ\n<|assistant|>\nA<|endoftext|>");
  EXPECT_EQ(t.bos_token(), "<|endoftext|>");
}

TEST(ChatTemplate, Qwen3ExtraVariables) {
  fs::path config = kSharedDir / "data/tokenizers/qwen3/tokenizer_config.json";
  if (!fs::exists(config)) GTEST_SKIP() << "shared tokenizer config not found: " << config.string();
  ChatTemplate t = ChatTemplate::from_tokenizer_config(config.parent_path().string());  // a folder works too
  EXPECT_TRUE(ChatTemplate::available(config.parent_path().string()));
  EXPECT_EQ(t.eos_token(), "<|im_end|>");
  EXPECT_EQ(t.bos_token(), "");
  EXPECT_EQ(t.render({{"user", "hi"}}, true), "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(t.render({{"user", "hi"}}, true, {{"enable_thinking", false}}),
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  EXPECT_THROW(t.render({}, true), Error);  // empty conversation, like transformers
  EXPECT_THROW(t.render({{"user", "hi"}}, true, {{"messages", 1}}), Error);
}

class TempDir {
 public:
  TempDir() {
    path_ = fs::temp_directory_path() /
            ("moecel_chat_template_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string write(const std::string& name, const std::string& text) const {
    std::ofstream(path_ / name, std::ios::binary) << text;
    return (path_ / name).string();
  }
  std::string str() const { return path_.string(); }

 private:
  fs::path path_;
};

TEST(ChatTemplate, ConfigWithStringTemplateAndTokenObjects) {
  TempDir d;
  std::string path = d.write("tokenizer_config.json", R"({
    "bos_token": {"content": "<s>", "lstrip": false}, "eos_token": "</s>", "unk_token": null,
    "chat_template": "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}{{ eos_token }}"})");
  ChatTemplate t = ChatTemplate::from_tokenizer_config(path);
  EXPECT_EQ(t.render({{"user", "a"}, {"assistant", "b"}}, false), "<s>[user]a[assistant]b</s>");
  EXPECT_EQ(t.special_tokens().count("unk_token"), 0u);
  EXPECT_TRUE(ChatTemplate::available(d.str()));
  // Extra variables override the special tokens.
  EXPECT_EQ(t.render({{"user", "a"}}, false, {{"eos_token", "<END>"}}), "<s>[user]a<END>");
}

TEST(ChatTemplate, ConfigWithNamedTemplates) {
  TempDir d;
  d.write("tokenizer_config.json", R"({"chat_template": [
    {"name": "default", "template": "D{{ messages | length }}"},
    {"name": "tool_use", "template": "T{{ tools | length }}"}]})");
  ChatTemplate t = ChatTemplate::from_tokenizer_config(d.str());
  EXPECT_EQ(t.render({{"user", "x"}}, false), "D1");
  EXPECT_EQ(t.render_json(ojson::parse(R"([{"role": "user", "content": "x"}])"), false,
                          ojson::parse(R"({"tools": [{"name": "a"}, {"name": "b"}]})")),
            "T2");
  EXPECT_EQ(t.source(), "D{{ messages | length }}");
}

TEST(ChatTemplate, JinjaFileTakesPrecedence) {
  TempDir d;
  d.write("tokenizer_config.json", R"({"eos_token": "E", "chat_template": "from config"})");
  d.write("chat_template.jinja", "from file {{ eos_token }}\n");
  EXPECT_EQ(ChatTemplate::from_tokenizer_config(d.str()).render({{"user", "x"}}, false), "from file E");
}

TEST(ChatTemplate, MissingOrBrokenTemplates) {
  TempDir d;
  d.write("tokenizer_config.json", R"({"eos_token": "</s>"})");
  EXPECT_FALSE(ChatTemplate::available(d.str()));
  try {
    ChatTemplate::from_tokenizer_config(d.str());
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no chat template"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(ChatTemplate::available(d.str() + "/does_not_exist"));
  EXPECT_THROW(ChatTemplate::from_tokenizer_config(d.str() + "/does_not_exist"), Error);

  d.write("tokenizer_config.json", "{not json");
  EXPECT_FALSE(ChatTemplate::available(d.str()));
  try {
    ChatTemplate::from_tokenizer_config(d.str());
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer_config.json"), std::string::npos) << e.what();
  }

  d.write("tokenizer_config.json", R"({"chat_template": "line one\n{% for m in messages %}{{ m.content }"})");
  try {
    ChatTemplate::from_tokenizer_config(d.str());
    ADD_FAILURE() << "expected a syntax error";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("tokenizer_config.json"), std::string::npos) << msg;
    EXPECT_NE(msg.find("line 2"), std::string::npos) << msg;
  }

  d.write("tokenizer_config.json", R"({"chat_template": 5})");
  EXPECT_THROW(ChatTemplate::from_tokenizer_config(d.str()), Error);
}

TEST(ChatTemplate, RuntimeErrorsNameOriginAndLine) {
  ChatTemplate t = ChatTemplate::from_string("ok\n{{ messages[0].content.nope() }}", {}, "my.jinja");
  try {
    t.render({{"user", "x"}}, false);
    ADD_FAILURE() << "expected an error";
  } catch (const jinja::RaisedError&) {
    ADD_FAILURE() << "not a raise_exception";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("my.jinja"), std::string::npos) << msg;
    EXPECT_NE(msg.find("line 2"), std::string::npos) << msg;
  }
  ChatTemplate r = ChatTemplate::from_string("{{ raise_exception('Roles must alternate') }}");
  try {
    r.render({{"user", "x"}}, false);
    ADD_FAILURE() << "expected raise_exception";
  } catch (const jinja::RaisedError& e) {
    EXPECT_STREQ(e.what(), "Roles must alternate");
  }
}

TEST(ChatTemplate, MessageNormalisation) {
  ChatTemplate t = ChatTemplate::from_string(
      "{% for m in messages %}{{ m | tojson }}{% endfor %}|{{ tools }}|{{ documents }}|{{ add_generation_prompt }}");
  ojson msgs = ojson::parse(R"([{"role": "assistant", "content": "a", "tool_calls": null, "reasoning": "r"}])");
  EXPECT_EQ(t.render_json(msgs, true),
            R"({"thinking": "r", "role": "assistant", "content": "a", "reasoning": "r", "reasoning_content": "r"})"
            "|None|None|True");
  EXPECT_THROW(t.render_json(ojson::parse(R"(["not an object"])"), false), Error);
}

}  // namespace
}  // namespace moecel
