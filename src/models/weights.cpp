// Weight binding with shape checks against the config, and stacking of per-expert or fused expert tensors.
#include "models/weights.h"

#include <cstring>

#include "core/error.h"
#include "runtime/progress.h"

namespace moecel {
namespace {

// Stacks equally shaped tensors along a new leading axis into an owned host tensor.
Tensor stack(const std::vector<const Tensor*>& parts, const std::string& what) {
  const Tensor& first = *parts.front();
  Shape shape = first.shape;
  shape.insert(shape.begin(), int64_t(parts.size()));
  Tensor out = make_host_tensor(first.dtype, shape);
  char* dst = out.ptr<char>();
  for (const Tensor* p : parts) {
    MOECEL_CHECK(p->dtype == first.dtype && p->shape == first.shape,
                 "{}: every expert must have dtype {} and shape {}, got {} {}", what, dtype_name(first.dtype),
                 shape_str(first.shape), dtype_name(p->dtype), shape_str(p->shape));
    std::memcpy(dst, p->data, p->nbytes());
    dst += p->nbytes();
  }
  return out;
}

// Rows [begin, begin + count) of every slice of a (n, rows, cols) tensor, as an owned (n, count, cols) tensor.
Tensor take_rows(const Tensor& t, int64_t begin, int64_t count) {
  const int64_t n = t.dim(0), rows = t.dim(1), cols = t.dim(2);
  Tensor out = make_host_tensor(t.dtype, {n, count, cols});
  const size_t row_bytes = size_t(cols) * dtype_size(t.dtype);
  for (int64_t e = 0; e < n; ++e) {
    std::memcpy(out.ptr<char>() + size_t(e * count) * row_bytes, t.ptr<char>() + size_t(e * rows + begin) * row_bytes,
                size_t(count) * row_bytes);
  }
  return out;
}

void check_logical(const LinearWeight& w, const Shape& logical, bool stacked) {
  Shape got = stacked ? Shape{w.n_stack, w.out, w.in} : Shape{w.out, w.in};
  MOECEL_CHECK(got == logical, "tensor {}.weight: expected logical shape {} from config.json, got {}", w.name,
               shape_str(logical), shape_str(got));
}

}  // namespace

LinearWeight WeightLoader::load(const std::string& prefix, Shape logical, bool stacked) {
  LinearWeight w;
  if (store_.has(prefix + ".scales")) {
    std::optional<QuantSpec> spec = config_.quant_for(prefix);
    MOECEL_CHECK(spec.has_value(), "tensor {}.scales: the weight is quantized but {} has no quantization for it",
                 prefix, config_.source());
    MOECEL_CHECK(store_.has(prefix + ".biases"), "tensor {}.biases is missing (MLX affine weights need biases)",
                 prefix);
    w = LinearWeight::quantized_from(prefix, store_.get(prefix + ".weight"), store_.get(prefix + ".scales"),
                                     store_.get(prefix + ".biases"), *spec, stacked);
  } else {
    w = LinearWeight::dense_from(prefix, store_.get(prefix + ".weight"), stacked);
  }
  check_logical(w, logical, stacked);
  return w;
}

LinearWeight WeightLoader::linear(const std::string& prefix, int64_t out, int64_t in) {
  LinearWeight w = backend_.to_device(load(prefix, {out, in}, false));
  report_load_bytes(w.total_bytes());
  return w;
}

Tensor WeightLoader::vector(const std::string& name, int64_t d) {
  const Tensor& t = store_.get(name);
  MOECEL_CHECK(is_float(t.dtype) && t.shape == Shape{d}, "tensor {}: expected a float vector {}, got {} {}", name,
               shape_str({d}), dtype_name(t.dtype), shape_str(t.shape));
  Tensor on_device = backend_.to_device(t);
  report_load_bytes(t.nbytes());
  return on_device;
}

SwitchWeights WeightLoader::experts(const std::string& mlp_prefix, int64_t n_experts, int64_t hidden, int64_t ffn,
                                    const ExpertNames& names, const std::string& stacked) {
  SwitchWeights sw;
  const std::string sp = mlp_prefix + "." + stacked + ".";
  const std::string ep = mlp_prefix + ".experts.";
  if (store_.has(sp + names.gate + ".weight")) {
    sw.gate = load(sp + names.gate, {n_experts, ffn, hidden}, true);
    sw.up = load(sp + names.up, {n_experts, ffn, hidden}, true);
    sw.down = load(sp + names.down, {n_experts, hidden, ffn}, true);
  } else if (store_.has(ep + "gate_up_proj")) {
    const Tensor& gate_up = store_.get(ep + "gate_up_proj");
    const Tensor& down = store_.get(ep + "down_proj");
    MOECEL_CHECK(gate_up.shape == Shape({n_experts, 2 * ffn, hidden}), "tensor {}gate_up_proj: expected {}, got {}", ep,
                 shape_str({n_experts, 2 * ffn, hidden}), shape_str(gate_up.shape));
    sw.gate = LinearWeight::dense_from(ep + "gate_up_proj[gate]", take_rows(gate_up, 0, ffn), true);
    sw.up = LinearWeight::dense_from(ep + "gate_up_proj[up]", take_rows(gate_up, ffn, ffn), true);
    sw.down = LinearWeight::dense_from(ep + "down_proj", down, true);
    check_logical(sw.down, {n_experts, hidden, ffn}, true);
  } else if (store_.has(ep + "0." + names.gate + ".weight")) {
    auto stack_proj = [&](const std::string& proj, int64_t out, int64_t in) {
      std::vector<const Tensor*> w, s, b;
      for (int64_t e = 0; e < n_experts; ++e) {
        const std::string p = ep + std::to_string(e) + "." + proj;
        w.push_back(&store_.get(p + ".weight"));
        if (store_.has(p + ".scales")) {
          s.push_back(&store_.get(p + ".scales"));
          b.push_back(&store_.get(p + ".biases"));
        }
      }
      const std::string name = ep + "*." + proj;
      LinearWeight lw;
      if (!s.empty()) {
        MOECEL_CHECK(s.size() == w.size(), "{}: some experts are quantized and some are not", name);
        std::optional<QuantSpec> spec = config_.quant_for(ep + "0." + proj);
        MOECEL_CHECK(spec.has_value(), "{}: quantized experts but no quantization in {}", name, config_.source());
        lw = LinearWeight::quantized_from(name, stack(w, name + ".weight"), stack(s, name + ".scales"),
                                          stack(b, name + ".biases"), *spec, true);
      } else {
        lw = LinearWeight::dense_from(name, stack(w, name + ".weight"), true);
      }
      check_logical(lw, {n_experts, out, in}, true);
      return lw;
    };
    sw.gate = stack_proj(names.gate, ffn, hidden);
    sw.up = stack_proj(names.up, ffn, hidden);
    sw.down = stack_proj(names.down, hidden, ffn);
  } else {
    fail("missing experts of {}: expected {}{}.weight (stacked), {}gate_up_proj (fused) or {}0.{}.weight (per expert)",
         mlp_prefix, sp, names.gate, ep, ep, names.gate);
  }
  for (LinearWeight* w : {&sw.gate, &sw.up, &sw.down}) {
    *w = backend_.to_device(*w);
    report_load_bytes(w->total_bytes());
  }
  return sw;
}

void WeightLoader::check_all_used() const {
  for (const std::string& name : store_.unused()) {
    if (name.ends_with("rotary_emb.inv_freq")) continue;  // a buffer some exporters save; recomputed here
    fail("unexpected tensor {} in {}: the {} model has no such weight (wrong model_type or extra layers?)", name,
         store_.file_of(name), config_.model_type());
  }
}

}  // namespace moecel
