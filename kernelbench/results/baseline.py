"""Kept baselines: one run per processor of a machine class, under
``reports/baselines/<device_class>/<processor>/`` (``<processor>``: vendor-family-model-stepping,
:func:`~kernelbench.results.compare.processor_key`).

One class name covers hosts that are not comparable (two processors sold as one VM type, peaks
2x apart), so each keeps its own baseline; a run that records no processor identity (a GPU run,
an older run) keeps the class folder itself, ``reports/baselines/<device_class>/``.

:func:`update_baseline` copies a run's ``results.jsonl`` and ``env.json`` there (byte for byte,
each replaced atomically), after checking the run is one a gate can compare against: readable,
complete, one device class, no failed rows (unless forced). :func:`find_baseline` returns the
folder ``kernelbench compare`` should use as BASE for a device class and processor.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path

from kernelbench.results.compare import processor_key
from kernelbench.results.schema import ENV_FILE, RESULTS_FILE, SchemaError, read_run_rows

DEFAULT_DIR = Path("reports/baselines")
#: Beside a baseline: the speed tolerance measured on its rounds (``scripts/gate_noise.py``),
#: which ``scripts/ci_gate.sh`` uses instead of its default.
GATE_FILE = "gate.json"


class BaselineError(ValueError):
    """A run that cannot become a baseline (the message says why)."""


def sanitize(device_class: str) -> str:
    """A device class as one safe path component: ``cuda-NVIDIA H200`` -> ``cuda-NVIDIA_H200``."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", device_class).strip("._")
    if not name:
        raise BaselineError(f"device class {device_class!r} gives no usable folder name")
    return name


def _run_rows(run_dir: Path) -> list[dict]:
    results = run_dir / RESULTS_FILE
    if not results.is_file():
        raise BaselineError(f"{results}: no such file")
    try:
        return read_run_rows(results, strict=True).rows  # a baseline is a complete run
    except SchemaError as exc:
        raise BaselineError(f"{results}: not usable results ({exc})") from None


def _copy_atomic(src: Path, dest: Path) -> None:
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.")
    os.close(fd)
    try:
        shutil.copyfile(src, tmp)
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def update_baseline(
    run_dir: Path,
    baselines_dir: Path = DEFAULT_DIR,
    name: str | None = None,
    force: bool = False,
) -> Path:
    """Make the run in ``run_dir`` the baseline of its device class and processor; returns the
    folder.

    The folder is ``baselines_dir / sanitize(device_class) / <processor>`` when the run's
    env.json records the processor's identity, else ``baselines_dir / sanitize(device_class)``;
    ``baselines_dir / name`` when ``name`` is given (then :func:`find_baseline` does not find
    it). A run with failed rows is refused unless ``force``; a run spanning several device
    classes is always refused (run each class separately). A run without ``env.json`` replaces
    the baseline's ``env.json`` by nothing, so the two files always come from one run."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise BaselineError(f"{run_dir}: not a run directory")
    rows = _run_rows(run_dir)
    classes = sorted({str(r["device_class"]) for r in rows})
    if len(classes) != 1:
        raise BaselineError(f"{run_dir}: rows of several device classes {classes}; one per run")
    failed = [r for r in rows if r["status"] == "failed"]
    if failed and not force:
        first = failed[0]
        raise BaselineError(
            f"{run_dir}: {len(failed)} failed row(s), e.g. {first['backend']}/{first['method']} "
            f"{first['layer']} d={first['d_model']}: {first.get('reason', '')}; "
            "fix them or force"
        )
    env = run_dir / ENV_FILE
    if name:
        dest = Path(baselines_dir) / sanitize(name)
    else:
        dest = Path(baselines_dir) / sanitize(classes[0])
        processor = processor_key(_read_env(env))
        if processor:
            dest = dest / processor
    dest.mkdir(parents=True, exist_ok=True)
    _copy_atomic(run_dir / RESULTS_FILE, dest / RESULTS_FILE)
    if env.is_file():
        _copy_atomic(env, dest / ENV_FILE)
    else:
        (dest / ENV_FILE).unlink(missing_ok=True)
    return dest


def _read_env(path: Path) -> dict:
    try:
        env = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return env if isinstance(env, dict) else {}


def find_baseline(
    device_class: str, baselines_dir: Path = DEFAULT_DIR, processor: str | None = None
) -> Path | None:
    """The kept baseline folder for ``device_class`` on ``processor`` (a
    :func:`~kernelbench.results.compare.processor_key`), or ``None`` when the class has none.

    The processor's own baseline first; else the class folder's; else another processor's of
    the same class (the first by name). A baseline from another processor still gates the
    errors, and ``compare`` says its speeds are not comparable."""
    try:
        folder = Path(baselines_dir) / sanitize(device_class)
    except BaselineError:
        return None
    if processor:
        own = folder / sanitize(processor)
        if (own / RESULTS_FILE).is_file():
            return own
    if (folder / RESULTS_FILE).is_file():
        return folder
    if not folder.is_dir():
        return None
    others = sorted(p for p in folder.iterdir() if (p / RESULTS_FILE).is_file())
    return others[0] if others else None
