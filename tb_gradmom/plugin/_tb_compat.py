"""What the plugin uses of TensorBoard beyond its data provider API, in one place.

With the Python loader (``--load_fast=false``) TensorBoard's `MultiplexerDataProvider`
decodes a tag's *whole* series on every ``read_tensors`` call, even for ``downsample=1``
(250 MB for 500 steps of a 64K-cell variable, to serve one step). Its event multiplexer,
which TensorBoard hands to plugins as the (deprecated, still documented)
``TBContext.multiplexer``, holds the same events undecoded: reading them there lets the plugin
decode only the steps it needs, after checking each tensor proto
(`metadata.check_tensor_proto`). The sample a ``downsample=k`` read would return is
reproduced by `downsample_indices`, so both ways of reading give the same steps.

RustBoard (``--load_fast=true``) has no multiplexer: the plugin then reads through the data
provider only. Everything here is checked against TensorBoard by
``tests/test_robustness.py::test_tensorboard_internals_the_plugin_relies_on``, which fails
loudly when TensorBoard changes them.
"""

from __future__ import annotations

import random

__all__ = ["is_python_loader", "multiplexer_of", "tensor_events", "downsample_indices"]

_PYTHON_PROVIDER = "MultiplexerDataProvider"


def is_python_loader(data_provider) -> bool:
    """Whether ``data_provider`` is TensorBoard's Python loader (not a gRPC one)."""
    return type(data_provider).__name__ == _PYTHON_PROVIDER


def multiplexer_of(context, data_provider):
    """The event multiplexer behind a Python-loader data provider, or None.

    ``context.multiplexer`` when TensorBoard's app gave one, else the provider's own
    (``_multiplexer``, for a provider built by hand); None for any other provider.
    """
    if not is_python_loader(data_provider):
        return None
    mux = getattr(context, "multiplexer", None) if context is not None else None
    if mux is None:
        mux = getattr(data_provider, "_multiplexer", None)
    if mux is None or not callable(getattr(mux, "Tensors", None)):
        return None
    return mux


def tensor_events(multiplexer, run: str, tag: str) -> list | None:
    """The stored events of one series, in the data provider's order, or None if unknown.

    Each has ``step``, ``wall_time`` and an undecoded ``tensor_proto``; the list is a copy
    (TensorBoard's reservoir returns one), safe to use while loading goes on.
    """
    try:
        return list(multiplexer.Tensors(run, tag))
    except KeyError:
        return None


def downsample_indices(count: int, k: int) -> list[int]:
    """The indices of the points ``read_tensors(downsample=k)`` returns out of ``count``.

    TensorBoard's Python loader keeps every point if ``k >= count``, none if ``k == 0``, and
    otherwise the last point plus ``k - 1`` others drawn by ``random.Random(0)``.
    """
    if k >= count:
        return list(range(count))
    if k <= 0:
        return []
    indices = random.Random(0).sample(range(count - 1), k - 1)
    indices.sort()
    indices.append(count - 1)
    return indices
