// `moecel logits`: teacher-forced logits of every prompt position, written as a float32 .npy.
#include <memory>

#include "cli/common.h"
#include "core/error.h"
#include "io/npy.h"
#include "models/registry.h"

namespace moecel::cli {
namespace {

struct LogitsArgs {
  CommonOptions common;
  std::string prompt_ids, out;
};

void run_logits(const LogitsArgs& a) {
  std::vector<int32_t> ids = parse_ids(a.prompt_ids, "--prompt-ids");
  auto backend = make_backend(a.common);
  auto model = load_model(model_dir(a.common), *backend);
  KvCache cache = model->make_cache(int64_t(ids.size()));
  Tensor logits = model->forward(ids, cache, true);  // (n_tokens, vocab_size)
  std::vector<float> host(static_cast<size_t>(logits.numel()));
  backend->to_host(logits, host.data());
  write_npy(a.out, logits.shape, host.data());
}

}  // namespace

void register_logits(CLI::App& app) {
  auto a = std::make_shared<LogitsArgs>();
  CLI::App* sub = app.add_subcommand("logits", "Write teacher-forced logits of every prompt position to a .npy file");
  add_common_options(sub, a->common);
  sub->add_option("--prompt-ids", a->prompt_ids, "Prompt as comma-separated token ids")->required();
  sub->add_option("-o,--out", a->out, "Output .npy file (float32, shape (n_tokens, vocab_size))")->required();
  sub->callback([a] { run_logits(*a); });
}

}  // namespace moecel::cli
