"""Diffusion training: objectives (noise schedules, targets, weights) and deterministic samplers."""
