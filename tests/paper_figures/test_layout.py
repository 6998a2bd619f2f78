"""Every figure of ``paper_figures`` laid out without overlaps, checked with matplotlib's own
geometry (window extents after a draw, at the resolution the PNG is written at): legends lie
outside every axes and clear of every text, tick label and other legend; no text (title, axis
label, annotation, caption) crosses another text, the figure's edge or a panel that is not its
own; an annotation inside a panel covers none of its data (bars, lines, markers); tick labels
stay out of the other panels.

Each figure is drawn from a small result file written here (the helpers of the other tests in
this folder) and, where the repository holds one, from its committed results."""

import itertools
import json
import pathlib

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.patches import Rectangle
from matplotlib.transforms import Bbox

from paper_figures import accuracy, char_lm, fig7, fig8, fig9, fig10, fig13, table1, width
from paper_figures.result_files import JsonLines
from tests.paper_figures import (
    test_accuracy_figure,
    test_char_lm,
    test_fig10_table1,
    test_irmas_figures,
    test_width,
)
from tests.paper_figures.test_fig7_fig8 import META, _point, _run_rows, _write

ROOT = pathlib.Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
TOLERANCE = 0.5  # pixels: boxes that only touch do not overlap
# What bppsa.Auto chose in `make demo`: the label that once ran across both panels of Fig. 7.
LONG_CHOICE = "Auto(profile=None) -> Blocked(method=SequentialScan(), block=2048)"


def _overlap(a: Bbox, b: Bbox) -> bool:
    return (
        min(a.x1, b.x1) - max(a.x0, b.x0) > TOLERANCE
        and min(a.y1, b.y1) - max(a.y0, b.y0) > TOLERANCE
    )


def _inside(inner: Bbox, outer: Bbox) -> bool:
    return (
        inner.x0 >= outer.x0 - TOLERANCE
        and inner.y0 >= outer.y0 - TOLERANCE
        and inner.x1 <= outer.x1 + TOLERANCE
        and inner.y1 <= outer.y1 + TOLERANCE
    )


def _tick_labels(ax, renderer):
    """The boxes of the tick labels drawn (those of ticks inside the view, visible, non-empty)."""
    boxes = []
    for axis in (ax.xaxis, ax.yaxis):
        low, high = sorted(axis.get_view_interval())
        span = (high - low) * 1e-9
        for ticks, locs in (
            (axis.get_major_ticks(), axis.get_majorticklocs()),
            (axis.get_minor_ticks(), axis.get_minorticklocs()),
        ):
            for tick, loc in zip(ticks, locs):
                label = tick.label1
                if low - span <= loc <= high + span and label.get_visible() and label.get_text():
                    boxes.append((f"tick label {label.get_text()!r}", label))
    return [(name, t.get_window_extent(renderer)) for name, t in boxes]


def _texts(fig, renderer):
    """``(name, box, axes or None)`` of every non-empty visible text but tick labels."""
    found, seen = [], set()

    def add(text, owner):
        if text is None or id(text) in seen:  # the suptitle is one of fig.texts too
            return
        seen.add(id(text))
        if text.get_visible() and text.get_text().strip():
            found.append((repr(text.get_text()[:40]), text.get_window_extent(renderer), owner))

    add(fig._suptitle, None)
    for text in fig.texts:
        add(text, None)
    for ax in fig.axes:
        for text in (ax.title, ax._left_title, ax._right_title, ax.xaxis.label, ax.yaxis.label):
            add(text, ax)
        for text in ax.texts:
            add(text, ax)
    return found


def _covers_data(box: Bbox, ax, renderer) -> bool:
    """Whether ``box`` holds any of the data drawn in ``ax``: a bar, a point of a line or on a
    segment between two (sampled every pixel), or a marker of a scatter."""
    bars = [p for p in ax.patches if isinstance(p, Rectangle) and p.get_width() and p.get_height()]
    if any(_overlap(box, bar.get_window_extent(renderer)) for bar in bars):
        return True
    points = []
    for line in ax.lines:
        if line.get_visible() and len(line.get_xydata()):
            xy = line.get_transform().transform(line.get_xydata())
            xy = xy[np.isfinite(xy).all(axis=1)]
            for start, end in itertools.pairwise(xy):
                steps = int(np.ceil(np.hypot(*(end - start)))) + 1
                points.append(np.linspace(start, end, min(steps, 10_000)))
            points.append(xy)
    for collection in ax.collections:
        offsets = collection.get_offsets()
        if len(offsets):
            points.append(collection.get_offset_transform().transform(offsets))
    if not points:
        return False
    xy = np.concatenate(points)
    inside = (
        (xy[:, 0] > box.x0 + TOLERANCE)
        & (xy[:, 0] < box.x1 - TOLERANCE)
        & (xy[:, 1] > box.y0 + TOLERANCE)
        & (xy[:, 1] < box.y1 - TOLERANCE)
    )
    return bool(inside.any())


def problems(fig: plt.Figure) -> list[str]:
    """Every overlap in ``fig``, in words (empty: a clean layout)."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    page = fig.bbox
    areas = [(ax, ax.get_window_extent(renderer)) for ax in fig.axes if ax.get_visible()]
    legends = [lg for lg in [ax.get_legend() for ax in fig.axes] + fig.legends if lg is not None]
    legend_boxes = [(f"legend {i}", lg.get_window_extent(renderer)) for i, lg in enumerate(legends)]
    texts = _texts(fig, renderer)
    ticks = [(ax, name, box) for ax, _ in areas for name, box in _tick_labels(ax, renderer)]
    found = []

    for name, box in legend_boxes:
        if not _inside(box, page):
            found.append(f"{name} runs beyond the figure's edge")
        found += [f"{name} overlaps an axes" for _, area in areas if _overlap(box, area)]
        found += [f"{name} overlaps text {t}" for t, tbox, _ in texts if _overlap(box, tbox)]
        found += [f"{name} overlaps {t}" for _, t, tbox in ticks if _overlap(box, tbox)]
        found += [
            f"{name} overlaps {other}"
            for other, obox in legend_boxes
            if other != name and _overlap(box, obox)
        ]

    for i, (name, box, owner) in enumerate(texts):
        if not _inside(box, page):
            found.append(f"text {name} runs beyond the figure's edge")
        found += [
            f"text {name} overlaps text {other}"
            for other, obox, _ in texts[i + 1 :]
            if _overlap(box, obox)
        ]
        found += [f"text {name} overlaps {t}" for _, t, tbox in ticks if _overlap(box, tbox)]
        for ax, area in areas:
            inside_own = ax is owner and _inside(box, area)
            if not inside_own and _overlap(box, area):
                found.append(f"text {name} runs into a panel")
            if inside_own and _covers_data(box, ax, renderer):
                found.append(f"text {name} covers data of its panel")

    for ax, name, box in ticks:
        if not _inside(box, page):
            found.append(f"{name} runs beyond the figure's edge")
        for other, area in areas:
            if other is not ax and _overlap(box, area):
                found.append(f"{name} runs into another panel")
        found += [
            f"{name} overlaps {t} of another panel"
            for other, t, tbox in ticks
            if other is not ax and _overlap(box, tbox)
        ]
    return found


# The figures, each from a small result file written into a folder.


def _fig7(folder):
    for method, step_s in (("bp", 0.010), ("bppsa", 0.004)):
        rows = _run_rows(method, step_s)
        rows[0]["config"]["resolved"] = LONG_CHOICE
        _write(folder / method / "metrics.jsonl", rows)
    return fig7.draw(fig7.load_runs(folder))


def _fig8(folder, sweeps=("T", "B")):
    rows = [{"kind": "sweep"} | META | {"config": {"hidden": 20, "resolved": {}}}]
    if "T" in sweeps:
        rows += [_point("T", t, 16, 1e-5 * t, 0.6e-5 * t) for t in (10, 100, 1000, 10_000)]
    if "B" in sweeps:
        rows += [_point("B", 1000, b, 1e-3 * b, 1.5e-3 * b) for b in (2, 16, 128)]
    _write(folder / "sweep.jsonl", rows)
    return fig8.draw(*fig8.load_sweep(folder))


def _fig9(folder):
    JsonLines(folder / "breakdown.jsonl").extend(
        test_irmas_figures.breakdown_rows(skip={("S", 16)})
    )
    return fig9.draw(*fig9.load_breakdown(folder))


def _fig10(folder, levels=None):
    (folder / "analyze.json").write_text(json.dumps(test_fig10_table1._analysis(empty=[13])))
    return fig10.draw(fig10.load(folder), levels)


def _fig13(folder):
    test_irmas_figures.write_runs(folder)
    return fig13.draw(fig13.load_runs(folder))


def _table1(folder):
    JsonLines(folder / "jacobians.jsonl").extend(test_fig10_table1.jacobian_rows())
    return table1.draw(*table1.load(folder))


def _accuracy(folder):
    (folder / "accuracy.json").write_text(json.dumps(test_accuracy_figure._payload()))
    return accuracy.draw(accuracy.load(folder / "accuracy.json"))


FIGURES = {
    "fig7": _fig7,
    "fig8": _fig8,
    "fig8 (T only)": lambda folder: _fig8(folder, ("T",)),
    "fig9": _fig9,
    "fig10": _fig10,
    "fig10 (full scan)": lambda folder: _fig10(folder, "all"),
    "fig13": _fig13,
    "table1": _table1,
    "accuracy": _accuracy,
    "char_lm": lambda folder: char_lm.draw(
        char_lm.load_runs(test_char_lm.write_run(folder, ("bp", "bppsa", "bppsa-newton")))
    ),
    "width": lambda folder: width.draw(width.load(test_width.write_runs(folder))),
    "fig10 of the committed analysis": lambda _: fig10.draw(
        fig10.load(RESULTS / "pruned_vgg11" / "analyze_cpu.json"), "all"
    ),
    "table1 of the committed results": lambda _: table1.draw(
        *table1.load(RESULTS / "pruned_vgg11" / "jacobians_paper_cpu.jsonl")
    ),
    "accuracy of the committed results": lambda _: accuracy.draw(
        accuracy.load(RESULTS / "accuracy_cpu.json")
    ),
}


@pytest.mark.parametrize("name", FIGURES)
def test_nothing_overlaps(name, tmp_path):
    fig = FIGURES[name](tmp_path)
    try:
        assert fig.legends, "every figure keeps its legends in the band under the axes"
        assert problems(fig) == []
    finally:
        plt.close(fig)


def test_long_method_descriptions_go_to_the_caption(tmp_path):
    fig = _fig7(tmp_path)
    try:
        labels = [t.get_text() for legend in fig.legends for t in legend.get_texts()]
        assert labels == ["BP: 0.4 s for 40 it.", "BPPSA: 0.2 s for 40 it."]
        caption = " ".join(fig.texts[-1].get_text().split())
        assert "BPPSA (bppsa.Auto) = Blocked(method=SequentialScan(), block=2048)" in caption
    finally:
        plt.close(fig)


def test_the_check_finds_overlaps():
    """The checks can fail: the old Fig. 7's legend inside the axes, over its curve and the
    title, and a text crossing into the next panel."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(6, 3))
    try:
        left.plot([0, 1], [0, 1], label="a label long enough to run across both panels of it")
        left.set_title("title")
        left.legend(loc="upper left", bbox_to_anchor=(0.0, 1.08))
        right.text(-0.3, 0.5, "into the left panel", transform=right.transAxes)
        right.plot([0, 1], [0, 1])
        right.text(0.5, 0.5, "over the curve", transform=right.transAxes, ha="center")
        found = problems(fig)
        assert any(p.startswith("legend 0 overlaps an axes") for p in found)
        assert any(p.startswith("legend 0 overlaps text 'title'") for p in found)
        assert "text 'into the left panel' runs into a panel" in found
        assert "text 'over the curve' covers data of its panel" in found
    finally:
        plt.close(fig)
