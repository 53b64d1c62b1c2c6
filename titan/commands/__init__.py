"""The ``titan`` subcommands, one module per verb (``titan import`` and ``titan export`` share
:mod:`titan.commands.import_export`; ``summarize``, ``perf`` and ``report`` share
:mod:`titan.commands.summarize_perf_report`): each defines ``add_parser(subparsers)`` and the
``run`` it sets, and imports its command's implementation (JAX, DuckDB) only when it runs, so
that ``titan --help`` and every other command start quickly. :mod:`titan.cli` lists them."""
