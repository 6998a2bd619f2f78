"""The experiments' command lines agree: one preset vocabulary, defaults shown in ``--help``,
``--forward fused``, run folders named after the configuration, a resume error that names
``--overwrite``, and help texts that say what ``bppsa.Auto()`` runs today. Parsing only: no
run starts here."""

import argparse
import pathlib
import re

import pytest

import bppsa
from experiments import _cli, char_lm, demo, gru_irmas, pruned_vgg11, rnn_synthetic
from experiments import sharded_multihost as sharded
from experiments._records import config_mismatch
from experiments.methods import FORWARDS, forward_of, parse_forward

# (script, command, the presets it offers, in the vocabulary's order)
PRESETS = [
    (rnn_synthetic, ["train"], ["smoke", "quick", "paper"]),
    (rnn_synthetic, ["sweep"], ["smoke", "quick", "paper"]),
    (gru_irmas, ["breakdown"], ["smoke", "quick", "paper"]),
    (gru_irmas, ["train"], ["smoke", "quick", "paper"]),
    (pruned_vgg11, ["analyze"], ["smoke", "quick", "paper"]),
    (pruned_vgg11, ["jacobians"], ["smoke", "quick", "paper"]),
    (pruned_vgg11, ["benchmark"], ["smoke", "quick", "paper"]),
    (pruned_vgg11, ["retrain"], ["smoke", "quick", "paper"]),
    (char_lm, [], ["smoke", "quick", "gpu"]),
    (demo, [], ["quick", "paper"]),
]
ID = [f"{m.__name__.rsplit('.', 1)[1]} {' '.join(c)}".strip() for m, c, _ in PRESETS]


def _help(capsys, module, *argv) -> str:
    with pytest.raises(SystemExit) as info:
        module.main([*argv, "--help"])
    assert info.value.code == 0
    return " ".join(capsys.readouterr().out.split())  # unwrapped


def _parser(module) -> argparse.ArgumentParser:
    if module is pruned_vgg11:
        return pruned_vgg11._vgg_cli.parser(pruned_vgg11.__doc__)
    if module is demo:  # its parser is built inside main
        parser = _cli.parser("experiments.demo", demo.__doc__)
        _cli.add_presets(parser, {"quick": "", "paper": ""})
        return parser
    return module._parser()


# ----------------------------------------------------------------------------- presets


@pytest.mark.parametrize("module, command, presets", PRESETS, ids=ID)
def test_every_script_offers_its_presets_by_the_same_flags(module, command, presets, capsys):
    help_text = _help(capsys, module, *command)
    assert "[" + " | ".join(f"--{name}" for name in presets) + "]" in help_text
    for other in set(_cli.PRESETS) - set(presets):
        assert f"--{other} " not in help_text
    assert "(the default)" in help_text
    parser = _parser(module)
    assert parser.parse_args([*command]).preset == "quick"
    for name in presets:
        assert parser.parse_args([*command, f"--{name}"]).preset == name


@pytest.mark.parametrize("module, command, presets", PRESETS, ids=ID)
def test_two_presets_are_refused_naming_both(module, command, presets, capsys):
    with pytest.raises(SystemExit) as info:
        _parser(module).parse_args([*command, f"--{presets[0]}", f"--{presets[-1]}"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert f"argument --{presets[-1]}: not allowed with argument --{presets[0]}" in err


def test_presets_outside_the_vocabulary_are_refused():
    with pytest.raises(ValueError, match="expected names of"):
        _cli.add_presets(argparse.ArgumentParser(), {"quick": "", "fast": ""})
    with pytest.raises(ValueError, match="expected names of"):
        _cli.add_presets(argparse.ArgumentParser(), {"paper": ""})  # no default among them


def test_the_smoke_presets_are_small():
    smoke, quick = rnn_synthetic.PRESETS["smoke"], rnn_synthetic.PRESETS["quick"]
    assert smoke.train.length < quick.train.length and smoke.train.iterations < 20
    vgg = pruned_vgg11._vgg_cli.presets()["smoke"]
    assert vgg.analyze_size == vgg.retrain.input_size == 8 and vgg.width_divisor == 16


def test_gru_irmas_needs_data_unless_smoke(tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        gru_irmas.main(["breakdown", "--out", str(tmp_path / "out")])
    assert info.value.code == 2
    assert "argument --data: required (or --smoke" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------- --help


@pytest.mark.parametrize(
    "module, command, out",
    [
        (rnn_synthetic, ["train"], "results/rnn_synthetic"),
        (rnn_synthetic, ["sweep"], "results/rnn_synthetic"),
        (gru_irmas, ["breakdown"], "results/gru_irmas"),
        (gru_irmas, ["train"], "results/gru_irmas"),
        (pruned_vgg11, ["analyze"], "results/pruned_vgg11"),
        (pruned_vgg11, ["retrain"], "results/pruned_vgg11"),
        (char_lm, [], "results/char_lm"),
        (demo, [], "results/demo"),
    ],
)
def test_help_shows_the_defaults(module, command, out, capsys):
    help_text = _help(capsys, module, *command)
    assert re.search(rf"--out OUT [^-]*\(default: {out}\)", help_text), help_text
    if module is gru_irmas:
        assert "--workers WORKERS feature processes (default: 1)" in help_text
    if command == ["train"]:
        assert "(default: 100)" in help_text  # --checkpoint-every
        assert "--lr LR Adam learning rate (default: " in help_text


def test_help_of_the_multihost_script_shows_the_defaults(capsys):
    with pytest.raises(SystemExit):
        sharded.parse(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "sequence length T (default: 1000)" in help_text
    assert "--cpu-collectives CPU_COLLECTIVES CPU collectives (default: gloo)" in help_text


def test_the_help_formatter_leaves_out_flags_and_unset_defaults():
    parser = _cli.parser("x", "doc")
    parser.add_argument("--flag", action="store_true", help="a flag")
    parser.add_argument("--unset", help="unset")
    parser.add_argument("--zero", type=int, default=0, help="zero")
    parser.add_argument("--said", default=3, help="said (default: three)")
    parser.add_argument("--percent", default="5%", help="percent")
    text = " ".join(parser.format_help().split())
    assert "a flag --unset UNSET unset --zero ZERO zero (default: 0)" in text
    assert "said (default: three) --percent PERCENT percent (default: 5%)" in text


# ----------------------------------------------------------------------------- --forward


def test_every_forward_of_the_library_that_the_experiments_name_resolves():
    assert FORWARDS == ("sequential", "newton", "fused")
    assert parse_forward("sequential") is None
    assert isinstance(parse_forward("newton"), bppsa.Newton)
    assert isinstance(parse_forward("fused"), bppsa.Fused)
    assert forward_of("bp", "fused") == "sequential"  # the reference keeps lax.scan
    assert forward_of("bppsa", "fused") == "fused"


@pytest.mark.parametrize(
    "module, command",
    [(rnn_synthetic, ["train"]), (rnn_synthetic, ["sweep"]), (gru_irmas, ["train"])],
)
def test_every_forward_option_takes_fused(module, command, capsys):
    assert _parser(module).parse_args([*command, "--forward", "fused"]).forward == "fused"
    help_text = _help(capsys, module, *command)
    assert "--forward {sequential,newton,fused}" in help_text
    assert "fused (bppsa.Fused()" in help_text


# ----------------------------------------------------------------------------- run folders


def test_a_run_folder_is_named_after_the_sizes_that_differ_from_the_preset():
    sizes = {"T": (300, 1000), "B": (16, 16), "H": (None, 20), "p": (0.5, 0.97)}
    assert _cli.run_name("train-quick", sizes) == "train-quick-T300-p0.5"
    assert _cli.run_name("train-quick", {"T": (1000, 1000)}) == "train-quick"
    assert _cli.run_name("sweep-paper") == "sweep-paper"
    args = argparse.Namespace(out=pathlib.Path("r"), name=None)
    assert _cli.run_folder(args, "train-quick-T300") == pathlib.Path("r/train-quick-T300")
    args.name = "mine"
    assert _cli.run_folder(args, "train-quick-T300") == pathlib.Path("r/mine")


def test_the_scripts_name_their_folders_by_the_rule(tmp_path):
    vgg = pruned_vgg11._vgg_cli.parser(pruned_vgg11.__doc__)
    presets = pruned_vgg11._vgg_cli.presets()
    for argv, name in [
        (["benchmark"], "benchmark-quick"),
        (["benchmark", "--input-size", "8", "--width-divisor", "1"], "benchmark-quick-S8"),
        (["retrain", "--smoke", "--batch", "4"], "retrain-smoke-B4"),
        (["analyze", "--batch", "2", "--input-size", "32"], "analyze-quick-B2"),
        (["jacobians", "--paper", "--input-size", "16"], "jacobians-paper-S16"),
    ]:
        args = vgg.parse_args([*argv, "--out", str(tmp_path)])
        assert pruned_vgg11._folder(args, presets[args.preset]) == tmp_path / name

    parser = char_lm._parser()
    for argv, name in [
        ([], "quick-diagonal-gru"),
        (["--cell", "gru", "--width", "64"], "quick-gru-H64"),
        (["--gpu", "--dry-run", "--length", "64"], "gpu-dry-run-diagonal-gru-T64"),
    ]:
        args = parser.parse_args(argv)
        assert char_lm._folder_name(args, char_lm._config(parser, args)) == name

    base = rnn_synthetic.PRESETS["quick"].train
    config = rnn_synthetic.dataclasses.replace(base, length=300, hidden=20)
    sizes = rnn_synthetic._sizes(config, base)
    assert _cli.run_name("train-quick", sizes) == "train-quick-T300"


# ----------------------------------------------------------------------------- resume


def test_the_resume_error_names_overwrite_and_the_options_for_another_folder():
    error = config_mismatch("results/x", "run", {"lr": 0.1}, {"lr": 0.2})
    assert "lr: 0.1 there, 0.2 now" in str(error)
    assert "pass --overwrite to start it afresh" in str(error)
    assert "--out or --name" in str(error)


# ----------------------------------------------------------------------------- Auto


@pytest.mark.parametrize(
    "module, command",
    [(rnn_synthetic, ["train"]), (gru_irmas, ["breakdown"]), (pruned_vgg11, ["benchmark"])],
)
def test_help_says_what_auto_runs_today(module, command, capsys):
    help_text = _help(capsys, module, *command)
    assert "Blelloch on accelerators" not in help_text  # what it ran two rounds ago
    if module is pruned_vgg11:  # over layers: the sparse chain or BP
        assert "the sequential sparse chain or BP by the measured margin" in help_text
        return
    for today in ("cost model", "FusedSequential", "measured rules", "memory limit"):
        assert today in help_text
