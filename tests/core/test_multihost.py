"""Two processes on this machine form one ``jax.distributed`` cluster (CPU collectives over
gloo, 2 CPU devices each) and run ``experiments/sharded_multihost.py``: the sharded gradient
over their 4 devices equals ``jax.grad`` through ``lax.scan`` in this one process. Every wait is
bounded, so a hung peer fails the test instead of hanging the suite; the bounds are generous
(a peer's start, import and compilation on a machine whose cores are busy with other work take
tens of seconds), since a bound that load can reach fails the suite by chance."""

import functools
import os
import socket
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np

from experiments.sharded_multihost import problem
from tests.helpers import assert_trees_close, classifier_loss_reference

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
T, B, H = 37, 3, 6  # T not a multiple of the 4 devices


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_give_the_one_process_gradient(tmp_path):
    out = tmp_path / "grads.npz"
    port = free_port()
    env = dict(os.environ, JAX_NUM_CPU_DEVICES="2", PYTHONPATH=ROOT)
    command = [sys.executable, "-m", "experiments.sharded_multihost"]
    command += ["--coordinator", f"127.0.0.1:{port}", "--processes", "2", "--timeout", "240"]
    command += ["--length", str(T), "--batch", str(B), "--hidden", str(H), "--out", str(out)]
    procs = [
        subprocess.Popen(
            [*command, "--process-id", str(i)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]
    logs = []
    try:
        for proc in procs:
            logs.append(proc.communicate(timeout=900)[0])
    finally:
        for proc in procs:
            proc.kill()
    assert [p.returncode for p in procs] == [0, 0], "\n".join(logs)[-4000:]
    assert "process 0 of 2: 4 devices, 2 local" in logs[0], logs[0][-2000:]

    model, params, xs, labels = problem(T, B, H)
    expected = jax.grad(functools.partial(classifier_loss_reference, model))(params, xs, labels)
    saved = np.load(out)
    leaves = jax.tree_util.tree_leaves_with_path(expected)
    actual = [jnp.asarray(saved[f"sharded/{jax.tree_util.keystr(path)}"]) for path, _ in leaves]
    assert_trees_close(actual, [leaf for _, leaf in leaves], jnp.float32)
