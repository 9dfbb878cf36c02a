"""A deliberately broken backend, for trying `--backend-file` and `kernelbench check-backend`:
its int8 GEMM ignores the last ``k % 16`` input dims (a kernel that forgot its tail loop).
Right whenever k is a multiple of 16; wrong on every other shape."""

from __future__ import annotations

import torch

from kernelbench.api import API_VERSION, Availability, Backend, PreparedWeight

TILE = 16


class BrokenTailsBackend(Backend):
    name = "broken_tails"
    description = "example of a broken kernel: drops the k tail of the int8 GEMM"
    api_version = API_VERSION
    version = "0.0.1"

    def availability(self, device: torch.device) -> Availability:
        if torch.device(device).type != "cpu":
            return Availability.no("CPU only")
        return Availability.yes()

    def int8_matmul(self, a: torch.Tensor, pw: PreparedWeight) -> torch.Tensor:
        b = pw.int8_columns(torch.arange(pw.in_features))
        k = a.shape[1] - a.shape[1] % TILE  # the bug: no tail loop
        return (a[:, :k].long() @ b[:, :k].long().T).to(torch.int32)


BACKEND = BrokenTailsBackend()
