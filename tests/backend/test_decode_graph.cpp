// Decode graphs of the CUDA backend: a recorded single-token step replayed at many positions gives bit-identical
// logits and the same greedy ids as the plain per-op path, across captures at different positions, cache resets
// and the generate loop. Runs on small random OLMoE checkpoints; skips with "no CUDA device" without a GPU.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "core/error.h"
#include "models/registry.h"
#include "models/test_model.h"
#include "runtime/generate.h"

namespace moecel {
namespace {

// A test checkpoint in a fresh temporary folder, removed at the end.
struct ModelDir {
  std::filesystem::path path;
  // head_dim 128 as in OLMoE-1B-7B, several experts per token, 3 layers; `hidden` and `layers` as given.
  explicit ModelDir(const std::string& name, int bits, int hidden = 512, int layers = 3) {
    path = std::filesystem::temp_directory_path() / ("moecel-graph-" + name + "-" + std::to_string(::getpid()));
    std::filesystem::create_directories(path);
    TestModelOptions opt;
    opt.bits = bits;
    opt.seed = 11;
    opt.config_overrides = {{"hidden_size", hidden},
                            {"num_attention_heads", hidden / 128},
                            {"num_key_value_heads", hidden / 128},
                            {"intermediate_size", 256},
                            {"num_experts", 16},
                            {"num_experts_per_tok", 4},
                            {"num_hidden_layers", layers},
                            {"vocab_size", 1000},
                            {"eos_token_id", 999}};
    write_test_model(opt, path.string());
  }
  ~ModelDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

// Sets MOECEL_CUDA_GRAPH (and MOECEL_CUDA_GRAPH_STEPS when given) for the lifetime of the object.
struct GraphEnv {
  explicit GraphEnv(const char* v, const char* steps = nullptr) {
    setenv("MOECEL_CUDA_GRAPH", v, 1);
    if (steps) setenv("MOECEL_CUDA_GRAPH_STEPS", steps, 1);
  }
  ~GraphEnv() {
    unsetenv("MOECEL_CUDA_GRAPH");
    unsetenv("MOECEL_CUDA_GRAPH_STEPS");
  }
};

std::vector<float> host_floats(Backend& be, const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  be.to_host(t, v.data());
  return v;
}

// One recorded decode step of `model` at the cache's current length (left as it was): the graph and the logits
// tensor each replay writes.
struct RecordedStep {
  Tensor ids, next, logits;
  std::unique_ptr<DecodeGraph> graph;
};
RecordedStep record_step(CudaBackend& be, Model& model, KvCache& cache) {
  RecordedStep r;
  r.ids = be.alloc(DType::kI32, {1});
  r.next = be.alloc(DType::kI32, {1});
  const int64_t len = cache.length;
  r.graph = be.capture_decode(
      [&] {
        r.logits = model.forward_device(r.ids, cache, false);
        be.argmax_to(r.logits, r.next);
      },
      r.ids, r.next);
  cache.length = len;
  return r;
}

class DecodeGraph4 : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    std::string why;
    if (cuda_device_count(&why) == 0) GTEST_SKIP() << "no CUDA device (" << why << ")";
  }
};

// The recorded step's logits equal the plain step's bit for bit at every position (captured mid-context,
// replayed forward, then again from an emptied cache at positions below the capture position).
TEST_P(DecodeGraph4, LogitsBitIdenticalAcrossPositions) {
  ModelDir dir("logits", GetParam());
  CudaBackend be;
  auto model = load_model(dir.path.string(), be);
  const int64_t vocab = model->info().vocab_size;
  const std::vector<int32_t> prompt = {5, 17, 300, 42, 42, 7, 511};
  constexpr int kSteps = 40;

  // Plain path: prefill, then kSteps single-token forwards fed with their own argmax.
  KvCache plain = model->make_cache(int64_t(prompt.size()) + kSteps);
  int32_t id = be.argmax(model->forward(prompt, plain, false))[0];
  const int32_t first = id;
  std::vector<std::vector<float>> want;
  std::vector<int32_t> want_ids;
  for (int s = 0; s < kSteps; ++s) {
    const Tensor logits = model->forward(std::span<const int32_t>(&id, 1), plain, false);
    want.push_back(host_floats(be, logits));
    id = be.argmax(logits)[0];
    want_ids.push_back(id);
  }

  // Graph path on another cache: same prefill, then one recording replayed kSteps times.
  KvCache cache = model->make_cache(int64_t(prompt.size()) + kSteps);
  ASSERT_EQ(be.argmax(model->forward(prompt, cache, false))[0], first);
  RecordedStep rec = record_step(be, *model, cache);
  ASSERT_NE(rec.graph, nullptr);
  DecodeGraph* graph = rec.graph.get();
  const Tensor& logits = rec.logits;
  id = first;
  for (int s = 0; s < kSteps; ++s) {
    const int32_t got = graph->run(id, cache.length);
    cache.length += 1;
    const std::vector<float> l = host_floats(be, logits);
    ASSERT_EQ(l.size(), size_t(vocab));
    ASSERT_EQ(std::memcmp(l.data(), want[size_t(s)].data(), l.size() * sizeof(float)), 0) << "step " << s;
    ASSERT_EQ(got, want_ids[size_t(s)]) << "step " << s;
    id = got;
  }

  // Replays from position 0 of the same cache (below the capture position) match a fresh plain run.
  KvCache plain2 = model->make_cache(int64_t(prompt.size()) + kSteps);
  cache.length = 0;
  id = 3;
  int32_t plain_id = 3;
  for (int s = 0; s < 24; ++s) {
    const Tensor pl = model->forward(std::span<const int32_t>(&plain_id, 1), plain2, false);
    const std::vector<float> w = host_floats(be, pl);
    plain_id = be.argmax(pl)[0];
    id = graph->run(id, cache.length);
    cache.length += 1;
    const std::vector<float> l = host_floats(be, logits);
    ASSERT_EQ(std::memcmp(l.data(), w.data(), l.size() * sizeof(float)), 0) << "restart step " << s;
    ASSERT_EQ(id, plain_id) << "restart step " << s;
  }
}

// generate() with graphs on and off gives the same ids, and the stepper really used a graph.
TEST_P(DecodeGraph4, GenerateSameIdsWithAndWithoutGraph) {
  ModelDir dir("generate", GetParam());
  CudaBackend be;
  auto model = load_model(dir.path.string(), be);
  const std::vector<int32_t> prompt = {1, 2, 3, 400, 500, 600, 7, 8};
  GenerateOptions opt;
  opt.max_tokens = 64;
  opt.stop_at_eos = false;
  GenerateResult off, on;
  {
    GraphEnv env("0");
    off = generate(*model, prompt, opt);
  }
  {
    GraphEnv env("1");
    on = generate(*model, prompt, opt);
  }
  ASSERT_EQ(off.output_ids.size(), 64u);
  EXPECT_EQ(on.output_ids, off.output_ids);

  GraphEnv env("1");
  KvCache cache = model->make_cache(100);
  GreedyStepper stepper(*model, cache);
  int32_t id = 9;
  for (int s = 0; s < 90; ++s) id = stepper.step(id);
  EXPECT_TRUE(stepper.uses_graph());
  EXPECT_EQ(cache.length, 90);
  // Context full: the stepper refuses instead of writing past the cache.
  for (int s = 0; s < 10; ++s) id = stepper.step(id);
  EXPECT_THROW(stepper.step(id), Error);
}

// The stepper runs the next step ahead, fed its own output on the device. Fed another token (teacher forcing),
// at another position (a reset cache) or told no step follows, it must still return exactly what steps without a
// graph return.
TEST_P(DecodeGraph4, StepsAheadDiscardedWhenNotTaken) {
  ModelDir dir("ahead", GetParam());
  CudaBackend be;
  auto model = load_model(dir.path.string(), be);
  auto run = [&](const char* graph, const char* steps) {
    GraphEnv env(graph, steps);
    KvCache cache = model->make_cache(64);
    GreedyStepper stepper(*model, cache);
    std::vector<int32_t> out;
    int32_t id = 5;
    for (int s = 0; s < 40; ++s) {
      const int32_t next = stepper.step(id, s % 7 != 3);
      out.push_back(next);
      id = s % 3 == 0 ? int32_t((s * 37 + 11) % 1000) : next;  // every third step is fed another token
      if (s == 25) {                                           // a reset: the step run ahead was for position 26
        cache.length = 10;
        id = 42;
      }
    }
    EXPECT_EQ(stepper.uses_graph(), graph[0] == '1');
    EXPECT_EQ(stepper.uses_two_step_graph(), graph[0] == '1' && steps[0] == '2');
    return out;
  };
  const std::vector<int32_t> off = run("0", "2");
  ASSERT_EQ(off.size(), 40u);
  EXPECT_EQ(run("1", "1"), off) << "one step per replay";
  EXPECT_EQ(run("1", "2"), off) << "two steps per replay";
}

// Replays of two steps up to a full cache (odd and even room left, every step's token taken or the last one not
// wanted) give the ids of steps without a graph, and the MoE trace counts one decode step per token taken.
TEST_P(DecodeGraph4, TwoStepReplaysUpToAFullCache) {
  ModelDir dir("two", GetParam());
  CudaBackend be;
  auto model = load_model(dir.path.string(), be);
  for (int64_t capacity : {int64_t(21), int64_t(22)}) {
    auto run = [&](const char* graph, const char* steps, int64_t start) {
      GraphEnv env(graph, steps);
      KvCache cache = model->make_cache(capacity);
      cache.length = start;  // rows below it are never read by these ids: any start is a valid context
      GreedyStepper stepper(*model, cache);
      std::vector<int32_t> out;
      int32_t id = 77;
      while (cache.length < capacity) {
        const bool more = cache.length + 1 < capacity;
        id = stepper.step(id, more);
        out.push_back(id);
      }
      EXPECT_EQ(stepper.uses_two_step_graph(), graph[0] == '1' && steps[0] == '2');
      return out;
    };
    for (int64_t start : {int64_t(0), int64_t(1)}) {
      const std::string what = "capacity " + std::to_string(capacity) + " start " + std::to_string(start);
      const std::vector<int32_t> off = run("0", "2", start);
      ASSERT_EQ(int64_t(off.size()), capacity - start) << what;
      EXPECT_EQ(run("1", "2", start), off) << what;
    }
  }
  // One decode step counted per token taken, whatever the replays ran.
  GraphEnv env("1", "2");
  const moe_trace::Counts before = moe_trace::totals();
  KvCache cache = model->make_cache(30);
  GreedyStepper stepper(*model, cache);
  int32_t id = 5;
  for (int s = 0; s < 9; ++s) id = stepper.step(id);
  const moe_trace::Counts after = moe_trace::totals();
  EXPECT_EQ(after.decode_steps - before.decode_steps, 9);
  EXPECT_EQ(after.fused + after.gather - before.fused - before.gather, 9 * 3) << "3 MoE layers";
}

// The router ranked inside kernels A and B (MOECEL_CUDA_FUSED_ROUTE=1) in whole decode steps of a model whose shapes
// it takes (hidden 2048: OLMoE's o projection and kernel A groups): teacher-forced logits within rounding of the
// default two ops (and not bit for bit: the route ran), and a recorded step replayed over them bit for bit the plain
// routed steps (each layer's kernel B leaves the words zeroed for the next, also across replays).
TEST(DecodeGraphRoute, RoutedStepsMatchTheTwoOpsAndReplayBitForBit) {
  std::string why;
  if (cuda_device_count(&why) == 0) GTEST_SKIP() << "no CUDA device (" << why << ")";
  ModelDir dir("route", 4, 2048, 2);
  setenv("MOECEL_CUDA_FUSED_ROUTE", "1", 1);
  CudaBackend be;
  unsetenv("MOECEL_CUDA_FUSED_ROUTE");
  CudaBackend ref;  // the default: the router's launch
  auto model = load_model(dir.path.string(), be);
  auto ref_model = load_model(dir.path.string(), ref);
  const std::vector<int32_t> prompt = {5, 17, 300, 42};
  constexpr int kSteps = 24;
  auto fed = [](int s) { return int32_t((s * 37 + 11) % 1000); };
  KvCache plain = model->make_cache(int64_t(prompt.size()) + kSteps);
  KvCache ref_cache = ref_model->make_cache(int64_t(prompt.size()) + kSteps);
  model->forward(prompt, plain, false);
  ref_model->forward(prompt, ref_cache, false);
  std::vector<std::vector<float>> want;
  double err = 0, norm = 0;
  bool differs = false;
  for (int s = 0; s < kSteps; ++s) {
    const int32_t id = fed(s);
    want.push_back(host_floats(be, model->forward(std::span<const int32_t>(&id, 1), plain, false)));
    const std::vector<float> r =
        host_floats(ref, ref_model->forward(std::span<const int32_t>(&id, 1), ref_cache, false));
    ASSERT_EQ(r.size(), want.back().size());
    differs = differs || std::memcmp(r.data(), want.back().data(), r.size() * sizeof(float)) != 0;
    for (size_t i = 0; i < r.size(); ++i) {
      const double d = double(want.back()[i]) - double(r[i]);
      err += d * d;
      norm += double(r[i]) * double(r[i]);
    }
  }
  EXPECT_LE(err / norm, 1e-8) << "routed logits vs the two ops'";
  EXPECT_TRUE(differs) << "the routed logits are bit for bit the two ops': did the route run?";

  KvCache cache = model->make_cache(int64_t(prompt.size()) + kSteps);
  model->forward(prompt, cache, false);
  RecordedStep rec = record_step(be, *model, cache);
  ASSERT_NE(rec.graph, nullptr);
  DecodeGraph* graph = rec.graph.get();
  const Tensor& logits = rec.logits;
  for (int s = 0; s < kSteps; ++s) {
    graph->run(fed(s), cache.length);
    cache.length += 1;
    const std::vector<float> l = host_floats(be, logits);
    ASSERT_EQ(std::memcmp(l.data(), want[size_t(s)].data(), l.size() * sizeof(float)), 0) << "step " << s;
  }
}

INSTANTIATE_TEST_SUITE_P(Bits, DecodeGraph4, ::testing::Values(4, 8, 0),
                         [](const ::testing::TestParamInfo<int>& i) { return "bits" + std::to_string(i.param); });

}  // namespace
}  // namespace moecel
