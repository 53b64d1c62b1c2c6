"""What reads runs afterwards: the DuckDB ingest and summaries, liveness, ETTR and goodput, the
performance database, reports, plots and trace summaries, and the ``titan summarize``, ``perf``,
``report`` and ``export`` commands. It reads the records that :mod:`titan.telemetry` writes."""
