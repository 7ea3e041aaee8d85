// `moecel bench`: llama-bench style throughput. pp<N>: one batched forward of an N-token prompt; tg<N>: N
// single-token decode steps from an empty context. One warm-up run, then -r repetitions: mean and spread in
// tokens/s, and achieved GB/s from the weights one decode step reads.
#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>

#include "cli/common.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "models/moe_dispatch.h"
#include "models/registry.h"
#include "runtime/generate.h"

namespace moecel::cli {
namespace {

struct BenchArgs {
  CommonOptions common;
  std::vector<int> prompt{512};
  std::vector<int> gen{128};
  int reps = 5;
  bool json = false;
  uint64_t seed = 0;
};

double time_pp(Model& m, const std::vector<int32_t>& tokens) {
  KvCache cache = m.make_cache(int64_t(tokens.size()));
  auto t0 = std::chrono::steady_clock::now();
  Tensor logits = m.forward(tokens, cache, false);
  m.backend().argmax(logits);
  m.backend().synchronize();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// n greedy decode steps from an empty context, through the same stepper as generate (decode graphs on CUDA).
// The cache is reused (emptied) across repetitions so a recorded graph is too.
double time_tg(Model& m, KvCache& cache, GreedyStepper& stepper, int n, int32_t first) {
  cache.length = 0;
  int32_t id = first;
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) id = stepper.step(id, i + 1 < n);
  m.backend().synchronize();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// --fused-moe for bench: a comma-separated list of on/off values; each tg test runs once per value.
std::vector<bool> fused_values(const std::string& list) {
  if (list.empty()) return {fused_moe_settings().enabled};
  std::vector<bool> v;
  size_t pos = 0;
  while (pos <= list.size()) {
    const size_t end = std::min(list.find(',', pos), list.size());
    v.push_back(parse_on_off(list.substr(pos, end - pos).c_str(), "--fused-moe"));
    pos = end + 1;
  }
  return v;
}

// What the MoE blocks of a decode run took, from the dispatch counts (not from the setting).
std::string moe_path(const moe_trace::Counts& before, const moe_trace::Counts& after) {
  const int64_t f = after.fused - before.fused, g = after.gather - before.gather;
  if (f == 0 && g == 0) return "-";
  return g == 0 ? "fused" : f == 0 ? "gather" : "mixed";
}

void run_bench(const BenchArgs& a) {
  MOECEL_CHECK(a.reps >= 1, "-r must be >= 1, got {}", a.reps);
  const std::vector<bool> fused = fused_values(a.common.fused_moe);
  CommonOptions common = a.common;
  common.fused_moe.clear();
  auto backend = make_backend(common);
  const std::string dir = model_dir(a.common);
  auto model = load_model(dir, *backend);
  const ModelInfo& info = model->info();
  std::mt19937 rng(uint32_t(a.seed));
  std::uniform_int_distribution<int32_t> tok(0, int32_t(info.vocab_size - 1));

  struct Row {
    std::string test;
    int n;
    std::vector<double> tps;
    std::string moe = "-";  // tg: the path the MoE blocks took
  };
  std::vector<Row> rows;
  for (int p : a.prompt) {
    if (p <= 0) continue;
    std::vector<int32_t> tokens(static_cast<size_t>(p));
    for (auto& t : tokens) t = tok(rng);
    time_pp(*model, tokens);  // warm-up
    Row r{fmt::format("pp{}", p), p, {}};
    for (int i = 0; i < a.reps; ++i) r.tps.push_back(p / time_pp(*model, tokens));
    rows.push_back(r);
  }
  for (int n : a.gen) {
    if (n <= 0) continue;
    for (bool on : fused) {
      FusedMoeSettings s = fused_moe_settings();
      s.enabled = on;
      set_fused_moe_settings(s);
      KvCache cache = model->make_cache(n);
      GreedyStepper stepper(*model, cache);                        // a new stepper: a recorded graph bakes in the path
      time_tg(*model, cache, stepper, std::min(n, 16), tok(rng));  // warm-up (records the decode graph)
      Row r{fmt::format("tg{}", n), n, {}};
      const moe_trace::Counts before = moe_trace::totals();
      for (int i = 0; i < a.reps; ++i) r.tps.push_back(n / time_tg(*model, cache, stepper, n, tok(rng)));
      r.moe = moe_path(before, moe_trace::totals());
      rows.push_back(r);
    }
  }

  const double gb_per_token = double(info.active_bytes_per_token) / 1e9;
  nlohmann::json out = nlohmann::json::array();
  if (!a.json) {
    std::printf("| model | size | backend | threads | moe | test | t/s | GB/s |\n");
    std::printf("| --- | ---: | --- | ---: | --- | --- | ---: | ---: |\n");
  }
  for (const Row& r : rows) {
    double mean = 0, var = 0;
    for (double v : r.tps) mean += v;
    mean /= double(r.tps.size());
    for (double v : r.tps) var += (v - mean) * (v - mean);
    const double sd = r.tps.size() > 1 ? std::sqrt(var / double(r.tps.size() - 1)) : 0.0;
    // GB/s counts the weights streamed per forward: per token for decode, once per batch for prefill.
    const double gbs = r.test[0] == 't' ? mean * gb_per_token : mean / r.n * gb_per_token;
    if (a.json) {
      out.push_back({{"model", dir},
                     {"model_type", info.model_type},
                     {"weight_bytes", info.weight_bytes},
                     {"active_bytes_per_token", info.active_bytes_per_token},
                     {"backend", a.common.backend},
                     {"threads", num_threads()},
                     {"test", r.test},
                     {"moe_path", r.moe},
                     {"n_tokens", r.n},
                     {"reps", r.tps.size()},
                     {"tokens_per_second", r.tps},
                     {"avg_ts", mean},
                     {"stddev_ts", sd},
                     {"gb_per_second", gbs}});
    } else {
      std::printf("| %s | %.2f GiB | %s | %d | %s | %s | %.2f ± %.2f | %.1f |\n", info.model_type.c_str(),
                  double(info.weight_bytes) / double(1ull << 30), a.common.backend.c_str(), num_threads(),
                  r.moe.c_str(), r.test.c_str(), mean, sd, gbs);
    }
  }
  if (a.json) std::printf("%s\n", out.dump(2).c_str());
}

}  // namespace

void register_bench(CLI::App& app) {
  auto a = std::make_shared<BenchArgs>();
  CLI::App* sub = app.add_subcommand("bench", "Measure prefill (pp) and decode (tg) throughput, llama-bench style");
  add_common_options(sub, a->common);
  sub->add_option("-p,--n-prompt", a->prompt, "Prompt lengths for pp tests (0 = none)")
      ->default_val(512)
      ->delimiter(',');
  sub->add_option("-n,--n-gen", a->gen, "Generated lengths for tg tests (0 = none)")->default_val(128)->delimiter(',');
  sub->add_option("-r,--repetitions", a->reps, "Repetitions of each test")->default_val(5);
  sub->add_option("--seed", a->seed, "Seed for the random prompt tokens")->default_val(0);
  sub->add_flag("--json", a->json, "Print JSON instead of a markdown table");
  sub->callback([a] { run_bench(*a); });
}

}  // namespace moecel::cli
