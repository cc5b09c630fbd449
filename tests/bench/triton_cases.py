"""What the tests of bench/triton_kernels/ share: the attention shapes they run on a GPU, and the choice
between those and the tiny shapes of Triton's interpreter on the CPU (made at collection, since
the cases are test parameters)."""

# (B, Sq, Sk, Hq, Hk, D, causal, dtype, config) of the forward and the backward tests on a GPU:
# ragged lengths, Sq != Sk both ways, GQA, head dims that are not powers of two; config None =
# the module's tiles for that head dim.
ATTENTION_GPU = [
    (2, 1000, 1000, 8, 2, 64, False, "float16", None),
    (2, 1000, 1000, 8, 2, 64, True, "bfloat16", None),
    (1, 777, 1531, 4, 4, 128, True, "float16", None),
    (1, 1531, 777, 4, 1, 128, True, "bfloat16", None),
    (3, 257, 513, 6, 3, 72, False, "bfloat16", None),
    (1, 300, 300, 2, 1, 256, True, "float16", None),
]


def pick(cpu_cases, gpu_cases):
    """``gpu_cases`` when torch is installed and sees a GPU, else ``cpu_cases``."""
    try:
        import torch
    except ImportError:
        return cpu_cases
    return gpu_cases if torch.cuda.is_available() else cpu_cases
