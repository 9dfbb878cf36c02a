"""Cases: sweep definitions (``cases/*.toml``) and the inputs they generate.

A case names model sizes (``d_model``), layer shapes in terms of d, and activation
distributions. :func:`layer_inputs` draws one layer's inputs (weights, bias, a batch of
activations) from a seed derived from the case seed and the layer (size, layer, distribution),
so every run (and every executor) sees the same inputs; :func:`make_inputs` gives a cell (a
token count of that layer) the first rows of the layer's activations. Every token count of a
layer thus multiplies the same weights (as a model does), and a run can quantize them once.

Distributions:

``gaussian``     x ~ N(0, 1)
``paper-bench``  gaussian with 5 columns set to 8.0 (the benchmark behind Table 5)
``outliers``     App. C Table 4 for the nearest model size: N(0, 1) clipped to [-3.5, 3.5] for
                 regular dims, plus ``dims`` outlier dims whose values, on the given share of
                 positions, follow the table's quartiles (one-sided dims keep the quartiles'
                 sign; the others take a random sign)
``file:<path>``  the user's activations from a ``.pt`` / ``.npy`` file (data only: never
                 unpickled), shape (tokens, d) or (..., d)
"""

from __future__ import annotations

import hashlib
import math
import pickle
import zipfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np
import tomllib
import torch

from kernelbench.checks import InputError
from kernelbench.core import PAPER_LAYER, PAPER_TOKENS

DISTRIBUTIONS = ("outliers", "gaussian", "paper-bench")


@dataclass(frozen=True)
class Size:
    name: str
    label: str
    d_model: int
    outliers: str  # key into the case's outlier_stats
    #: Explicit (layer, k, n) of this size (gated FFNs, grouped-query attention); empty: the
    #: case's layers as multiples of d.
    layers: tuple[tuple[str, int, int], ...] = ()


@dataclass(frozen=True)
class OutlierStats:
    dims: int
    one_sided: int
    positions: float
    quartiles: tuple[float, float, float]


@dataclass(frozen=True)
class Case:
    name: str
    description: str
    seed: int
    sizes: tuple[Size, ...]
    layers: dict[str, tuple[int, int]]  # layer -> (k multiple of d, n multiple of d)
    default_layer: str
    default_tokens: tuple[int, ...]
    default_dist: str
    outlier_stats: dict[str, OutlierStats]
    paper_speedup: dict[str, dict[int, float]]

    def size(self, d_model: int) -> Size:
        for s in self.sizes:
            if s.d_model == d_model:
                return s
        known = ", ".join(str(s.d_model) for s in self.sizes)
        raise InputError(f"case {self.name!r} has no model dimension {d_model}; known: {known}")

    def layer_names(self, d_model: int) -> tuple[str, ...]:
        """The layers of one transformer block of this size, in the block's order."""
        explicit = self.size(d_model).layers
        return tuple(name for name, _, _ in explicit) if explicit else tuple(self.layers)

    def shape(self, layer: str, d_model: int) -> tuple[int, int]:
        """(k, n) of ``layer`` at model dimension ``d_model``."""
        explicit = {name: (k, n) for name, k, n in self.size(d_model).layers}
        if explicit:
            if layer not in explicit:
                raise InputError(
                    f"unknown layer {layer!r} for {self.name} d={d_model}; known: "
                    f"{', '.join(explicit)}, all"
                )
            return explicit[layer]
        if layer not in self.layers:
            raise InputError(f"unknown layer {layer!r}; known: {', '.join(self.layers)}, all")
        km, nm = self.layers[layer]
        return km * d_model, nm * d_model

    def paper_figure(self, method: str, d_model: int, layer: str, tokens: int) -> float | None:
        """The paper's App. D.1 figure, only for the cell it measured (ffn1, 2048 tokens)."""
        if (layer, tokens) != (PAPER_LAYER, PAPER_TOKENS):
            return None
        return self.paper_speedup.get(method, {}).get(d_model)


def cases_dir() -> Path:
    """A source checkout's ``cases/`` (an editable install runs from one), else the copy
    installed inside the package."""
    checkout = Path(__file__).resolve().parents[2] / "cases"
    if (checkout / "gpt3.toml").is_file():
        return checkout
    return Path(str(resources.files("kernelbench") / "cases"))


def load_case(name_or_path: str) -> Case:
    path = Path(name_or_path)
    if not path.suffix:
        path = cases_dir() / f"{name_or_path}.toml"
    if not path.exists():
        available = ", ".join(sorted(p.stem for p in cases_dir().glob("*.toml")))
        raise InputError(f"no case {name_or_path!r} (looked for {path}); available: {available}")
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    return Case(
        name=data["name"],
        description=data.get("description", ""),
        seed=int(data["seed"]),
        sizes=tuple(
            Size(
                s["name"],
                s.get("label", s["name"]),
                int(s["d_model"]),
                s["outliers"],
                tuple((name, int(v["k"]), int(v["n"])) for name, v in s.get("layers", {}).items()),
            )
            for s in data["sizes"]
        ),
        layers={k: (int(v["k"]), int(v["n"])) for k, v in data.get("layers", {}).items()},
        default_layer=data["default_layer"],
        default_tokens=tuple(int(t) for t in data["default_tokens"]),
        default_dist=data["default_dist"],
        outlier_stats={
            k: OutlierStats(
                int(v["dims"]),
                int(v["one_sided"]),
                float(v["positions"]),
                tuple(float(q) for q in v["quartiles"]),
            )
            for k, v in _outlier_stats_table(data, path).items()
        },
        paper_speedup={
            method: {int(d): float(s) for d, s in cells.items()}
            for method, cells in data.get("paper_speedup", {}).items()
        },
    )


def _outlier_stats_table(data: dict, path: Path) -> dict:
    """The case's App. C statistics, or those of the case it names in ``outlier_stats_from``
    (model families share the paper's one table)."""
    source = data.get("outlier_stats_from")
    if source is None:
        return data.get("outlier_stats", {})
    other = path.parent / f"{source}.toml"
    if not other.exists():
        raise InputError(f"{path}: outlier_stats_from = {source!r}, but {other} does not exist")
    return tomllib.loads(other.read_text(encoding="utf-8")).get("outlier_stats", {})


def layer_seed(case: Case, d_model: int, layer: str, dist: str) -> int:
    """A stable seed per layer (independent of Python's hash randomisation)."""
    text = f"{case.seed}|{d_model}|{layer}|{dist}"
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "little")


# --- activations -------------------------------------------------------------------------------


def _quartile_sample(gen: torch.Generator, count: int, quartiles) -> torch.Tensor:
    """Values whose quartiles are ``quartiles``: a piecewise-linear quantile function through
    (0.25, q1), (0.5, q2), (0.75, q3), extended linearly to 0 and 1 with the outer slopes."""
    q1, q2, q3 = quartiles
    u = torch.rand(count, generator=gen, dtype=torch.float64)
    xs = torch.tensor([0.0, 0.25, 0.5, 0.75, 1.0], dtype=torch.float64)
    ys = torch.tensor([q1 - (q2 - q1), q1, q2, q3, q3 + (q3 - q2)], dtype=torch.float64)
    idx = torch.clamp(torch.searchsorted(xs, u, right=True) - 1, 0, 3)
    t = (u - xs[idx]) / (xs[idx + 1] - xs[idx])
    return ys[idx] + t * (ys[idx + 1] - ys[idx])


def outlier_activations(
    gen: torch.Generator,
    m: int,
    k: int,
    stats: OutlierStats,
    dims: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(x float32 (m, k), the outlier dims) following App. C Table 4 statistics; the dims are
    drawn from ``gen`` unless given (in the order whose first ``stats.one_sided`` are one-sided)."""
    x = torch.randn(m, k, generator=gen).clamp_(-3.5, 3.5)
    if dims is None:
        dims = torch.randperm(k, generator=gen)[: min(stats.dims, k)]
    for i, dim in enumerate(dims.tolist()):
        affected = torch.rand(m, generator=gen) < stats.positions
        if m and not bool(affected.any()):
            affected[int(torch.randint(m, (1,), generator=gen))] = True
        count = int(affected.sum())
        values = _quartile_sample(gen, count, stats.quartiles).float()
        if i >= stats.one_sided:  # two-sided dim: random sign per value
            signs = torch.randint(0, 2, (count,), generator=gen).float() * 2 - 1
            values = values.abs() * signs
        x[affected, dim] = values
    return x, dims.sort().values


def load_activation_file(path: Path) -> torch.Tensor:
    """A user's activations as a float32 (tokens, d) tensor. Data only: ``weights_only`` for
    ``.pt``, ``allow_pickle=False`` for ``.npy`` (whose header is checked against the file's
    size before anything is allocated); every bad file is an :class:`InputError`."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"activation file {path} does not exist or is not a file")
    if path.suffix == ".npy":
        t = torch.from_numpy(np.ascontiguousarray(_load_npy(path)))
    elif path.suffix in (".pt", ".pth"):
        t = _load_pt(path)
    else:
        suffix = repr(path.suffix) if path.suffix else "no suffix"
        raise InputError(f"activation file {path} must be .pt or .npy, got {suffix}")
    if t.dim() < 2 or t.numel() == 0:
        raise InputError(
            f"activations in {path} must be (tokens, d) or (..., d), non-empty; "
            f"got shape {tuple(t.shape)}"
        )
    if not t.is_floating_point():
        raise InputError(f"activations in {path} must be floating point, got {t.dtype}")
    t = t.reshape(-1, t.shape[-1]).float()
    if not bool(torch.isfinite(t).all()):
        raise InputError(f"activations in {path} contain NaN/Inf")
    return t


def _load_npy(path: Path) -> np.ndarray:
    try:
        with path.open("rb") as fh:
            version = np.lib.format.read_magic(fh)
            if version not in ((1, 0), (2, 0)):
                raise ValueError(f".npy format version {version} (1.0 and 2.0 are read)")
            read_header = getattr(np.lib.format, f"read_array_header_{version[0]}_0")
            shape, _, dtype = read_header(fh)
            offset = fh.tell()
    except (ValueError, OSError, SyntaxError) as exc:
        raise InputError(f"{path} is not a .npy array file ({exc})") from None
    if dtype.hasobject:
        raise InputError(f"{path} holds Python objects, not numbers (refused: data only)")
    need = math.prod(shape) * dtype.itemsize
    have = path.stat().st_size - offset
    if need > have:
        raise InputError(
            f"{path}: its header claims shape {shape} ({need} bytes of {dtype}), "
            f"the file holds {have} bytes"
        )
    try:
        return np.load(path, allow_pickle=False)
    except (ValueError, OSError, MemoryError) as exc:
        raise InputError(f"{path} is not a readable .npy array ({exc})") from None


def _load_pt(path: Path) -> torch.Tensor:
    if not zipfile.is_zipfile(path):  # torch.save has written zip archives since torch 1.6
        raise InputError(f"{path} is not a torch tensor file (torch.save writes a zip archive)")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError:
        raise InputError(
            f"{path} holds pickled Python objects, not only tensors; refused (a file from a user "
            "is read as data). Save a plain tensor: torch.save(tensor, path)"
        ) from None
    except (RuntimeError, EOFError, OSError, ValueError, MemoryError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InputError(f"{path} is not a readable torch tensor file ({first})") from None
    if not isinstance(obj, torch.Tensor):
        raise InputError(f"{path} must hold one tensor, found {type(obj).__name__}")
    return obj


#: Every cell of a layer with at most this many tokens takes the first rows of one batch of
#: activations of this many tokens (larger cells draw a larger batch, whose first rows are the
#: same); ``llm_int8``'s calibrated outlier dims come from this many rows.
CALIBRATION_TOKENS = 2048


@dataclass
class LayerInputs:
    """What every cell of one layer shares: its weights, bias and a batch of activations."""

    x: torch.Tensor  # (tokens, k) in the layer dtype, on the device: cells take its first rows
    weight: torch.Tensor  # (n, k)
    bias: torch.Tensor  # (n,)
    seed: int
    planted_outliers: int  # outlier dims the distribution planted (0 for gaussian / files)

    @property
    def calibration(self) -> torch.Tensor:
        """The rows ``llm_int8``'s kept outlier dims are calibrated on."""
        return self.x[:CALIBRATION_TOKENS]


@dataclass
class CellInputs:
    x: torch.Tensor  # (m, k) in the layer dtype, on the device
    weight: torch.Tensor  # (n, k)
    bias: torch.Tensor  # (n,)
    seed: int
    planted_outliers: int  # outlier dims the distribution planted (0 for gaussian / files)


def _sub_generator(seed: int, part: str) -> torch.Generator:
    """A generator of its own for one part of a layer's draws: the weights do not depend on
    how many activation rows were drawn before them."""
    digest = hashlib.sha256(f"{seed}|{part}".encode()).digest()[:8]
    return torch.Generator().manual_seed(int.from_bytes(digest, "little"))


def _synthetic_activations(
    case: Case, size: Size, dist: str, rows: int, k: int, seed: int
) -> tuple[torch.Tensor, int]:
    """(x float32 (rows, k), planted outlier dims), drawn in blocks of
    :data:`CALIBRATION_TOKENS` rows, each from its own generator, with the planted dims drawn
    once: the first rows are the same however many are drawn."""
    dims_gen = _sub_generator(seed, "dims")
    stats = case.outlier_stats[size.outliers] if dist == "outliers" else None
    if stats is not None:
        dims = torch.randperm(k, generator=dims_gen)[: min(stats.dims, k)]
    elif dist == "paper-bench":
        dims = torch.randperm(k, generator=dims_gen)[:5]
    else:
        dims = torch.zeros(0, dtype=torch.int64)
    blocks = []
    for b in range(math.ceil(rows / CALIBRATION_TOKENS)):
        gen = _sub_generator(seed, f"x{b}")
        m = min(CALIBRATION_TOKENS, rows - b * CALIBRATION_TOKENS)
        if stats is not None:
            blocks.append(outlier_activations(gen, m, k, stats, dims)[0])
        else:
            block = torch.randn(m, k, generator=gen)
            block[:, dims] = 8.0  # paper-bench (no dims for gaussian)
            blocks.append(block)
    return torch.cat(blocks), int(dims.numel())


#: Rows of a weight drawn at a time (a multiple of 16: see :func:`_normal_weight`).
WEIGHT_BLOCK_ROWS = 1024


def _normal_weight(n: int, k: int, gen: torch.Generator, dtype: torch.dtype) -> torch.Tensor:
    """``torch.randn(n, k, generator=gen).div_(k**0.5).to(dtype)``, the same values, drawn a
    block of rows at a time into the ``dtype`` tensor: no float32 copy of the whole weight
    (2.4 GB at 175B, whose first touch took longer than the draw on a VM). torch's CPU normal
    sampler fills 16 values at a time (a draw of fewer takes another path), so blocks of a
    multiple of 16 values, then a last one of at least 16, continue one draw's stream exactly."""
    weight = torch.empty(n, k, dtype=dtype)
    starts = list(range(0, n, WEIGHT_BLOCK_ROWS))
    if len(starts) > 1 and (n - starts[-1]) * k < 16:
        starts.pop()  # the short last block joins the one before it
    ends = [*starts[1:], n]
    block = torch.empty(max(e - s for s, e in zip(starts, ends, strict=True)), k)
    for start, end in zip(starts, ends, strict=True):
        weight[start:end] = block[: end - start].normal_(generator=gen).div_(k**0.5)
    return weight


def layer_inputs(
    case: Case,
    size: Size,
    layer: str,
    dist: str,
    dtype: torch.dtype,
    device: torch.device,
    activations: torch.Tensor | None = None,
    tokens: int = CALIBRATION_TOKENS,
) -> LayerInputs:
    """Fresh random inputs for one layer (never zeros), activations for at least ``tokens``
    tokens (and at least :data:`CALIBRATION_TOKENS`, except for a shorter activation file).
    Weights ~ N(0, 1/k), bias ~ N(0, 0.1)."""
    k, n = case.shape(layer, size.d_model)
    seed = layer_seed(case, size.d_model, layer, dist)
    rows = max(tokens, CALIBRATION_TOKENS)
    if dist.startswith("file:"):
        if activations is None:
            raise InputError("dist 'file:...' needs the activations tensor")
        if activations.shape[1] != k:
            raise InputError(
                f"activations have d={activations.shape[1]}, layer {layer} at "
                f"d_model={size.d_model} needs in_features={k}"
            )
        if activations.shape[0] < tokens:
            raise InputError(f"activations have {activations.shape[0]} tokens, {tokens} asked")
        x, planted = activations[:rows].clone(), 0
    elif dist in DISTRIBUTIONS:
        x, planted = _synthetic_activations(case, size, dist, rows, k, seed)
    else:
        raise InputError(f"unknown distribution {dist!r}; known: {', '.join(DISTRIBUTIONS)}, file:")
    wgen = _sub_generator(seed, "weight")
    weight = _normal_weight(n, k, wgen, dtype)
    bias = torch.randn(n, generator=wgen) * 0.1
    return LayerInputs(
        x=x.to(dtype).to(device).contiguous(),
        weight=weight.to(device).contiguous(),
        bias=bias.to(dtype).to(device),
        seed=seed,
        planted_outliers=planted,
    )


def make_inputs(
    case: Case,
    size: Size,
    layer: str,
    tokens: int,
    dist: str,
    dtype: torch.dtype,
    device: torch.device,
    activations: torch.Tensor | None = None,
    layer_in: LayerInputs | None = None,
) -> CellInputs:
    """One cell's inputs: the first ``tokens`` rows of its layer's activations (``layer_in``,
    drawn here when not given or too short) with the layer's weights and bias."""
    if layer_in is None or layer_in.x.shape[0] < tokens:
        layer_in = layer_inputs(case, size, layer, dist, dtype, device, activations, tokens)
    return CellInputs(
        x=layer_in.x[:tokens],
        weight=layer_in.weight,
        bias=layer_in.bias,
        seed=layer_in.seed,
        planted_outliers=layer_in.planted_outliers,
    )
