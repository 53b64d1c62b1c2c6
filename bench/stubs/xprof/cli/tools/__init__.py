"""Part of the xprof stand-in (bench/stubs/xprof/__init__.py)."""
