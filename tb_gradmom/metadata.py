"""The event-file format of Grad Moments: where the writer and the reader meet.

This module imports no TensorFlow. The summary writer (`tb_gradmom.summary`), the reader
(`tb_gradmom.data`) and the TensorBoard plugin (`tb_gradmom.plugin`) all go through it.
The full format is documented in `docs/format.md`.

Every Grad Moments tag is a tensor summary with plugin name ``gradmom`` and
``data_class=DATA_CLASS_TENSOR``. Its ``plugin_data.content`` is UTF-8 JSON (the *content
message*) with a ``version`` field and a ``kind``:

* ``kind="moments"``: tag ``<variable path>``, tensor float32 ``[k, *stored_shape]`` holding the
  raw moments ``M_p = (1/n) sum_j g_j**p`` for the ``k`` orders in ``orders``. ``stored_shape``
  is the variable's shape, or for a variable bigger than ``max_elements`` a 2-D block-pooled
  grid (block means of each moment over the 2-D view described in `to_2d_shape`).
* ``kind="stats"``: tag ``<variable path>/_stats`` (and ``_model/_stats`` for all variables of
  one call together), tensor float32 ``[len(STATS_FIELDS) + len(HIST_EDGES) + 1]``: the exact
  sums in ``STATS_FIELDS`` followed by the counts of a histogram of the per-element unbiased
  variance over the fixed buckets ``HIST_EDGES`` (bucket 0 holds values below ``HIST_EDGES[0]``,
  zeros included; the last bucket holds values at or above ``HIST_EDGES[-1]``).

TensorBoard keeps the metadata of a tag from its first event only, so everything in the
content message is fixed per tag; what varies per step (the batch size, the loss) is in the
``stats`` tensor.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from tensorboard.compat.proto import summary_pb2

PLUGIN_NAME = "gradmom"
FORMAT_VERSION = 1

KIND_MOMENTS = "moments"
KIND_STATS = "stats"

STATS_SUFFIX = "/_stats"
MODEL_TAG = "_model"

# The exact per-step sums stored at the head of every stats tensor, in this order.
STATS_FIELDS: tuple[str, ...] = (
    "batch_size",  # n, the number of examples the moments average over
    "num_elements",  # D, the number of scalar parameters summed over
    "sum_m2",  # sum over elements of M_1**2  (= |m|^2, squared norm of the batch gradient)
    "sum_var",  # sum of the unbiased variance s2 = n/(n-1) (M_2 - M_1**2)  (= tr(Sigma))
    "sum_gsnr",  # sum of M_1**2 / s2 over elements with s2 > 0
    "gsnr_count",  # number of elements with s2 > 0
    "sum_m2_raw",  # sum of M_2, the raw second moment
    "loss",  # the mini-batch loss if the writer was given it, else NaN
    "learning_rate",  # the learning rate if the writer was given it, else NaN
)

# Fixed log-spaced bucket edges for the histogram of the per-element unbiased variance:
# 4 buckets per decade from 1e-24 to 1e8. The content message stores the three numbers, not
# the edges, to keep the per-event metadata small.
HIST_SPEC: tuple[int, int, int] = (-24, 8, 4)  # (first decade, last decade, buckets per decade)


def hist_edges(spec: tuple[int, int, int] = HIST_SPEC) -> tuple[float, ...]:
    """The bucket edges ``10 ** (k / per_decade)`` from ``10**first`` to ``10**last``."""
    first, last, per_decade = spec
    return tuple(10.0 ** (k / per_decade) for k in range(first * per_decade, last * per_decade + 1))


HIST_EDGES: tuple[float, ...] = hist_edges()
NUM_HIST_BUCKETS = len(HIST_EDGES) + 1
STATS_LENGTH = len(STATS_FIELDS) + NUM_HIST_BUCKETS


@dataclass(frozen=True)
class MomentsContent:
    """The content message of a ``moments`` tag.

    Attributes:
      orders: the moment orders stored, in the order of the tensor's first axis.
      shape: the variable's shape.
      stored_shape: the shape of each stored moment array (``shape`` unless pooled).
      pooled: whether the arrays are block means over the 2-D view of the variable.
      block: the pooling block ``[rows, cols]`` when pooled, else ``[1, 1]``.
      dtype: the variable's dtype name.
      op: the op type that consumes the variable (``MatMul``, ``Conv2D``, ...).
      layer: a readable layer name (for Keras, the variable path without its last part).
      variable: the variable's full name.
    """

    orders: tuple[int, ...]
    shape: tuple[int, ...]
    stored_shape: tuple[int, ...]
    pooled: bool = False
    block: tuple[int, int] = (1, 1)
    dtype: str = "float32"
    op: str = ""
    layer: str = ""
    variable: str = ""
    version: int = FORMAT_VERSION
    kind: str = field(default=KIND_MOMENTS)


@dataclass(frozen=True)
class StatsContent:
    """The content message of a ``stats`` tag (field and bucket layout of the tensor)."""

    fields: tuple[str, ...] = STATS_FIELDS
    hist_edges: tuple[float, ...] = HIST_EDGES
    variable: str = ""
    version: int = FORMAT_VERSION
    kind: str = field(default=KIND_STATS)


def to_2d_shape(shape: Sequence[int]) -> tuple[int, int]:
    """The 2-D view used for heatmaps and pooling: all axes but the last become rows.

    A scalar is ``[1, 1]``, a bias ``[d]`` is ``[1, d]``, a Dense kernel ``[d_in, d_out]`` stays,
    a Conv1D kernel ``[k, c_in, c_out]`` is ``[k * c_in, c_out]`` and a Conv2D kernel
    ``[kh, kw, c_in, c_out]`` is ``[kh * kw * c_in, c_out]`` (row ``(i * kw + j) * c_in + c``).
    """
    shape = tuple(int(s) for s in shape)
    if len(shape) == 0:
        return (1, 1)
    if len(shape) == 1:
        return (1, shape[0])
    return (int(math.prod(shape[:-1])), shape[-1])


def pool_block(shape: Sequence[int], max_elements: int) -> tuple[int, int]:
    """The smallest square-ish block so that the pooled 2-D view has <= max_elements cells."""
    rows, cols = to_2d_shape(shape)
    if rows * cols <= max_elements:
        return (1, 1)
    br = bc = 1
    while math.ceil(rows / br) * math.ceil(cols / bc) > max_elements:
        # Grow the block along the axis that currently has more pooled cells.
        if math.ceil(rows / br) >= math.ceil(cols / bc):
            br += 1
        else:
            bc += 1
    return (br, bc)


def _encode(obj) -> bytes:
    d = {k: list(v) if isinstance(v, tuple) else v for k, v in obj.__dict__.items()}
    if isinstance(obj, StatsContent):
        edges = d.pop("hist_edges")
        if tuple(edges) != HIST_EDGES:
            raise ValueError("stats content must use the fixed HIST_EDGES")
        d["hist"] = list(HIST_SPEC)
    return json.dumps(d, sort_keys=True, separators=(",", ":")).encode("utf-8")


def create_summary_metadata(content: MomentsContent | StatsContent, description: str = ""):
    """A `SummaryMetadata` proto for one Grad Moments tag."""
    return summary_pb2.SummaryMetadata(
        summary_description=description,
        plugin_data=summary_pb2.SummaryMetadata.PluginData(
            plugin_name=PLUGIN_NAME, content=_encode(content)
        ),
        data_class=summary_pb2.DATA_CLASS_TENSOR,
    )


class FormatError(ValueError):
    """Raised when a tag's content message cannot be read by this version."""


def parse_plugin_content(content: bytes) -> MomentsContent | StatsContent:
    """Parses ``plugin_data.content`` of a Grad Moments tag.

    Raises:
      FormatError: if the content is not JSON, has no known kind, or comes from a newer format
        version than this reader knows (upgrade tb_gradmom to read it).
    """
    try:
        d = json.loads(bytes(content).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise FormatError(f"Grad Moments tag content is not valid JSON: {e}") from None
    if not isinstance(d, dict):
        raise FormatError("Grad Moments tag content must be a JSON object")
    version = d.get("version")
    if not isinstance(version, int) or version < 1:
        raise FormatError(f"Grad Moments tag content has no valid version: {version!r}")
    if version > FORMAT_VERSION:
        raise FormatError(
            f"Grad Moments format version {version} is newer than this reader "
            f"({FORMAT_VERSION}); upgrade tb_gradmom"
        )
    kind = d.get("kind")
    try:
        if kind == KIND_MOMENTS:
            return MomentsContent(
                orders=tuple(int(o) for o in d["orders"]),
                shape=tuple(int(s) for s in d["shape"]),
                stored_shape=tuple(int(s) for s in d["stored_shape"]),
                pooled=bool(d.get("pooled", False)),
                block=tuple(int(b) for b in d.get("block", (1, 1))),
                dtype=str(d.get("dtype", "float32")),
                op=str(d.get("op", "")),
                layer=str(d.get("layer", "")),
                variable=str(d.get("variable", "")),
                version=version,
            )
        if kind == KIND_STATS:
            if "hist" in d:
                edges = hist_edges(tuple(int(x) for x in d["hist"]))
            else:
                edges = tuple(float(e) for e in d["hist_edges"])
            return StatsContent(
                fields=tuple(str(f) for f in d["fields"]),
                hist_edges=edges,
                variable=str(d.get("variable", "")),
                version=version,
            )
    except (KeyError, TypeError, ValueError) as e:
        raise FormatError(
            f"Grad Moments {kind} content is missing or has a bad field: {e}"
        ) from None
    raise FormatError(f"Grad Moments tag content has an unknown kind: {kind!r}")


def stats_tag(variable_tag: str) -> str:
    """The stats tag that belongs to a moments tag."""
    return variable_tag + STATS_SUFFIX
