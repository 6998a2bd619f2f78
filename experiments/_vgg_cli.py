"""The command line of ``experiments/pruned_vgg11.py``: its configurations and arguments (bad
values are refused by argparse, naming the argument, before any work starts)."""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
from typing import Any

from experiments import _cli, _vgg_jacobians, _vgg_model
from experiments.methods import OVER_LAYERS
from paper_figures.result_files import methods as method_names

DEFAULT_OUT = pathlib.Path("results/pruned_vgg11")
COMMANDS = ("analyze", "jacobians", "benchmark", "retrain")


@dataclasses.dataclass(frozen=True)
class Preset:
    """A named configuration of every command."""

    name: str
    analyze_levels: tuple[int | None, ...]
    jacobians_size: int
    jacobians_repeats: int
    benchmark_size: int
    sparsities: tuple[float, ...]
    batches: tuple[int, ...]
    benchmark_repeats: int
    retrain: Any  # _vgg_retrain.Config
    analyze_size: int = 32  # analyze's image side
    width_divisor: int = 1  # analyze's and benchmark's


def presets() -> dict[str, Preset]:
    from experiments._vgg_retrain import Config

    return {
        # Seconds: every command's structure at 8x8, widths / 16.
        "smoke": Preset(
            "smoke",
            analyze_levels=(2, None),
            jacobians_size=8,
            jacobians_repeats=1,
            benchmark_size=8,
            sparsities=(0.9,),
            batches=(1,),
            benchmark_repeats=1,
            retrain=Config(
                input_size=8, width_divisor=16, batch=8, pretrain_iterations=5, iterations=5
            ),
            analyze_size=8,
            width_divisor=16,
        ),
        "quick": Preset(
            "quick",
            analyze_levels=(2, None),
            jacobians_size=16,
            jacobians_repeats=5,
            benchmark_size=16,
            sparsities=(0.9, 0.97, 0.99),
            batches=(1, 4, 16),
            benchmark_repeats=7,
            retrain=Config(input_size=16, width_divisor=2, pretrain_iterations=200, iterations=100),
        ),
        "paper": Preset(
            "paper",
            analyze_levels=(1, 2, 3, None),
            jacobians_size=32,
            jacobians_repeats=5,
            benchmark_size=32,
            sparsities=(0.9, 0.97, 0.99),
            batches=(1, 4, 16),
            benchmark_repeats=30,
            retrain=Config(input_size=32, pretrain_iterations=500, iterations=1000),
        ),
    }


# ----------------------------------------------------------------------------- arguments


def _input_size(text: str) -> int:
    value = _cli.positive_int(text)
    if value not in _vgg_model.INPUT_SIZES:
        raise argparse.ArgumentTypeError(
            f"expected one of {', '.join(map(str, _vgg_model.INPUT_SIZES))}, got {text!r}"
        )
    return value


def _width_divisor(text: str) -> int:
    value = _cli.positive_int(text)
    if value & (value - 1) or value > 64:
        raise argparse.ArgumentTypeError(f"expected a power of two up to 64, got {text!r}")
    return value


def _levels(text: str) -> int | None:
    if text in ("all", "none", "None"):
        return None
    try:
        return _cli.non_negative_int(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"expected a number of levels (0, 1, 2, ...) or 'all', got {text!r}"
        ) from None


def parser(doc: str) -> argparse.ArgumentParser:
    """The parser of ``python -m experiments.pruned_vgg11``, described by ``doc``'s first
    paragraph."""
    parser = _cli.parser("experiments.pruned_vgg11", doc)
    commands = _cli.add_commands(parser, COMMANDS)
    common = argparse.ArgumentParser(add_help=False)
    _cli.add_presets(
        common,
        {
            "smoke": "seconds: 8x8 images, widths / 16",
            "quick": "minutes on a 2-core CPU: 16x16 (analyze 32x32)",
            "paper": "the paper's sizes (32x32)",
        },
    )
    common.add_argument("--seed", type=_cli.non_negative_int, default=0, help="seed")
    _cli.add_results(common, DEFAULT_OUT)
    net = argparse.ArgumentParser(add_help=False)
    net.add_argument(
        "--input-size",
        type=_input_size,
        help="image side: 32 (VGG-11), or 16, 8, ... (the last max-poolings left out; "
        "default: the preset's)",
    )
    net.add_argument(
        "--width-divisor",
        type=_width_divisor,
        help="divide every conv width by this (default: the preset's)",
    )
    net.add_argument(
        "--scope",
        choices=_vgg_model.SCOPES,
        help="pruning scope (default: global for trained parameters, layer for an init)",
    )
    pruned = argparse.ArgumentParser(add_help=False)
    pruned.add_argument(
        "--checkpoint",
        type=pathlib.Path,
        help="prune these parameters (a retrain run's pretrained.npz) instead of an init",
    )

    a = commands.add_parser(
        "analyze", parents=[common, net, pruned], help="FLOPs of the scan's products (Fig. 10)"
    )
    a.add_argument("--sparsity", type=_cli.fraction_or_zero, default=0.97, help="pruned fraction")
    a.add_argument(
        "--levels",
        type=_levels,
        nargs="+",
        help="parallel levels of each scan (default: the preset's, 2 all)",
    )
    a.add_argument("--batch", type=_cli.positive_int, default=1, help="examples B")

    j = commands.add_parser(
        "jacobians", parents=[common], help="analytic vs autodiff Jacobians (Table 1)"
    )
    j.add_argument(
        "--input-size",
        type=_input_size,
        help="image side (default: the preset's: smoke 8, quick 16, paper 32)",
    )
    j.add_argument("--repeats", type=_cli.positive_int, help="timed rounds (default: 5)")
    j.add_argument(
        "--layers",
        nargs="+",
        choices=_vgg_jacobians.LAYERS,
        help="the layers (default: conv relu maxpool)",
    )
    j.add_argument(
        "--dense-budget-mib",
        type=_cli.positive_int,
        help="above this, the dense Jacobian is computed in blocks of rows (default: 2048)",
    )

    b = commands.add_parser(
        "benchmark", parents=[common, net, pruned], help="measured backward and memory"
    )
    b.add_argument(
        "--sparsities",
        type=_cli.fraction_or_zero,
        nargs="+",
        help="pruned fractions (default: the preset's)",
    )
    b.add_argument(
        "--batches", type=_cli.positive_int, nargs="+", help="batch sizes (default: the preset's)"
    )
    b.add_argument(
        "--repeats", type=_cli.positive_int, help="timed rounds per point (default: the preset's)"
    )
    b.add_argument(
        "--memory-limit-mib",
        type=_cli.positive_int,
        help="memory the backward may use (default: the device's available memory); a method "
        "over it is recorded as skipped",
    )
    _cli.add_methods(
        b,
        [
            method_names.BP,
            method_names.BPPSA,
            "blelloch-2",
            method_names.BLELLOCH,
            method_names.SEQUENTIAL_JACOBIANS,
        ],
        forms=OVER_LAYERS,
        help="bp (dense JAX backward), bppsa (bppsa.Auto(): over layers, the sequential sparse "
        "chain or BP by the measured margin), blelloch, blelloch-K (K parallel levels), "
        "sequential-jacobians (the sparse chain); default: all of them with K = 2",
    )

    r = commands.add_parser(
        "retrain", parents=[common, net], help="prune and re-train with BP and BPPSA"
    )
    r.add_argument(
        "--data",
        choices=_vgg_model.DATA,
        default="digits",
        help="digits (scikit-learn's, real; default), cifar10 (the real set under --root), "
        "fixture (SYNTHETIC, written under --root; for tests)",
    )
    r.add_argument("--root", type=pathlib.Path, help="CIFAR-10 folder (or the fixture's)")
    r.add_argument("--sparsity", type=_cli.fraction_or_zero, help="pruned fraction (default: 0.97)")
    r.add_argument("--batch", type=_cli.positive_int, help="batch size B (default: 16)")
    r.add_argument("--lr", type=_cli.positive_float, help="Adam learning rate (default: 1e-3)")
    r.add_argument(
        "--pretrain-iterations",
        type=_cli.positive_int,
        help="dense iterations before pruning (default: the preset's)",
    )
    r.add_argument(
        "--iterations",
        type=_cli.positive_int,
        help="re-training iterations (default: the preset's)",
    )
    _cli.add_methods(
        r,
        [method_names.BP, method_names.SEQUENTIAL_JACOBIANS, "blelloch-2"],
        forms=OVER_LAYERS,
        help="as for benchmark (default: bp sequential-jacobians blelloch-2)",
    )
    r.add_argument(
        "--chunk", type=_cli.positive_int, default=25, help="iterations per lockstep turn"
    )
    return parser
