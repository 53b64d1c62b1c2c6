"""Budget planner: does a model fit, which layout is fastest, how long and how much.

It prices the facts that sit below it, on the ground floor: :mod:`~titan.flops` (parameter
counts and training FLOPs per token) and :mod:`~titan.gpus` (the accelerator catalog: dense peaks,
memory, power, links, sources).

- :mod:`~titan.planning.memory`: bytes per device under DP, FSDP, TP, PP and remat.
- :mod:`~titan.planning.collectives`: alpha-beta times of ring collectives.
- :mod:`~titan.planning.step`: step time, with the calibration of achievable fractions.
- :mod:`~titan.planning.budget`: plans and the layout search behind ``titan plan``
  (its command is :mod:`~titan.commands.plan`, above the planner and the run analysis).
- :mod:`~titan.planning.verdict`: fits or by how much not, what would fit, GPUs needed.

Pure Python: importing it loads neither JAX nor Textual (the console uses it directly).
"""
