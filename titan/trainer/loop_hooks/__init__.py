"""The training loop's hooks (:class:`titan.trainer.hooks.Hook`), one module each: checkpoints,
compiles, evaluation, health, heartbeats, pinned host memory, power, profiles, progress, sinks
and stalls. :mod:`titan.trainer.train` adds them to the loop."""
