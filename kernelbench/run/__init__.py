"""The sweep pipeline: cases, plans, cells measured into rows, executors, environment, peaks.

May import: the ground modules, ``kernels``, ``backends``, ``measure``, ``results``. Never the
report or the command line.
"""
