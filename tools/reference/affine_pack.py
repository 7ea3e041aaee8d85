"""MLX affine quantization format in plain numpy: quantize, pack, unpack, dequantize.

Written from the format description (value i of a row at bit i*bits of the row's little-endian bit
stream; w = scale[g] * q + bias[g], g = i / group_size), independently of MLX, so that checkpoints it
writes and MLX's own checkpoints cross-check each other. Used by make_olmoe_hf_golden.py.
"""

import numpy as np

SUPPORTED_BITS = (2, 3, 4, 5, 6, 8)


def pack(q, bits):
    """(..., n) integers in [0, 2^bits) -> (..., n * bits / 32) uint32."""
    q = np.asarray(q, dtype=np.uint32)
    n = q.shape[-1]
    assert bits in SUPPORTED_BITS and (n * bits) % 32 == 0
    assert q.max(initial=0) < (1 << bits)
    # (..., n, bits) bit planes, least significant first, flattened into one bit stream per row.
    stream = ((q[..., None] >> np.arange(bits, dtype=np.uint32)) & 1).reshape(*q.shape[:-1], n * bits // 32, 32)
    return (stream << np.arange(32, dtype=np.uint32)).sum(axis=-1, dtype=np.uint64).astype(np.uint32)


def unpack(w, bits, n):
    """(..., n * bits / 32) uint32 -> (..., n) uint32 integers."""
    w = np.asarray(w, dtype=np.uint32)
    assert w.shape[-1] * 32 == n * bits
    stream = ((w[..., None] >> np.arange(32, dtype=np.uint32)) & 1).reshape(*w.shape[:-1], n, bits)
    return (stream << np.arange(bits, dtype=np.uint32)).sum(axis=-1, dtype=np.uint64).astype(np.uint32)


def quantize(w, bits, group_size, store_dtype=np.float32):
    """Min/max affine quantization of the last axis: returns (packed uint32, scales, biases).

    scales and biases are rounded to store_dtype first (what the file holds), and the integers are
    chosen against those stored values, so dequantize() of the stored triple is the model's truth.
    """
    w = np.asarray(w, dtype=np.float32)
    n = w.shape[-1]
    assert n % group_size == 0
    g = w.reshape(*w.shape[:-1], n // group_size, group_size)
    lo, hi = g.min(-1), g.max(-1)
    levels = (1 << bits) - 1
    scales = np.maximum((hi - lo) / levels, 1e-8).astype(store_dtype).astype(np.float32)
    biases = lo.astype(store_dtype).astype(np.float32)
    q = np.clip(np.rint((g - biases[..., None]) / scales[..., None]), 0, levels).astype(np.uint32)
    return pack(q.reshape(w.shape), bits), scales.astype(store_dtype), biases.astype(store_dtype)


def dequantize(packed, scales, biases, bits, group_size):
    """Stored triple -> float32 weights (..., n), computed as scale * q + bias in float32."""
    scales = np.asarray(scales, dtype=np.float32)
    biases = np.asarray(biases, dtype=np.float32)
    n = scales.shape[-1] * group_size
    q = unpack(packed, bits, n).astype(np.float32).reshape(*scales.shape, group_size)
    return (scales[..., None] * q + biases[..., None]).reshape(*scales.shape[:-1], n).astype(np.float32)
