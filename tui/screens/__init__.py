"""The console's screens, one per module: run list, launch form, run monitor, key help."""
