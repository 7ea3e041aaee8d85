// Tokenizer throughput: single-threaded encode MB/s of English prose (the KJV records of the golden corpus) with
// the real OLMoE and Qwen3 tokenizers, plus the split regexes alone (hand-written vs PCRE2) and decode. Checks the
// round trip first. Compare with tools/reference/bench_tokenizer_hf.py on the same text.
//   build/bench_tokenizer [--repo DIR] [--text FILE] [--tokenizer FILE]... [--seconds S]
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/tokenizer.h"

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Best MB/s of fn() over repeats lasting about `budget` seconds in total.
template <class Fn>
double best_mb_per_s(size_t bytes, double budget, Fn&& fn) {
  double best = 0;
  auto start = Clock::now();
  do {
    auto t0 = Clock::now();
    fn();
    best = std::max(best, double(bytes) / 1e6 / seconds_since(t0));
  } while (seconds_since(start) < budget);
  return best;
}

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) moecel::fail("cannot open {}", p.string());
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string golden_prose(const fs::path& repo) {
  fs::path corpus = repo / "tests" / "golden" / "tokenizer" / "corpus.jsonl";
  std::ifstream f(corpus);
  if (!f) moecel::fail("cannot open {} (run from the repository root or pass --repo / --text)", corpus.string());
  std::string text, line;
  while (std::getline(f, line)) {
    auto j = nlohmann::json::parse(line);
    if (j["name"].get<std::string>().rfind("prose/", 0) == 0) text += j["text"].get<std::string>();
  }
  return text;
}

void bench_tokenizer(const std::string& path, const std::string& text, double budget) {
  auto t0 = Clock::now();
  moecel::Tokenizer tok = moecel::Tokenizer::load(path);
  double load_s = seconds_since(t0);

  t0 = Clock::now();
  std::vector<int32_t> ids = tok.encode(text);
  double cold = double(text.size()) / 1e6 / seconds_since(t0);
  if (tok.decode(ids) != text) moecel::fail("{}: decode(encode(text)) != text", path);

  double warm = best_mb_per_s(text.size(), budget, [&] { ids = tok.encode(text); });
  double dec = best_mb_per_s(text.size(), budget / 2, [&] { (void)tok.decode(ids); });
  std::printf("%s\n  load %.0f ms, %zu ids for %zu bytes (%.2f bytes/token)\n", path.c_str(), load_s * 1e3, ids.size(),
              text.size(), double(text.size()) / double(ids.size()));
  std::printf("  encode: %.1f MB/s (first call, empty word cache), %.1f MB/s (best of repeats)\n", cold, warm);
  std::printf("  decode: %.1f MB/s\n", dec);
}

void bench_split(const char* name, std::string_view pattern, const std::string& text, double budget) {
  auto fast = moecel::tok::make_regex_matcher(std::string(pattern), "bench");
  auto pcre2 = moecel::tok::make_regex_matcher(std::string(pattern), "bench", /*force_pcre2=*/true);
  std::vector<moecel::tok::Segment> a, b;
  fast->find_matches(text, a);
  pcre2->find_matches(text, b);
  bool same = a.size() == b.size();
  for (size_t i = 0; same && i < a.size(); ++i) same = a[i].start == b[i].start && a[i].end == b[i].end;
  double fa = best_mb_per_s(text.size(), budget, [&] {
    a.clear();
    fast->find_matches(text, a);
  });
  double fb = best_mb_per_s(text.size(), budget, [&] {
    b.clear();
    pcre2->find_matches(text, b);
  });
  std::printf("split %-6s hand-written %.1f MB/s, PCRE2 (JIT) %.1f MB/s, %zu pieces, %s\n", name, fa, fb, a.size(),
              same ? "identical" : "DIFFERENT");
}

}  // namespace

int main(int argc, char** argv) {
  try {
    fs::path repo = ".";
    std::string text_file;
    std::vector<std::string> tokenizers;
    double budget = 2.0;
    for (int i = 1; i < argc; ++i) {
      std::string a = argv[i];
      auto next = [&]() -> std::string {
        if (i + 1 >= argc) moecel::fail("{} needs a value", a);
        return argv[++i];
      };
      if (a == "--repo")
        repo = next();
      else if (a == "--text")
        text_file = next();
      else if (a == "--tokenizer")
        tokenizers.push_back(next());
      else if (a == "--seconds")
        budget = std::stod(next());
      else
        moecel::fail(
            "unknown argument {} (usage: bench_tokenizer [--repo DIR] [--text FILE] [--tokenizer FILE]... "
            "[--seconds S])",
            a);
    }
    if (tokenizers.empty())
      for (const char* family : {"olmoe", "qwen3"})
        tokenizers.push_back((repo / ".." / "shared" / "data" / "tokenizers" / family / "tokenizer.json").string());
    const std::string text = text_file.empty() ? golden_prose(repo) : read_file(text_file);
    std::printf("text: %zu bytes of %s\n", text.size(),
                text_file.empty() ? "KJV prose (golden corpus)" : text_file.c_str());
    for (const std::string& t : tokenizers) bench_tokenizer(t, text, budget);
    bench_split("gpt2", moecel::tok::kGpt2Pattern, text, budget / 2);
    bench_split("qwen2", moecel::tok::kQwen2Pattern, text, budget / 2);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
