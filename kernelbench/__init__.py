"""kernelbench: honest speed and accuracy numbers for int8 matmul kernels (LLM.int8())."""

__version__ = "0.1.0"
