"""Reports opened in headless Chromium: the page renders (not blank) with no console errors.

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
from test_report import write_run

from kernelbench.report import write_report

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
    # speedup vs d, vs tokens, heatmaps, stages, error, speed vs error, memory
    assert dom.count("<img ") == 7
    assert "<script" not in dom.lower()


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
    dom = _chromium(page, tmp_path, "--dump-dom").stdout
    assert 'id="accuracy"' in dom and dom.count("<img ") == 1
