// `moecel tokenize` and `moecel detokenize`: text -> token ids (a JSON list) and ids -> text with a model's
// tokenizer.json, exactly as HuggingFace tokenizers computes them.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cli/common.h"
#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace moecel::cli {
namespace {

struct TokenizerSource {
  std::string model;      // model folder holding tokenizer.json
  std::string tokenizer;  // or the tokenizer.json itself
};

void add_source_options(CLI::App* sub, TokenizerSource& src) {
  auto* m = sub->add_option("--model", src.model,
                            "Model folder with a tokenizer.json (default: the bundled model, or MOECEL_MODEL_DIR)");
  auto* t = sub->add_option("--tokenizer", src.tokenizer, "A tokenizer.json file, instead of a model folder");
  m->excludes(t);
  t->excludes(m);
}

Tokenizer load_tokenizer(const TokenizerSource& src) {
  if (!src.tokenizer.empty()) return Tokenizer::load(src.tokenizer);
  CommonOptions o;
  o.model = src.model;
  return Tokenizer::load(model_dir(o) + "/tokenizer.json");
}

}  // namespace

void register_tokenize(CLI::App& app) {
  struct Args {
    TokenizerSource src;
    std::string text;
    bool special = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* sub = app.add_subcommand("tokenize", "Print the token ids of a text as a JSON list");
  sub->footer(
      "Added tokens written in the text (e.g. <|im_end|>) become their ids. Example:\n"
      "  moecel tokenize --tokenizer olmoe/tokenizer.json --text \"Hello world\"   ->  [12092, 1533]");
  add_source_options(sub, args->src);
  sub->add_option("--text", args->text, "The text to tokenize")->required();
  sub->add_flag("--special", args->special,
                "Add the special tokens the tokenizer's post-processor asks for (bos/eos); off by default");
  sub->callback([args] {
    Tokenizer tok = load_tokenizer(args->src);
    std::vector<int32_t> ids = tok.encode(args->text, args->special);
    std::printf("[%s]\n", fmt::format("{}", fmt::join(ids, ", ")).c_str());
  });
}

void register_detokenize(CLI::App& app) {
  struct Args {
    TokenizerSource src;
    std::string ids;
    bool skip_special = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* sub = app.add_subcommand("detokenize", "Print the text of a list of token ids");
  sub->footer(
      "Ids without a token are skipped; bytes that do not form UTF-8 print as U+FFFD. Example:\n"
      "  moecel detokenize --tokenizer olmoe/tokenizer.json --ids 12092,1533   ->  Hello world");
  add_source_options(sub, args->src);
  sub->add_option("--ids", args->ids, "Comma-separated token ids, e.g. 1,2,3")->required();
  sub->add_flag("--skip-special", args->skip_special, "Leave out special tokens such as <|endoftext|>");
  sub->callback([args] {
    Tokenizer tok = load_tokenizer(args->src);
    std::vector<int32_t> ids = parse_ids(args->ids, "--ids");
    std::string text = tok.decode(ids, args->skip_special);
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fputc('\n', stdout);
  });
}

}  // namespace moecel::cli
