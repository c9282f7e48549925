"""Judging a GPU from its window means: the verdict classes and the thresholds they use."""
