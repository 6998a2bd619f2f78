"""Paper experiment 2: a GRU classifier on IRMAS MFCC sequences, trained by back-propagation (BP)
and by BPPSA (Wang, Bai & Pekhimenko, MLSys 2020, Figs. 9 and 13).

The model: a GRU with hidden size 20 over the MFCC frames of a 3 s stereo clip, a linear head on
the last state, 11 classes, cross-entropy, Adam with learning rate 3e-4 (all configurable). The
data: the IRMAS training set read by :mod:`bppsa.data.irmas` in the variants S (259 frames x 38
features), M (517 x 24) and L (1034 x 12); features are cached under ``--cache-dir``.

Commands:
    breakdown  Fig. 9: for every variant and batch size (16, 32, 64), the medians over
               ``--repeats`` interleaved rounds of BP's and BPPSA's gradient, its forward and
               its backward, and of building the Jacobians, each its own program (see
               experiments/_irmas_breakdown.py);
    train      Fig. 13: trains BP and BPPSA in lockstep on the same batches for every variant
               at batch 16, logging loss and wall-clock per iteration and the training-set loss
               and accuracy at the end of every epoch;
    fixture    writes a small SYNTHETIC dataset in the exact IRMAS layout (NOT IRMAS).

Presets: ``--smoke`` (minutes: without ``--data``, on a SYNTHETIC fixture that it writes under
``<out>/fixture``, NOT IRMAS, and the command's figure drawn), ``--quick`` (the default: a few
hundred iterations, for a CPU) and ``--paper`` (the artifact's 400 epochs; for a GPU). Any
option overrides the preset's value. ``train --forward newton`` runs the forward pass of BPPSA
by Newton iterations (``bppsa.Newton()``), ``--forward fused`` in one kernel
(``bppsa.Fused()``); BP keeps ``lax.scan`` (the reference), and each run's log records the
forward it ran.

Results go to ``<out>/<name>/`` (default ``results/gru_irmas/<command>-<preset>/``, followed by
the sizes that differ from the preset's, e.g. ``train-quick-H8``): ``breakdown.jsonl``, or per
variant ``<variant>-B<batch>/<method>/{metrics.jsonl, checkpoint.npz}``. Rerunning the same
command resumes where it stopped. Draw the figures with ``python -m paper_figures fig9 fig13``
(or ``python -m paper_figures.fig9 <breakdown run>``, ``python -m paper_figures.fig13 <train
run>``).

Examples:
    python -m experiments.gru_irmas breakdown --smoke
    python -m experiments.gru_irmas train --smoke
    python -m experiments.gru_irmas breakdown --data ~/data/IRMAS-TrainingData
    python -m experiments.gru_irmas train --data ~/data/IRMAS-TrainingData --paper
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import sys
from collections.abc import Sequence

from bppsa.data import irmas, irmas_fixture
from experiments import _cli, _irmas_breakdown, _report
from experiments._irmas_data import Clips, load_clips
from experiments._irmas_runs import PRESETS, Config, breakdown, train
from experiments._records import ResultsFolderError
from experiments._sweep import compare
from paper_figures.result_files import methods as method_names

__all__ = ["PRESETS", "Config", "breakdown", "main", "train"]

DEFAULT_OUT = pathlib.Path("results/gru_irmas")
DEFAULT_CACHE = DEFAULT_OUT / "features"
FIXTURE_CLIPS = 6  # per class: 66 clips, enough for a batch of 64
SYNTHETIC_NOTE = "SYNTHETIC fixture (tones in the IRMAS layout), NOT IRMAS"
COMMANDS = ("breakdown", "train", "fixture")


def _variant(text: str) -> str:
    try:
        return irmas.resolve_variant(text).name
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _parser() -> argparse.ArgumentParser:
    parser = _cli.parser("experiments.gru_irmas", __doc__)
    commands = _cli.add_commands(parser, COMMANDS)
    out = argparse.ArgumentParser(add_help=False)
    _cli.add_results(out, DEFAULT_OUT, name=False)
    model = argparse.ArgumentParser(add_help=False)
    model.add_argument("--hidden", type=_cli.positive_int, help="GRU hidden size H (default: 20)")
    model.add_argument(
        "--seed", type=_cli.non_negative_int, help="init and data-order seed (default: 0)"
    )
    model.add_argument(
        "--variants", nargs="+", type=_variant, metavar="V", help="MFCC variants (default: S M L)"
    )
    model.add_argument("--workers", type=_cli.positive_int, default=1, help="feature processes")
    model.add_argument(
        "--cache-dir", type=pathlib.Path, default=DEFAULT_CACHE, help="feature cache folder"
    )
    model.add_argument("--no-cache", action="store_true", help="neither read nor write it")
    model.add_argument("--strict", action="store_true", help="fail on a bad clip (else skip)")
    common = argparse.ArgumentParser(add_help=False, parents=[out, model])
    common.add_argument(
        "--data",
        type=pathlib.Path,
        help="IRMAS training root (required, but with --smoke: default a SYNTHETIC fixture "
        "under --out)",
    )
    _cli.add_presets(
        common,
        {
            "smoke": "minutes, on a SYNTHETIC fixture; draws the command's figure",
            "quick": "a few hundred iterations, for a CPU",
            "paper": "the artifact's sizes (for a GPU)",
        },
    )
    _cli.add_name(common)

    b = commands.add_parser("breakdown", parents=[common], help="runtime breakdown (Fig. 9)")
    b.add_argument(
        "--batches", type=_cli.positive_int, nargs="+", help="batch sizes (default: 16 32 64)"
    )
    b.add_argument(
        "--repeats", type=_cli.positive_int, help="timed rounds per point (default: the preset's)"
    )
    b.add_argument(
        "--method",
        type=_cli.method_name(),
        default=method_names.BPPSA,
        help=f"the BPPSA method: bppsa ({_cli.AUTO_HELP}), blelloch, chunked, chunked-C",
    )

    t = commands.add_parser("train", parents=[common], help="training curves (Fig. 13)")
    t.add_argument("--batch", type=_cli.positive_int, help="batch size B (default: 16)")
    _cli.add_training(t, lr="3e-4")
    t.add_argument("--no-eval", action="store_true", help="no training-set evaluation")
    _cli.add_checkpoint_every(t)

    f = commands.add_parser("fixture", help="write a SYNTHETIC fixture in the IRMAS layout")
    f.add_argument("--out", type=pathlib.Path, required=True, help="the fixture's root folder")
    f.add_argument(
        "--clips-per-class", type=_cli.positive_int, default=FIXTURE_CLIPS, help="clips per class"
    )
    f.add_argument("--seed", type=_cli.non_negative_int, default=0, help="the tones' seed")
    return parser


def _check_data(parser: argparse.ArgumentParser, root: pathlib.Path, batches: Sequence[int]):
    """Fails with the argument's name before any feature is computed."""
    try:
        clips, _ = irmas.find_clips(root)
    except (OSError, irmas.IrmasError) as error:
        parser.error(f"argument --data: {error}")
    if max(batches) > len(clips):
        parser.error(
            f"argument --batch/--batches: batch size {max(batches)} exceeds the {len(clips)} "
            f"clips under {root}"
        )


def _load(args, root: pathlib.Path, variants: Sequence[str], seed: int) -> dict[str, Clips]:
    cache = None if args.no_cache else args.cache_dir
    loaded = {}
    for v in variants:
        loaded[v] = load_clips(
            root,
            v,
            seed=seed,
            cache_dir=cache,
            workers=args.workers,
            strict=args.strict,
            progress=not args.no_progress,
        )
        features = loaded[v].features
        note = f" ({SYNTHETIC_NOTE})" if features.synthetic else ""
        print(
            f"{v}: {len(features)} clips x {loaded[v].frames} frames x {loaded[v].num_features}"
            f" features, {len(features.skipped)} skipped{note}",
            flush=True,
        )
    return loaded


def _check_usable(parser, clips: dict[str, Clips], batches: Sequence[int]) -> None:
    """After skipping bad clips: is there still a full batch of the largest size?"""
    for v, data in clips.items():
        if max(batches) > len(data):
            parser.error(
                f"argument --batch/--batches: batch size {max(batches)} exceeds the "
                f"{len(data)} usable clips of variant {v}"
            )


def _run_breakdown(args, clips, batches, folder, repeats, method, progress) -> None:
    print(f"breakdown {', '.join(clips)} x B {batches} ({repeats} rounds) -> {folder}")
    rows = breakdown(
        clips,
        batches,
        folder,
        hidden=args.hidden or 20,
        seed=args.seed or 0,
        repeats=repeats,
        method=method,
        overwrite=args.overwrite,
        progress=progress,
    )
    print(_irmas_breakdown.table(rows))


def _run_train(args, clips, config, methods, folder, checkpoint_every, progress) -> None:
    for v, data in clips.items():
        at = dataclasses.replace(config, variant=v)
        run_dir = folder / f"{v}-B{at.batch}"
        print(f"training {', '.join(methods)}: {at} -> {run_dir}", flush=True)
        runs = train(
            at,
            data,
            methods,
            run_dir,
            checkpoint_every=checkpoint_every,
            overwrite=args.overwrite,
            progress=progress,
        )
        print(_report.loss_table(runs))
        print(_report.timing_table(compare(runs, skip=1)))


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "fixture":
        try:
            paths = irmas_fixture.write_fixture(args.out, args.clips_per_class, seed=args.seed)
        except (FileExistsError, ValueError) as error:
            parser.error(f"argument --out: {error}")
        print(f"wrote {len(paths)} clips to {args.out}: {SYNTHETIC_NOTE}")
        return 0
    try:
        return _run(parser, args)
    except (irmas.IrmasError, ResultsFolderError) as error:  # found only once loaded/opened
        _cli.fail(parser, args, error)


def _run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    progress = _cli.progress(args)
    preset = PRESETS[_cli.configuration(args)]
    base = f"{args.command}-{preset.name}"
    data = _data(parser, args)
    variants = list(dict.fromkeys(args.variants or preset.variants))
    if args.command == "breakdown":
        # the batches are the points', which join one log: only H names the folder
        sizes = {"H": (args.hidden, preset.train.hidden)}
        folder = _cli.run_folder(args, _cli.run_name(base, sizes))
        batches = list(dict.fromkeys(args.batches or preset.batches))
        _check_data(parser, data, batches)
        clips = _load(args, data, variants, args.seed or 0)
        _check_usable(parser, clips, batches)
        _run_breakdown(
            args, clips, batches, folder, args.repeats or preset.repeats, args.method, progress
        )
        if args.preset == "smoke":
            from paper_figures import fig9

            fig9.main([str(folder)])
        return 0
    config = _config(args, preset.train)
    sizes = {"B": (config.batch, preset.train.batch), "H": (config.hidden, preset.train.hidden)}
    folder = _cli.run_folder(args, _cli.run_name(base, sizes))
    _check_data(parser, data, [config.batch])
    clips = _load(args, data, variants, config.seed)
    _check_usable(parser, clips, [config.batch])
    methods = _cli.methods(args)
    _run_train(args, clips, config, methods, folder, args.checkpoint_every, progress)
    if args.preset == "smoke":
        from paper_figures import fig13

        fig13.main([str(folder)])
    return 0


def _data(parser: argparse.ArgumentParser, args: argparse.Namespace) -> pathlib.Path:
    """``--data``; with ``--smoke`` and none, the SYNTHETIC fixture under ``<out>/fixture``
    (written unless it is there, or afresh with ``--overwrite``)."""
    if args.data is not None:
        return args.data
    if args.preset != "smoke":
        parser.error("argument --data: required (or --smoke, on a SYNTHETIC fixture)")
    root = args.out / "fixture"
    print(f"smoke run on a {SYNTHETIC_NOTE}: {root}", flush=True)
    if args.overwrite or not (root / irmas.SYNTHETIC_MARKER).exists():
        irmas_fixture.write_fixture(root, FIXTURE_CLIPS, seed=0)
    return root


def _config(args: argparse.Namespace, base: Config) -> Config:
    evaluate = False if args.no_eval else None
    return _cli.training_config(
        base, args, hidden=args.hidden, seed=args.seed, batch=args.batch, evaluate=evaluate
    )


if __name__ == "__main__":
    sys.exit(main())
