"""Manifest of the prebuilt CUDA modules (``.gpu-prebuilt/``).

``write``: scripts/prebuild_gpu.sh records what it built: the commit, a hash of the sources the
modules come from (so an edit after the build is caught without git), the SHA-256 of each
module, the Python it was built for and the CUDA version.
``verify``: scripts/gpu_check.sh checks all of that against the machine it runs on before it
installs the modules into ``kernelbench/`` (``--install``); any mismatch is named and the exit
status is 1, so that the caller falls back to building on the device.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MANIFEST = "manifest.json"
#: What the modules are built from: a change here makes a prebuilt module stale.
SOURCE_PATHS = ("csrc", "cmake/cuda.cmake", "CMakeLists.txt")
MODULES = ("_cuda", "_cutlass")


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def sources_sha256(root: Path | None = None) -> str:
    """One hash over the module sources: each file's relative path and contents, sorted."""
    root = root or ROOT
    h = hashlib.sha256()
    files: list[Path] = []
    for rel in SOURCE_PATHS:
        p = root / rel
        files.extend(sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else [p])
    for f in sorted(files):
        h.update(f.relative_to(root).as_posix().encode() + b"\0")
        h.update(f.read_bytes() + b"\0")
    return h.hexdigest()


def _git_commit(root: Path) -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True
        )
    except OSError:
        return None
    return out.stdout.strip() or None


def module_files(folder: Path) -> dict[str, Path]:
    """Module name -> its file in ``folder/kernelbench`` (e.g. ``_cuda.cpython-312-...so``)."""
    found = {}
    for name in MODULES:
        hits = sorted((folder / "kernelbench").glob(f"{name}.*.so"))
        if hits:
            found[name] = hits[0]
    return found


def write(
    folder: Path,
    ext_suffix: str,
    cache_tag: str,
    cuda: str,
    root: Path | None = None,
    sources: str | None = None,
) -> dict:
    """Write the manifest; ``sources`` is the sources hash taken before the build started
    (default: now)."""
    mods = module_files(folder)
    missing = [m for m in MODULES if m not in mods]
    if missing:
        raise SystemExit(f"gpu_prebuilt: not built: {', '.join(missing)} (in {folder})")
    manifest = {
        "commit": _git_commit(root or ROOT),
        "sources_sha256": sources or sources_sha256(root),
        "python_cache_tag": cache_tag,
        "ext_suffix": ext_suffix,
        "cuda": cuda,
        "archs": ["sm_80", "sm_90a"],
        "modules": {p.name: file_sha256(p) for p in mods.values()},
    }
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def problems(folder: Path, root: Path | None = None, torch_cuda: str | None = None) -> list[str]:
    """What makes the prebuilt modules in ``folder`` unusable here (empty: usable)."""
    path = folder / MANIFEST
    if not path.is_file():
        return [f"no {path}"]
    try:
        man = json.loads(path.read_text())
        mods = dict(man["modules"])
    except (ValueError, KeyError, TypeError) as exc:
        return [f"{path} is not a manifest: {exc}"]
    found: list[str] = []
    here = sysconfig.get_config_var("EXT_SUFFIX")
    if man.get("ext_suffix") != here:
        found.append(f"built for {man.get('ext_suffix')}, this Python loads {here}")
    if man.get("sources_sha256") != sources_sha256(root):
        found.append("csrc/ or the CMake files changed since the build")
    for name, digest in mods.items():
        f = folder / "kernelbench" / name
        if not f.is_file():
            found.append(f"{name} is missing")
        elif file_sha256(f) != digest:
            found.append(f"{name}: SHA-256 differs from the manifest")
    if {n.split(".")[0] for n in mods} != set(MODULES):
        found.append(f"the manifest lists {sorted(mods)}, expected {list(MODULES)}")
    built_major = str(man.get("cuda", "")).split(".")[0]
    if torch_cuda and built_major != torch_cuda.split(".")[0]:
        found.append(f"built with CUDA {man.get('cuda')}, torch uses CUDA {torch_cuda}")
    return found


def _torch_cuda() -> str | None:
    try:
        import torch
    except ImportError:
        return None
    return torch.version.cuda


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write", help="write FOLDER/manifest.json")
    w.add_argument("folder", type=Path)
    w.add_argument("--ext-suffix", required=True)
    w.add_argument("--cache-tag", required=True)
    w.add_argument("--cuda", required=True)
    w.add_argument("--sources-sha256", help="the sources hash taken before the build")
    sub.add_parser("sources", help="print the hash of the module sources")
    v = sub.add_parser("verify", help="check FOLDER against this machine")
    v.add_argument("folder", type=Path)
    v.add_argument("--install", type=Path, help="copy the modules here when they match")
    args = ap.parse_args(argv)
    if args.cmd == "sources":
        print(sources_sha256())
        return 0
    if args.cmd == "write":
        man = write(
            args.folder, args.ext_suffix, args.cache_tag, args.cuda, sources=args.sources_sha256
        )
        print(json.dumps(man, indent=1))
        return 0
    found = problems(args.folder, torch_cuda=_torch_cuda())
    for p in found:
        print(f"gpu_prebuilt: {p}")
    if found:
        return 1
    print(f"gpu_prebuilt: {args.folder} matches this checkout and Python")
    if args.install:
        for f in module_files(args.folder).values():
            shutil.copy2(f, args.install / f.name)
            print(f"gpu_prebuilt: installed {args.install / f.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
