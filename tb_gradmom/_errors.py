"""Exceptions raised by the graph core."""

from __future__ import annotations

__all__ = ["GradMomentsError", "UnsupportedOpError", "BatchSizeError"]


class GradMomentsError(ValueError):
    """Base class of the errors that tb_gradmom raises about a user's graph or arguments."""

    # Let the error leave a tf.function unchanged (AutoGraph would re-wrap it otherwise).
    ag_pass_through = True


class UnsupportedOpError(GradMomentsError):
    """A requested variable is consumed by an op that has no exact moment rule."""


class BatchSizeError(GradMomentsError):
    """The number of examples in the batch is unknown or the graph disagrees about it."""
