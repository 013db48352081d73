# Writes reference.safetensors with the reference implementation
# (pip package `safetensors`, tested with 0.8.0, and numpy), so that
# tests/test_safetensors.c checks hpc's reader against a file hpc did not
# write.  Run: python3 tests/data/st/make_reference.py
# The values are closed formulas that the C test recomputes.
import os
import numpy as np
from safetensors.numpy import save_file

here = os.path.dirname(os.path.abspath(__file__))
tensors = {
    "x": (np.arange(20, dtype=np.float32).reshape(4, 5) * 0.25 - 1.0),   # x[i,j] = (5i+j)/4 - 1
    "y": np.array([10, -3, 7], dtype=np.int64),
    "z": (np.arange(4, dtype=np.float16) * 0.5).reshape(2, 2),          # z = 0, .5, 1, 1.5
    "d": np.array([np.pi, -np.e], dtype=np.float64),
    "i": np.arange(-2, 3, dtype=np.int32),                              # -2..2
    "empty": np.zeros((0, 3), dtype=np.float32),
}
save_file(tensors, os.path.join(here, "reference.safetensors"), metadata={"format": "np", "made_by": "make_reference.py"})
