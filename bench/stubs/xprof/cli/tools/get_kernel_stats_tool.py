"""The one xprof module tokamax imports (bench/stubs/xprof/__init__.py)."""


def compute_kernel_stats(*args, **kwargs):
    """tokamax's xprof kernel timing; not available in the stand-in."""
    raise NotImplementedError("xprof stand-in (bench/stubs): install xprof for kernel timing")
