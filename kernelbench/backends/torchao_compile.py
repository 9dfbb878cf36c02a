"""``torchao_compile`` backend: the ``torchao`` layer under ``torch.compile``.

Same quantization as :mod:`kernelbench.backends.torchao` (see its docstring for the variant),
with torchao's recommended inductor settings (``set_inductor_config=True``, which changes
``torch._inductor.config`` for the whole process, as it does for torchao's users). The runner
compiles once, outside the timed region, and stores the seconds of that first (compiling) call in
the optional attribute ``Runner.compile_seconds``. On CPU inductor needs a C++ compiler; on this
2-core machine a cold compile of a small layer took about 75 s (warm cache: much less).
"""

from __future__ import annotations

from kernelbench.backends.torchao import TorchaoBackend


class TorchaoCompileBackend(TorchaoBackend):
    name = "torchao_compile"
    methods = ("vectorwise",)  # weight-only: eager only (its compiled path is not checked here)
    compile = True
    in_default_sweep = False  # ~75 s of compile per shape on 2 cores: ask for it by name
    #: its test runs only with KERNELBENCH_TEST_COMPILE=1 and no kept run includes it
    verified = {}


BACKEND = TorchaoCompileBackend()
