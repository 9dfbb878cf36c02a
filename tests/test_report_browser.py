"""Reports opened in headless Chromium: the page renders (not blank) with no console errors,
and the plots' text (inline SVG) is in the DOM: log axes read as plain numbers, names holding
markup are text.

Needs the Debian package ``chromium`` (``scripts/install_chromium.sh``); skipped when
/usr/bin/chromium is absent. The report has no scripts and a CSP that blocks every load, so
*any* console message (an uncaught error, a blocked request) counts as a failure.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
from matplotlib.image import imread
from test_report import (
    EVIL,
    LOG_AXES,
    assert_plain_log_labels,
    make_rows,
    plot_tick_labels,
    write_run,
)

from kernelbench.report import write_report
from kernelbench.results.schema import ResultsWriter

CHROMIUM = Path("/usr/bin/chromium")
pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="/usr/bin/chromium not installed (run scripts/install_chromium.sh)",
)

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--enable-logging=stderr",
    "--v=0",
]
#: Console output in Chromium's log: `[...:INFO:CONSOLE:12] "message", source: ...`.
CONSOLE = re.compile(r":CONSOLE[:(]|Uncaught|Content Security Policy|Refused to", re.I)


def _chromium(page: Path, tmp: Path, *extra: str) -> subprocess.CompletedProcess:
    args = [str(CHROMIUM), *FLAGS, f"--user-data-dir={tmp / 'profile'}", *extra, page.as_uri()]
    return subprocess.run(args, capture_output=True, text=True, timeout=180, check=False)


def console_errors(stderr: str) -> list[str]:
    """Console lines of the page under test; Chromium's own pages (``source: chrome://...``,
    e.g. a "Slow network is detected" notice in a network namespace) are not the report."""
    return [
        line
        for line in stderr.splitlines()
        if CONSOLE.search(line) and "source: chrome://" not in line
    ]


def dominant_share(png: Path) -> float:
    """Share of the screenshot's pixels that have its most common colour."""
    img = imread(png)  # float RGBA in [0, 1]
    rgb = (img[..., :3] * 255).round().astype(np.uint32)
    packed = (rgb[..., 0] << 16) | (rgb[..., 1] << 8) | rgb[..., 2]
    _, counts = np.unique(packed, return_counts=True)
    return counts.max() / packed.size


def _screenshot(page: Path, tmp: Path, height: int = 3000) -> tuple[Path, list[str]]:
    shot = tmp / "shot.png"
    proc = _chromium(page, tmp, f"--screenshot={shot}", f"--window-size=1400,{height}")
    assert shot.exists(), f"no screenshot; chromium exited {proc.returncode}: {proc.stderr[-2000:]}"
    return shot, console_errors(proc.stderr)


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> dict[str, Path]:
    a = write_run(tmp_path_factory.mktemp("a"))
    b = write_run(tmp_path_factory.mktemp("b"), faster=1.25, peak=False)
    return {"single": write_report([a]), "compare": write_report([a, b])}


@pytest.mark.parametrize("kind", ["single", "compare"])
def test_renders_without_console_errors(reports, kind, tmp_path):
    shot, errors = _screenshot(reports[kind], tmp_path)
    assert errors == []
    share = dominant_share(shot)
    assert share < 0.93, f"screenshot is {share:.0%} one colour: blank page?"


def test_dom_rendered(reports, tmp_path):
    proc = _chromium(reports["single"], tmp_path, "--dump-dom")
    dom = proc.stdout
    assert console_errors(proc.stderr) == []
    for marker in ('id="environment"', 'class="section-app-d1"', 'id="problems"'):
        assert marker in dom
    # speedup vs d, vs tokens, heatmaps, stages, error, speed vs error, memory: inline SVG
    assert dom.count("<svg ") == 7 and "<img " not in dom
    assert "<script" not in dom.lower()


def _dom(page: Path, tmp: Path) -> str:
    proc = _chromium(page, tmp, "--dump-dom")
    assert console_errors(proc.stderr) == []
    return proc.stdout


def test_log_axes_read_as_plain_numbers_in_the_dom(reports, tmp_path):
    """The tick labels of every log axis, as the browser holds them (the <text> elements of
    matplotlib's tick groups in the DOM): plain numbers such as ``0.001`` or ``1e-05``, no
    ``$`` and no ``\\mathdefault``."""
    figures = plot_tick_labels(_dom(reports["single"], tmp_path))
    log_figures = [t for t in LOG_AXES if t in figures]
    assert {"Error vs model dimension", "Weight memory per method", "Speedup vs tokens",
            "Speed against error"} <= set(log_figures)  # fmt: skip
    assert_plain_log_labels(figures, log_figures)
    # the linear axes are numbers too (the speedup axis of the first figure)
    assert all(float(t) >= 0 for t in figures["Speedup over 16-bit vs model dimension"]["y"])


def test_a_name_holding_markup_is_text_in_the_plots(tmp_path):
    """A backend named like a script tag: drawn in the plots' titles, legends and labels as
    text, never an element (matplotlib's SVG writer escapes it, the page adds no script)."""
    evil = f"x{EVIL}"
    writer = ResultsWriter(tmp_path / "run")
    for row in make_rows():
        if row.backend == "custom":
            row.backend = evil
        writer.append(row)
    page = write_report([tmp_path / "run"])
    html = page.read_text(encoding="utf-8")
    assert "<script" not in html.lower()
    assert f"backend x{EVIL}".replace("<", "&lt;").replace(">", "&gt;") in html  # a panel title
    dom = _dom(page, tmp_path)
    assert "<script" not in dom.lower()
    # the browser's text of the SVG: the name as written, in a panel title and the legends
    texts = re.findall(r"<text\b[^>]*>([^<]*)</text>", dom)
    unescaped = [t.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&") for t in texts]
    assert f"backend {evil}" in unescaped
    assert any(t.startswith(f"{evil} · ") for t in unescaped)  # "backend · method" labels


def test_detector_sees_console_errors(tmp_path):
    """The checks above can fail: a page with an error and a blocked load is caught."""
    bad = tmp_path / "bad.html"
    bad.write_text(
        '<!DOCTYPE html><html><head><meta http-equiv="Content-Security-Policy" '
        "content=\"default-src 'none'; img-src data:\"></head><body>"
        '<img src="https://example.invalid/x.png"></body></html>',
        encoding="utf-8",
    )
    shot, errors = _screenshot(bad, tmp_path)
    assert errors, "a CSP-blocked image should log to the console"
    assert dominant_share(shot) > 0.99  # and an empty page counts as blank


def test_accuracy_section_renders(tmp_path):
    """An accuracy study's report in Chromium: no console errors, the section and its figure
    drawn (not blank)."""
    from test_report import write_study

    page = write_report([write_study(tmp_path / "study")])
    shot, errors = _screenshot(page, tmp_path, height=900)  # the section's figure and table
    assert errors == []
    assert dominant_share(shot) < 0.93
    dom = _dom(page, tmp_path)
    assert 'id="accuracy"' in dom and dom.count("<svg ") == 1
    assert_plain_log_labels(plot_tick_labels(dom), ["Accuracy study: error vs model size"])
