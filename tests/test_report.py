"""HTML reports (kernelbench.report) rendered from a synthetic results.jsonl."""

from __future__ import annotations

import dataclasses
import json
import re
import xml.etree.ElementTree as ET
from html import unescape
from html.parser import HTMLParser
from pathlib import Path

import pandas as pd
import pytest
from conftest import make_row

from kernelbench.report import write_report
from kernelbench.results.schema import ENV_FILE, ResultRow, ResultsWriter, load_results

SIZES = [("125M", 768), ("1.3B", 2048), ("175B", 12288)]
PAPER = {  # App. D.1 Table 5 at the fixture's sizes
    "int8_raw": {768: 0.99, 2048: 1.61, 12288: 2.29},
    "absmax_torch": {768: 0.25, 2048: 0.45, 12288: 1.50},
    "vectorwise_torch": {768: 0.21, 2048: 0.41, 12288: 1.50},
    "vectorwise": {768: 0.43, 2048: 0.91, 12288: 2.00},
    "llm_int8": {768: 0.14, 2048: 0.51, 12288: 1.81},
    "fp16": {768: 1.0, 2048: 1.0, 12288: 1.0},
}
BACKENDS = {
    "torch": ["fp32", "fp16", "int8_raw", "absmax_torch", "vectorwise_torch"],
    "custom": ["int8_raw", "vectorwise", "llm_int8"],
}
EVIL = '<script>alert("pwned")</script>'
DEVICE_CLASS = "cpu-avx2-2core"


def _speedup(backend: str, method: str, d: int, tokens: int) -> float:
    if method == "fp16":
        return 1.0
    base = {
        "fp32": 0.4,
        "int8_raw": 1.3,
        "absmax_torch": 0.5,
        "vectorwise_torch": 0.45,
        "vectorwise": 0.8,
        "llm_int8": 0.6,
    }[method]
    bonus = 0.1 if backend == "custom" else 0.0
    return round((base + bonus) * (d / 768) ** 0.2 * (tokens / 2048) ** 0.1, 6)


def make_rows(faster: float = 1.0) -> list[ResultRow]:
    """Every row of a synthetic run; ``faster`` divides every time (speedups stay)."""
    rows = []
    for backend, methods in BACKENDS.items():
        for method in methods:
            for size, d in SIZES:
                for tokens in (512, 2048):
                    sp = _speedup(backend, method, d, tokens)
                    base_ms = 1e-6 * tokens * d * 4 * d / faster
                    ms = base_ms / sp
                    int8 = method not in ("fp16", "fp32")
                    stages = (
                        {
                            "quantize": 0.2 * ms,
                            "int8_matmul": 0.6 * ms,
                            "dequantize": 0.15 * ms,
                            "outlier_product": 0.05 * ms,
                        }
                        if int8
                        else {}
                    )
                    rows.append(
                        ResultRow(
                            case="gpt3",
                            size=size,
                            d_model=d,
                            layer="ffn1",
                            tokens=tokens,
                            m=tokens,
                            k=d,
                            n=4 * d,
                            dist="outliers",
                            seed=0,
                            backend=backend,
                            method=method,
                            device="cpu",
                            device_class=DEVICE_CLASS,
                            dtype="bfloat16",
                            median_ms=ms,
                            iqr_ms=0.02 * ms,
                            min_ms=0.95 * ms,
                            mean_ms=ms,
                            rel_spread=0.02,
                            samples=20,
                            stages_ms=stages,
                            baseline_ms=base_ms,
                            speedup=sp,
                            tops=2 * tokens * d * 4 * d / ms / 1e9,
                            paper_speedup=PAPER.get(method, {}).get(d),
                            rel_error=(3e-3 if int8 else 1e-3 if method == "fp16" else 1e-7),
                            baseline_rel_error=1e-3,
                            weight_bytes=(d * 4 * d + 4 * 4 * d) if int8 else d * 4 * d * 2,
                            weight_bytes_16bit=d * 4 * d * 2,
                        )
                    )
    over = f"over the time budget {EVIL}"
    rows.append(
        make_row(
            "llm_int8",
            "custom",
            d_model=12288,
            tokens=8192,
            device_class=DEVICE_CLASS,
            status="skipped",
            skip_kind=None,
            reason=over,
        )
    )
    no_cuda = f"RuntimeError: no CUDA device & {EVIL}"
    cuda = dict(device="cuda", device_class="cuda-none", dtype="float16")
    rows.append(
        make_row("vectorwise", "cublaslt", tokens=2048, status="failed", reason=no_cuda, **cuda)
    )
    return rows


def write_run(run_dir: Path, faster: float = 1.0, peak: bool = True) -> Path:
    writer = ResultsWriter(run_dir)
    for row in make_rows(faster):
        writer.append(row)
    env = {
        "schema_version": 1,
        "command": f"kernelbench run --case gpt3 --note '{EVIL}'",
        "host": "testhost",
        "python": "3.11",
        "torch": "2.13.0+cpu",
        "cpu": {"model": "Synthetic CPU", "cores": 2, "flags": ["avx2", "avx512_vnni"]},
        "cuda": None,
    }
    if peak:
        env["peak"] = {
            "int8": {"tops": 0.8, "source": "measured", "note": "torch._int_mm, 2 cores"},
            "16bit": {"tops": 0.4, "source": "datasheet"},
            "fp32": {"tops": 9.0, "source": "a guess"},  # not measured/datasheet: ignored
        }
    (run_dir / ENV_FILE).write_text(json.dumps(env), encoding="utf-8")
    return run_dir


class _Cells(HTMLParser):
    """Collects <td data-*> cells of grid tables, the <svg> plots and element ids/classes."""

    def __init__(self) -> None:
        super().__init__()
        self.cells: list[dict] = []
        self.images: list[str] = []  # an <svg> element per plot, as its id-less tag name
        self.classes: set[str] = set()
        self.grid_kind = ""
        self._cell: dict | None = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.classes.update((a.get("class") or "").split())
        if tag == "table":
            kinds = [c for c in (a.get("class") or "").split() if c.startswith("grid-")]
            self.grid_kind = kinds[0][5:] if kinds else ""
        if tag == "td" and "data-method" in a:
            self._cell = {"kind": self.grid_kind, **a, "text": ""}
        if tag in ("img", "svg"):
            self.images.append(tag)

    def handle_endtag(self, tag):
        if tag == "td" and self._cell is not None:
            self.cells.append(self._cell)
            self._cell = None

    def handle_data(self, text):
        if self._cell is not None:
            self._cell["text"] += text


def _parse(html: str) -> _Cells:
    p = _Cells()
    p.feed(html)
    return p


@pytest.fixture(scope="module")
def single(tmp_path_factory) -> tuple[Path, str]:
    run = write_run(tmp_path_factory.mktemp("run"))
    path = write_report([run])
    return path, path.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def compare(tmp_path_factory) -> tuple[Path, str]:
    a = write_run(tmp_path_factory.mktemp("a"))
    b = write_run(tmp_path_factory.mktemp("b"), faster=1.25, peak=False)
    path = write_report([a, b])
    return path, path.read_text(encoding="utf-8")


def test_single_default_path_and_sections(single):
    path, html = single
    assert path.name == "report.html"
    classes = _parse(html).classes
    for section in (
        "section-environment",
        "section-app-d1",
        "section-plots",
        "section-throughput",
        "section-memory",
        "section-problems",
    ):
        assert section in classes, section
    for text in (
        "Synthetic CPU",
        "2.13.0+cpu",
        "kernelbench run --case gpt3",
        DEVICE_CLASS,
        "App. D.1 Table 5",
        "layer ffn1, 2048 tokens",
        "Speedup over 16-bit vs model",
        "Speedup vs tokens",
        "Time per stage",
        "Error vs model dimension",
        "Weight memory per method",
    ):
        assert text in html, text


def test_header_says_what_ran_then_the_headline(single):
    _, html = single
    title = re.search(r"<h1>(.*?)</h1>", html).group(1)
    assert "case gpt3" in title and DEVICE_CLASS in title
    assert html.index('class="command mono run-command"') < html.index('class="headline"')
    assert "Fastest over 16-bit" in html and "Precision: " in html
    assert "PyTorch + NVIDIA" not in html  # a CPU run names its methods true to the device
    assert "Absmax, PyTorch ops" in html
    assert html.count('<div class="scroll">') == html.count('<table class="grid')


def test_escaping(single):
    _, html = single
    assert "<script" not in html.lower()
    assert "&lt;script&gt;alert(" in html
    assert "over the time budget" in html and "no CUDA device &amp;" in html


def test_no_network_resources(single):
    _, html = single
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html)
    assert "@import" not in html
    urls = re.findall(r"url\(([^)]*)\)", html)  # the plots' clip paths: in-page fragments only
    assert urls and all(u.startswith("#") for u in urls), sorted(set(urls))[:5]


def test_speedup_cells_match_results(single, tmp_path):
    path, html = single
    df = load_results(path.parent)
    ok = df[(df["status"] == "ok") & (df["tokens"] == 2048)]
    cells = [c for c in _parse(html).cells if c["kind"] == "speedup"]
    assert len(cells) == len(ok)
    for c in cells:
        row = ok[
            (ok["backend"] == c["data-backend"])
            & (ok["method"] == c["data-method"])
            & (ok["d_model"] == int(c["data-d-model"]))
        ]
        assert len(row) == 1
        rec = row.iloc[0]
        assert c["text"].startswith(f"{rec['speedup']:.2f}")
        assert float(c["data-value"]) == pytest.approx(rec["speedup"])
        if rec["paper_speedup"] == rec["paper_speedup"]:  # not NaN
            assert f"paper {rec['paper_speedup']:.2f}" in c["text"]
        assert "background" in c["style"]


def test_paper_figure_beside_cell(single):
    _, html = single
    cells = _parse(html).cells
    llm = [
        c
        for c in cells
        if c["kind"] == "speedup"
        and c["data-method"] == "llm_int8"
        and c["data-d-model"] == "12288"
    ]
    assert len(llm) == 1 and "paper 1.81" in llm[0]["text"]


def test_peak_share_uses_only_known_peaks(single):
    _, html = single
    cells = [c for c in _parse(html).cells if c["kind"] == "tops"]
    int8 = [c for c in cells if c["data-method"] == "vectorwise"]
    fp32 = [c for c in cells if c["data-method"] == "fp32"]
    assert int8 and all("of roofline" in c["text"] for c in int8)
    for c in int8:  # no bandwidth given: the roofline is the int8 compute peak
        share = 100 * float(c["data-value"]) / 0.8
        assert f"{share:.0f}% of roofline" in c["text"]
    assert fp32 and not any("of roofline" in c["text"] for c in fp32)  # "a guess" is ignored
    assert "(datasheet)" in html and "(measured, torch._int_mm, 2 cores)" in html


def test_the_bandwidth_peak_of_each_placement_of_the_threads_is_stated(tmp_path):
    run = write_run(tmp_path)
    env = json.loads((run / ENV_FILE).read_text(encoding="utf-8"))
    placements = [{"link_ns": 60.2, "gbs": 37.0}, {"link_ns": 284.0, "gbs": 64.5}]
    bandwidth = {"gbs": 64.5, "source": "measured", "note": "", "placements": placements}
    env["peak"]["bandwidth"] = bandwidth
    (run / ENV_FILE).write_text(json.dumps(env), encoding="utf-8")
    html = write_report([run], tmp_path / "out" / "r.html").read_text(encoding="utf-8")
    assert (
        "37 GB/s at a round trip of about 60 ns, 64.5 GB/s at a round trip of about 284 ns" in html
    )


def test_no_peak_known(tmp_path):
    run = write_run(tmp_path, peak=False)
    html = write_report([run], tmp_path / "out" / "r.html").read_text(encoding="utf-8")
    assert "no peak known" in html
    assert "% of roofline" not in html


def test_error_table_with_outliers_found_and_planted(single):
    _, html = single
    cells = [c for c in _parse(html).cells if c["kind"] == "error"]
    assert cells and all(c["text"] != "" for c in cells)
    rows = {(c["data-method"], c["data-d-model"]): c for c in cells}
    assert any(m == "llm_int8" for m, _ in rows)


def test_memory_cells(single):
    _, html = single
    cells = [c for c in _parse(html).cells if c["kind"] == "memory"]
    d = 2048
    c = next(c for c in cells if c["data-method"] == "llm_int8" and c["data-d-model"] == str(d))
    assert c["text"].startswith(f"{(d * 4 * d + 16 * d) / 2**20:.2f}")
    assert f"{(d * 4 * d + 16 * d) / (d * 4 * d * 2):.3f}× of 16-bit" in c["text"]


def test_problem_rows_listed(single):
    _, html = single
    assert html.count('class="status-skipped"') == 1
    assert html.count('class="status-failed"') == 1


SVG = "{http://www.w3.org/2000/svg}"
XLINK_HREF = "{http://www.w3.org/1999/xlink}href"


def svgs(html: str) -> list[str]:
    """The inline <svg> elements of a page, as markup."""
    return re.findall(r"<svg\b.*?</svg>", html, flags=re.S)


def _svg_ok(svg: str) -> None:
    """Well-formed SVG with a size, its text as <text> elements, referring to nothing outside
    itself."""
    root = ET.fromstring(svg)
    assert root.tag == f"{SVG}svg" and root.get("viewBox")
    assert root.get("width", "").endswith("pt") and root.get("height", "").endswith("pt")
    assert [t.text for t in root.iter(f"{SVG}text") if t.text], "text was drawn as paths"
    assert not list(root.iter(f"{SVG}image")) and "@import" not in svg
    hrefs = [el.get(XLINK_HREF) or el.get("href") for el in root.iter()]
    assert all(h.startswith("#") for h in hrefs if h), hrefs
    ids = {f"#{i}" for i in re.findall(r'id="([^"]+)"', svg)}
    assert set(re.findall(r"url\(([^)]*)\)", svg)) <= ids  # clip paths of this figure


def test_plots_are_inline_svg(single):
    _, html = single
    plots_ = svgs(html)
    # speedup vs d, speedup vs tokens, size x tokens heatmaps, stages, error, speed vs error,
    # memory
    assert len(plots_) == 7 == len(_parse(html).images)
    for svg in plots_:
        _svg_ok(svg)
    assert "<?xml" not in html and "<!DOCTYPE svg" not in html
    ids = re.findall(r'\bid="([^"]+)"', html)
    assert len(ids) > 100 and len(ids) == len(set(ids)), "two elements of the page share an id"


class PlotTicks(HTMLParser):
    """The tick labels of each plot of a page (``figures[title]["x" | "y"]``), read from the
    ``<text>`` elements inside matplotlib's ``xtick_N`` / ``ytick_N`` groups; the title is the
    figure's caption's bold part."""

    TICK = re.compile(r"(?:^|-)([xy])tick_\d+$")

    def __init__(self) -> None:
        super().__init__()
        self.figures: dict[str, dict[str, list[str]]] = {}
        self._fig: dict | None = None
        self._groups: list[str | None] = []
        self._text: str | None = None
        self._title: str | None = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "figure" and "plot" in (a.get("class") or "").split():
            self._fig = {"x": [], "y": []}
        elif self._fig is None:
            return
        elif tag == "g":
            tick = self.TICK.search(a.get("id") or "")
            self._groups.append(tick.group(1) if tick else None)
        elif tag == "text":
            self._text = ""
        elif tag == "strong":
            self._title = ""

    def handle_endtag(self, tag):
        if self._fig is None:
            return
        if tag == "g" and self._groups:
            self._groups.pop()
        elif tag == "text" and self._text is not None:
            axis = next((g for g in reversed(self._groups) if g), None)
            if axis and self._text.strip():
                self._fig[axis].append(self._text.strip())
            self._text = None
        elif tag == "strong" and self._title is not None:
            self._fig["title"] = self._title.strip().rstrip(".")
            self._title = None
        elif tag == "figure":
            self.figures[self._fig.pop("title", "")] = self._fig
            self._fig = None

    def handle_data(self, text):
        if self._text is not None:
            self._text += text
        if self._title is not None:
            self._title += text


def plot_tick_labels(html: str) -> dict[str, dict[str, list[str]]]:
    p = PlotTicks()
    p.feed(html)
    return p.figures


#: The log axes of a report's figures (figure title -> axis): their tick labels must read as
#: plain numbers, ``0.001`` or ``1e-05``; matplotlib's own are mathtext (``$10^{-3}$``), which
#: the figures turn off, and would then print as ``$\mathdefault{10^{-3}}$``.
LOG_AXES = {
    "Error vs model dimension": "y",
    "Weight memory per method": "y",
    "Speedup vs tokens": "x",
    "Speed against error": "x",
    "Accuracy study: error vs model size": "y",
}
PLAIN_NUMBER = re.compile(r"^\d+(\.\d+)?(e-\d+)?$")


def assert_plain_log_labels(figures: dict, titles) -> None:
    """Each named figure's log axis has at least two tick labels, every one a plain positive
    number, spanning at least a factor of 2."""
    for title in titles:
        labels = figures[title][LOG_AXES[title]]
        assert len(labels) >= 2, (title, labels)
        bad = [t for t in labels if not PLAIN_NUMBER.match(t) or "$" in t or "mathdefault" in t]
        assert not bad, (title, bad)
        values = sorted({float(t) for t in labels})
        assert values[0] > 0 and values[-1] / values[0] >= 2, (title, values)


def test_log_axis_labels_in_the_page_are_plain_numbers(single):
    figures = plot_tick_labels(single[1])
    assert_plain_log_labels(figures, [t for t in LOG_AXES if t in figures])
    assert {"Error vs model dimension", "Weight memory per method"} <= set(figures)


def test_compare_mode(compare):
    path, html = compare
    assert path.name == "compare.html" and path.parent.name.startswith("b")
    parsed = _parse(html)
    assert {"section-ratios", "section-unmatched", "section-problems"} <= parsed.classes
    cells = [c for c in parsed.cells if c["kind"] == "ratio"]
    assert cells
    # B ran 1.25x faster everywhere, its 16-bit baseline too (a quiet machine against a
    # loaded one): each cell shows what the verdict judges, the speedup over 16-bit B / A, 1.0
    # and "same"; the time ratio 0.8 is secondary
    for c in cells:
        assert float(c["data-value"]) == pytest.approx(1.0)
        assert float(c["data-time-ratio"]) == pytest.approx(0.8)
        assert c["text"].startswith("1.000×") and "same" in c["text"]
        assert "time B/A 0.800×" in c["text"]
        assert "background" not in c.get("style", "")  # no change found: no colour
    assert "all 48 matched cells" in html and "B is 0 faster, 48 same" in html
    assert html.count('class="status-skipped"') == 2  # one per run
    assert "<script" not in html.lower()
    assert len(parsed.images) == 1
    for svg in svgs(html):
        _svg_ok(svg)


def test_compare_explicit_output_and_unmatched(tmp_path):
    a = write_run(tmp_path / "a")
    b = tmp_path / "b"
    rows = [r for r in make_rows() if not (r.method == "vectorwise" and r.d_model == 768)]
    writer = ResultsWriter(b)
    for r in rows:
        writer.append(r)
    out = write_report([a, b], tmp_path / "x" / "ab.html")
    html = out.read_text(encoding="utf-8")
    assert out == tmp_path / "x" / "ab.html"
    assert html.count("<td>A only</td>") == 2  # vectorwise at d=768, two token counts
    assert "no env.json in this run directory" in html
    same = [c for c in _parse(html).cells if c["kind"] == "ratio" and c["data-value"]]
    assert same and all("same" in c["text"] for c in same)


def test_rejects_three_dirs(tmp_path):
    with pytest.raises(ValueError):
        write_report([tmp_path, tmp_path, tmp_path])


def test_template_in_package():
    from importlib import resources

    assert resources.files("kernelbench.report").joinpath("template.html.j2").is_file()


def test_backends_and_their_verification_from_env(tmp_path):
    run = write_run(tmp_path / "run")
    env = json.loads((run / ENV_FILE).read_text(encoding="utf-8"))
    env["backends"] = {
        "custom": {"available": True, "reason": "", "verification": "verified: reports/x"},
        "cutlass": {"available": False, "reason": f"no GPU {EVIL}", "verification": "unverified"},
    }
    (run / ENV_FILE).write_text(json.dumps(env), encoding="utf-8")
    html = write_report([run], tmp_path / "r.html").read_text(encoding="utf-8")
    assert "verified: reports/x" in html and "unverified" in html
    assert EVIL not in html  # the reason is escaped


def test_log_axes_have_numeric_tick_labels(tmp_path, monkeypatch):
    """Every tick label of every plot is plain text (no raw mathtext such as
    ``$\\mathdefault{10^{-1}}$``); the log axes' labels read as numbers."""
    from kernelbench.report import plots

    figures = []
    encode = plots._encode

    def keep(fig):
        figures.append(fig)
        return encode(fig)

    monkeypatch.setattr(plots, "_encode", keep)
    write_report([write_run(tmp_path / "run")])
    log_labels = []
    for fig in figures:
        fig.canvas.draw()
        for ax in fig.axes:
            for axis, scale in ((ax.xaxis, ax.get_xscale()), (ax.yaxis, ax.get_yscale())):
                labels = [t.get_text() for t in axis.get_ticklabels() if t.get_text()]
                assert not any("$" in t or "mathdefault" in t for t in labels), labels
                if scale == "log":
                    log_labels += labels
                    assert all(float(t) > 0 for t in labels), labels
    assert len(log_labels) >= 10  # error, memory, tokens and d_model axes are log-scaled


def test_compare_cells_show_the_speedup_their_verdict_judges(tmp_path):
    """B gained on its baseline for custom llm_int8 and lost for torch int8_raw: the cells say
    so in their number (speedup B / A), their verdict and their colour alike."""
    from kernelbench.report.tables import speedup_color

    a = write_run(tmp_path / "a")
    rows = make_rows()
    for r in rows:
        if r.status != "ok":
            continue
        change = {("custom", "llm_int8"): 1.5, ("torch", "int8_raw"): 0.6}.get(
            (r.backend, r.method), 1.0
        )
        r.speedup *= change
        r.median_ms /= change
    b = tmp_path / "b"
    writer = ResultsWriter(b)
    for r in rows:
        writer.append(r)
    (b / ENV_FILE).write_text((a / ENV_FILE).read_text(), encoding="utf-8")
    html = write_report([a, b]).read_text(encoding="utf-8")
    cells = [c for c in _parse(html).cells if c["kind"] == "ratio"]
    faster = [c for c in cells if (c["data-backend"], c["data-method"]) == ("custom", "llm_int8")]
    slower = [c for c in cells if (c["data-backend"], c["data-method"]) == ("torch", "int8_raw")]
    assert faster and slower
    for c in faster:
        assert c["text"].startswith("1.500×") and "faster" in c["text"]
        assert "time B/A 0.667×" in c["text"]
        assert speedup_color(1.5) in c.get("style", "")
    for c in slower:
        assert c["text"].startswith("0.600×") and "slower" in c["text"]
        assert speedup_color(0.6) in c.get("style", "")


# --- the accuracy study and the speed-error frontier ----------------------------------------

STUDY_SIZES = ((768, "125M"), (4096, "6.7B"))
STUDY_ERRORS = {"absmax_torch": 40.0, "llm_int8": 4.0, "smoothquant": 11.0, "fp32": 0.05}


def write_study(run_dir: Path, seeds: int = 3) -> Path:
    """An accuracy study's rows: untimed, one per seed; each seed scales every error alike,
    the 16-bit baseline's included."""
    writer = ResultsWriter(run_dir)
    untimed = dict(median_ms=None, baseline_ms=None, speedup=None, samples=0, tokens=2048)
    for seed in range(seeds):
        for d, _ in STUDY_SIZES:
            base = 1.5e-3 * (1 + 0.1 * seed)
            writer.append(make_row("fp16", "torch", d_model=d, seed=seed, rel_error=base,
                                   baseline_rel_error=base, **untimed))  # fmt: skip
            for method, times in STUDY_ERRORS.items():
                err = base * times * (1 + 0.2 * seed)
                writer.append(make_row(method, "torch" if method == "fp32" else "reference",
                                       d_model=d, seed=seed, rel_error=err,
                                       baseline_rel_error=base, **untimed))  # fmt: skip
    (run_dir / ENV_FILE).write_text(json.dumps({"command": f"kernelbench accuracy {EVIL}"}))
    return run_dir


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> tuple[Path, str]:
    run = write_study(tmp_path_factory.mktemp("study"))
    path = write_report([run])
    return run, path.read_text(encoding="utf-8")


def test_accuracy_section_cells_are_the_seeds_median_ratio(study):
    run, html = study
    p = _parse(html)
    assert "section-accuracy" in p.classes
    cells = {
        (c["data-method"], int(c["data-d-model"])): c for c in p.cells if c["kind"] == "accuracy"
    }
    for d, _ in STUDY_SIZES:
        for method, times in STUDY_ERRORS.items():
            # ratio per seed: times * (1 + 0.2 seed); median over seeds 0, 1, 2: times * 1.2
            c = cells[(method, d)]
            assert float(c["data-value"]) == pytest.approx(times * 1.2, rel=1e-12)
            assert c["text"].startswith(f"{times * 1.2:.3g}×")
            assert f"{times:.3g}–{times * 1.4:.3g}" in c["text"]  # the seeds' range
        assert float(cells[("fp16", d)]["data-value"]) == pytest.approx(1.5e-3 * 1.1)
    # Table 1's perplexity beside the sizes it has, as orientation
    assert "ppl 87.76" in cells[("absmax_torch", 768)]["text"]
    assert "ppl 13.24" in cells[("llm_int8", 4096)]["text"]
    assert "ppl" not in cells[("smoothquant", 768)]["text"]
    assert "model-level" in html
    # one figure (error vs size), and no empty timed sections for an untimed run
    assert len(p.images) == 1 and "Accuracy study: error vs model size" in html
    assert "section-app-d1" not in p.classes and "no successful rows" not in html
    assert EVIL not in html


def test_timed_run_has_no_accuracy_section_but_a_frontier(single):
    _, html = single
    p = _parse(html)
    assert "section-accuracy" not in p.classes and 'href="#accuracy"' not in html
    assert "Speed against error" in html


def test_frontier_points_are_speedup_against_error_ratio():
    from kernelbench.report import plots

    rows = [make_row("fp16", "torch", rel_error=2e-3, baseline_rel_error=2e-3, speedup=1.0)]
    rows += [make_row("llm_int8", "custom", rel_error=8e-3, baseline_rel_error=2e-3, speedup=1.7)]
    df = pd.DataFrame([dataclasses.asdict(r) for r in rows])
    fig = plots.speed_error_frontier(df, "ffn1", 8)
    assert fig is not None and fig.svg.startswith("<svg")
    # no error or no baseline error: nothing to place
    assert plots.speed_error_frontier(df.assign(baseline_rel_error=None), "ffn1", 8) is None
    assert plots.speed_error_frontier(df[df["method"] == "fp16"], "ffn1", 8) is None
    # fp32 is shown as absolute time, never as a speedup: no point of its own
    fp32 = make_row("fp32", "torch", rel_error=1e-7, baseline_rel_error=2e-3, speedup=0.4)
    df32 = pd.DataFrame([dataclasses.asdict(r) for r in (rows[0], fp32)])
    assert plots.speed_error_frontier(df32, "ffn1", 8) is None


def test_log_axes_read_as_plain_numbers():
    """mathtext is off in report figures: the default 10^k labels would print as markup."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from kernelbench.report import plots

    for lo, hi, want in ((1e-7, 0.2, {"1e-07", "0.001", "0.1"}), (1e-3, 0.05, {"0.002", "0.01"})):
        fig = Figure()
        FigureCanvasAgg(fig)
        ax = fig.subplots()
        ax.plot([1, 2], [lo, hi])
        with plots._style():
            plots._numeric_log_axis(ax, "y")
            fig.canvas.draw()
            labels = {t.get_text() for t in ax.get_yticklabels() if t.get_text()}
        assert want <= labels, labels
        assert not any("$" in t or "mathdefault" in t for t in labels)


def _ab_runs(tmp_path: Path) -> tuple[Path, Path]:
    """A and B of one machine class, every ok row paired with a ±2% interval. B ran 1.25x faster
    in time everywhere, its 16-bit baseline too (a quiet machine against a loaded one: the same
    speedups), except two pairs whose speedup over 16-bit moved: custom llm_int8 gained 1.5x
    (faster), torch int8_raw kept 0.6x of its speedup (slower)."""
    change = {("custom", "llm_int8"): 1.5, ("torch", "int8_raw"): 0.6}
    runs = []
    for name, faster in (("a", 1.0), ("b", 1.25)):
        writer = ResultsWriter(tmp_path / name)
        for r in make_rows(faster):
            if r.status == "ok":
                c = change.get((r.backend, r.method), 1.0) if name == "b" else 1.0
                r.speedup *= c
                r.median_ms /= c
                r.paired, r.speedup_lo, r.speedup_hi = True, r.speedup * 0.98, r.speedup * 1.02
            writer.append(r)
        runs.append(tmp_path / name)
    return runs[0], runs[1]


def test_ab_plot_shows_the_speedup_ratio_its_verdict_judges(tmp_path, monkeypatch):
    """The A/B figure draws B's speedup over 16-bit divided by A's (1.5 faster, 0.6 slower, 1.0
    for the pairs that only ran on a quieter machine, whose time ratio is 0.8), its axis says
    so, and its bars (the verdict's noise band) leave out 1 exactly for the faster and the
    slower pair."""
    from matplotlib.collections import LineCollection
    from matplotlib.colors import to_hex

    from kernelbench.report import plots

    figures = []
    encode = plots._encode
    monkeypatch.setattr(plots, "_encode", lambda fig: figures.append(fig) or encode(fig))
    a, b = _ab_runs(tmp_path)
    html = write_report([a, b]).read_text(encoding="utf-8")
    assert len(figures) == 1
    assert "Speedup over 16-bit, B / A" in html and "Time ratio B / A" not in html
    want = {("custom", "llm_int8"): 1.5, ("torch", "int8_raw"): 0.6}
    seen = set()
    for ax in figures[0].axes:
        backend = ax.get_title().removeprefix("backend ")
        assert ax.get_ylabel() == "speedup over 16-bit, B / A"
        method_of = {}
        for line in ax.get_lines():
            if line.get_label().startswith("_"):  # the dotted line at 1
                continue
            method = line.get_label()
            method_of[to_hex(line.get_color())] = method
            expected = want.get((backend, method), 1.0)
            assert list(line.get_ydata()) == pytest.approx([expected] * 3), (backend, method)
            seen.add((backend, method))
        bars = [c for c in ax.collections if isinstance(c, LineCollection)]
        assert len(bars) == len(method_of)  # one set of bars per method line
        for c in bars:
            method = method_of[to_hex(c.get_colors()[0])]
            for (_, lo), (_, hi) in c.get_segments():
                if (backend, method) == ("custom", "llm_int8"):
                    assert lo > 1.0
                elif (backend, method) == ("torch", "int8_raw"):
                    assert hi < 1.0
                else:
                    assert lo < 1.0 < hi
    assert set(want) <= seen and ("torch", "fp16") not in seen  # the baseline: the line at 1


def test_paired_band_leaves_out_one_exactly_where_the_verdict_finds_a_change(tmp_path):
    from kernelbench.report import data, tables
    from kernelbench.results.schema import KEY_COLUMNS

    a, b = (data.load_run(p) for p in _ab_runs(tmp_path))
    pairs = tables.paired(a.ok, b.ok, list(KEY_COLUMNS))
    assert len(pairs) == 48 and pairs["speedup_ratio_lo"].notna().all()
    clear = (pairs["speedup_ratio_lo"] > 1) | (pairs["speedup_ratio_hi"] < 1)
    assert list(clear) == list(pairs["verdict"].isin(["faster", "slower"]))
    assert set(pairs["verdict"]) == {"faster", "slower", "same"}
    assert pairs["ratio"].min() == pytest.approx(0.8 / 1.5)  # time B/A moved everywhere
    # a spread not measured (one sample, no interval): no band
    thin = b.ok.assign(samples=1, speedup_lo=None, speedup_hi=None, paired=False)
    assert tables.paired(a.ok, thin, list(KEY_COLUMNS))["speedup_ratio_lo"].isna().all()


def _svg_texts(html: str) -> list[str]:
    return [t.strip() for t in re.findall(r"<text\b[^>]*>([^<]*)</text>", html) if t.strip()]


def test_figures_and_captions_explain_only_what_they_show(single, tmp_path):
    """Legends and captions name what is drawn: the paper's crosses, the interval bars and the
    outlier stage only where there are some; the 16-bit baseline once, in black, never also as
    a method of its own colour."""
    texts, html = _svg_texts(single[1]), unescape(single[1])  # the paper's cell, no intervals
    assert "method (x: paper)" in texts and "crosses: the paper's App. D.1 figure" in html
    assert '"paper x" under a number' in html and "'paper x', the paper's" in html
    assert "outlier_product" in texts
    assert "bars: 95% interval" not in html  # no row has an interval
    assert "S suspect" not in html and "! interval wider" not in html  # no row is either
    assert not [t for t in texts if t == "fp16" or t.endswith("· fp16")], "fp16 drawn as a method"
    assert "16-bit baseline" in texts and "16-bit weights" in texts

    writer = ResultsWriter(tmp_path / "run")
    for r in make_rows():
        if r.status == "ok":
            r.paper_speedup = None
            r.stages_ms = {k: v for k, v in (r.stages_ms or {}).items() if k != "outlier_product"}
            r.paired, r.speedup_lo, r.speedup_hi = True, 0.9 * r.speedup, 1.1 * r.speedup
        writer.append(r)
    page = write_report([tmp_path / "run"]).read_text(encoding="utf-8")
    texts, html = _svg_texts(page), unescape(page)
    assert "method" in texts and "method (x: paper)" not in texts
    assert "paper x" not in html and "crosses" not in html
    assert "outlier_product" not in texts
    assert "bars: 95% interval of each speedup" in html
    assert "! interval wider than the run's target" in html  # ±10% against a 5% target


def test_a_backend_with_only_the_baseline_gets_no_empty_panel(tmp_path):
    """torch ran only the 16-bit baseline, with no baseline error recorded: the error figure
    has no empty torch panel (matplotlib would warn of a legend with nothing in it)."""
    import warnings

    from conftest import make_row

    writer = ResultsWriter(tmp_path)
    writer.append(make_row("fp16", "torch"))
    writer.append(make_row("llm_int8", "custom", median_ms=0.5))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        html = write_report([tmp_path]).read_text(encoding="utf-8")
    assert not [w for w in caught if "No artists with labels" in str(w.message)]
    texts = _svg_texts(html)
    assert "backend custom" in texts and "backend torch" not in texts
    assert "Error vs model dimension" in html


def test_a_cold_decode_row_shows_its_share_at_the_bus_beside_the_share_at_the_peak(tmp_path):
    from kernelbench.core import work_bytes
    from kernelbench.report.tables import tops_grids
    from kernelbench.results.schema import write_env
    from kernelbench.results.view import load_view

    ms = work_bytes("llm_int8", 1, 768, 3072) / 40e9 * 1e3  # 40 GB/s of weights
    writer = ResultsWriter(tmp_path)
    writer.append(make_row("fp16", "torch", tokens=1, cache="cold"))
    read = dict(median_ms=ms, raw_ms=[ms] * 3, bus_gbps=[50.0] * 3)
    writer.append(make_row("llm_int8", "custom", tokens=1, cache="cold", **read))
    peak = {
        "int8": {"tops": 100.0, "source": "measured"},
        "bandwidth": {"gbs": 80.0, "source": "measured"},
    }
    write_env(tmp_path, {"peak": peak})
    view = load_view(tmp_path)
    (grid,) = [g for g in tops_grids(view[view["status"] == "ok"], peak) if "custom" in g.title]
    notes = [c.note for r in grid.rows for c in r.cells if c.note]
    assert notes == ["50% of roofline (80% at the bus)"]
    assert "at the bus" in grid.caption
