"""A stand-in for array_record (a 3.7 MB wheel of C++ record readers) where bench/peers_maxtext.py
carries MaxText's stack to a machine that has no package index: grain imports
``array_record.python.array_record_data_source`` at import time (MaxText's trainer imports grain)
and reads ArrayRecord files only for ``dataset_type=grain``, never for the synthetic data that
runner trains on. Like grain's own Windows stand-in, the data source raises when it is made."""
