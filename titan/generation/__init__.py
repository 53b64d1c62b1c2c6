"""Text generation from a run's checkpoint (``titan generate``): loading the weights
(:mod:`titan.generation.loading`), nucleus sampling (:mod:`titan.generation.sampling`) and the
decode loop with a KV cache (:mod:`titan.generation.generate`)."""
