"""MLX affine quantization goldens: packed words, scales, biases, codes and dequantized values from MLX itself.

Writes tests/golden/quant/mlx_affine.safetensors (with MLX's own safetensors writer), which
tests/unit/test_quant.cpp reads to check moecel's pack/unpack, quantize_row and dequantize_row bit for bit.
Run: /root/venv/bin/python tools/reference/quant_goldens.py  (needs the `mlx` package; CPU is enough).
"""
import os
import sys

import mlx.core as mx
import numpy as np

ROWS, COLS = 8, 256  # COLS is a multiple of 128 and of 32 / gcd(bits, 32) for every bits
BITS = [2, 3, 4, 5, 6, 8]
GROUP_SIZES = [32, 64, 128]


def make_matrix():
    rng = np.random.default_rng(20240607)
    w = rng.standard_normal((ROWS, COLS)).astype(np.float32)
    w *= rng.uniform(0.05, 2.0, size=(ROWS, 1)).astype(np.float32)
    w[0, :32] = 0.0                                   # all-zero group: scale falls back to eps, bias 0
    w[1, :128] = np.abs(w[1, :128]) + 0.25            # positive-only groups: the max is the edge
    w[2, 32:64] = 0.5                                 # constant group
    w[3, :] = -np.abs(w[3, :])                        # negative-only row: the min is the edge
    w[4, :] *= 300.0                                  # large magnitudes
    w[5, :] *= 1e-4                                   # tiny magnitudes
    w[6, ::7] = 0.0                                   # exact zeros inside groups
    return w


def add_case(out, name, w, group_size, bits):
    q, s, b = mx.quantize(w, group_size=group_size, bits=bits)
    # Codes as MLX unpacks them: dequantize with scale 1 and bias 0.
    ones = mx.ones(s.shape, dtype=mx.float32)
    zeros = mx.zeros(s.shape, dtype=mx.float32)
    codes = mx.dequantize(q, ones, zeros, group_size=group_size, bits=bits)
    # Reference dequantization in f32 (scales/biases of lower precision are widened exactly first).
    deq = mx.dequantize(q, s.astype(mx.float32), b.astype(mx.float32), group_size=group_size, bits=bits)
    out[f"{name}.weight"] = q
    out[f"{name}.scales"] = s
    out[f"{name}.biases"] = b
    out[f"{name}.q"] = codes.astype(mx.uint8)
    out[f"{name}.dequant"] = deq


def main():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = os.path.join(root, "tests", "golden", "quant", "mlx_affine.safetensors")
    w32 = mx.array(make_matrix())
    out = {"w": w32}
    skipped = []
    for bits in BITS:
        for gs in GROUP_SIZES:
            try:
                add_case(out, f"f32_b{bits}_g{gs}", w32, gs, bits)
            except (ValueError, RuntimeError) as e:  # a bits value this MLX version lacks
                skipped.append(f"bits={bits} group_size={gs}: {e}")
        try:
            add_case(out, f"bf16_b{bits}_g64", w32.astype(mx.bfloat16), 64, bits)
            add_case(out, f"f16_b{bits}_g128", w32.astype(mx.float16), 128, bits)
        except (ValueError, RuntimeError) as e:
            skipped.append(f"bits={bits} (bf16/f16): {e}")
    mx.eval(out)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    mx.save_safetensors(path, out, metadata={"generator": "tools/reference/quant_goldens.py",
                                             "mlx_version": mx.__version__,
                                             "rows": str(ROWS), "cols": str(COLS)})
    print(f"wrote {path}: {len(out)} tensors, {os.path.getsize(path)} bytes, mlx {mx.__version__}")
    for s in skipped:
        print("skipped:", s, file=sys.stderr)


if __name__ == "__main__":
    main()
