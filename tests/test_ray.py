"""The ``ray`` executor on a real local Ray cluster: two nodes of one CPU each, advertised on
127.0.0.1, started once for the module and shut down by the fixture's finalizer.

The same tiny sweep runs through ``local`` and ``ray``: same row keys and statuses; ``done``
keys are skipped (``--resume``); a worker killed mid-cell is retried and nothing is lost or
duplicated; a worker that keeps dying gives one ``failed`` row per pair; ^C cancels the tasks
still out; a missing Ray is a clear error. Skipped when Ray is not installed (the ``[ray]``
extra), except the missing-Ray test.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

import pytest

from kernelbench.measure.engine import TimerSettings
from kernelbench.run.cases import load_case
from kernelbench.run.executors import get_executor
from kernelbench.run.plan import RunOptions, plan

try:
    import ray
except ImportError:  # pragma: no cover - CI installs the [ray] extra
    ray = None


def _loopback_only() -> bool:
    """True inside a network namespace whose only interface is ``lo``."""
    import socket

    try:
        return [name for _, name in socket.if_nameindex()] == ["lo"]
    except OSError:
        return False


# Ray 2.60 opens its ports on every interface whatever address it is given, and on this
# project's VMs a Ray started beside other interfaces was seen to hang in its GCS connection.
# The cluster tests therefore run only where the network namespace has loopback alone: CI runs
# the suite under `unshare -n` (.ci/run); locally, `scripts/run_isolated.sh pytest -q`.
needs_ray = pytest.mark.skipif(
    ray is None or not _loopback_only(),
    reason="ray is not installed (pip install 'llmint8-kernelbench[ray]')"
    if ray is None
    else "Ray cluster tests run only in a loopback-only network namespace "
    "(scripts/run_isolated.sh pytest -q; CI does this)",
)

FAST = TimerSettings(budget_s=0.05, warmup_s=0.0, min_samples=1)


def _opts(tokens=(16,)) -> RunOptions:
    return RunOptions(
        case="gpt3",
        sizes=(768,),
        tokens=tokens,
        backends=("torch", "custom"),
        methods=("fp16", "int8_raw", "llm_int8"),
        device="cpu",
        timer=FAST,
        stage_timer=TimerSettings(budget_s=0.02, warmup_s=0.0, min_samples=1),
        error_rows=16,
        rounds=1,
    )


def _sweep(executor, opts, done=frozenset()):
    case = load_case(opts.case)
    return [row for _, row in executor.run(plan(case, opts), case, opts, set(done))]


def _keys(rows) -> dict:
    keys = [r.key() for r in rows]
    assert len(keys) == len(set(keys)), "duplicate rows"
    return {r.key(): r.status for r in rows}


#: Past this a test is taken to hang. A guard against hangs, not a speed limit: the resume test
#: takes 7 s on an idle 2-vCPU VM and 98 s beside two busy-looping processes (over 150 s within
#: the full suite there).
HANG_S = 600


@contextlib.contextmanager
def _deadline(seconds: int):
    """Nothing here may hang the suite: past ``seconds`` a TimeoutError is raised (SIGALRM)."""
    if not hasattr(signal, "SIGALRM"):
        yield
        return

    def expire(signum, frame):
        raise TimeoutError(f"tests/test_ray.py: over {seconds} s")

    old = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.fixture(autouse=True)
def _per_test_deadline():
    with _deadline(HANG_S):
        yield


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    node = {"num_cpus": 1, "node_ip_address": "127.0.0.1", "object_store_memory": 80 * 2**20}
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # hooks defined here
    c = Cluster()
    cwd = os.getcwd()
    try:
        # As ray_executor.connect does: from a source checkout, workers would otherwise import
        # its kernelbench/ (Ray puts the driver's cwd first on their sys.path).
        os.chdir(tempfile.gettempdir())
        with _deadline(HANG_S):
            c.add_node(**node, include_dashboard=False)  # the head
            c.add_node(**node)
            ray.init(
                address=c.address,
                _node_ip_address="127.0.0.1",
                include_dashboard=False,
                log_to_driver=False,
            )
        os.chdir(cwd)
        yield c
    finally:
        os.chdir(cwd)
        ray.shutdown()
        c.shutdown()
        ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def local_rows():
    return _sweep(get_executor("local"), _opts((16, 32)))


def _ray(**kw):
    return get_executor("ray", address=None, **kw)


# --- hooks run in the Ray workers (pickled by value) ---------------------------------------


def _crash_once(marker: Path):
    def hook(item):
        if item.tokens == 16 and not marker.exists():
            marker.write_text(str(os.getpid()))
            os._exit(1)

    return hook


def _always_crash(item):
    if item.tokens == 16:
        os._exit(1)


def _slow_32(item):
    if item.tokens == 32:
        time.sleep(60)


# --- tests ----------------------------------------------------------------------------------


@needs_ray
def test_ray_matches_local_and_resumes(cluster, local_rows):
    local = _keys(local_rows)
    assert set(local.values()) >= {"ok", "skipped"}  # custom has no fp16: a skipped row
    got = _keys(_sweep(_ray(), _opts((16, 32))))
    assert got == local
    # --resume: (key, round) in done are not measured again, the rest are
    skipped = set(list(local)[::2])
    resumed = _keys(_sweep(_ray(), _opts((16, 32)), {(k, 0) for k in skipped}))
    assert set(resumed) == set(local) - skipped


@needs_ray
def test_worker_killed_mid_cell_is_retried(cluster, local_rows, tmp_path, monkeypatch):
    from kernelbench.run import ray_executor

    marker = tmp_path / "crashed"
    monkeypatch.setattr(ray_executor, "_before_measure", _crash_once(marker))
    got = _keys(_sweep(_ray(max_retries=2), _opts((16, 32))))
    assert marker.exists(), "the hook never killed a worker"
    assert got == _keys(local_rows)  # nothing lost, nothing duplicated, no failed rows


@needs_ray
def test_worker_that_keeps_dying_gives_failed_rows(cluster, local_rows, monkeypatch):
    from kernelbench.run import ray_executor

    monkeypatch.setattr(ray_executor, "_before_measure", _always_crash)
    rows = _sweep(_ray(max_retries=1), _opts((16, 32)))
    got = _keys(rows)
    assert set(got) == set(_keys(local_rows))  # same keys, incl. the device class
    failed = [r for r in rows if r.tokens == 16]
    assert failed and all(r.status == "failed" for r in failed)
    assert all("WorkerCrashedError after 2 attempt(s)" in r.reason for r in failed)
    assert all(r.status != "failed" for r in rows if r.tokens == 32)


@needs_ray
def test_interrupt_cancels_remaining_tasks(cluster, monkeypatch):
    from kernelbench.run import ray_executor

    monkeypatch.setattr(ray_executor, "_before_measure", _slow_32)
    executor = _ray()
    opts = _opts((16, 32))
    case = load_case(opts.case)
    gen = executor.run(plan(case, opts), case, opts, set())
    item, _ = next(gen)
    assert item.tokens == 16
    with pytest.raises(KeyboardInterrupt):
        gen.throw(KeyboardInterrupt)
    assert len(executor.cancelled) == 1
    with pytest.raises((ray.exceptions.TaskCancelledError, ray.exceptions.WorkerCrashedError)):
        ray.get(executor.cancelled[0], timeout=30)


@needs_ray
def test_collect_cluster_env(cluster):
    import torch

    from kernelbench.run.env import device_class
    from kernelbench.run.ray_executor import collect_cluster_env

    hosts = collect_cluster_env(None, "cpu")["hosts"]
    assert len(hosts) == 1  # two nodes, one host and one device class
    assert hosts[0]["device_class"] == device_class(torch.device("cpu"))
    assert hosts[0]["threads"] == 1 and hosts[0]["torch"] == torch.__version__


def test_missing_ray_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    monkeypatch.delitem(sys.modules, "kernelbench.run.ray_executor", raising=False)
    with pytest.raises(ValueError, match=r"pip install 'llmint8-kernelbench\[ray\]'"):
        get_executor("ray", address=None)
    with pytest.raises(ImportError, match=r"llmint8-kernelbench\[ray\]"):
        from kernelbench.run.ray_executor import RayExecutor  # noqa: F401
