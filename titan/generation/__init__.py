"""Text generation from a run's checkpoint (``titan generate``): loading the weights
(:mod:`titan.generation.loading`), nucleus sampling (:mod:`titan.generation.next_token`) and the
decode loop with a KV cache (:mod:`titan.generation.generate`)."""

MAX_TEMPERATURE = 100.0
"""Largest ``--temperature``: at 100, logits 10 apart (a strong preference) change a token's
odds by e^0.1, about 10%: draws are near uniform already, and a higher one only adds float32
rounding (an infinite one would turn every logit into NaN)."""
