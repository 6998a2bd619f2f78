"""What result files hold, defined once for the experiments and benchmarks that write them and the
figures that read them: crash-safe JSON-lines logs and JSON files (:mod:`results_io.files`) and
the names of the backward methods that key their rows (:mod:`results_io.methods`).

Imports neither JAX nor ``bppsa``: drawing a figure from result files loads neither.
"""

from results_io import methods
from results_io.files import (
    JsonLines,
    read_json,
    read_points,
    read_rows,
    replace_atomically,
    write_json,
)

__all__ = [
    "JsonLines",
    "methods",
    "read_json",
    "read_points",
    "read_rows",
    "replace_atomically",
    "write_json",
]
