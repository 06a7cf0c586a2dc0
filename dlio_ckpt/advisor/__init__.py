"""dlio_ckpt-advise: from measured runs to a checkpoint configuration (docs/advisor.md).

calibrate (summary.json -> costs and scaling fits) -> simulate (seeded failures, multi-level
checkpoints, restarts) -> search (the configuration space, exhaustive, Young/Daly) and surrogate
(learned ranking, confirmed in the simulator) -> cli and plot.
"""
