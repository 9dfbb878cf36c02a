"""The ``ray`` executor: one Ray task per work item (cell), on a Ray cluster.

A task owns its device while it times: ``num_gpus=1`` for CUDA sweeps, and for CPU sweeps
``num_cpus`` = the CPU count of the smallest node, with at most one task in flight per node
(spread over the nodes), so two timing tasks do not share a machine on a cluster of equal nodes.
The task calls :func:`kernelbench.run.cell.measure_cell` on the worker, which draws the cell's
inputs from the case and its seed; only the work item, the options, the ``done`` keys and (with
``--activations``) the user's activation tensor, put once in the object store, cross the network.

A task returns all of its cell's rows at once, so the driver never yields partial rows; a worker
that dies mid-task is retried by Ray (``max_retries``, system failures only) and, once retries are
spent, its cell is recorded as ``failed`` rows, one per (backend, method) pair, with the reason.
Rows already in ``done`` (``--resume``) or already yielded are never yielded again. A
``KeyboardInterrupt`` (or closing the generator) cancels the tasks still queued or running.

The package must be installed, at the same version, on every node of the cluster.
"""

from __future__ import annotations

import copy
import os
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import replace

try:
    import ray
    import ray.exceptions
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
except ImportError as _exc:  # get_executor turns this into a CLI error
    raise ImportError(
        f"the ray executor needs Ray ({_exc}); install it with: "
        "pip install 'llmint8-kernelbench[ray]'"
    ) from None

import torch

from kernelbench.results.schema import ResultRow
from kernelbench.run import env as envmod
from kernelbench.run.cases import Case
from kernelbench.run.cell import base_row, measure_cell
from kernelbench.run.plan import (
    CallEstimator,
    RunOptions,
    WorkItem,
    load_user_activations,
    method_pairs,
)

#: Test hook, called with the work item in the worker before it is measured (tests inject a
#: crash through it). Read once per ``run`` on the driver and shipped with each task.
_before_measure: Callable[[WorkItem], None] | None = None

#: Seconds to wait for the small tasks that describe a failed cell or a node's environment.
SMALL_TASK_TIMEOUT_S = 120.0


def _measure_item(item, case, opts, estimator, done, activations, hook, threads):
    if hook is not None:
        hook(item)
    if threads:
        torch.set_num_threads(threads)
    return list(measure_cell(item, case, opts, estimator, done, activations))


def _cell_rows(item: WorkItem, case: Case, opts: RunOptions, done: set) -> list[ResultRow]:
    """The rows ``measure_cell`` would start from for this cell, on this machine, minus ``done``."""
    device = torch.device(opts.device)
    try:
        dclass = envmod.device_class(device)
    except Exception:  # noqa: BLE001 - e.g. a driver without the GPU the workers have
        dclass = f"{device.type}-unknown"
    rows = []
    for backend, method in method_pairs(opts):
        row = base_row(item, case, backend, method, device, dclass)
        if (row.key(), item.round) not in done:
            rows.append(row)
    return rows


def _node_env(device: str, threads: int | None, node: dict) -> dict:
    if threads:
        torch.set_num_threads(threads)
    from kernelbench.kernels import cpu_ext

    info = envmod.collect(
        torch.device(device), [], kernel_isa=cpu_ext.isa(), huge_pages=cpu_ext.huge_page_setting()
    )
    for key in ("command", "argv", "schema_version"):
        info.pop(key, None)
    info.update(node_id=node["NodeID"], node_ip=node["NodeManagerAddress"])
    return info


_measure_remote = ray.remote(_measure_item)
_cell_rows_remote = ray.remote(_cell_rows)
_node_env_remote = ray.remote(_node_env)


def connect(address: str | None = None) -> bool:
    """Connect this process to Ray unless it already is; True when a local Ray was started.

    ``address=None`` starts a local Ray on loopback with this machine's CPUs; otherwise the
    cluster at ``address`` (HOST:PORT, as printed by ``ray start --head``) is joined. Ray shuts
    the connection (and a local Ray) down when the process exits.
    """
    if ray.is_initialized():
        return False
    common = dict(include_dashboard=False, log_to_driver=False, logging_level="warning")
    # Ray puts the driver's working directory first on its workers' sys.path: started from a
    # source checkout, workers would import its kernelbench/ (without the built extensions)
    # instead of the installed package. Start from a neutral directory.
    cwd = os.getcwd()
    os.chdir(tempfile.gettempdir())  # (contextlib.chdir needs Python 3.11)
    try:
        if address:
            ray.init(address=address, **common)
            return False
        ray.init(address="local", num_cpus=os.cpu_count(), _node_ip_address="127.0.0.1", **common)
        return True
    finally:
        os.chdir(cwd)


def _alive_nodes() -> list[dict]:
    return [n for n in ray.nodes() if n.get("Alive")]


def _placement(device: str) -> tuple[dict, int, int | None]:
    """(task options, tasks in flight, torch threads per task) for timing tasks on this cluster."""
    nodes = _alive_nodes()
    if device == "cuda":
        gpus = int(sum(n["Resources"].get("GPU", 0) for n in nodes))
        if gpus < 1:
            raise ValueError("--device cuda: the Ray cluster has no GPU")
        return {"num_gpus": 1}, gpus, None
    cpus = [int(n["Resources"].get("CPU", 0)) for n in nodes]
    cpus = [c for c in cpus if c >= 1]
    if not cpus:
        raise ValueError("the Ray cluster has no node with a CPU to run on")
    per_task = min(cpus)
    return {"num_cpus": per_task, "scheduling_strategy": "SPREAD"}, len(cpus), per_task


def _resolve_device(opts: RunOptions) -> RunOptions:
    if opts.device != "auto":
        return opts
    has_gpu = any(n["Resources"].get("GPU", 0) for n in _alive_nodes())
    return replace(opts, device="cuda" if has_gpu else "cpu")


def _as_row(row) -> ResultRow:
    return row if isinstance(row, ResultRow) else ResultRow(**row)


class RayExecutor:
    """One Ray task per cell; rows streamed back cell by cell as tasks finish."""

    name = "ray"

    def __init__(self, address: str | None = None, max_retries: int = 2, **_: object) -> None:
        self.address = address
        self.max_retries = max(0, int(max_retries))
        self._started_local = False
        self.cancelled: list = []  # refs cancelled by the last interrupted run (for tests)
        self.estimator = CallEstimator()  # fed from finished cells, shipped with later ones

    def learn(self, rows: list[dict]) -> None:
        self.estimator.record_rows(rows)

    def connect(self) -> None:
        self._started_local = connect(self.address) or self._started_local

    def close(self) -> None:
        """Shut down the local Ray this executor started (a joined cluster keeps running)."""
        if self._started_local and ray.is_initialized():
            ray.shutdown()
        self._started_local = False

    def cluster_env(self, device: str | None = None) -> dict:
        self.connect()
        return collect_cluster_env(self.address, device)

    def run(
        self, items: list[WorkItem], case: Case, opts: RunOptions, done: set[tuple]
    ) -> Iterator[tuple[WorkItem, ResultRow]]:
        self.connect()
        opts = _resolve_device(opts)
        method_pairs(opts)  # unknown backends / methods fail here, before anything is sent
        hook = _before_measure
        activations = load_user_activations(opts)
        act_ref = ray.put(activations) if activations is not None else None
        done_ref = ray.put(set(done))
        seen: set[tuple] = set(done)
        estimator = self.estimator
        queue = list(items)
        pending: dict = {}  # ObjectRef -> WorkItem
        self.cancelled = []
        try:
            while queue or pending:
                task_opts, slots, threads = _placement(opts.device)
                while queue and len(pending) < slots:
                    item = queue.pop(0)
                    ref = _measure_remote.options(
                        **task_opts, max_retries=self.max_retries, retry_exceptions=False
                    ).remote(
                        item, case, opts, copy.deepcopy(estimator), done_ref, act_ref, hook, threads
                    )
                    pending[ref] = item
                ready, _ = ray.wait(list(pending), num_returns=1)
                for ref in ready:
                    item = pending.pop(ref)
                    for row in self._rows(ref, item, case, opts, done_ref, task_opts):
                        key = (row.key(), row.round)
                        if key in seen:
                            continue
                        seen.add(key)
                        estimator.record_rows([vars(row)])  # a dataclass: its fields
                        yield item, row
        finally:
            # ^C, an error, or the consumer closing the generator: stop what is still out there.
            for ref in pending:
                try:
                    ray.cancel(ref, force=True)
                    self.cancelled.append(ref)
                except Exception:  # noqa: BLE001 - already finished or gone
                    pass

    def _rows(self, ref, item, case, opts, done_ref, task_opts) -> list[ResultRow]:
        try:
            return [_as_row(r) for r in ray.get(ref)]
        except ray.exceptions.RayTaskError as exc:  # measure_cell itself raised
            cause = exc.cause if exc.cause is not None else exc
            reason = f"{type(cause).__name__}: {cause}"
        except ray.exceptions.RayError as exc:  # worker or node died, retries spent
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            reason = f"{type(exc).__name__} after {self.max_retries + 1} attempt(s): {first}"
        return self._failed_rows(item, case, opts, done_ref, task_opts, reason[:500])

    def _failed_rows(self, item, case, opts, done_ref, task_opts, reason) -> list[ResultRow]:
        """One failed row per (backend, method) of the cell, described by a node of the kind the
        cell runs on (its device class), or by the driver when no node answers."""
        try:
            ref = _cell_rows_remote.options(**task_opts, max_retries=1).remote(
                item, case, opts, done_ref
            )
            rows = [_as_row(r) for r in ray.get(ref, timeout=SMALL_TASK_TIMEOUT_S)]
        except ray.exceptions.RayError:
            rows = _cell_rows(item, case, opts, ray.get(done_ref))
        for row in rows:
            row.status, row.reason = "failed", reason
        return rows


def collect_cluster_env(address: str | None = None, device: str | None = None) -> dict:
    """``{"hosts": [...]}``: :func:`kernelbench.run.env.collect` run on every node of the cluster,
    one entry per (host, device class).

    ``device`` is ``cpu`` or ``cuda``; ``None`` means ``cuda`` on nodes with a GPU, else ``cpu``.
    With ``cuda``, nodes without a GPU are left out. Connects (see :func:`connect`) if this
    process is not connected yet and leaves the connection up for the executor's run.
    """
    connect(address)
    nodes = _alive_nodes()
    cpus = [int(n["Resources"].get("CPU", 0)) for n in nodes]
    threads = min([c for c in cpus if c >= 1], default=None)
    refs = []
    for node in nodes:
        gpus = node["Resources"].get("GPU", 0)
        dev = device if device in ("cpu", "cuda") else ("cuda" if gpus else "cpu")
        if dev == "cuda" and not gpus:
            continue
        task = _node_env_remote.options(
            num_cpus=0,
            num_gpus=0.01 if dev == "cuda" else 0,
            max_retries=1,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False),
        )
        node_info = {"NodeID": node["NodeID"], "NodeManagerAddress": node["NodeManagerAddress"]}
        refs.append(task.remote(dev, threads if dev == "cpu" else None, node_info))
    hosts, seen = [], set()
    for info in ray.get(refs, timeout=SMALL_TASK_TIMEOUT_S):
        key = (info["host"], info["device_class"])
        if key not in seen:
            seen.add(key)
            hosts.append(info)
    return {"hosts": hosts}
