"""What the experiments record beside their result rows: run metadata, checkpoints replaced
atomically, and resumable sweeps of points over a JSON-lines log.

The result files themselves (JSON-lines logs, JSON files) are written and read through
:mod:`paper_figures.result_files`, so that an interrupted run leaves only complete records behind
and can resume where its last checkpoint stands.
"""

from __future__ import annotations

import datetime
import json
import os
import pathlib
import platform
import sys
from collections.abc import Callable, Iterable
from importlib import metadata
from typing import Any

import jax
import numpy as np

from paper_figures.result_files import JsonLines

PACKAGES = ("bppsa", "jax", "jaxlib", "numpy", "optax")


def cpu_model() -> str:
    """The CPU's model name (from ``/proc/cpuinfo`` where there is one), else the machine type."""
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def run_metadata(config: dict[str, Any]) -> dict[str, Any]:
    """What a result needs to be interpreted later: config, versions, device and host."""
    versions = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    device = jax.devices()[0]
    return dict(
        config=config,
        versions=versions,
        platform=device.platform,
        device=getattr(device, "device_kind", device.platform),
        cpus=os.cpu_count(),
        machine=platform.processor() or platform.machine(),
        cpu_model=cpu_model(),
        started=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        argv=sys.argv,
    )


def save_checkpoint(path: str | os.PathLike, tree: Any, **extra: Any) -> None:
    """Saves a pytree of arrays (e.g. parameters and optimizer state) and JSON-able ``extra``
    values, replacing ``path`` atomically."""
    leaves = jax.tree.leaves(tree)
    arrays = {f"leaf_{i}": np.asarray(leaf) for i, leaf in enumerate(leaves)}
    arrays["extra"] = np.frombuffer(json.dumps(extra).encode(), dtype=np.uint8)
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        np.savez(f, **arrays)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load_checkpoint(path: str | os.PathLike, like: Any) -> tuple[Any, dict[str, Any]] | None:
    """Loads a checkpoint written by :func:`save_checkpoint` into the structure of ``like``;
    ``None`` when there is none."""
    path = pathlib.Path(path)
    if not path.exists():
        return None
    with np.load(path) as data:
        treedef = jax.tree.structure(like)
        leaves = [data[f"leaf_{i}"] for i in range(treedef.num_leaves)]
        extra = json.loads(data["extra"].tobytes().decode())
    like_leaves = jax.tree.leaves(like)
    if [np.shape(x) for x in like_leaves] != [x.shape for x in leaves]:
        raise ValueError(
            f"checkpoint {path} does not match the model being trained (different shapes); "
            "remove it or use another output folder"
        )
    return jax.tree.unflatten(treedef, [jax.numpy.asarray(x) for x in leaves]), extra


# Keys that the configurations gained after result files had been written, with the value
# that such older files ran with: they resume as if they held them, so they stay valid.
ADDED_KEYS = {"forward": "sequential"}  # --forward; before it, every run ran lax.scan


def same_config(old: dict[str, Any], new: dict[str, Any]) -> bool:
    """Whether a result file's configuration ``old`` is ``new`` (a key of :data:`ADDED_KEYS`
    that either lacks counts with its value there)."""
    return ADDED_KEYS | old == ADDED_KEYS | new


class ResultsFolderError(ValueError):
    """A results folder that cannot be resumed: it holds results of another configuration."""


def config_mismatch(path: os.PathLike | str, what: str, old: dict, new: dict) -> ResultsFolderError:
    """The error for resuming into ``path``, which holds a ``what`` run with config ``old``."""
    old, new = ADDED_KEYS | old, ADDED_KEYS | new
    keys = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
    diffs = ", ".join(f"{k}: {old.get(k)!r} there, {new.get(k)!r} now" for k in keys)
    return ResultsFolderError(
        f"{path} holds a {what} with another configuration ({diffs}); pass --overwrite to "
        "start it afresh, or choose another folder with --out or --name."
    )


def resume_points(
    log: JsonLines,
    config: dict[str, Any],
    points: Iterable[dict[str, Any]],
    measure: Callable[[dict[str, Any]], dict[str, Any]],
    *,
    what: str,
    on_point: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Measures every point not yet in ``log``; returns all point rows, old and new.

    The log holds a ``sweep`` row (run metadata with ``config``) per session and a ``point`` row
    (``{"kind": "point", "point": point} | measure(point)``) per finished point, so a restarted
    run measures only the missing points.

    Raises:
        ResultsFolderError: when ``log`` holds a ``what`` with another configuration.
    """
    rows = log.read()
    metadata = run_metadata(config)
    first = next((row for row in rows if row.get("kind") == "sweep"), None)
    if first is not None and not same_config(first["config"], metadata["config"]):
        raise config_mismatch(log.path, what, first["config"], metadata["config"])
    log.append({"kind": "sweep"} | metadata)
    done = [row for row in rows if row.get("kind") == "point"]
    finished = [row["point"] for row in done]
    for point in points:
        if point in finished:
            continue
        row = {"kind": "point", "point": point} | measure(point)
        log.append(row)
        done.append(row)
        if on_point is not None:
            on_point(row)
    return done
