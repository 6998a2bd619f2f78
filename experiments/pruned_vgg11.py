"""Paper experiment 3: BPPSA over the sparse transposed Jacobians of a pruned VGG-11 (Wang, Bai &
Pekhimenko, MLSys 2020, Fig. 10 and Table 1), plus what the paper's artifact did not run: the
measured backward and a re-training with BP and BPPSA in lockstep.

Commands:
    analyze     Fig. 10: the FLOPs of every SpGEMM/SpMV of the Blelloch scan over the layers
                (per level, ``--levels 2`` as in the paper, and the full scan) against the dense
                product's 2mnk, the critical path, and the totals against dense BP and the
                sequential sparse chain; symbolic (patterns only), B = 1 at 32x32;
    jacobians   Table 1: time to generate the transposed Jacobians of the first Conv2d, ReLU and
                MaxPool2d analytically vs by ``jax.jacrev`` (dense), checked equal;
    benchmark   the measured backward (its own program: the pullback of a ``jax.vjp``), with the
                whole gradient and its forward, of sparse BPPSA (``bppsa``, ``blelloch-2``,
                ``blelloch``, ``sequential-jacobians``) vs JAX's dense backward (``bp``) over
                pruning sparsity x batch size, with XLA's peak memory and the library's
                estimate, and where the sparse chain stops beating BP;
    retrain     pre-trains VGG-11 briefly (dense), prunes it, and re-trains it with BP and BPPSA
                in lockstep on the same batches (Fig. 7-style curves; their agreement).

Pruning: magnitude pruning (:func:`bppsa.models.magnitude_prune`) of a seeded initialization, or
of trained parameters (``retrain``, or ``--checkpoint <retrain run>/pretrained.npz``). The
default scope is ``global`` (one threshold for all weights) for trained parameters, but
``layer`` (every layer pruned to the sparsity) for an initialization: a global threshold on
PyTorch's default initialization, whose bound ``1/sqrt(fan_in)`` is smallest for the widest
layers, removes the 512-wide convolutions entirely at 97% and disconnects the network
(``--scope global`` runs it anyway, warns and records the empty layers).

Presets: ``--smoke`` (seconds: every command at 8x8, widths / 16), ``--quick`` (the default:
minutes on a 2-core CPU; the benchmark, Table 1 and re-training at 16x16, which leaves out
VGG-11's last max-pooling, and re-training at half width) and ``--paper`` (everything at 32x32,
full width). Any option overrides the preset's value.

Results go to ``<out>/<name>/`` (default ``results/pruned_vgg11/<command>-<preset>/``, followed by
the sizes that differ from the preset's: ``S`` the image side, ``D`` the width divisor, ``B`` the
batch, e.g. ``benchmark-quick-S8-D4``); a rerun of the same command resumes (finished points are
not redone). Draw the figures with
``python -m paper_figures.fig10 <analyze run>``, ``python -m paper_figures.table1 <jacobians
run>``; ``retrain`` prints the per-iteration agreement and writes ``retrain.json``.

Examples:
    python -m experiments.pruned_vgg11 analyze
    python -m experiments.pruned_vgg11 jacobians --paper
    python -m experiments.pruned_vgg11 benchmark --sparsities 0.97 --batches 1 4
    python -m experiments.pruned_vgg11 retrain --data cifar10 --root ~/data/cifar10 --paper
"""

from __future__ import annotations

import dataclasses
import pathlib
import sys
from collections.abc import Sequence
from typing import Any

import jax

from bppsa.models import sparsity_of
from experiments import _cli, _vgg_analysis, _vgg_benchmark, _vgg_cli, _vgg_jacobians, _vgg_model
from experiments._records import ResultsFolderError, load_checkpoint
from paper_figures.result_files import methods as method_names

DEFAULT_OUT = _vgg_cli.DEFAULT_OUT


def _net(args, default_size: int, default_width: int = 1):
    size = args.input_size or default_size
    width = args.width_divisor or default_width
    return size, width, _vgg_model.vgg11_chain(size, width)


def _params(parser, args, chain, size: int, width: int):
    """Seeded init, or the ``--checkpoint`` (which must be of the same network)."""
    if args.checkpoint is None:
        return _vgg_model.init_params(chain, args.seed), None
    like = jax.eval_shape(chain.init, jax.random.key(0))
    try:
        loaded = load_checkpoint(args.checkpoint, like)
    except (OSError, ValueError, KeyError) as error:
        parser.error(f"argument --checkpoint: {error}")
    if loaded is None:
        parser.error(f"argument --checkpoint: no file at {args.checkpoint}")
    params, extra = loaded
    if (extra.get("input_size"), extra.get("width_divisor")) not in ((size, width), (None, None)):
        parser.error(
            f"argument --checkpoint: it holds a VGG-11 at {extra.get('input_size')}x"
            f"{extra.get('input_size')}, widths / {extra.get('width_divisor')}; pass "
            "--input-size and --width-divisor to match"
        )
    return params, dict(path=str(args.checkpoint), **extra)


def _prune_note(chain, masks) -> dict[str, Any]:
    empty = _vgg_model.empty_layers(chain, masks)
    if empty:
        print(
            f"warning: pruning removes every weight of layers {empty}: the network is "
            "disconnected (all their gradients are zero); --scope layer avoids it",
            flush=True,
        )
    return dict(sparsity=sparsity_of(masks)._asdict(), empty_layers=empty)


def _scope(args) -> str:
    return args.scope or ("layer" if args.checkpoint is None else "global")


def _analyze(parser, args, preset, folder, progress) -> int:
    size, width, chain = _net(args, preset.analyze_size, preset.width_divisor)
    params, source = _params(parser, args, chain, size, width)
    args.scope = _scope(args)
    levels = list(dict.fromkeys(args.levels or preset.analyze_levels))
    pruned, masks = _vgg_model.prune(params, args.sparsity, args.scope)
    note = _prune_note(chain, masks)
    config = dict(
        input_size=size,
        width_divisor=width,
        sparsity=args.sparsity,
        scope=args.scope,
        seed=args.seed,
        batch=args.batch,
        checkpoint=source,
    )
    net = _vgg_model.net_name(size, width)
    print(f"analyze {net}, {100 * args.sparsity:g}% pruned ({args.scope}) -> {folder}", flush=True)
    result = _vgg_analysis.run(
        chain,
        pruned,
        masks,
        levels,
        folder,
        config,
        batch=args.batch,
        input_size=size,
        extra=dict(net=net, config=config, **note),
        overwrite=args.overwrite,
        progress=progress,
    )
    print(_vgg_analysis.summary(result))
    return 0


def _jacobians(parser, args, preset, folder, progress) -> int:
    size = args.input_size or preset.jacobians_size
    repeats = args.repeats or preset.jacobians_repeats
    layers = list(dict.fromkeys(args.layers or _vgg_jacobians.LAYERS))
    budget = None if args.dense_budget_mib is None else args.dense_budget_mib << 20
    config = dict(input_size=size, seed=args.seed, repeats=repeats, dense_budget=budget)
    print(f"Table 1 at {size}x{size}, {repeats} rounds -> {folder}", flush=True)
    rows = _vgg_jacobians.run(
        layers,
        size,
        folder,
        config,
        seed=args.seed,
        repeats=repeats,
        dense_budget=budget,
        overwrite=args.overwrite,
        progress=progress,
    )
    print(_vgg_jacobians.table(rows))
    return 0


def _benchmark(parser, args, preset, folder, progress) -> int:
    size, width, chain = _net(args, preset.benchmark_size, preset.width_divisor)
    params, source = _params(parser, args, chain, size, width)
    args.scope = _scope(args)
    sparsities = list(dict.fromkeys(args.sparsities or preset.sparsities))
    batches = list(dict.fromkeys(args.batches or preset.batches))
    repeats = args.repeats or preset.benchmark_repeats
    methods = _cli.methods(args)
    if method_names.BASELINE not in methods:
        methods.insert(0, method_names.BASELINE)
    points = [{"sparsity": s, "batch": b} for s in sparsities for b in batches]
    config = dict(
        input_size=size,
        width_divisor=width,
        scope=args.scope,
        seed=args.seed,
        repeats=repeats,
        methods=methods,
        resolved={name: _vgg_model.describe(name) for name in methods},
        checkpoint=source,
        memory_limit_mib=args.memory_limit_mib,
    )
    net = _vgg_model.net_name(size, width)
    print(f"benchmark {net}: {len(points)} points x {methods} -> {folder}", flush=True)
    result = _vgg_benchmark.run(
        chain,
        params,
        points,
        methods,
        folder,
        config,
        input_size=size,
        scope=args.scope,
        repeats=repeats,
        seed=args.seed,
        memory_limit=None if args.memory_limit_mib is None else args.memory_limit_mib << 20,
        overwrite=args.overwrite,
        progress=progress,
        on_point=lambda row: print(_vgg_benchmark.table([row]), flush=True),
    )
    print(_vgg_benchmark.table(result["points"]))
    for entry in result["crossover"].values():
        print(entry["summary"])
    return 0


def _retrain(parser, args, preset, folder, progress) -> int:
    from experiments import _vgg_retrain

    base = preset.retrain
    overrides = dict(
        data=args.data,
        root=None if args.root is None else str(args.root),
        input_size=args.input_size,
        width_divisor=args.width_divisor,
        sparsity=args.sparsity,
        scope=args.scope,
        batch=args.batch,
        lr=args.lr,
        pretrain_iterations=args.pretrain_iterations,
        iterations=args.iterations,
        seed=args.seed,
    )
    config = dataclasses.replace(base, **{k: v for k, v in overrides.items() if v is not None})
    if config.data == "fixture":
        if args.root is None:
            parser.error("argument --root: --data fixture writes its SYNTHETIC set there")
        from bppsa.data import cifar10_fixture

        try:
            cifar10_fixture.write_fixture(args.root, per_batch=40, seed=0)
        except (FileExistsError, ValueError) as error:
            parser.error(f"argument --root: {error}")
    elif config.data == "cifar10" and args.root is None:
        parser.error("argument --root: --data cifar10 needs the CIFAR-10 folder")
    try:
        train = _vgg_model.load_images(
            config.data, "train", root=config.root, input_size=config.input_size
        )
    except (OSError, ValueError, ImportError) as error:
        parser.error(f"argument --data/--root: {error}")
    if config.batch > len(train):
        parser.error(
            f"argument --batch: batch size {config.batch} exceeds the {len(train)} training images"
        )
    methods = _cli.methods(args)
    if method_names.BASELINE not in methods:
        methods.insert(0, method_names.BASELINE)
    print(
        f"retrain {_vgg_model.net_name(config.input_size, config.width_divisor)} on "
        f"{train.describe()}: {methods} -> {folder}",
        flush=True,
    )
    summary = _vgg_retrain.retrain(
        config, methods, folder, chunk=args.chunk, overwrite=args.overwrite, progress=progress
    )
    if summary["empty_layers"]:
        print(f"warning: pruning removed every weight of layers {summary['empty_layers']}")
    for name, message in summary["skipped"].items():
        print(f"skipped {name}: {message}")
    print(summary["loss_table"])
    for name, final in summary["final"].items():
        print(
            f"{name}: {final['iterations']} iterations, {final['wall_clock_s']:.2f} s of training "
            f"steps, test accuracy {final['test_accuracy']:.3f}"
        )
    return 0


COMMANDS = {
    "analyze": _analyze,
    "jacobians": _jacobians,
    "benchmark": _benchmark,
    "retrain": _retrain,
}


def _folder(args, preset: _vgg_cli.Preset) -> pathlib.Path:
    """The run folder, named after the command, the preset and the sizes given that differ
    from the preset's (:func:`experiments._cli.run_name`)."""
    size, width, batch = (getattr(args, k, None) for k in ("input_size", "width_divisor", "batch"))
    retrain, divisor = preset.retrain, preset.width_divisor
    sizes = {
        "analyze": dict(S=(size, preset.analyze_size), D=(width, divisor), B=(batch, 1)),
        "jacobians": dict(S=(size, preset.jacobians_size)),
        "benchmark": dict(S=(size, preset.benchmark_size), D=(width, divisor)),
        "retrain": dict(
            S=(size, retrain.input_size), D=(width, retrain.width_divisor), B=(batch, retrain.batch)
        ),
    }[args.command]
    return _cli.run_folder(args, _cli.run_name(f"{args.command}-{preset.name}", sizes))


def main(argv: Sequence[str] | None = None) -> int:
    parser = _vgg_cli.parser(__doc__)
    args = parser.parse_args(argv)
    preset = _vgg_cli.presets()[_cli.configuration(args)]
    folder = _folder(args, preset)
    progress = not args.no_progress  # bars also when stderr is not a terminal
    try:
        return COMMANDS[args.command](parser, args, preset, folder, progress)
    except ResultsFolderError as error:
        _cli.fail(parser, args, error)


if __name__ == "__main__":
    sys.exit(main())
