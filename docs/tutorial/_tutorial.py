"""What the chapter scripts share: the simulator switch, ``--out``, sizes by where they run, the
committed benchmark CSVs and figures.

Every script is ``python docs/tutorial/NN_name.py [--out DIR]``: its figures go to a new
temporary folder unless ``--out`` names one, so a reader's run leaves the committed figures alone
(``--out docs/tutorial/figures`` regenerates those). Without a GPU it turns Numba's
CUDA simulator on before Numba loads (as ``python -m numba_flash`` does) and runs tiny shapes; on
a GPU it runs real ones. Its ``main(argv)`` prints what the chapter's page shows and returns the
same numbers as a dict, which ``tests/test_tutorial.py`` checks.
"""

import argparse
import csv
import pathlib
import tempfile

from numba_flash.runtime.env import use_simulator_without_gpu

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
RESULTS = ROOT / "bench" / "results" / "NVIDIA-H200"


def start(description, argv=None):
    """Parse ``--out`` (default: a new temporary folder) and choose GPU or simulator. Returns the
    arguments, with ``simulator`` set."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--out", type=pathlib.Path,
                   help="folder the figures are written to (default: a new temporary folder; "
                        "docs/tutorial/figures holds the committed ones)")
    args = p.parse_args(argv)
    args.simulator = use_simulator_without_gpu()
    if args.out is None:
        args.out = pathlib.Path(tempfile.mkdtemp(prefix="numba_flash_tutorial_"))
    args.out.mkdir(parents=True, exist_ok=True)
    print("running on", "Numba's CUDA simulator (tiny shapes)" if args.simulator else "the GPU")
    print("figures go to", args.out)
    return args


def device_array(x, simulator):
    """A host array where kernels can read it: itself under the simulator, else a GPU copy."""
    if simulator:
        return x
    from numba import cuda

    return cuda.to_device(x)


def host(x):
    """A kernel's output as a NumPy array."""
    return x.copy_to_host() if hasattr(x, "copy_to_host") else x


def read_csv(name):
    """Rows (dicts of strings) of ``bench/results/NVIDIA-H200/<name>``, its ``#`` header skipped."""
    with open(RESULTS / name) as f:
        return list(csv.DictReader(line for line in f if not line.startswith("#")))


def pyplot():
    """matplotlib's pyplot on the Agg backend (files only, no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig, args, name):
    """Write ``fig`` to ``args.out / name`` and say so."""
    path = args.out / name
    fig.savefig(path, dpi=100, bbox_inches="tight")
    pyplot().close(fig)
    print("figure:", path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)
    return path
