"""What the plugin uses of TensorBoard beyond its data provider API, in one place.

Both of TensorBoard's data providers decode every tensor of a ``read_tensors`` reply with
`tensor_util.make_ndarray`, unchecked, and fail the whole reply if one cannot be decoded:

* With the Python loader (``--load_fast=false``) `MultiplexerDataProvider` decodes a tag's
  *whole* series on every call, even for ``downsample=1`` (250 MB for 500 steps of a
  64K-cell variable, to serve one step). Its event multiplexer, which TensorBoard hands to
  plugins as the (deprecated, still documented) ``TBContext.multiplexer``, holds the same
  events undecoded (`tensor_events`); `downsample_indices` reproduces the sample a
  ``downsample=k`` read returns.
* With RustBoard (``--load_fast=true``) `GrpcDataProvider` sends the request the plugin could
  send itself to the data server's stub (`grpc_read_tensors`), which returns the tensor protos.

So the plugin takes tensor protos undecoded and decodes only the steps it needs, each after
`metadata.check_tensor_proto`: one bad step (or one proto declaring 2^40 values) is skipped
without failing its series or allocating for it. Any other provider is read through
``read_tensors``. Everything here is checked against TensorBoard by
``tests/test_robustness.py::test_tensorboard_internals_the_plugin_relies_on`` and
``tests/test_compat.py`` (the providers' class names, their private ``_multiplexer`` and
``_stub``, the request `GrpcDataProvider` sends), which fail loudly when TensorBoard changes
them. The TensorFlow and Keras counterparts of this module are in `tb_gradmom._compat`.
"""

from __future__ import annotations

import random

__all__ = [
    "is_python_loader",
    "multiplexer_of",
    "tensor_events",
    "plugin_tags",
    "downsample_indices",
    "grpc_stub_of",
    "grpc_read_tensors",
]

_PYTHON_PROVIDER = "MultiplexerDataProvider"
_GRPC_PROVIDER = "GrpcDataProvider"


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


def listing_version(multiplexer) -> tuple | None:
    """A value that changes whenever the Python loader's multiplexer gains a run or a tensor
    event, or purges events (an orphaned step after a restart), or None if it cannot say.

    Per run: its accumulator, the step and wall time of the last event it took (TensorBoard
    updates them whenever it may purge), how many tensor series it holds and how many events
    they have taken (their reservoirs' counts). Costs microseconds, where listing the series
    (``list_tensors``) copies and scans every event of every series.
    """
    try:
        accumulators = list(multiplexer._accumulators.items())  # noqa: SLF001
        out = []
        for run, acc in sorted(accumulators, key=lambda item: item[0]):
            series = list(acc.tensors_by_tag.values())
            seen = 0
            for reservoir in series:
                for bucket in list(reservoir._buckets.values()):  # noqa: SLF001
                    seen += bucket._num_items_seen + len(bucket.items)  # noqa: SLF001
            out.append(
                (run, id(acc), acc.most_recent_step, acc.most_recent_wall_time, len(series), seen)
            )
        return tuple(out)
    except Exception:  # noqa: BLE001 - another TensorBoard, or a series added meanwhile
        return None


def plugin_tags(multiplexer, plugin_name: str, run: str) -> list[str] | None:
    """The tags of ``run`` whose first event names ``plugin_name``, from the Python loader's
    multiplexer (`PluginRunToTagToContent`), or None if it cannot say.

    The data provider has no call that names a run's tags without listing each series, which
    TensorBoard's Python loader fails for a tag with metadata and no tensor event; this lists
    the names so that the plugin can list the others one by one.
    """
    try:
        by_run = multiplexer.PluginRunToTagToContent(plugin_name)
        return sorted(by_run.get(run, {}))
    except Exception:  # noqa: BLE001 - an older or newer multiplexer: the caller skips the run
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


def grpc_stub_of(data_provider):
    """The data server stub behind RustBoard's `GrpcDataProvider`, or None."""
    if type(data_provider).__name__ != _GRPC_PROVIDER:
        return None
    stub = getattr(data_provider, "_stub", None)
    return stub if callable(getattr(stub, "ReadTensors", None)) else None


def grpc_read_tensors(
    stub, experiment_id: str, plugin_name: str, run: str, tags, downsample: int
) -> dict:
    """``read_tensors`` of some tags of one run without decoding: ``{tag: [(step, wall_time,
    TensorProto)]}``, as `GrpcDataProvider.read_tensors` builds the request.

    Raises:
      tensorboard.errors.NotFoundError, InvalidArgumentError: as the data provider would.
    """
    import grpc
    from tensorboard import errors
    from tensorboard.data.proto import data_provider_pb2

    req = data_provider_pb2.ReadTensorsRequest()
    req.experiment_id = experiment_id
    req.plugin_filter.plugin_name = plugin_name
    req.run_tag_filter.runs.names[:] = [run]
    req.run_tag_filter.tags.names[:] = sorted(tags)
    req.downsample.num_points = downsample
    try:
        res = stub.ReadTensors(req)
    except grpc.RpcError as e:
        code = e.code() if callable(getattr(e, "code", None)) else None
        if code == grpc.StatusCode.NOT_FOUND:
            raise errors.NotFoundError(e.details()) from None
        if code == grpc.StatusCode.INVALID_ARGUMENT:
            raise errors.InvalidArgumentError(e.details()) from None
        raise
    out = {}
    for run_entry in res.runs:
        if run_entry.run_name != run:
            continue
        for tag_entry in run_entry.tags:
            d = tag_entry.data
            out[tag_entry.tag_name] = list(zip(d.step, d.wall_time, d.value))
    return out
