"""Part of the array_record stand-in (bench/stubs/array_record/__init__.py)."""
