"""What a run writes while it trains: the typed events and the run record (``events.jsonl``),
the environment, the watchdog, power and energy, FLOPs and MFU, profiles, device memory and the
metric sinks. It imports nothing from the run analysis (:mod:`titan.analysis`), the planner or
the trainer."""
