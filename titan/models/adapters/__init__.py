"""Model adapters: the model families behind the seam of :mod:`titan.models.adapters.base`."""
