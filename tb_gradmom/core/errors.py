"""Exceptions raised by the graph core."""

from __future__ import annotations

__all__ = ["GradMomentsError", "UnsupportedOpError", "BatchSizeError", "PerExampleLossError"]


class GradMomentsError(ValueError):
    """Base class of the errors that tb_gradmom raises about a user's graph or arguments."""

    # Let the error leave a tf.function unchanged (AutoGraph would re-wrap it otherwise).
    ag_pass_through = True


class UnsupportedOpError(GradMomentsError):
    """A requested variable is consumed by an op that has no exact moment rule."""

    def __init__(self, message: str, reason: str | None = None):
        super().__init__(message)
        # a short form ("While op 'lstm/while' has no rule") for the fallback's warning
        self.reason = reason or message


class BatchSizeError(GradMomentsError):
    """The number of examples in the batch is unknown or the graph disagrees about it."""


class PerExampleLossError(GradMomentsError):
    """The exact fallback needs the per-example losses and cannot find them in the graph."""
