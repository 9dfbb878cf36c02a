"""The measurement engine and its clocks: timing of zero-argument calls, paired and pooled.

May import: ``core``, ``statistics``. Knows nothing about rows, backends or cases.
"""
