"""A stand-in for Hugging Face ``datasets`` (with pyarrow, pandas and the rest, some 60 MiB of
wheels) where bench/peers_torchtitan.py carries torchtitan to a machine that has no package index:
``torchtitan.hf_datasets.text_datasets`` imports ``Dataset``, ``load_dataset`` and
``datasets.distributed.split_dataset_by_node`` at import time (through
``torchtitan.components.validate``, which ``torchtitan.trainer`` imports) and calls them only in
its Hugging Face text dataloaders, which the peer's synthetic dataloader replaces. Only the
worker of bench/peers_torchtitan.py puts this folder on ``sys.path`` (last: an installed
``datasets`` wins)."""


class Dataset:
    """Never built on the peer's path."""

    def __init__(self, *args, **kwargs):
        raise ImportError("datasets is a stub here (bench/stubs/for-torchtitan)")


def load_dataset(*args, **kwargs):
    raise ImportError("datasets is a stub here (bench/stubs/for-torchtitan)")
