"""A stand-in for xprof (a 32 MB profiler wheel) where bench/maxtext.py carries MaxText's stack to
a machine that has no package index: tokamax imports ``xprof.cli.tools.get_kernel_stats_tool`` at
import time and calls it only when it benchmarks kernels with xprof timing, which building and
training a MaxText model never does. Never on the path of an installed ``[maxtext]`` extra."""
