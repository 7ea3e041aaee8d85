"""Self-test: affine_pack.py (numpy) against MLX's mx.quantize / mx.dequantize, bit for bit.

Checks both directions for every bits in {2, 3, 4, 5, 6, 8} and group_size in {32, 64, 128}: MLX-packed
triples dequantize identically in numpy, and numpy-packed triples dequantize identically in MLX.
Usage: python check_affine_pack.py   (exits non-zero on any mismatch)
"""

import sys

import mlx.core as mx
import numpy as np

import affine_pack


def main():
    rng = np.random.default_rng(0)
    bad = 0
    for bits in affine_pack.SUPPORTED_BITS:
        for gs in (32, 64, 128):
            w = rng.standard_normal((3, 5, 256)).astype(np.float32)
            mw, ms, mb = mx.quantize(mx.array(w), group_size=gs, bits=bits)
            a = np.array(mx.dequantize(mw, ms, mb, group_size=gs, bits=bits))
            b = affine_pack.dequantize(np.array(mw), np.array(ms), np.array(mb), bits, gs)
            pw, ps, pb = affine_pack.quantize(w, bits, gs)
            c = np.array(mx.dequantize(mx.array(pw), mx.array(ps), mx.array(pb), group_size=gs, bits=bits))
            d = affine_pack.dequantize(pw, ps, pb, bits, gs)
            same_words = np.array_equal(affine_pack.pack(affine_pack.unpack(np.array(mw), bits, 256), bits), np.array(mw))
            ok = np.array_equal(a, b) and np.array_equal(c, d) and same_words
            bad += not ok
            print(f"bits {bits} group {gs}: {'ok' if ok else 'MISMATCH'}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
