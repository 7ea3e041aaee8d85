// MLX affine quantization: bit layout (hand-computed, including values that straddle words), pack/unpack round
// trips, quantize/dequantize error bounds, the LinearWeight factories, and goldens written by MLX itself
// (tools/reference/quant_goldens.py -> tests/golden/quant/mlx_affine.safetensors).
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/error.h"
#include "core/half.h"
#include "expect_error.h"
#include "io/safetensors.h"
#include "quant/affine.h"
#include "quant/qweight.h"

namespace moecel {
namespace {

constexpr int kAllBits[] = {2, 3, 4, 5, 6, 8};

TEST(AffineQuant, ValidParameters) {
  for (int b = -1; b <= 16; ++b) EXPECT_EQ(valid_bits(b), b == 2 || b == 3 || b == 4 || b == 5 || b == 6 || b == 8);
  for (int g : {0, 16, 32, 48, 64, 96, 128, 256}) EXPECT_EQ(valid_group_size(g), g == 32 || g == 64 || g == 128);
  EXPECT_EQ(packed_words(64, 4), 8);
  EXPECT_EQ(packed_words(32, 3), 3);
  EXPECT_EQ(packed_words(32, 5), 5);
  EXPECT_EQ(packed_words(16, 6), 3);
  EXPECT_EQ(packed_words(2048, 6), 384);
  expect_error([] { packed_words(10, 4); }, "row length 10 x 4 bits is not a whole number of 32-bit words");
  expect_error([] { packed_words(32, 7); }, "unsupported bits 7");
}

TEST(AffineQuant, HandComputedBitLayout) {
  uint32_t p[6];
  // 4 bits: nibbles in order inside each word.
  uint8_t q4[8] = {0, 1, 2, 3, 4, 5, 6, 7};
  pack_row(q4, 8, 4, p);
  EXPECT_EQ(p[0], 0x76543210u);
  // 8 bits: bytes in order (little-endian).
  uint8_t q8[4] = {0x01, 0x02, 0x03, 0xff};
  pack_row(q8, 4, 8, p);
  EXPECT_EQ(p[0], 0xff030201u);
  // 2 bits: value i at bits 2i.
  uint8_t q2[16] = {3, 0, 1, 2};
  pack_row(q2, 16, 2, p);
  EXPECT_EQ(p[0], 3u | (1u << 4) | (2u << 6));

  // 6 bits: v0..v3 fill 3 bytes as v0 | v1 << 6 | v2 << 12 | v3 << 18; value 5 spans bits 30..35.
  uint8_t q6[16] = {0x3f, 0x01, 0x2a, 0x15, 0, 0b101101};
  pack_row(q6, 16, 6, p);
  EXPECT_EQ(p[0] & 0xffffffu, 0x3fu | (0x01u << 6) | (0x2au << 12) | (0x15u << 18));
  EXPECT_EQ(p[0] >> 30, 0b01u);     // low 2 bits of v5 end word 0
  EXPECT_EQ(p[1] & 0xfu, 0b1011u);  // high 4 bits of v5 start word 1
  EXPECT_EQ(p[0], 0x0056a07fu | (1u << 30));
  uint8_t back[32];
  unpack_row(p, 16, 6, back);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(back[i], q6[i]) << i;

  // 3 bits: 32 values in 3 words; value 10 spans bits 30..32, value 21 spans bits 63..65.
  uint8_t q3[32] = {};
  q3[0] = 5;
  q3[10] = 0b110;
  q3[21] = 0b011;
  q3[31] = 7;
  pack_row(q3, 32, 3, p);
  EXPECT_EQ(p[0], 5u | (0b10u << 30));
  EXPECT_EQ(p[1], 0b1u | (0b1u << 31));
  EXPECT_EQ(p[2], 0b01u | (7u << 29));
  unpack_row(p, 32, 3, back);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(back[i], q3[i]) << i;

  // 5 bits: value 6 spans bits 30..34.
  uint8_t q5[32] = {};
  q5[6] = 0b10111;
  q5[31] = 0b10000;
  pack_row(q5, 32, 5, p);
  EXPECT_EQ(p[0], 0b11u << 30);
  EXPECT_EQ(p[1], 0b101u);
  EXPECT_EQ(p[4], 0b10000u << 27);
  unpack_row(p, 32, 5, back);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(back[i], q5[i]) << i;
}

TEST(AffineQuant, PackUnpackRoundTripEveryBits) {
  std::mt19937 rng(123);
  for (int bits : kAllBits) {
    for (int64_t in : {32, 64, 96, 128, 2048}) {
      std::vector<uint8_t> q(static_cast<size_t>(in)), back(static_cast<size_t>(in));
      for (auto& v : q) v = uint8_t(rng() & ((1u << bits) - 1));
      std::vector<uint32_t> p(size_t(packed_words(in, bits)) + 1, 0xabababab);
      pack_row(q.data(), in, bits, p.data());
      EXPECT_EQ(p.back(), 0xababababu) << "pack_row wrote past the row";
      unpack_row(p.data(), in, bits, back.data());
      EXPECT_EQ(q, back) << "bits " << bits << " in " << in;
    }
  }
  uint8_t bad[32] = {16};
  uint32_t p[4];
  expect_error([&] { pack_row(bad, 32, 4, p); }, "value 16 at index 0 does not fit in 4 bits");
}

// Dequantize a row quantized by quantize_row (plain arrays, f32 scales).
std::vector<float> roundtrip(const std::vector<float>& w, int bits, int gs, std::vector<float>* scales,
                             std::vector<float>* biases) {
  const int64_t in = int64_t(w.size());
  std::vector<uint32_t> packed(size_t(packed_words(in, bits)));
  scales->assign(size_t(in / gs), 0.0f);
  biases->assign(size_t(in / gs), 0.0f);
  quantize_row(w.data(), in, bits, gs, packed.data(), scales->data(), biases->data());
  std::vector<uint8_t> q(static_cast<size_t>(in));
  unpack_row(packed.data(), in, bits, q.data());
  std::vector<float> out(static_cast<size_t>(in));
  for (int64_t i = 0; i < in; ++i) {
    // volatile: two roundings as MLX does, even where the compiler would fuse them into an fma
    volatile float sq = (*scales)[size_t(i / gs)] * float(q[size_t(i)]);
    out[size_t(i)] = sq + (*biases)[size_t(i / gs)];
  }
  return out;
}

TEST(AffineQuant, QuantizeDequantizeErrorBounds) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int bits : kAllBits) {
    for (int gs : {32, 64, 128}) {
      std::vector<float> w(512);
      for (auto& v : w) v = normal(rng) * 0.3f;
      std::vector<float> s, b;
      std::vector<float> d = roundtrip(w, bits, gs, &s, &b);
      double sq = 0, ref = 0;
      for (size_t g = 0; g < s.size(); ++g) {
        float lo = w[g * gs], hi = w[g * gs];
        size_t edge = g * gs;
        for (size_t i = g * gs; i < (g + 1) * gs; ++i) {
          lo = std::min(lo, w[i]);
          hi = std::max(hi, w[i]);
          if (std::fabs(w[i]) > std::fabs(w[edge])) edge = i;
        }
        const float step = (hi - lo) / float((1 << bits) - 1);
        // The larger-magnitude extreme is the bias and is reproduced exactly.
        EXPECT_EQ(d[edge], w[edge]) << "bits " << bits << " gs " << gs << " group " << g;
        EXPECT_EQ(b[g], w[edge]);
        for (size_t i = g * gs; i < (g + 1) * gs; ++i) {
          // Half a step inside the range; the zero-preserving scale nudge may clip the far end by < 1 step.
          EXPECT_LE(std::fabs(d[i] - w[i]), step * 1.0001f) << "bits " << bits << " gs " << gs << " i " << i;
          sq += double(d[i] - w[i]) * (d[i] - w[i]);
          ref += double(step) * step;
        }
      }
      // RMS error close to the uniform-rounding value step / sqrt(12).
      EXPECT_LT(std::sqrt(sq / ref), 0.45) << "bits " << bits << " gs " << gs;
    }
  }
}

TEST(AffineQuant, QuantizeSpecialGroups) {
  std::vector<float> w(64, 0.0f);
  for (int i = 32; i < 64; ++i) w[size_t(i)] = 0.75f;  // a constant group
  std::vector<float> s, b;
  std::vector<float> d = roundtrip(w, 4, 32, &s, &b);
  EXPECT_EQ(d, w);  // zero and constant groups are exact
  EXPECT_EQ(b[0], 0.0f);
  EXPECT_EQ(b[1], 0.75f);
  std::vector<uint32_t> p(8);
  std::vector<float> sc(2), bi(2);
  w[3] = NAN;
  expect_error([&] { quantize_row(w.data(), 64, 4, 32, p.data(), sc.data(), bi.data()); },
               "non-finite value nan at index 3");
  expect_error([&] { quantize_row(w.data(), 64, 4, 48, p.data(), sc.data(), bi.data()); }, "unsupported group_size 48");
  expect_error([&] { quantize_row(w.data(), 96, 4, 64, p.data(), sc.data(), bi.data()); },
               "row length 96 is not a multiple of group_size 64");
}

TEST(AffineQuant, LoadFloat) {
  float f[2] = {1.5f, -2.0f};
  uint16_t bf[2] = {f32_to_bf16(3.0f), f32_to_bf16(-0.5f)};
  uint16_t hf[2] = {f32_to_f16(0.25f), f32_to_f16(65504.0f)};
  EXPECT_EQ(load_float(f, DType::kF32, 1), -2.0f);
  EXPECT_EQ(load_float(bf, DType::kBF16, 0), 3.0f);
  EXPECT_EQ(load_float(bf, DType::kBF16, 1), -0.5f);
  EXPECT_EQ(load_float(hf, DType::kF16, 0), 0.25f);
  EXPECT_EQ(load_float(hf, DType::kF16, 1), 65504.0f);
  expect_error([&] { load_float(f, DType::kU32, 0); }, "dtype U32 is not a float type");
}

// A tensor with a shape and a dummy pointer: the factories check metadata only.
Tensor fake(DType dtype, Shape shape) {
  static uint32_t dummy[4];
  Tensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.data = dummy;
  return t;
}

TEST(LinearWeightFactory, QuantizedShapesAndBytes) {
  const std::string name = "model.layers.7.mlp.switch_mlp.up_proj";
  LinearWeight w =
      LinearWeight::quantized_from(name, fake(DType::kU32, {64, 1024, 256}), fake(DType::kBF16, {64, 1024, 32}),
                                   fake(DType::kBF16, {64, 1024, 32}), {4, 64}, true);
  EXPECT_EQ(w.bits, 4);
  EXPECT_EQ(w.group_size, 64);
  EXPECT_EQ(w.n_stack, 64);
  EXPECT_EQ(w.out, 1024);
  EXPECT_EQ(w.in, 2048);
  EXPECT_TRUE(w.quantized());
  EXPECT_EQ(w.bytes_per_slice(), 1024u * 256 * 4 + 2u * 1024 * 32 * 2);
  EXPECT_EQ(w.total_bytes(), 64u * w.bytes_per_slice());

  LinearWeight w6 = LinearWeight::quantized_from("m.down", fake(DType::kU32, {2048, 192}), fake(DType::kF16, {2048, 8}),
                                                 fake(DType::kF16, {2048, 8}), {6, 128}, false);
  EXPECT_EQ(w6.in, 1024);
  EXPECT_EQ(w6.n_stack, 0);
  EXPECT_EQ(w6.total_bytes(), w6.bytes_per_slice());

  LinearWeight d = LinearWeight::dense_from("m.gate", fake(DType::kBF16, {64, 2048}), false);
  EXPECT_FALSE(d.quantized());
  EXPECT_EQ(d.out, 64);
  EXPECT_EQ(d.in, 2048);
  EXPECT_EQ(d.bytes_per_slice(), 64u * 2048 * 2);
  LinearWeight ds = LinearWeight::dense_from("m.experts", fake(DType::kF32, {8, 32, 16}), true);
  EXPECT_EQ(ds.n_stack, 8);
  EXPECT_EQ(ds.total_bytes(), 8u * 32 * 16 * 4);
}

TEST(LinearWeightFactory, Errors) {
  const std::string n = "model.layers.7.mlp.switch_mlp.up_proj";
  auto q = [&](Tensor w, Tensor s, Tensor b, QuantSpec spec, bool stacked) {
    return [=] { LinearWeight::quantized_from(n, w, s, b, spec, stacked); };
  };
  const Tensor w3 = fake(DType::kU32, {64, 1024, 256});
  const Tensor s3 = fake(DType::kBF16, {64, 1024, 32});
  // The DESIGN.md example: scales too narrow for 4-bit with group 64.
  expect_error(q(w3, fake(DType::kBF16, {64, 1024, 16}), fake(DType::kBF16, {64, 1024, 16}), {4, 64}, true),
               "tensor model.layers.7.mlp.switch_mlp.up_proj.scales: expected (64, 1024, 32), got (64, 1024, 16)");
  // Shapes that fit another (bits, group_size): the message says which.
  expect_error(q(fake(DType::kU32, {16, 64}), fake(DType::kF16, {16, 4}), fake(DType::kF16, {16, 4}), {4, 64}, false),
               "expected (16, 8), got (16, 4) (config: bits 4, group_size 64; the shapes fit bits 8, group_size 64 or "
               "bits 4, group_size 128)");
  expect_error(q(fake(DType::kU32, {16, 10}), fake(DType::kF16, {16, 1}), fake(DType::kF16, {16, 1}), {4, 64}, false),
               ".weight: packed width 10 does not fit bits 4 with group_size 64 and 1 groups");
  expect_error(q(fake(DType::kBF16, {64, 1024, 256}), s3, s3, {4, 64}, true),
               "up_proj.weight: expected dtype U32 (packed quantized weight), got BF16");
  expect_error(q(w3, fake(DType::kU32, {64, 1024, 32}), s3, {4, 64}, true),
               "up_proj.scales: expected dtype F32, F16 or BF16, got U32");
  expect_error(q(w3, s3, fake(DType::kF16, {64, 1024, 32}), {4, 64}, true),
               "up_proj.biases: expected dtype BF16 (same as scales), got F16");
  expect_error(q(w3, s3, fake(DType::kBF16, {64, 1024, 31}), {4, 64}, true),
               "up_proj.biases: expected (64, 1024, 32) (same as scales), got (64, 1024, 31)");
  expect_error(q(w3, fake(DType::kBF16, {64, 512, 32}), fake(DType::kBF16, {64, 512, 32}), {4, 64}, true),
               "up_proj.scales: expected (64, 1024, 32) (leading dims of");
  expect_error(q(w3, s3, s3, {4, 64}, false),
               "up_proj.weight: expected 2 dims (out, in * bits / 32), got (64, 1024, 256)");
  expect_error(
      q(fake(DType::kU32, {1024, 256}), fake(DType::kBF16, {1024, 32}), fake(DType::kBF16, {1024, 32}), {4, 64}, true),
      "expected 3 dims (n_experts, out, in * bits / 32), got (1024, 256)");
  expect_error(q(fake(DType::kU32, {0, 1024, 256}), s3, s3, {4, 64}, true), "every dim must be positive");
  expect_error(q(w3, s3, s3, {7, 64}, true), "config quantization bits 7 / group_size 64 are not supported");
  expect_error(q(w3, s3, s3, {4, 48}, true), "bits 4 / group_size 48 are not supported");
  Tensor nodata = w3;
  nodata.data = nullptr;
  expect_error(q(nodata, s3, s3, {4, 64}, true), "up_proj.weight: has no data");

  expect_error(
      [] {
        LinearWeight::dense_from("m.gate", fake(DType::kU32, {64, 32}), false);
      },
      "tensor m.gate.weight: expected dtype F32, F16 or BF16 for a dense weight, got U32");
  expect_error([] { LinearWeight::dense_from("m.gate", fake(DType::kF32, {64}), false); },
               "tensor m.gate.weight: expected 2 dims (out, in), got (64,)");
  expect_error(
      [] {
        LinearWeight::dense_from("m.x", fake(DType::kF32, {4, 64, 0}), true);
      },
      "every dim must be positive");
}

TEST(AffineQuant, DequantizeRowDenseAndRanges) {
  Tensor t = make_host_tensor(DType::kBF16, {2, 3, 4});  // stacked dense
  for (int i = 0; i < 24; ++i) t.ptr<uint16_t>()[i] = f32_to_bf16(float(i) - 4.0f);
  LinearWeight w = LinearWeight::dense_from("d", t, true);
  float out[4];
  dequantize_row(w, 1, 2, out);  // flat row 5
  for (int i = 0; i < 4; ++i) EXPECT_EQ(out[i], float(20 + i - 4));
  expect_error([&] { dequantize_row(w, 2, 0, out); },
               "dequantize_row d: expert 2 row 0 out of range (2 slices of 3 rows)");
  expect_error([&] { dequantize_row(w, 0, 3, out); }, "out of range");
  LinearWeight w2 = LinearWeight::dense_from("d2", t.reshaped({6, 4}), false);
  dequantize_row(w2, 0, 5, out);
  EXPECT_EQ(out[3], 19.0f);
  expect_error([&] { dequantize_row(w2, 1, 0, out); }, "out of range");
}

TEST(AffineQuant, DequantizeRowQuantizedStacked) {
  // Two experts of 3 rows, in = 64, 5-bit, group 32: quantize each row, then dequantize through LinearWeight.
  const int bits = 5, gs = 32;
  const int64_t in = 64, rows = 6;
  Tensor wq = make_host_tensor(DType::kU32, {2, 3, packed_words(in, bits)});
  Tensor sc = make_host_tensor(DType::kF32, {2, 3, in / gs});
  Tensor bi = make_host_tensor(DType::kF32, {2, 3, in / gs});
  std::vector<float> w(size_t(rows * in));
  for (size_t i = 0; i < w.size(); ++i) w[i] = std::sin(0.37f * float(i)) * (1.0f + float(i % 7));
  for (int64_t r = 0; r < rows; ++r) {
    quantize_row(&w[size_t(r * in)], in, bits, gs, wq.ptr<uint32_t>() + r * packed_words(in, bits),
                 sc.ptr<float>() + r * (in / gs), bi.ptr<float>() + r * (in / gs));
  }
  LinearWeight lw = LinearWeight::quantized_from("e", wq, sc, bi, {bits, gs}, true);
  std::vector<float> out(static_cast<size_t>(in));
  for (int64_t r = 0; r < rows; ++r) {
    dequantize_row(lw, r / 3, r % 3, out.data());
    std::vector<float> s, b;
    std::vector<float> expect =
        roundtrip(std::vector<float>(&w[size_t(r * in)], &w[size_t((r + 1) * in)]), bits, gs, &s, &b);
    EXPECT_EQ(out, expect) << "row " << r;
  }
}

// ---- Goldens from MLX (mx.quantize / mx.dequantize) ----

std::shared_ptr<SafetensorsFile> golden() {
  static std::shared_ptr<SafetensorsFile> f =
      SafetensorsFile::open(std::string(MOECEL_SOURCE_DIR) + "/tests/golden/quant/mlx_affine.safetensors");
  return f;
}

// Checks one golden case: unpack_row reproduces MLX's codes, dequantize_row reproduces mx.dequantize exactly,
// and (for f32) quantize_row reproduces mx.quantize's packed words, scales and biases bit for bit.
void check_case(const std::string& name, int bits, int gs, bool check_quantize) {
  SCOPED_TRACE(name);
  const auto& ts = golden()->tensors();
  ASSERT_TRUE(ts.count(name + ".weight")) << "golden case missing";
  const Tensor& packed = ts.at(name + ".weight");
  const Tensor& codes = ts.at(name + ".q");
  const Tensor& deq = ts.at(name + ".dequant");
  const int64_t rows = packed.dim(0), in = codes.dim(1);
  ASSERT_EQ(deq.dtype, DType::kF32);
  ASSERT_EQ(codes.dtype, DType::kU8);
  // bits inferred from the MLX shapes must agree with the case's bits
  LinearWeight w =
      LinearWeight::quantized_from(name, packed, ts.at(name + ".scales"), ts.at(name + ".biases"), {bits, gs}, false);
  ASSERT_EQ(w.in, in);
  ASSERT_EQ(w.out, rows);
  std::vector<uint8_t> q(static_cast<size_t>(in));
  std::vector<float> out(static_cast<size_t>(in));
  int64_t code_mismatch = 0, value_mismatch = 0;
  for (int64_t r = 0; r < rows; ++r) {
    unpack_row(packed.ptr<const uint32_t>() + r * packed.dim(1), in, bits, q.data());
    dequantize_row(w, 0, r, out.data());
    for (int64_t i = 0; i < in; ++i) {
      code_mismatch += q[size_t(i)] != codes.ptr<const uint8_t>()[r * in + i];
      const float want = deq.ptr<const float>()[r * in + i];
      if (out[size_t(i)] != want) {
        if (++value_mismatch < 5)
          ADD_FAILURE() << "row " << r << " col " << i << ": " << out[size_t(i)] << " vs " << want;
      }
    }
  }
  EXPECT_EQ(code_mismatch, 0);
  EXPECT_EQ(value_mismatch, 0);

  // Stacked view of the same data: (2, rows / 2, ...) must give identical rows.
  LinearWeight ws = LinearWeight::quantized_from(
      name, packed.reshaped({2, rows / 2, packed.dim(1)}), ts.at(name + ".scales").reshaped({2, rows / 2, in / gs}),
      ts.at(name + ".biases").reshaped({2, rows / 2, in / gs}), {bits, gs}, true);
  dequantize_row(ws, 1, rows / 2 - 1, out.data());
  for (int64_t i = 0; i < in; ++i) EXPECT_EQ(out[size_t(i)], deq.ptr<const float>()[(rows - 1) * in + i]);

  if (!check_quantize) return;
  const Tensor& src = ts.at("w");
  std::vector<uint32_t> p(size_t(packed.dim(1)));
  std::vector<float> s(size_t(in / gs)), b(size_t(in / gs));
  for (int64_t r = 0; r < rows; ++r) {
    quantize_row(src.ptr<const float>() + r * in, in, bits, gs, p.data(), s.data(), b.data());
    for (int64_t k = 0; k < packed.dim(1); ++k) {
      EXPECT_EQ(p[size_t(k)], packed.ptr<const uint32_t>()[r * packed.dim(1) + k]) << "row " << r << " word " << k;
    }
    for (int64_t g = 0; g < in / gs; ++g) {
      EXPECT_EQ(s[size_t(g)], ts.at(name + ".scales").ptr<const float>()[r * (in / gs) + g]) << "row " << r;
      EXPECT_EQ(b[size_t(g)], ts.at(name + ".biases").ptr<const float>()[r * (in / gs) + g]) << "row " << r;
    }
  }
}

TEST(QuantGolden, FileWrittenByMlxLoads) {
  auto f = golden();
  EXPECT_TRUE(f->metadata().count("mlx_version"));
  EXPECT_EQ(f->tensors().at("w").shape, (Shape{8, 256}));
  EXPECT_EQ(f->tensors().size(), 1u + 5u * (6 * 3 + 6 * 2));
}

TEST(QuantGolden, MatchesMlxF32) {
  for (int bits : kAllBits) {
    for (int gs : {32, 64, 128}) check_case("f32_b" + std::to_string(bits) + "_g" + std::to_string(gs), bits, gs, true);
  }
}

TEST(QuantGolden, MatchesMlxHalfPrecisionScales) {
  for (int bits : kAllBits) {
    check_case("bf16_b" + std::to_string(bits) + "_g64", bits, 64, false);
    check_case("f16_b" + std::to_string(bits) + "_g128", bits, 128, false);
  }
}

}  // namespace
}  // namespace moecel
