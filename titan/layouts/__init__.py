"""Layouts: how a run's model is spread over its devices. The contract both layouts implement
(:mod:`titan.layouts.contract`: the train state and the ``Trainer`` protocol) and the layout
description it records (:mod:`titan.layouts.description`); the SPMD layout
(:mod:`titan.layouts.spmd`) and the MPMD pipeline (:mod:`titan.layouts.mpmd`, the executor of
the schedules in :mod:`titan.schedules`); the registries of layouts and model families and their
builders (:mod:`titan.layouts.builders`); the memory check before compiling
(:mod:`titan.layouts.memory_check`)."""
