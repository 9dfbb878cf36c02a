"""Results: the schema of ``results.jsonl`` / ``env.json`` and every reader of a saved run
(pooled view, physics, merge, verdict, compare, baseline).

May import: ``core``, ``statistics``; never torch, so that reading and comparing runs works
on a machine without the benchmark's dependencies. ``load_results`` is the public reader.
"""

from kernelbench.results.schema import (
    ENV_FILE,
    KEY_COLUMNS,
    RESULTS_FILE,
    SCHEMA_VERSION,
    ResultRow,
    SchemaError,
    load_env,
    load_results,
    read_rows,
    read_run_rows,
)

__all__ = [
    "ENV_FILE",
    "KEY_COLUMNS",
    "RESULTS_FILE",
    "SCHEMA_VERSION",
    "ResultRow",
    "SchemaError",
    "load_env",
    "load_results",
    "read_rows",
    "read_run_rows",
]
