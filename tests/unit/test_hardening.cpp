// Regressions for defects found by the fuzz targets (fuzz/) and the broken-checkpoint corpus
// (tests/model/test_broken_corpus.cpp): each test reproduces the input that exposed one.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "core/error.h"
#include "io/json_parse.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/jinja.h"
#include "tokenizer/tokenizer.h"

namespace moecel {
namespace {

// The message of the moecel::Error that f throws ("" when it does not throw).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

bool is_ascii(const std::string& s) {
  for (char c : s) {
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  }
  return true;
}

// nlohmann's parse errors quote the last bytes read verbatim; from a non-UTF-8 file that put raw invalid bytes
// into the one-line message the CLI prints. They are now shown as \xNN.
TEST(Hardening, JsonErrorOfNonUtf8InputIsEscaped) {
  const std::string msg = error_of([] { parse_json_strict("{\"w\xff\xfe\": 1}", "x.json"); });
  EXPECT_NE(msg.find("x.json: invalid JSON"), std::string::npos) << msg;
  EXPECT_NE(msg.find("ill-formed UTF-8"), std::string::npos) << msg;
  EXPECT_NE(msg.find("\"w\\xFF"), std::string::npos) << msg;
  EXPECT_TRUE(is_ascii(msg)) << msg;
}

TEST(Hardening, TokenizerJsonErrorOfNonUtf8InputIsEscaped) {
  const std::string msg = error_of([] { Tokenizer::from_json("{\"model\": \"\xc3\x28\"}", "tok.json"); });
  EXPECT_NE(msg.find("tok.json"), std::string::npos) << msg;
  EXPECT_NE(msg.find("\\xC3"), std::string::npos) << msg;
  EXPECT_TRUE(is_ascii(msg)) << msg;
}

TEST(Hardening, TokenizerConfigErrorOfNonUtf8InputIsEscaped) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("moecel-hardening-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "tokenizer_config.json") << "{\"chat_template\": \"\xff\"}";
  const std::string msg = error_of([&] { ChatTemplate::from_tokenizer_config(dir.string()); });
  std::filesystem::remove_all(dir);
  EXPECT_NE(msg.find("tokenizer_config.json"), std::string::npos) << msg;
  EXPECT_NE(msg.find("\\xFF"), std::string::npos) << msg;
  EXPECT_TRUE(is_ascii(msg)) << msg;
}

// fuzz_chat_template: `'4555...52' | int` parsed the string as the float 4.6e50 and cast it to int64, which is
// undefined behaviour (UBSan: "4.55556e+50 is outside the range of representable values of type 'long'"); the
// same for a float filtered through int. Out-of-range values are now an error (jinja2 would give a big integer).
TEST(Hardening, JinjaIntFilterOutOfRangeIsAnError) {
  const nlohmann::json ctx = {{"big", 1e30}, {"edge", 9.2e18}, {"neg", -9.3e18}};
  auto render = [&](const std::string& src) { return jinja::Template(src).render(ctx); };
  for (const char* src : {"{{ '455555555555555555555555555555555555555555555555552' | int }}", "{{ big | int }}",
                          "{{ neg | int }}", "{{ '9.3e18' | int }}", "{{ '-1e19' | int(7) }}"}) {
    const std::string msg = error_of([&] { render(src); });
    EXPECT_NE(msg.find("outside the 64-bit integer range"), std::string::npos) << src << " gave: " << msg;
  }
  EXPECT_EQ(render("{{ edge | int }}"), "9200000000000000000");
  EXPECT_EQ(render("{{ '-9.2e18' | int }}"), "-9200000000000000000");
  EXPECT_EQ(render("{{ '42' | int }} {{ 2.9 | int }} {{ -2.9 | int }} {{ 'x' | int(7) }}"), "42 2 -2 7");
}

// The CLI prints every error through printable_message: a newline or terminal escape carried in by input (a config
// key or value, a prompt) must not split the "error:" line or reach the terminal raw.
TEST(Hardening, ErrorMessagesPrintAsOneLine) {
  EXPECT_EQ(printable_message("unknown model_type 'a\nerror: b'"), "unknown model_type 'a\\nerror: b'");
  EXPECT_EQ(printable_message(std::string("x\r\t\x1b[2J\x7f\x01") + '\0' + "y"), "x\\r\\t\\x1B[2J\\x7F\\x01\\x00y");
  EXPECT_EQ(printable_message("caf\xc3\xa9 \\n stays"), "caf\xc3\xa9 \\n stays");  // UTF-8 and backslashes kept
  EXPECT_EQ(printable_message(""), "");
}

}  // namespace
}  // namespace moecel
