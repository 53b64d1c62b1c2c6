"""``datasets.distributed`` of the stand-in (see ``__init__``)."""


def split_dataset_by_node(*args, **kwargs):
    raise ImportError("datasets is a stub here (bench/stubs/for-torchtitan)")
