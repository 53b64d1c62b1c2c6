"""Checkpoints: the :class:`titan.checkpoint.checkpointer.Checkpointer` that saves and restores a
run's chunks with orbax, made of the checkpoints folder (:mod:`titan.checkpoint.folder`), the saves
(:mod:`titan.checkpoint.saving`), retention (:mod:`titan.checkpoint.retention`) and the restores
(:mod:`titan.checkpoint.restoring`), the order in which the processes of a run save one
(:mod:`titan.checkpoint.protocol`), the items one process holds alone
(:mod:`titan.checkpoint.stage_store`), the copy of the state a background save writes
(:mod:`titan.checkpoint.snapshot`) and the pinned host memory it copies into
(:mod:`titan.checkpoint.pinned_host`), the finite-weights check and digests of every save
(:mod:`titan.checkpoint.finite_check`), and the options a run takes from a checkpoint
(:mod:`titan.checkpoint.init_from`) or from the run it resumes (:mod:`titan.checkpoint.resume`)."""
