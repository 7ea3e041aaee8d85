// Backend parity tests (in the spirit of llama.cpp's test-backend-ops): every op of the CUDA backend against
// the CPU backend (the oracle) on OLMoE-1B-7B shapes (hidden 2048, 64 experts, top-8, head_dim 128,
// moe_intermediate_size 1024), decode (1 token) and prefill (7, 64 tokens), odd shapes, and every
// bits x group_size of the MLX affine format. Errors are normalized MSE: sum((cuda - cpu)^2) / sum(cpu^2).
// Every test skips with "no CUDA device" on machines without a GPU; listing the tests never touches CUDA.
#include <cstdlib>

#include "backend_ops_common.h"

namespace moecel {
namespace {

using namespace ops_test;  // NOLINT: the shared fixture, helpers and thresholds

class ReleaseBackend : public ::testing::Environment {
 public:
  void TearDown() override { CudaOps::release(); }
};
[[maybe_unused]] ::testing::Environment* const kReleaseBackend =
    ::testing::AddGlobalTestEnvironment(new ReleaseBackend);

// ---- memory ----

TEST_F(CudaOps, AllocIsZeroedAlsoWhenRecycled) {
  Tensor a = cu().alloc(DType::kF32, {1000});
  EXPECT_EQ(a.device, Device::kCuda);
  std::vector<float> ones(1000, 1.0f);
  cu().from_host(ones.data(), a);
  EXPECT_EQ(down(a), ones);
  void* p = a.data;
  a = Tensor();
  Tensor b = cu().alloc(DType::kF32, {1000});
  EXPECT_EQ(b.data, p) << "a freed block of the same bucket should be reused";
  EXPECT_EQ(down(b), std::vector<float>(1000, 0.0f));
  Tensor empty = cu().alloc(DType::kF32, {0, 5});
  EXPECT_EQ(empty.numel(), 0);
  EXPECT_GT(cu().pool_live_bytes(), 0u);
}

TEST_F(CudaOps, TransfersRoundTrip) {
  Rng rng(1);
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
    Tensor h = host_random(dt, {3, 77}, rng);
    Tensor d = cu().to_device(h);
    EXPECT_EQ(d.device, Device::kCuda);
    std::vector<uint8_t> back(h.nbytes());
    cu().to_host(d, back.data());
    EXPECT_EQ(0, std::memcmp(back.data(), h.data, h.nbytes())) << dtype_str(dt);
  }
}

TEST_F(CudaOps, MakeBackendCuda) {
  auto be = make_backend("cuda");
  EXPECT_EQ(be->name(), "cuda");
  EXPECT_EQ(be->device(), Device::kCuda);
}

// ---- embedding ----

TEST_F(CudaOps, EmbeddingQuantizedAndDense) {
  Rng rng(2);
  const int64_t vocab = 1000;
  std::vector<LinearWeight> tables;
  for (int bits : {2, 3, 4, 5, 6, 8}) tables.push_back(make_quant(0, vocab, kHidden, bits, 64, DType::kF16, rng));
  tables.push_back(make_quant(0, vocab, kHidden, 4, 32, DType::kBF16, rng));
  tables.push_back(make_quant(0, vocab, kHidden, 8, 128, DType::kF32, rng));
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) tables.push_back(make_dense(0, vocab, 100, dt, rng));
  for (const LinearWeight& table : tables) {
    const LinearWeight dtable = cu().to_device(table);
    for (int64_t n : {1, 7, 64}) {
      std::vector<int32_t> ids;
      for (int64_t t = 0; t < n; ++t) ids.push_back(int32_t(rng.below(vocab)));
      ids[0] = int32_t(vocab - 1);
      Tensor hid = host_i32({n}, ids);
      Tensor ref = cpu.alloc(DType::kF32, {n, table.in});
      cpu.embedding(table, hid, ref);
      Tensor got = cu().alloc(DType::kF32, {n, table.in});
      cu().embedding(dtable, cu().to_device(hid), got);
      EXPECT_LE(nmse(down(got), down(ref)), kExact) << "bits " << table.bits << " n " << n;
    }
  }
}

TEST_F(CudaOps, EmbeddingBadIdIsReportedAtSync) {
  Rng rng(3);
  const LinearWeight dtable = cu().to_device(make_quant(0, 50, 64, 4, 32, DType::kF16, rng));
  Tensor got = cu().alloc(DType::kF32, {2, 64});
  cu().embedding(dtable, cu().to_device(host_i32({2}, {3, 50})), got);
  EXPECT_THROW(cu().synchronize(), Error);
  cu().synchronize();  // the flag was cleared
}

// ---- linear / gather_linear over every bits x group_size ----

class QuantOps : public CudaOps, public ::testing::WithParamInterface<std::tuple<int, int>> {};

void run_linear(CudaOps& f, CudaBackend& cu, const LinearWeight& w, std::initializer_list<int64_t> token_counts,
                Rng& rng, const std::string& what) {
  const LinearWeight dw = cu.to_device(w);
  for (int64_t n : token_counts) {
    Tensor x = host_random(DType::kF32, {n, w.in}, rng);
    Tensor ref = f.cpu.alloc(DType::kF32, {n, w.out});
    f.cpu.linear(w, x, ref);
    Tensor got = cu.alloc(DType::kF32, {n, w.out});
    cu.linear(dw, cu.to_device(x), got);
    std::vector<float> g(static_cast<size_t>(got.numel())), r(static_cast<size_t>(ref.numel()));
    cu.to_host(got, g.data());
    std::memcpy(r.data(), ref.data, ref.nbytes());
    EXPECT_LE(nmse(g, r), kMatmul) << what << " out " << w.out << " in " << w.in << " n_tokens " << n;
  }
}

void run_gather(CudaOps& f, CudaBackend& cu, const LinearWeight& w, int64_t k, bool per_slot,
                std::initializer_list<int64_t> token_counts, Rng& rng, const std::string& what) {
  const LinearWeight dw = cu.to_device(w);
  for (int64_t n : token_counts) {
    Tensor x = per_slot ? host_random(DType::kF32, {n, k, w.in}, rng) : host_random(DType::kF32, {n, w.in}, rng);
    Tensor idx = host_i32({n, k}, random_experts(n, k, w.n_stack, rng));
    Tensor ref = f.cpu.alloc(DType::kF32, {n, k, w.out});
    f.cpu.gather_linear(w, x, idx, ref);
    Tensor got = cu.alloc(DType::kF32, {n, k, w.out});
    cu.gather_linear(dw, cu.to_device(x), cu.to_device(idx), got);
    std::vector<float> g(static_cast<size_t>(got.numel())), r(static_cast<size_t>(ref.numel()));
    cu.to_host(got, g.data());
    std::memcpy(r.data(), ref.data, ref.nbytes());
    EXPECT_LE(nmse(g, r), kMatmul) << what << (per_slot ? " per-slot x" : " shared x") << " experts " << w.n_stack
                                   << " out " << w.out << " in " << w.in << " k " << k << " n_tokens " << n;
  }
}

TEST_P(QuantOps, LinearOlmoeShapes) {
  const auto [bits, gs] = GetParam();
  Rng rng(uint64_t(bits * 1000 + gs));
  // q_proj (decode, few-token matrix-vector, prefill tiles incl. a partial one) and the router.
  run_linear(*this, cu(), make_quant(0, kHidden, kHidden, bits, gs, DType::kF16, rng), {1, 3, 7, 64, 130}, rng,
             "q_proj");
  run_linear(*this, cu(), make_quant(0, kExperts, kHidden, bits, gs, DType::kBF16, rng), {1, 7, 64}, rng, "router");
}

TEST_P(QuantOps, GatherOlmoeShapes) {
  const auto [bits, gs] = GetParam();
  Rng rng(uint64_t(bits * 1000 + gs + 7));
  // gate/up: x shared by the k slots; down: one x row per slot.
  run_gather(*this, cu(), make_quant(kExperts, kFfn, kHidden, bits, gs, DType::kF16, rng), kTopK, false, {1, 7, 64},
             rng, "gate_proj");
  run_gather(*this, cu(), make_quant(kExperts, kHidden, kFfn, bits, gs, DType::kF16, rng), kTopK, true, {1, 7, 64}, rng,
             "down_proj");
}

TEST_P(QuantOps, OddShapesAndScaleTypes) {
  const auto [bits, gs] = GetParam();
  Rng rng(uint64_t(bits * 1000 + gs + 13));
  for (DType sd : {DType::kF32, DType::kF16, DType::kBF16}) {
    const std::string what = "scales " + dtype_str(sd);
    run_linear(*this, cu(), make_quant(0, 13, 3 * gs, bits, gs, sd, rng), {1, 2, 4, 5, 65}, rng, what);
    run_gather(*this, cu(), make_quant(5, 13, 3 * gs, bits, gs, sd, rng), 3, false, {1, 2, 5, 33}, rng, what);
    run_gather(*this, cu(), make_quant(5, 70, gs, bits, gs, sd, rng), 3, true, {1, 4, 5, 33}, rng, what);
  }
}

INSTANTIATE_TEST_SUITE_P(AllFormats, QuantOps,
                         ::testing::Combine(::testing::Values(2, 3, 4, 5, 6, 8), ::testing::Values(32, 64, 128)),
                         [](const ::testing::TestParamInfo<std::tuple<int, int>>& info) {
                           return "bits" + std::to_string(std::get<0>(info.param)) + "_group" +
                                  std::to_string(std::get<1>(info.param));
                         });

// The tensor-core matrix-vector kernels for 4- and 8-bit weights (MOECEL_CUDA_DECODE_MMA=1, opt-in) against the
// CPU: decode and few-token products, partial slices (in = 3 * group size) and partial row tiles (13, 70 rows).
TEST_F(CudaOps, TensorCoreDecodeKernels) {
  setenv("MOECEL_CUDA_DECODE_MMA", "1", 1);
  CudaBackend mma;
  unsetenv("MOECEL_CUDA_DECODE_MMA");
  Rng rng(21);
  for (int bits : {4, 8}) {
    for (int gs : {32, 64, 128}) {
      for (DType sd : {DType::kF32, DType::kF16, DType::kBF16}) {
        const std::string what =
            "tensor cores, bits " + std::to_string(bits) + " group " + std::to_string(gs) + " scales " + dtype_str(sd);
        run_linear(*this, mma, make_quant(0, kHidden, kHidden, bits, gs, sd, rng), {1, 3}, rng, what);
        run_linear(*this, mma, make_quant(0, 13, 3 * gs, bits, gs, sd, rng), {1, 2}, rng, what + " odd");
        run_gather(*this, mma, make_quant(kExperts, kHidden, kFfn, bits, gs, sd, rng), kTopK, true, {1}, rng, what);
        run_gather(*this, mma, make_quant(5, 70, 3 * gs, bits, gs, sd, rng), 3, false, {1, 4}, rng, what + " odd");
      }
    }
  }
  // Wider than 8 slices of 256: a warp takes several slices of a tile.
  run_linear(*this, mma, make_quant(0, 40, 16384, 4, 64, DType::kF16, rng), {1}, rng, "tensor cores, 16384 wide");
  // By default (MOECEL_CUDA_DECODE_MMA=2) a vocabulary-sized projection takes them too.
  run_linear(*this, cu(), make_quant(0, 20000, 512, 4, 64, DType::kBF16, rng), {1, 2}, rng, "default, 20000 rows");
  // Each warp's ring of 2 or 4 stages instead of 3 (MOECEL_CUDA_MMA_STAGES): the same bytes.
  const LinearWeight w = make_quant(0, 20000, 2048, 4, 64, DType::kF16, rng);
  const Tensor x = host_random(DType::kF32, {1, 2048}, rng);
  std::vector<float> outs[3];
  const char* stages[] = {"3", "2", "4"};
  for (int i = 0; i < 3; ++i) {
    setenv("MOECEL_CUDA_MMA_STAGES", stages[i], 1);
    CudaBackend be;
    unsetenv("MOECEL_CUDA_MMA_STAGES");
    Tensor y = be.alloc(DType::kF32, {1, 20000});
    be.linear(be.to_device(w), be.to_device(x), y);
    outs[i] = dev_vec<float>(be, y);
    if (i > 0) {
      EXPECT_EQ(0, std::memcmp(outs[0].data(), outs[i].data(), outs[0].size() * 4)) << stages[i] << " stages";
    }
  }
}

TEST_F(CudaOps, DenseLinearAndGather) {
  Rng rng(4);
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
    const std::string what = "dense " + dtype_str(dt);
    run_linear(*this, cu(), make_dense(0, kHidden, kHidden, dt, rng), {1, 7, 64}, rng, what);
    run_linear(*this, cu(), make_dense(0, 13, 37, dt, rng), {1, 3, 7, 70}, rng, what + " odd");
    run_gather(*this, cu(), make_dense(6, 33, 100, dt, rng), 2, false, {1, 7, 64}, rng, what);
    run_gather(*this, cu(), make_dense(6, 33, 37, dt, rng), 2, true, {1, 7, 64}, rng, what + " odd");
  }
}

TEST_F(CudaOps, LongRows) {
  Rng rng(5);
  // 80000+ f32 of x do not fit in shared memory: the matrix-vector path hands over to the tiled kernel.
  run_linear(*this, cu(), make_dense(0, 5, 80000, DType::kBF16, rng), {1}, rng, "long dense");
  run_linear(*this, cu(), make_quant(0, 5, 128000, 4, 64, DType::kF16, rng), {1}, rng, "long 4-bit");
  // Rows whose x needs more than the default 48 KB of shared memory (the launcher opts in to more).
  run_linear(*this, cu(), make_dense(0, 9, 20000, DType::kF16, rng), {1, 2}, rng, "20000-wide dense");
  run_linear(*this, cu(), make_quant(0, 9, 16384, 6, 64, DType::kBF16, rng), {1, 2}, rng, "16384-wide 6-bit");
  run_gather(*this, cu(), make_quant(3, 9, 16384, 8, 128, DType::kF16, rng), 2, true, {1}, rng, "16384-wide 8-bit");
}

TEST_F(CudaOps, GatherWithManyPairsPerExpert) {
  Rng rng(6);
  // 150 tokens x 2 slots over 3 experts: every expert gets several 64-pair tiles, the last partial.
  const LinearWeight w = make_quant(3, 96, 256, 4, 64, DType::kF16, rng);
  const LinearWeight dw = cu().to_device(w);
  const int64_t n = 150, k = 2;
  std::vector<int32_t> ids;
  for (int64_t t = 0; t < n; ++t) {
    ids.push_back(int32_t(t % 3));
    ids.push_back(int32_t((t + 1) % 3));
  }
  Tensor x = host_random(DType::kF32, {n, w.in}, rng);
  Tensor idx = host_i32({n, k}, ids);
  Tensor ref = cpu.alloc(DType::kF32, {n, k, w.out});
  cpu.gather_linear(w, x, idx, ref);
  Tensor got = cu().alloc(DType::kF32, {n, k, w.out});
  cu().gather_linear(dw, cu().to_device(x), cu().to_device(idx), got);
  EXPECT_LE(nmse(down(got), down(ref)), kMatmul);
}

TEST_F(CudaOps, GatherBadExpertIndexIsReportedAtSync) {
  Rng rng(7);
  const LinearWeight dw = cu().to_device(make_quant(4, 32, 64, 4, 32, DType::kF16, rng));
  for (int64_t n : {1, 9}) {  // matrix-vector and routed paths
    std::vector<int32_t> ids(size_t(n * 2), 1);
    ids[1] = 4;
    Tensor got = cu().alloc(DType::kF32, {n, 2, 32});
    cu().gather_linear(dw, cu().to_device(host_random(DType::kF32, {n, 64}, rng)),
                       cu().to_device(host_i32({n, 2}, ids)), got);
    EXPECT_THROW(cu().synchronize(), Error) << "n_tokens " << n;
    const std::vector<float> g = down(got);
    EXPECT_TRUE(std::isnan(g[32])) << "the bad pair's row is NaN";
    EXPECT_FALSE(std::isnan(g[0]));
  }
}

// ---- norm, rope, attention ----

TEST_F(CudaOps, RmsNorm) {
  Rng rng(8);
  for (DType wdt : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (int64_t d : {kHidden, int64_t(37), int64_t(5000)}) {
      Tensor w = host_random(wdt, {d}, rng, 0.5f, 1.5f);
      Tensor dw = cu().to_device(w);
      for (int64_t n : {1, 7, 64}) {
        Tensor x = host_random(DType::kF32, {n, d}, rng, -3.0f, 3.0f);
        Tensor ref = cpu.alloc(DType::kF32, {n, d});
        cpu.rms_norm(x, w, 1e-5f, ref);
        Tensor got = cu().alloc(DType::kF32, {n, d});
        Tensor dx = cu().to_device(x);
        cu().rms_norm(dx, dw, 1e-5f, got);
        EXPECT_LE(nmse(down(got), down(ref)), kElementwise) << dtype_str(wdt) << " d " << d << " n " << n;
        cu().rms_norm(dx, dw, 1e-5f, dx);  // in place
        EXPECT_LE(nmse(down(dx), down(ref)), kElementwise) << "in place, d " << d;
      }
    }
  }
}

TEST_F(CudaOps, Rope) {
  Rng rng(9);
  struct Case {
    int n_heads, head_dim, rot_dims;
    float theta;
  };
  for (const Case& c :
       {Case{kHeads, kHeadDim, kHeadDim, 10000.0f}, Case{4, 64, 32, 500000.0f}, Case{3, 80, 80, 1e6f}}) {
    for (int64_t pos0 : {0, 5, 4000}) {
      for (int64_t n : {1, 7, 64}) {
        Tensor x = host_random(DType::kF32, {n, int64_t(c.n_heads) * c.head_dim}, rng);
        Tensor dx = cu().to_device(x);
        cpu.rope(x, pos0, c.n_heads, c.head_dim, c.rot_dims, c.theta);
        cu().rope(dx, pos0, c.n_heads, c.head_dim, c.rot_dims, c.theta);
        EXPECT_LE(nmse(down(dx), down(x)), kElementwise)
            << "heads " << c.n_heads << " head_dim " << c.head_dim << " pos0 " << pos0 << " n " << n;
      }
    }
  }
}

TEST_F(CudaOps, KvStoreAndAttention) {
  Rng rng(10);
  struct Case {
    int n_heads, n_kv_heads, head_dim, window;
  };
  const int64_t max_pos = 1200;
  // Prefill steps take the tiled kernel (32 queries per block, 32-key tiles) where head_dim % 4 == 0, the per-token
  // kernel otherwise (head_dim 30); 300 tokens span many query and key tiles, with and without a window.
  for (const Case& c : {Case{kHeads, kHeads, kHeadDim, 0}, Case{32, 8, 64, 0}, Case{8, 2, 128, 5}, Case{6, 3, 80, 0},
                        Case{4, 1, 256, 17}, Case{2, 2, 32, 0}, Case{3, 1, 30, 40}, Case{4, 2, 128, 45}}) {
    const int64_t q_width = int64_t(c.n_heads) * c.head_dim, kv_width = int64_t(c.n_kv_heads) * c.head_dim;
    const float scale = float(1.0 / std::sqrt(double(c.head_dim)));
    struct Step {
      int64_t pos0, n;
    };
    for (const Step& s : {Step{0, 1}, Step{100, 1}, Step{1000, 1}, Step{0, 7}, Step{37, 64}, Step{5, 300}}) {
      // Cache rows before pos0 hold earlier tokens; the step stores its own k, v first.
      Tensor kc = host_random(DType::kF32, {max_pos, kv_width}, rng);
      Tensor vc = host_random(DType::kF32, {max_pos, kv_width}, rng);
      Tensor dkc = cu().to_device(kc), dvc = cu().to_device(vc);
      Tensor k = host_random(DType::kF32, {s.n, kv_width}, rng);
      Tensor v = host_random(DType::kF32, {s.n, kv_width}, rng);
      Tensor q = host_random(DType::kF32, {s.n, q_width}, rng, -2.0f, 2.0f);
      cpu.kv_store(k, v, kc, vc, s.pos0);
      cu().kv_store(cu().to_device(k), cu().to_device(v), dkc, dvc, s.pos0);
      EXPECT_LE(nmse(down(dkc), down(kc)), kExact);
      EXPECT_LE(nmse(down(dvc), down(vc)), kExact);
      Tensor ref = cpu.alloc(DType::kF32, {s.n, q_width});
      cpu.attention(q, kc, vc, s.pos0, c.n_heads, c.n_kv_heads, c.head_dim, scale, c.window, ref);
      Tensor got = cu().alloc(DType::kF32, {s.n, q_width});
      cu().attention(cu().to_device(q), dkc, dvc, s.pos0, c.n_heads, c.n_kv_heads, c.head_dim, scale, c.window, got);
      EXPECT_LE(nmse(down(got), down(ref)), kAttention)
          << "heads " << c.n_heads << "/" << c.n_kv_heads << " head_dim " << c.head_dim << " window " << c.window
          << " pos0 " << s.pos0 << " n " << s.n;
    }
  }
}

// Fused entry points against the CPU backend's default (the plain ops in sequence).
TEST_F(CudaOps, AddRmsNorm) {
  Rng rng(16);
  for (DType wdt : {DType::kF32, DType::kBF16}) {
    for (int64_t d : {kHidden, int64_t(37)}) {
      Tensor w = host_random(wdt, {d}, rng, 0.5f, 1.5f);
      Tensor dw = cu().to_device(w);
      for (int64_t n : {1, 7}) {
        Tensor a = host_random(DType::kF32, {n, d}, rng, -3.0f, 3.0f), b = host_random(DType::kF32, {n, d}, rng);
        Tensor da = cu().to_device(a), db = cu().to_device(b);
        Tensor y = cpu.alloc(DType::kF32, {n, d}), dy = cu().scratch(DType::kF32, {n, d});
        cpu.add_rms_norm(a, b, a, w, 1e-5f, y);  // sum in place of a, as the models use it
        cu().add_rms_norm(da, db, da, dw, 1e-5f, dy);
        EXPECT_LE(nmse(down(da), down(a)), kExact) << "sum, d " << d << " n " << n;
        EXPECT_LE(nmse(down(dy), down(y)), kElementwise) << dtype_str(wdt) << " d " << d << " n " << n;
      }
    }
  }
}

TEST_F(CudaOps, QkNormRopeStore) {
  Rng rng(17);
  struct Case {
    int n_heads, n_kv_heads, head_dim, rot_dims;
  };
  const int64_t max_pos = 300;
  for (const Case& c : {Case{kHeads, kHeads, kHeadDim, kHeadDim}, Case{8, 2, 64, 32}, Case{4, 4, 128, 0}}) {
    const int64_t q_width = int64_t(c.n_heads) * c.head_dim, kv_width = int64_t(c.n_kv_heads) * c.head_dim;
    Tensor qn = host_random(DType::kBF16, {q_width}, rng, 0.5f, 1.5f), kn = host_random(DType::kBF16, {kv_width}, rng);
    Tensor dqn = cu().to_device(qn), dkn = cu().to_device(kn);
    for (int64_t pos0 : {0, 5, 250}) {
      for (int64_t n : {1, 7}) {
        Tensor q = host_random(DType::kF32, {n, q_width}, rng, -3.0f, 3.0f);
        Tensor k = host_random(DType::kF32, {n, kv_width}, rng), v = host_random(DType::kF32, {n, kv_width}, rng);
        Tensor kc = host_random(DType::kF32, {max_pos, kv_width}, rng);
        Tensor vc = host_random(DType::kF32, {max_pos, kv_width}, rng);
        Tensor dq = cu().to_device(q), dk = cu().to_device(k), dv = cu().to_device(v);
        Tensor dkc = cu().to_device(kc), dvc = cu().to_device(vc);
        cpu.qk_norm_rope_store(q, k, v, qn, kn, 1e-5f, c.n_heads, c.n_kv_heads, c.head_dim, c.rot_dims, 10000.0f, kc,
                               vc, pos0);
        cu().qk_norm_rope_store(dq, dk, dv, dqn, dkn, 1e-5f, c.n_heads, c.n_kv_heads, c.head_dim, c.rot_dims, 10000.0f,
                                dkc, dvc, pos0);
        const std::string what = "heads " + std::to_string(c.n_heads) + " rot " + std::to_string(c.rot_dims) +
                                 " pos0 " + std::to_string(pos0) + " n " + std::to_string(n);
        EXPECT_LE(nmse(down(dq), down(q)), kElementwise) << what;
        EXPECT_LE(nmse(down(dk), down(k)), kElementwise) << what;
        EXPECT_LE(nmse(down(dkc), down(kc)), kElementwise) << what;
        EXPECT_LE(nmse(down(dvc), down(vc)), kExact) << what;
        // The cache rows hold exactly the device's own k.
        std::vector<float> krow = down(dk), cache = down(dkc);
        EXPECT_EQ(0, std::memcmp(krow.data(), cache.data() + pos0 * kv_width, krow.size() * sizeof(float))) << what;
      }
    }
  }
}

TEST_F(CudaOps, ScratchAndArgmaxTo) {
  Tensor s = cu().scratch(DType::kF32, {3, 5});
  EXPECT_EQ(s.device, Device::kCuda);
  EXPECT_EQ(s.numel(), 15);
  EXPECT_NE(s.data, nullptr);
  Rng rng(18);
  Tensor logits = host_random(DType::kF32, {3, 1000}, rng, -10.0f, 10.0f);
  Tensor ids = cu().scratch(DType::kI32, {3});
  cu().argmax_to(cu().to_device(logits), ids);
  std::vector<int32_t> got(3);
  cu().to_host(ids, got.data());
  EXPECT_EQ(got, cpu.argmax(logits));
}

// ---- MoE ops ----

TEST_F(CudaOps, Glu) {
  Rng rng(11);
  for (Activation act : {Activation::kSiLU, Activation::kGeLU, Activation::kReLU2}) {
    for (int64_t n : {kTopK * kFfn, int64_t(1001)}) {
      Tensor g = host_random(DType::kF32, {n}, rng, -6.0f, 6.0f);
      Tensor u = host_random(DType::kF32, {n}, rng, -2.0f, 2.0f);
      Tensor ref = cpu.alloc(DType::kF32, {n});
      cpu.glu(act, g, u, ref);
      Tensor dg = cu().to_device(g);
      cu().glu(act, dg, cu().to_device(u), dg);  // in place, as switch_glu calls it
      EXPECT_LE(nmse(down(dg), down(ref)), kElementwise) << "activation " << int(act) << " n " << n;
    }
  }
}

TEST_F(CudaOps, AddAndClamp) {
  Rng rng(12);
  for (int64_t n : {kHidden, int64_t(64) * kHidden, int64_t(3)}) {
    Tensor a = host_random(DType::kF32, {n}, rng, -5.0f, 5.0f);
    Tensor b = host_random(DType::kF32, {n}, rng, -5.0f, 5.0f);
    Tensor da = cu().to_device(a);
    cpu.add(a, b, a);
    cu().add(da, cu().to_device(b), da);
    EXPECT_EQ(down(da), down(a));
    cpu.clamp(a, 2.5f);
    cu().clamp(da, 2.5f);
    EXPECT_EQ(down(da), down(a));
  }
}

void check_router(CudaOps& f, CudaBackend& cu, const Tensor& logits, RouterScoring scoring, int k, bool renorm,
                  const std::string& what) {
  const int64_t n = logits.dim(0);
  Tensor ri = f.cpu.alloc(DType::kI32, {n, k}), rw = f.cpu.alloc(DType::kF32, {n, k});
  f.cpu.router_topk(logits, scoring, k, renorm, ri, rw);
  Tensor gi = cu.alloc(DType::kI32, {n, k}), gw = cu.alloc(DType::kF32, {n, k});
  cu.router_topk(cu.to_device(logits), scoring, k, renorm, gi, gw);
  std::vector<int32_t> hi(static_cast<size_t>(n * k)), ci(hi.size());
  std::vector<float> hw(hi.size()), cw(hi.size());
  cu.to_host(gi, hi.data());
  cu.to_host(gw, hw.data());
  std::memcpy(ci.data(), ri.data, ri.nbytes());
  std::memcpy(cw.data(), rw.data, rw.nbytes());
  EXPECT_EQ(hi, ci) << what;
  EXPECT_LE(nmse(hw, cw), kElementwise) << what;
}

TEST_F(CudaOps, RouterTopK) {
  Rng rng(13);
  struct Case {
    int64_t n_experts;
    int k;
    RouterScoring scoring;
    bool renorm;
  };
  for (const Case& c : {Case{kExperts, int(kTopK), RouterScoring::kSoftmax, false},  // olmoe
                        Case{128, 8, RouterScoring::kSoftmax, true},                 // qwen3_moe
                        Case{8, 2, RouterScoring::kTopKSoftmax, false},              // mixtral
                        Case{1000, 64, RouterScoring::kSoftmax, false}, Case{5, 5, RouterScoring::kSoftmax, true}}) {
    for (int64_t n : {1, 7, 64}) {
      // Distinct logits far apart (no near-ties that f32 rounding could order differently), shuffled.
      Tensor logits = make_host_tensor(DType::kF32, {n, c.n_experts});
      std::vector<int32_t> perm(static_cast<size_t>(c.n_experts));
      for (int64_t t = 0; t < n; ++t) {
        std::iota(perm.begin(), perm.end(), 0);
        for (int64_t i = c.n_experts - 1; i > 0; --i) std::swap(perm[size_t(i)], perm[size_t(rng.below(i + 1))]);
        for (int64_t e = 0; e < c.n_experts; ++e)
          logits.ptr<float>()[t * c.n_experts + e] = float(perm[size_t(e)]) * (8.0f / float(c.n_experts)) - 4.0f;
      }
      check_router(*this, cu(), logits, c.scoring, c.k, c.renorm,
                   "experts " + std::to_string(c.n_experts) + " k " + std::to_string(c.k) + " n " + std::to_string(n));
    }
  }
}

TEST_F(CudaOps, RouterTiesGoToTheLowerIndex) {
  Tensor logits = make_host_tensor(DType::kF32, {2, kExperts});
  for (int64_t e = 0; e < kExperts; ++e) {
    logits.ptr<float>()[e] = (e % 3 == 0) ? 1.0f : -1.0f;  // 22 equal winners
    logits.ptr<float>()[kExperts + e] = 0.5f;              // all equal
  }
  check_router(*this, cu(), logits, RouterScoring::kSoftmax, int(kTopK), false, "ties");
  check_router(*this, cu(), logits, RouterScoring::kTopKSoftmax, int(kTopK), true, "ties, top-k softmax");
}

// The block top-k ranks NaN after every number (the lower index first among NaNs) and -0 equal to +0 (the lower index
// first): its order over all 24 experts against a host model of that rule (raw logits ranked: top-k softmax scoring).
TEST_F(CudaOps, RouterRanksNanLastAndSignedZerosEqual) {
  constexpr int64_t kN = 24;
  Tensor logits = make_host_tensor(DType::kF32, {1, kN});
  float* l = logits.ptr<float>();
  for (int64_t e = 0; e < kN; ++e) l[e] = -1.0f - 0.25f * float(e % 5);  // repeated values: ties
  l[3] = l[17] = NAN;
  l[9] = -0.0f;
  l[7] = 0.0f;
  l[12] = INFINITY;
  l[4] = -INFINITY;
  std::vector<int32_t> want(kN);
  std::iota(want.begin(), want.end(), 0);
  std::stable_sort(want.begin(), want.end(), [&](int32_t a, int32_t b) {
    const bool na = std::isnan(l[a]), nb = std::isnan(l[b]);
    if (na || nb) return !na && nb;  // numbers before NaN; stable: lower index first
    return l[a] > l[b];              // -0 == +0: stable keeps the lower index first
  });
  Tensor idx = cu().alloc(DType::kI32, {1, kN}), w = cu().alloc(DType::kF32, {1, kN});
  cu().router_topk(cu().to_device(logits), RouterScoring::kTopKSoftmax, int(kN), false, idx, w);
  EXPECT_EQ(dev_vec<int32_t>(cu(), idx), want);
  EXPECT_EQ(want[1], 7);  // after +inf (12): +0 at index 7 and -0 at index 9 tie, 7 first
  EXPECT_EQ(want[2], 9);
}

TEST_F(CudaOps, MoeWeightedSum) {
  Rng rng(14);
  for (int64_t n : {1, 7, 64}) {
    Tensor y = host_random(DType::kF32, {n, kTopK, kHidden}, rng);
    Tensor w = host_random(DType::kF32, {n, kTopK}, rng, 0.0f, 0.3f);
    Tensor ref = cpu.alloc(DType::kF32, {n, kHidden});
    cpu.moe_weighted_sum(y, w, ref);
    Tensor got = cu().alloc(DType::kF32, {n, kHidden});
    cu().moe_weighted_sum(cu().to_device(y), cu().to_device(w), got);
    EXPECT_LE(nmse(down(got), down(ref)), kElementwise) << "n " << n;
    // Into the residual stream: bit for bit the weighted sum, then add.
    Tensor res = host_random(DType::kF32, {n, kHidden}, rng, -4.0f, 4.0f);
    Tensor acc = cu().to_device(res), sum = cu().alloc(DType::kF32, {n, kHidden});
    cu().moe_weighted_sum_add(cu().to_device(y), cu().to_device(w), acc);
    cu().add(cu().to_device(res), got, sum);
    EXPECT_EQ(down(acc), down(sum)) << "n " << n;
  }
}

TEST_F(CudaOps, Argmax) {
  Rng rng(15);
  const int64_t vocab = 50304;
  for (int64_t n : {1, 7}) {
    Tensor logits = host_random(DType::kF32, {n, vocab}, rng, -10.0f, 10.0f);
    for (int64_t t = 0; t < n; ++t) {  // a planted tie: the lower index must win
      const int64_t a = rng.below(vocab / 2), b = a + 1 + rng.below(vocab / 2 - 1);
      logits.ptr<float>()[t * vocab + a] = 20.0f;
      logits.ptr<float>()[t * vocab + b] = 20.0f;
    }
    EXPECT_EQ(cu().argmax(cu().to_device(logits)), cpu.argmax(logits)) << "n " << n;
  }
}

// ---- ops of the qwen2_moe / qwen3_moe / dots1 blocks (bias_ops.cu, router_grouped.cu) ----

TEST_F(CudaOps, AddBias) {
  Rng rng(201);
  for (DType bdt : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (auto [n, d] : {std::pair<int64_t, int64_t>{1, kHidden}, {7, 4096}, {64, 512}, {3, 37}}) {
      Tensor b = host_random(bdt, {d}, rng);
      Tensor x = host_random(DType::kF32, {n, d}, rng, -3.0f, 3.0f);
      Tensor dx = cu().to_device(x);
      cpu.add_bias(x, b);
      cu().add_bias(dx, cu().to_device(b));
      EXPECT_LE(nmse(down(dx), down(x)), kExact) << dtype_str(bdt) << " n " << n << " d " << d;
    }
  }
}

TEST_F(CudaOps, AddSigmoidGated) {
  Rng rng(202);
  for (int64_t n : {1, 7, 64}) {
    for (int64_t d : {kHidden, int64_t(37)}) {
      Tensor a = host_random(DType::kF32, {n, d}, rng), b = host_random(DType::kF32, {n, d}, rng);
      Tensor g = host_random(DType::kF32, {n, 1}, rng, -6.0f, 6.0f);
      Tensor ref = cpu.alloc(DType::kF32, {n, d});
      cpu.add_sigmoid_gated(a, g, b, ref);
      Tensor da = cu().to_device(a), db = cu().to_device(b), dg = cu().to_device(g);
      Tensor got = cu().alloc(DType::kF32, {n, d});
      cu().add_sigmoid_gated(da, dg, db, got);
      EXPECT_LE(nmse(down(got), down(ref)), kElementwise) << "n " << n << " d " << d;
      cu().add_sigmoid_gated(da, dg, db, da);  // in place, as qwen2_moe calls it
      EXPECT_LE(nmse(down(da), down(ref)), kElementwise) << "in place, n " << n << " d " << d;
    }
  }
}

// Logits whose choice scores sigmoid(logit) + bias are set apart by construction: every group sits in its own band
// (so group scores are far apart) and experts are spread inside it, while the bias (up to +-0.05) reorders them
// against the plain sigmoid scores, so selection by s alone or with the bias in the weights would fail.
void grouped_router_inputs(int64_t n, int64_t n_experts, int n_group, DType bias_dtype, Rng& rng, Tensor& logits,
                           Tensor& bias) {
  const int64_t gs = n_experts / n_group;
  bias = make_host_tensor(bias_dtype, {n_experts});
  std::vector<float> b(static_cast<size_t>(n_experts));
  for (int64_t e = 0; e < n_experts; ++e) {
    store_float(bias, e, rng.uniform(-0.05f, 0.05f));
    const uint16_t h = bias.dtype == DType::kF32 ? 0 : bias.ptr<uint16_t>()[e];
    b[size_t(e)] = bias.dtype == DType::kF32   ? bias.ptr<float>()[e]
                   : bias.dtype == DType::kF16 ? f16_to_f32(h)
                                               : bf16_to_f32(h);  // the value the backends read
  }
  logits = make_host_tensor(DType::kF32, {n, n_experts});
  std::vector<int32_t> gperm(static_cast<size_t>(n_group)), eperm(static_cast<size_t>(gs));
  for (int64_t t = 0; t < n; ++t) {
    std::iota(gperm.begin(), gperm.end(), 0);
    for (int i = n_group - 1; i > 0; --i) std::swap(gperm[size_t(i)], gperm[size_t(rng.below(i + 1))]);
    for (int g = 0; g < n_group; ++g) {
      std::iota(eperm.begin(), eperm.end(), 0);
      for (int64_t i = gs - 1; i > 0; --i) std::swap(eperm[size_t(i)], eperm[size_t(rng.below(i + 1))]);
      const double band = 0.8 / n_group;
      for (int64_t i = 0; i < gs; ++i) {
        const int64_t e = g * gs + i;
        const double c = 0.1 + band * gperm[size_t(g)] + band * (eperm[size_t(i)] + 0.5) / double(gs + 1);
        const double s = c - b[size_t(e)];
        logits.ptr<float>()[t * n_experts + e] = float(std::log(s / (1.0 - s)));
      }
    }
  }
}

TEST_F(CudaOps, RouterGroupedTopK) {
  Rng rng(203);
  struct Case {
    int64_t n_experts;
    int n_group, topk_group, k;
    bool renorm;
    float scale;
    DType bias_dtype;
  };
  for (const Case& c : {Case{128, 1, 1, 6, true, 2.5f, DType::kF32},      // dots.llm1
                        Case{256, 8, 4, 8, true, 2.5f, DType::kF32},      // DeepSeek-V3 shape
                        Case{16, 4, 2, 4, true, 2.5f, DType::kBF16},      // the tiny dots1 preset
                        Case{8, 2, 1, 2, false, 1.5f, DType::kBF16},      // dots1_hf_bf16
                        Case{64, 8, 8, 5, false, 1.0f, DType::kF16},      // every group kept
                        Case{4096, 64, 3, 64, true, 1.0f, DType::kF32}})  // large, k at the limit
  {
    for (int64_t n : {1, 7, 64}) {
      Tensor logits, bias;
      grouped_router_inputs(n, c.n_experts, c.n_group, c.bias_dtype, rng, logits, bias);
      const int k = c.k;
      Tensor ri = cpu.alloc(DType::kI32, {n, k}), rw = cpu.alloc(DType::kF32, {n, k});
      cpu.router_grouped_topk(logits, bias, c.n_group, c.topk_group, k, c.renorm, c.scale, ri, rw);
      Tensor gi = cu().alloc(DType::kI32, {n, k}), gw = cu().alloc(DType::kF32, {n, k});
      cu().router_grouped_topk(cu().to_device(logits), cu().to_device(bias), c.n_group, c.topk_group, k, c.renorm,
                               c.scale, gi, gw);
      const std::string what = "experts " + std::to_string(c.n_experts) + " groups " + std::to_string(c.n_group) + "/" +
                               std::to_string(c.topk_group) + " k " + std::to_string(k) + " n " + std::to_string(n);
      EXPECT_EQ(down<int32_t>(gi), down<int32_t>(ri)) << what;
      EXPECT_LE(nmse(down(gw), down(rw)), kElementwise) << what;
    }
  }
}

TEST_F(CudaOps, RouterGroupedTiesGoToTheLowerIndex) {
  // All-equal logits and bias: every group and every expert ties; the lowest indices must win on both backends.
  const int64_t n_experts = 32;
  Tensor logits = make_host_tensor(DType::kF32, {2, n_experts});
  for (int64_t i = 0; i < 2 * n_experts; ++i) logits.ptr<float>()[i] = i < n_experts ? 0.3f : -1.0f;
  Tensor bias = make_host_tensor(DType::kF32, {n_experts});
  for (int64_t e = 0; e < n_experts; ++e) bias.ptr<float>()[e] = 0.0f;
  Tensor ri = cpu.alloc(DType::kI32, {2, 6}), rw = cpu.alloc(DType::kF32, {2, 6});
  cpu.router_grouped_topk(logits, bias, 4, 2, 6, true, 1.0f, ri, rw);
  Tensor gi = cu().alloc(DType::kI32, {2, 6}), gw = cu().alloc(DType::kF32, {2, 6});
  cu().router_grouped_topk(cu().to_device(logits), cu().to_device(bias), 4, 2, 6, true, 1.0f, gi, gw);
  EXPECT_EQ(down<int32_t>(gi), down<int32_t>(ri));
  EXPECT_EQ(down<int32_t>(ri), (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5}));
  EXPECT_LE(nmse(down(gw), down(rw)), kElementwise);
}

}  // namespace
}  // namespace moecel
