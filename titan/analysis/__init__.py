"""What reads runs afterwards: the DuckDB ingest and summaries, liveness, ETTR and goodput, the
performance database, reports, plots and trace summaries, which the ``titan summarize``,
``perf``, ``report`` and ``export`` commands (:mod:`titan.commands.summarize_perf_report`) show.
It reads the records that :mod:`titan.telemetry` writes."""
