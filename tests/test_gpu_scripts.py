"""The GPU-window scripts that can be checked without a GPU: the prebuilt-module manifest
(scripts/gpu_prebuilt.py) and the shell scripts' syntax."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "scripts"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


gpu_prebuilt = _load("gpu_prebuilt")
EXT = sysconfig.get_config_var("EXT_SUFFIX")


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A fake checkout (module sources) and a fake prebuilt folder with both modules."""
    src = tmp_path / "src"
    (src / "csrc").mkdir(parents=True)
    (src / "cmake").mkdir()
    (src / "csrc" / "a.cu").write_text("__global__ void k() {}\n")
    (src / "cmake" / "cuda.cmake").write_text("# flags\n")
    (src / "CMakeLists.txt").write_text("project(x)\n")
    pre = tmp_path / "pre" / "kernelbench"
    pre.mkdir(parents=True)
    for name in gpu_prebuilt.MODULES:
        (pre / f"{name}{EXT}").write_bytes(name.encode() * 100)
    gpu_prebuilt.write(pre.parent, EXT, "cpython-3xx", "13.0", root=src)
    return tmp_path


def test_manifest_matches_what_was_built(tree: Path) -> None:
    man = json.loads((tree / "pre" / gpu_prebuilt.MANIFEST).read_text())
    assert set(man["modules"]) == {f"{n}{EXT}" for n in gpu_prebuilt.MODULES}
    assert man["cuda"] == "13.0" and man["ext_suffix"] == EXT
    assert gpu_prebuilt.problems(tree / "pre", root=tree / "src", torch_cuda="13.0") == []


def test_a_changed_module_is_caught(tree: Path) -> None:
    (tree / "pre" / "kernelbench" / f"_cuda{EXT}").write_bytes(b"tampered")
    found = gpu_prebuilt.problems(tree / "pre", root=tree / "src")
    assert any("SHA-256" in p for p in found)


def test_a_source_edit_after_the_build_is_caught(tree: Path) -> None:
    (tree / "src" / "csrc" / "a.cu").write_text("__global__ void k2() {}\n")
    found = gpu_prebuilt.problems(tree / "pre", root=tree / "src")
    assert any("changed since the build" in p for p in found)


def test_another_python_or_cuda_major_is_caught(tree: Path) -> None:
    path = tree / "pre" / gpu_prebuilt.MANIFEST
    man = json.loads(path.read_text())
    man["ext_suffix"] = ".cpython-399-x86_64-linux-gnu.so"
    path.write_text(json.dumps(man))
    found = gpu_prebuilt.problems(tree / "pre", root=tree / "src", torch_cuda="12.8")
    assert any("this Python loads" in p for p in found)
    assert any("torch uses CUDA 12.8" in p for p in found)


def test_missing_or_broken_manifest_is_a_reason(tree: Path) -> None:
    path = tree / "pre" / gpu_prebuilt.MANIFEST
    path.write_text("{not json")
    assert "not a manifest" in gpu_prebuilt.problems(tree / "pre", root=tree / "src")[0]
    path.unlink()
    assert gpu_prebuilt.problems(tree / "pre", root=tree / "src") == [f"no {path}"]


def test_verify_installs_only_a_matching_build(tree: Path, monkeypatch) -> None:
    monkeypatch.setattr(gpu_prebuilt, "ROOT", tree / "src")
    monkeypatch.setattr(gpu_prebuilt, "_torch_cuda", lambda: None)
    dest = tree / "install"
    dest.mkdir()
    pre = str(tree / "pre")
    assert gpu_prebuilt.main(["verify", pre, "--install", str(dest)]) == 0
    assert sorted(p.name for p in dest.iterdir()) == sorted(
        f"{n}{EXT}" for n in gpu_prebuilt.MODULES
    )
    shutil.rmtree(dest)
    dest.mkdir()
    (tree / "pre" / "kernelbench" / f"_cutlass{EXT}").unlink()
    assert gpu_prebuilt.main(["verify", pre, "--install", str(dest)]) == 1
    assert list(dest.iterdir()) == []


def test_write_refuses_a_partial_build(tmp_path: Path) -> None:
    (tmp_path / "kernelbench").mkdir()
    (tmp_path / "kernelbench" / f"_cuda{EXT}").write_bytes(b"x")
    with pytest.raises(SystemExit, match="_cutlass"):
        gpu_prebuilt.write(tmp_path, EXT, "t", "13.0")


@pytest.mark.parametrize(
    "script",
    [
        "gpu_check.sh",
        "prebuild_gpu.sh",
        "fetch_gpu_wheels.sh",
        "carried_size.sh",
        "check_cuda_build.sh",
    ],
)
def test_shell_scripts_parse(script: str) -> None:
    if not (SCRIPTS / script).exists():
        pytest.skip(f"{script} not present")
    subprocess.run(["bash", "-n", str(SCRIPTS / script)], check=True)


kernel_workload = _load("kernel_workload")


def test_workload_walks_every_case_of_a_cpu_backend(capsys) -> None:
    assert kernel_workload.main(["--device", "cpu", "--backends", "custom"]) == 0
    out = capsys.readouterr().out
    cases = len(kernel_workload.SHAPES) * 3 * 2  # shapes x methods x dtypes
    assert out.count("custom ") == cases
    assert "0 case(s) failed" in out


class _Broken:
    """A backend whose runner fails: with a plain error (counted) or an InputError (listed)."""

    def __init__(self, exc: Exception) -> None:
        self.exc = exc

    def availability(self, device):
        from kernelbench.backends.base import Availability

        return Availability.yes()

    def supports(self, *args):
        return self.availability(None)

    def runner(self, *args, **kwargs):
        raise self.exc


def test_workload_counts_failures_but_not_refusals(monkeypatch, capsys) -> None:
    from kernelbench.checks import InputError

    monkeypatch.setattr(kernel_workload, "get_backend", lambda name: _Broken(InputError("no")))
    assert kernel_workload.main(["--device", "cpu", "--backends", "x"]) == 0
    assert "refused: no" in capsys.readouterr().out
    monkeypatch.setattr(kernel_workload, "get_backend", lambda name: _Broken(RuntimeError("bad")))
    assert kernel_workload.main(["--device", "cpu", "--backends", "x"]) == 1
    assert f"{len(kernel_workload.SHAPES) * 6} case(s) failed" in capsys.readouterr().out
