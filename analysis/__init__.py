"""Offline analysis of dlio_ckpt run folders, sweep folders and Darshan logs.

Installed as `dlio_ckpt.analysis` (the source lives in the top-level analysis/ folder so that the
analysis side can be read on its own). Nothing here runs during a benchmark: it reads what a run
left behind, so it may use pandas, matplotlib and PyDarshan, which the benchmark itself does not
need. Those are imported lazily through `dlio_ckpt.optional.require` so that a missing one gives
an install hint instead of a traceback.
"""
