"""Budget planner: does a model fit, which layout is fastest, how long and how much.

- :mod:`~titan.planning.models`: parameter counts and training FLOPs per token.
- :mod:`~titan.planning.gpus`: the GPU catalog (dense peaks, memory, power, links, sources).
- :mod:`~titan.planning.memory`: bytes per device under DP, FSDP, TP, PP and remat.
- :mod:`~titan.planning.collectives`: alpha-beta times of ring collectives.
- :mod:`~titan.planning.step`: step time, with the calibration of achievable fractions.
- :mod:`~titan.planning.budget`: plans and the layout search behind ``titan plan``
  (:mod:`~titan.planning.commands`).
- :mod:`~titan.planning.verdict`: fits or by how much not, what would fit, GPUs needed.

Pure Python: importing it loads neither JAX nor Textual (the console uses it directly).
"""
