"""Small .npy files written by NumPy itself, read by tests/unit/test_npy.cpp (tests/golden/npy/).

Run: /root/venv/bin/python tools/reference/npy_goldens.py
"""
import os

import numpy as np
from numpy.lib import format as npf


def main():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = os.path.join(root, "tests", "golden", "npy")
    os.makedirs(out, exist_ok=True)
    m = (np.arange(6, dtype=np.float32).reshape(2, 3) - 2.5) / 4  # [[-0.625, -0.375, -0.125], [0.125, 0.375, 0.625]]
    np.save(os.path.join(out, "f32_2x3.npy"), m)
    np.save(os.path.join(out, "f32_1d.npy"), np.array([1.0, -2.0, 3.5, 1e-30], dtype=np.float32))
    np.save(os.path.join(out, "f32_scalar.npy"), np.float32(7.25))
    np.save(os.path.join(out, "f32_empty.npy"), np.zeros((0, 5), dtype=np.float32))
    np.save(os.path.join(out, "f32_3d.npy"), np.arange(24, dtype=np.float32).reshape(2, 3, 4))
    for version in [(2, 0), (3, 0)]:
        with open(os.path.join(out, f"f32_v{version[0]}.npy"), "wb") as f:
            npf.write_array(f, m, version=version)
    np.save(os.path.join(out, "f64.npy"), m.astype(np.float64))
    np.save(os.path.join(out, "f32_big_endian.npy"), m.astype(">f4"))
    np.save(os.path.join(out, "f32_fortran.npy"), np.asfortranarray(np.arange(6, dtype=np.float32).reshape(2, 3)))
    for name in sorted(os.listdir(out)):
        print(name, os.path.getsize(os.path.join(out, name)))


if __name__ == "__main__":
    main()
