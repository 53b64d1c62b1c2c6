"""``titan-console``: a Textual terminal app to launch ``titan train`` runs and follow them.

The console is a client of the engine's public pieces: it builds its launch form from
:class:`titan.config.TrainConfig`, validates with :func:`titan.config.validate_train_config` (the
CLI's own check), starts ``python -P -m titan.cli train`` (:func:`titan.cli_command`) as a
child process and reads the run's ``events.jsonl`` through
:class:`titan.telemetry.records.EventTail`. ``titan/`` never imports this package.

Layout: pure modules (``options``, ``launcher``, ``run_state``, ``run_watch``, ``run_list``) hold
the logic and are testable without a terminal; ``screens/`` (one screen per file) and
``widgets/`` only draw.
"""
