"""What result files hold, defined once for the experiments and benchmarks that write them and the
figures that read them: crash-safe JSON-lines logs and JSON files
(:mod:`paper_figures.result_files.files`) and the names of the backward methods that key their rows
(:mod:`paper_figures.result_files.methods`), and :data:`PULLBACK`, the mark of a file whose backward
times are their own programs.

Imports neither JAX nor ``bppsa``: drawing a figure from result files loads neither.
"""

from paper_figures.result_files import methods
from paper_figures.result_files.files import (
    JsonLines,
    read_json,
    read_points,
    read_rows,
    replace_atomically,
    write_json,
)

# A result file's (or row's) "backward" when each backward time is the jitted pullback of a
# jax.vjp timed as its own program (the experiments.timing package), never a gradient minus a
# forward.
PULLBACK = "pullback"

__all__ = [
    "PULLBACK",
    "JsonLines",
    "methods",
    "read_json",
    "read_points",
    "read_rows",
    "replace_atomically",
    "write_json",
]
