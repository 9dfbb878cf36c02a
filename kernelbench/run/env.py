"""The machine, versions and command a run came from (``env.json``) and its device class.

Reads the machine and installed versions only: no backend and no kernel extension is imported
here. What the kernels chose at run time (e.g. the CPU kernel set) is passed in by the caller.
"""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import os
import platform
import socket
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import torch

from kernelbench import __version__

INT8_FLAGS = (
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512_vnni",
    "avx512_bf16",
    "avx_vnni",
    "amx_int8",
    "amx_bf16",
)
PEERS = ("bitsandbytes", "torchao", "triton", "numpy", "pandas")


def cpu_info(kernel_isa: str | None = None, huge_pages: str | None = None) -> dict:
    """The CPU's model, int8-relevant flags and cores; ``kernel_isa`` is the kernel set the
    ``custom`` CPU kernels run (``kernelbench.kernels.cpu_ext.isa()``) and ``huge_pages`` the
    system's transparent huge page setting their packed weights get
    (``cpu_ext.huge_page_setting()``), each recorded when the caller knows it."""
    model, flags = platform.processor() or "unknown", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and model in ("unknown", "", "x86_64"):
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return {
        "model": model,
        "flags": sorted(f for f in INT8_FLAGS if f in flags),
        "cores": os.cpu_count(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "kernel_isa": kernel_isa,
        "huge_pages": huge_pages,
        "identity": cpu_identity(),
    }


#: /proc/cpuinfo fields that identify the processor (env.json ``cpu.identity``).
IDENTITY_FIELDS = {
    "vendor_id": "vendor",
    "cpu family": "family",
    "model": "model",
    "stepping": "stepping",
    "microcode": "microcode",
}
SYSFS_CPU = Path("/sys/devices/system/cpu")


def cpu_identity(cpuinfo: str | None = None, sysfs: Path = SYSFS_CPU) -> dict:
    """What identifies the processor beyond its name: vendor, family, model, stepping and
    microcode (first processor of ``/proc/cpuinfo``, each where readable) and the cache sizes
    of cpu0 from sysfs (``{"L1d": "48K", "L2": "1024K", "L3": "32768K", ...}``). Two machines
    of one device class with different identities are not comparable
    (:mod:`kernelbench.results.compare`)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    ident: dict = {}
    for line in cpuinfo.splitlines():
        if not line.strip():
            if ident:
                break  # the first processor only
            continue
        name, _, value = line.partition(":")
        key = IDENTITY_FIELDS.get(name.strip())
        if key is not None and key not in ident:
            ident[key] = value.strip()
    caches = {}
    for index in sorted(sysfs.glob("cpu0/cache/index*")):
        try:
            level = (index / "level").read_text().strip()
            kind = (index / "type").read_text().strip()
            size = (index / "size").read_text().strip()
        except OSError:
            continue
        suffix = {"Data": "d", "Instruction": "i"}.get(kind, "")
        caches[f"L{level}{suffix}"] = size
    if caches:
        ident["caches"] = caches
    return ident


def device_class(device: torch.device) -> str:
    """Groups results that can be compared: ``cpu-<isa>-<cores>core`` or ``cuda-<gpu name>``."""
    device = torch.device(device)
    if device.type == "cuda":
        return f"cuda-{torch.cuda.get_device_name(device)}"
    info = cpu_info()
    flags = set(info["flags"])
    isa = (
        "amx"
        if "amx_int8" in flags
        else "avx512vnni"
        if "avx512_vnni" in flags
        else ("avx2" if "avx2" in flags else "generic")
    )
    return f"cpu-{isa}-{info['cores']}core"


#: Dense tensor-core peaks from vendor datasheets (TOPS / TFLOP/s), by a substring of the GPU
#: name; see ../shared/paper/tables.md. Reports mark them as datasheet values, not measured.
DATASHEET_PEAKS = {
    "H200": {"int8": 1979.0, "16bit": 989.0},
    "H100": {"int8": 1979.0, "16bit": 989.0},
    "A100": {"int8": 624.0, "16bit": 312.0},
}


def datasheet_peaks(device: torch.device) -> dict:
    """``{"int8"|"16bit": {"tops", "source": "datasheet", "note"}}`` for known GPUs, else {}."""
    if torch.device(device).type != "cuda":
        return {}
    name = torch.cuda.get_device_name(device)
    for key, peaks in DATASHEET_PEAKS.items():
        if key in name:
            return {
                kind: {
                    "tops": tops,
                    "source": "datasheet",
                    "note": f"{key} SXM dense, vendor datasheet",
                }
                for kind, tops in peaks.items()
            }
    return {}


def cuda_info(device: torch.device) -> dict | None:
    if torch.device(device).type != "cuda" or not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(device)
    info = {
        "device": props.name,
        "capability": f"{props.major}.{props.minor}",
        "sms": props.multi_processor_count,
        "memory_bytes": props.total_memory,
        "l2_bytes": getattr(props, "L2_cache_size", None),
        "cuda_runtime": torch.version.cuda,
    }
    try:
        out = subprocess.run(
            [
                "nvidia-smi",
                "--query-gpu=driver_version,clocks.sm,clocks.mem,clocks.max.sm",
                "--format=csv,noheader,nounits",
            ],
            capture_output=True,
            text=True,
            timeout=20,
        )
        driver, sm, mem, sm_max = (v.strip() for v in out.stdout.splitlines()[0].split(","))
        info.update(driver=driver, sm_clock_mhz=sm, mem_clock_mhz=mem, sm_clock_max_mhz=sm_max)
    except (OSError, IndexError, ValueError, subprocess.SubprocessError):
        info["driver"] = None
    return info


def git_commit(package_dir: Path | None = None) -> str | None:
    """The commit of the source tree this package (``package_dir``, by default the directory
    of this module) runs from, or ``None`` when unknown.

    ``KERNELBENCH_GIT_COMMIT`` wins when set (scripts that installed the package from a checkout
    pass its commit). Otherwise only a source checkout counts: an installed package sitting
    inside some other git repository (a pyenv or a dotfiles tree) must not report that
    repository's commit, so the repository must hold this very file as ``kernelbench/``. An
    installed package (no checkout) reports the commit its build recorded in ``BUILD_COMMIT_FILE``
    (written by CMakeLists.txt when it was built from a checkout)."""
    pinned = os.environ.get("KERNELBENCH_GIT_COMMIT", "").strip()
    if pinned:
        return pinned
    here = (package_dir or Path(__file__).parents[1]).resolve()
    return _checkout_commit(here) or _build_commit(here)


#: Written into the package at build time: the commit it was built from (empty: unknown).
BUILD_COMMIT_FILE = "build_commit.txt"


def _build_commit(package_dir: Path) -> str | None:
    try:
        text = (package_dir / BUILD_COMMIT_FILE).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    commit = text.removesuffix("-dirty")
    ok = len(commit) == 40 and all(c in "0123456789abcdef" for c in commit)
    return text if ok else None


def _checkout_commit(here: Path) -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--show-toplevel", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            cwd=here,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    lines = out.stdout.split()
    if out.returncode != 0 or len(lines) != 2:
        return None
    toplevel, commit = lines
    return commit if (Path(toplevel) / "kernelbench").resolve() == here else None


#: Environment variables that change what a run measures: thread counts and placement
#: (OpenMP), the instruction sets and kernels torch and its libraries pick, the allocator and
#: its settings, CUDA's behaviour. env.json records those set (``environment``); kernelbench's
#: own (the peak cache, plugin files, the commit) show in what env.json records of them.
MEASURED_ENV_PREFIXES = (
    "OMP_", "KMP_", "GOMP_", "MKL_", "ONEDNN_", "DNNL_", "ATEN_", "TORCH_", "PYTORCH_",
    "CUDA_", "CUBLAS", "NVIDIA_TF32", "MALLOC_", "GLIBC_TUNABLES", "LD_PRELOAD",
)  # fmt: skip


def measured_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables of ``environ`` (the process's) that change what a run measures."""
    environ = os.environ if environ is None else environ
    return {k: environ[k] for k in sorted(environ) if k.startswith(MEASURED_ENV_PREFIXES)}


def library_versions() -> dict[str, str]:
    versions = {}
    for name in PEERS:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return versions


def collect(
    device: torch.device,
    argv: list[str],
    extra: dict | None = None,
    kernel_isa: str | None = None,
    huge_pages: str | None = None,
) -> dict:
    """``env.json``: command, machine, versions, device; ``extra`` is merged in last."""
    from kernelbench.results.schema import SCHEMA_VERSION

    env = {
        "schema_version": SCHEMA_VERSION,
        "command": " ".join(["kernelbench", *argv]),
        "argv": argv,
        "started_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "kernelbench": __version__,
        "git_commit": git_commit(),
        "device": str(device),
        "device_class": device_class(device),
        "cpu": cpu_info(kernel_isa, huge_pages),
        "threads": torch.get_num_threads(),
        "environment": measured_environment(),
        "cuda": cuda_info(device),
        "libraries": library_versions(),
        "peak": datasheet_peaks(device),
    }
    env.update(extra or {})
    return env
