"""Small helpers shared by the interaction experiments: seeding, results.json, figures."""
import json
import os
import shlex
import sys
import time

import matplotlib
matplotlib.use("Agg")  # headless: figures only ever go to files
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402


def seed_all(seed):
    torch.manual_seed(seed)
    np.random.seed(seed)
    return torch.Generator().manual_seed(seed)


def to_jsonable(x):
    """Tensors and numpy scalars -> plain python, recursively."""
    if isinstance(x, dict):
        return {str(k): to_jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [to_jsonable(v) for v in x]
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().tolist()
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    return x


def load_results(folder):
    with open(os.path.join(folder, "results.json")) as f:
        return json.load(f)


def md_table(header, rows):
    """A markdown table: a header row, the rule, one line per row (cells already formatted)."""
    line = lambda cells: "| " + " | ".join(str(c) for c in cells) + " |"  # noqa: E731
    return "\n".join([line(header), "|" + "---|" * len(header)] + [line(r) for r in rows])


def sci(x):
    """The tables' scientific notation: two significant digits (7.4e-11)."""
    return "-" if x is None else f"{x:.1e}"


def run_row(results, label):
    """A row of the docs' run table: the command and its wall time under the load it met."""
    a, b = results["load_average"]
    return (f"| {label} | `{results['command']}` | {results['wall_seconds']:.0f} s "
            f"(load {a:.1f} at start, {b:.1f} at end) |")


def print_tables(tables):
    """--tables DIR: each generated block under its name, as the docs show it."""
    for name, text in tables.items():
        print(f"[{name}]\n{text}\n")


def save_results(out, results):
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "results.json")
    with open(path, "w") as f:
        json.dump(to_jsonable(results), f, indent=2)
    return path


def savefig(fig, out, name, dpi=90, run=None):
    """Save a PNG; with `run` (a RunRecord), the PNG's text chunks name the command and the run
    that drew it, so a figure in assets/ can be matched to the committed results.json."""
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, name)
    fig.savefig(path, dpi=dpi, bbox_inches="tight", metadata=run.png_metadata() if run else None)
    plt.close(fig)
    return path


class RunRecord:
    """Where a run's numbers come from: the command line, a run id (also written into every
    figure of the run), its wall time and the 1-minute load average at its start and end, all
    recorded in results.json (the machine these runs share is often busy: times are upper bounds)."""

    def __init__(self, module, argv=None):
        argv = sys.argv[1:] if argv is None else list(argv)
        self.command = " ".join(["python", "-m", module] + [shlex.quote(str(a)) for a in argv])
        self.run_id = f"{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
        self.t0, self.load0 = time.perf_counter(), os.getloadavg()[0]

    @classmethod
    def of(cls, results):
        """The record of an earlier run, from its results.json (to redraw its figures)."""
        run = cls.__new__(cls)
        run.command, run.run_id = results.get("command", ""), results.get("run_id", "")
        return run

    def header(self):
        return {"command": self.command, "run_id": self.run_id}

    def stamp(self):
        return {"wall_seconds": round(time.perf_counter() - self.t0, 1),
                "load_average": [round(self.load0, 2), round(os.getloadavg()[0], 2)]}

    def png_metadata(self):
        return {"Source": self.command, "Comment": f"run_id={self.run_id}"}


def png_source(path):
    """(command, run_id) that savefig wrote into a PNG, or (None, None)."""
    from PIL import Image
    with Image.open(path) as im:
        text = dict(getattr(im, "text", {}) or {})
    run = text.get("Comment", "")
    return text.get("Source"), run[len("run_id="):] if run.startswith("run_id=") else None


class Timer:
    def __enter__(self):
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self.t0


def mean_std(xs):
    xs = np.asarray(xs, dtype=float)
    return {"mean": float(xs.mean()), "std": float(xs.std(ddof=1)) if len(xs) > 1 else 0.0,
            "values": xs.tolist()}


class torch_threads:
    """Run with n torch threads (0: leave as is), then put the previous number back, so an
    experiment called from Python (the tests) leaves the caller's thread count alone."""

    def __init__(self, n):
        self.n = n

    def __enter__(self):
        self.before = torch.get_num_threads()
        if self.n:
            torch.set_num_threads(self.n)
        return self

    def __exit__(self, *exc):
        torch.set_num_threads(self.before)
