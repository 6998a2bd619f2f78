"""BPPSA's backward sharded over the devices of several processes (hosts), with ``jax.distributed``.

Every process runs this same script; together they form one mesh over all their devices, and
``bppsa.Sharded(mesh, "t")`` splits the time axis of the backward across it (each device builds
the Jacobians of its slice, one ``all_gather`` exchanges the slice aggregates). The gradient of
the paper's RNN classifier loss is written by process 0 (``--out``, ``.npz``), next to the
gradient of plain back-propagation on the same process, so the two can be compared.

On one machine, two processes of two CPU devices each (what ``tests/core/test_multihost.py``
runs)::

    for i in 0 1; do
      JAX_NUM_CPU_DEVICES=2 .venv/bin/python -m experiments.sharded_multihost \\
          --coordinator 127.0.0.1:12355 --processes 2 --process-id $i --out grads.npz &
    done; wait

On a cluster, run it once per host with the coordinator's address (GPUs: leave out
``JAX_NUM_CPU_DEVICES``; ``--cpu-collectives`` only matters on CPUs).
"""

from __future__ import annotations

import argparse
import os
import pathlib

from experiments._help import HelpFormatter


def parse(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.sharded_multihost",
        description=__doc__.split("\n\n")[0],
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--coordinator", required=True, help="host:port of process 0")
    parser.add_argument("--processes", type=int, required=True, help="number of processes")
    parser.add_argument("--process-id", type=int, required=True, help="this process, 0-based")
    parser.add_argument("--length", type=int, default=1000, help="sequence length T")
    parser.add_argument("--batch", type=int, default=4, help="batch size B")
    parser.add_argument("--hidden", type=int, default=20, help="hidden size H")
    parser.add_argument(
        "--out",
        type=pathlib.Path,
        help="where process 0 writes the gradients (default: nowhere, none written)",
    )
    parser.add_argument("--timeout", type=int, default=60, help="seconds to wait for peers")
    parser.add_argument("--cpu-collectives", default="gloo", help="CPU collectives")
    args = parser.parse_args(argv)
    if args.processes < 1 or not 0 <= args.process_id < args.processes:
        parser.error("--process-id must be in [0, --processes)")
    for name in ("length", "batch", "hidden", "timeout"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1")
    return args


def problem(length: int, batch: int, hidden: int):
    """``(model, params, xs, labels)``: the paper's RNN classifier and bitstream-like inputs,
    the same in every process (fixed keys)."""
    import jax
    import jax.numpy as jnp

    from bppsa.models import SequenceClassifier

    model = SequenceClassifier(1, hidden, 10)
    params = model.init(key=jax.random.key(0))
    keys = jax.random.split(jax.random.key(1))
    xs = jax.random.bernoulli(keys[0], 0.3, (batch, length, 1)).astype(jnp.float32)
    labels = jax.random.randint(keys[1], (batch,), 0, 10)
    return model, params, xs, labels


def main(argv=None) -> None:
    args = parse(argv)
    import jax

    jax.config.update("jax_cpu_collectives_implementation", args.cpu_collectives)
    jax.distributed.initialize(
        args.coordinator,
        num_processes=args.processes,
        process_id=args.process_id,
        initialization_timeout=args.timeout,
        heartbeat_timeout_seconds=args.timeout,
        shutdown_timeout_seconds=args.timeout,
    )
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    import bppsa

    mesh = Mesh(np.array(jax.devices()), ("t",))  # every device of every process
    model, params, xs, labels = problem(args.length, args.batch, args.hidden)
    replicated = NamedSharding(mesh, P())
    sharded = jax.jit(
        bppsa.grad(model.loss, method=bppsa.Sharded(mesh, "t")), out_shardings=replicated
    )
    plain = jax.jit(bppsa.grad(model.loss, method="sequential"), out_shardings=replicated)
    grads = {"sharded": sharded(params, xs, labels), "bp": plain(params, xs, labels)}
    flat = {
        f"{name}/{jax.tree_util.keystr(path)}": np.asarray(leaf)
        for name, tree in grads.items()
        for path, leaf in jax.tree_util.tree_leaves_with_path(tree)
    }
    print(
        f"process {jax.process_index()} of {jax.process_count()}: {len(jax.devices())} devices, "
        f"{len(jax.local_devices())} local; T={args.length}, B={args.batch}, H={args.hidden}",
        flush=True,
    )
    if jax.process_index() == 0 and args.out is not None:
        tmp = args.out.with_suffix(".tmp.npz")
        np.savez(tmp, **flat)
        os.replace(tmp, args.out)
    jax.distributed.shutdown()


if __name__ == "__main__":
    main()
