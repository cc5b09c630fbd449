"""Float32 constants the kernels share (NumPy scalars: Numba types them as float32)."""

import math

import numpy as np

LOG2E = np.float32(1.4426950408889634)  # exp(x) == exp2(x * LOG2E)
LN2 = np.float32(0.6931471805599453)
NEG_INF = np.float32(-math.inf)
POS_INF = np.float32(math.inf)
NAN = np.float32(math.nan)
