"""The event-file format of Grad Moments: where the writer and the reader meet.

This module imports no TensorFlow. The summary writer (`tb_gradmom.writers.summary`), the reader
(`tb_gradmom.analysis.data`) and the TensorBoard plugin (`tb_gradmom.plugin`) all go through it.
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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from tensorboard.compat.proto import summary_pb2, types_pb2

PLUGIN_NAME = "gradmom"
FORMAT_VERSION = 1

KIND_MOMENTS = "moments"
KIND_STATS = "stats"

STATS_SUFFIX = "/_stats"
MODEL_TAG = "_model"


def model_tag(group: str | None = None) -> str:
    """The whole-model tag of a group of tags (``_model``, or ``<group>/_model``)."""
    return f"{group}/{MODEL_TAG}" if group else MODEL_TAG


def is_model_tag(tag: str) -> bool:
    """Whether ``tag`` is a group's whole-model tag (``_model`` or ``<group>/_model``)."""
    return tag == MODEL_TAG or tag.endswith("/" + MODEL_TAG)


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


# Bounds a content message must keep (checked by `parse_plugin_content`): a tag whose content
# breaks one is skipped, so a corrupt or crafted header can neither crash a reader nor make
# it allocate without limit.
MAX_CONTENT_BYTES = 64 * 1024  # a content message is ~200 bytes (a few KB with explicit edges)
MAX_RANK = 32  # axes of a variable
MAX_ORDER = 8  # highest moment order (the writer logs 1 to 4)
MAX_VARIABLE_ELEMENTS = 2**48  # elements of a variable (pooled variables may be huge)
MAX_STORED_ELEMENTS = 2**28  # values of one moments tensor, k * prod(stored_shape): 1 GiB
MAX_FIELDS = 256  # names in a stats content's `fields`
MAX_HIST_EDGES = 4097  # edges of the variance histogram (the writer uses 129)
HIST_DECADES = (-300, 300)  # decades a histogram spec may span (10**k stays a finite float)
MAX_TEXT_CHARS = 4096  # each string field (op, layer, variable, dtype, field names)


def _is_int(x: object) -> TypeGuard[int]:
    return isinstance(x, int) and not isinstance(x, bool)


def hist_edges(spec: tuple[int, int, int] = HIST_SPEC) -> tuple[float, ...]:
    """The bucket edges ``10 ** (k / per_decade)`` from ``10**first`` to ``10**last``.

    Raises:
      ValueError: if the spec is not three integers with ``first < last`` inside
        `HIST_DECADES`, ``per_decade >= 1``, and at most `MAX_HIST_EDGES` edges.
    """
    if len(spec) != 3 or not all(_is_int(x) for x in spec):
        raise ValueError(f"a histogram spec is [first decade, last decade, per decade], got {spec}")
    first, last, per_decade = spec
    lo, hi = HIST_DECADES
    if not lo <= first < last <= hi:
        raise ValueError(
            f"histogram decades must satisfy {lo} <= first < last <= {hi}, got {first}, {last}"
        )
    if per_decade < 1 or (last - first) * per_decade + 1 > MAX_HIST_EDGES:
        raise ValueError(
            f"histogram spec {list(spec)} gives {(last - first) * per_decade + 1} edges; "
            f"buckets per decade must be >= 1 and the edges at most {MAX_HIST_EDGES}"
        )
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


def _encode(obj: MomentsContent | StatsContent) -> bytes:
    d = {k: list(v) if isinstance(v, tuple) else v for k, v in obj.__dict__.items()}
    if isinstance(obj, StatsContent):
        edges = d.pop("hist_edges")
        if tuple(edges) != HIST_EDGES:
            raise ValueError("stats content must use the fixed HIST_EDGES")
        d["hist"] = list(HIST_SPEC)
    return json.dumps(d, sort_keys=True, separators=(",", ":")).encode("utf-8")


def create_summary_metadata(
    content: MomentsContent | StatsContent, description: str = ""
) -> summary_pb2.SummaryMetadata:
    """A `SummaryMetadata` proto for one Grad Moments tag."""
    return summary_pb2.SummaryMetadata(
        summary_description=description,
        plugin_data=summary_pb2.SummaryMetadata.PluginData(
            plugin_name=PLUGIN_NAME, content=_encode(content)
        ),
        data_class=summary_pb2.DATA_CLASS_TENSOR,
    )


class FormatError(ValueError):
    """Raised when a tag's content message (or a tensor) cannot be read by this version."""


def _int(d: dict[str, Any], name: str, lo: int, hi: int) -> int:
    x = d[name]
    if not _is_int(x) or not lo <= x <= hi:
        raise FormatError(f"`{name}` must be an integer in [{lo}, {hi}], got {_show(x)}")
    return x


def _ints(
    d: dict[str, Any], name: str, lo: int, hi: int, min_len: int, max_len: int
) -> tuple[int, ...]:
    x = d[name]
    if not isinstance(x, list) or not min_len <= len(x) <= max_len:
        raise FormatError(
            f"`{name}` must be a list of {min_len} to {max_len} integers, got {_show(x)}"
        )
    if not all(_is_int(v) and lo <= v <= hi for v in x):
        raise FormatError(f"`{name}` must hold integers in [{lo}, {hi}], got {_show(x)}")
    return tuple(x)


def _text(d: dict[str, Any], name: str, default: str = "") -> str:
    x = d.get(name, default)
    if not isinstance(x, str) or len(x) > MAX_TEXT_CHARS:
        raise FormatError(f"`{name}` must be a string of at most {MAX_TEXT_CHARS} characters")
    return x


def _show(x: object) -> str:
    text = repr(x)
    return text if len(text) <= 60 else text[:57] + "..."


def _parse_moments(d: dict[str, Any], version: int) -> MomentsContent:
    orders = _ints(d, "orders", 1, MAX_ORDER, 1, MAX_ORDER)
    if len(set(orders)) != len(orders):
        raise FormatError(f"`orders` must not repeat an order, got {list(orders)}")
    shape = _ints(d, "shape", 1, MAX_VARIABLE_ELEMENTS, 0, MAX_RANK)
    stored = _ints(d, "stored_shape", 1, MAX_STORED_ELEMENTS, 0, MAX_RANK)
    if math.prod(shape) > MAX_VARIABLE_ELEMENTS:
        raise FormatError(f"`shape` {list(shape)} has more than {MAX_VARIABLE_ELEMENTS} elements")
    if len(orders) * math.prod(stored) > MAX_STORED_ELEMENTS:
        raise FormatError(
            f"{len(orders)} orders of `stored_shape` {list(stored)} are more than "
            f"{MAX_STORED_ELEMENTS} values per step"
        )
    pooled = d.get("pooled", False)
    if not isinstance(pooled, bool):
        raise FormatError(f"`pooled` must be true or false, got {_show(pooled)}")
    block_rows, block_cols = (
        _ints(d, "block", 1, MAX_VARIABLE_ELEMENTS, 2, 2) if "block" in d else (1, 1)
    )
    block = (block_rows, block_cols)
    if pooled:
        rows, cols = to_2d_shape(shape)
        want = (-(-rows // block[0]), -(-cols // block[1]))
        if stored != want:
            raise FormatError(
                f"`stored_shape` {list(stored)} of a pooled variable of shape {list(shape)} with "
                f"block {list(block)} must be {list(want)}"
            )
    else:
        if stored != shape:
            raise FormatError(
                f"`stored_shape` {list(stored)} must equal `shape` {list(shape)} when not pooled"
            )
        block = (1, 1)
    return MomentsContent(
        orders=orders,
        shape=shape,
        stored_shape=stored,
        pooled=pooled,
        block=block,
        dtype=_text(d, "dtype", "float32"),
        op=_text(d, "op"),
        layer=_text(d, "layer"),
        variable=_text(d, "variable"),
        version=version,
    )


def _parse_stats(d: dict[str, Any], version: int) -> StatsContent:
    fields = d["fields"]
    if not isinstance(fields, list) or not 1 <= len(fields) <= MAX_FIELDS:
        raise FormatError(
            f"`fields` must be a list of 1 to {MAX_FIELDS} names, got {_show(fields)}"
        )
    if not all(isinstance(f, str) and 0 < len(f) <= MAX_TEXT_CHARS for f in fields):
        raise FormatError(f"`fields` must hold non-empty strings, got {_show(fields)}")
    if len(set(fields)) != len(fields):
        raise FormatError(f"`fields` must not repeat a name, got {_show(fields)}")
    missing = [f for f in STATS_FIELDS if f not in fields]
    if missing:
        raise FormatError(
            f"`fields` lacks {', '.join(missing)} (format version 1 has all of "
            f"{', '.join(STATS_FIELDS)})"
        )
    if "hist" in d:
        spec = d["hist"]
        if not isinstance(spec, list):
            raise FormatError(f"`hist` must be [first, last, per decade], got {_show(spec)}")
        try:
            edges = hist_edges(tuple(spec))
        except ValueError as e:
            raise FormatError(f"`hist`: {e}") from None
    else:
        raw = d["hist_edges"]
        if not isinstance(raw, list) or not 2 <= len(raw) <= MAX_HIST_EDGES:
            raise FormatError(f"`hist_edges` must be a list of 2 to {MAX_HIST_EDGES} numbers")
        if not all(isinstance(e, (int, float)) and not isinstance(e, bool) for e in raw):
            raise FormatError("`hist_edges` must hold numbers")
        edges = tuple(float(e) for e in raw)
        if not all(math.isfinite(e) for e in edges) or any(
            b <= a for a, b in zip(edges, edges[1:])
        ):
            raise FormatError("`hist_edges` must be finite and strictly increasing")
    return StatsContent(
        fields=tuple(fields), hist_edges=edges, variable=_text(d, "variable"), version=version
    )


def parse_plugin_content(content: bytes) -> MomentsContent | StatsContent:
    """Parses and checks ``plugin_data.content`` of a Grad Moments tag.

    Total: any bytes give a content object or `FormatError`, never another exception. Every
    field is checked against the bounds above (`MAX_RANK`, `MAX_STORED_ELEMENTS`,
    `MAX_HIST_EDGES`, ...), pooled shapes must agree with their block, and a stats tag must
    name every field of `STATS_FIELDS`; unknown extra fields are ignored.

    Raises:
      FormatError: if the content is not a JSON object of a known kind, breaks a bound, or
        comes from a newer format version than this reader knows (upgrade tb_gradmom to read
        it). The message says which field and what was expected.
    """
    try:
        raw = bytes(content)
    except Exception:  # noqa: BLE001 - not bytes-like
        raise FormatError("Grad Moments tag content is not bytes") from None
    if len(raw) > MAX_CONTENT_BYTES:
        raise FormatError(
            f"Grad Moments tag content has {len(raw)} bytes, more than {MAX_CONTENT_BYTES}"
        )
    try:
        d = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise FormatError(f"Grad Moments tag content is not valid JSON: {e}") from None
    except RecursionError:
        raise FormatError("Grad Moments tag content is nested too deeply") from None
    if not isinstance(d, dict):
        raise FormatError("Grad Moments tag content must be a JSON object")
    version = d.get("version")
    if not _is_int(version) or version < 1:
        raise FormatError(f"Grad Moments tag content has no valid version: {_show(version)}")
    if version > FORMAT_VERSION:
        raise FormatError(
            f"Grad Moments format version {version} is newer than this reader "
            f"({FORMAT_VERSION}); upgrade tb_gradmom"
        )
    kind = d.get("kind")
    parsers: dict[str, Callable[[dict[str, Any], int], MomentsContent | StatsContent]] = {
        KIND_MOMENTS: _parse_moments,
        KIND_STATS: _parse_stats,
    }
    parse = parsers.get(kind) if isinstance(kind, str) else None
    if parse is None:
        raise FormatError(f"Grad Moments tag content has an unknown kind: {_show(kind)}")
    try:
        return parse(d, version)
    except FormatError as e:
        raise FormatError(f"Grad Moments {kind} content: {e}") from None
    except KeyError as e:
        raise FormatError(f"Grad Moments {kind} content is missing the field {e}") from None
    except Exception as e:  # noqa: BLE001 - total: whatever slipped past the checks
        raise FormatError(
            f"Grad Moments {kind} content is unreadable: {type(e).__name__}"
        ) from None


def moments_shape(content: MomentsContent) -> tuple[int, ...]:
    """The shape of a moments tag's tensor: ``[len(orders), *stored_shape]``."""
    return (len(content.orders), *content.stored_shape)


def stats_length(content: StatsContent) -> int:
    """The length of a stats tag's tensor: the fields, then ``len(hist_edges) + 1`` counts."""
    return len(content.fields) + len(content.hist_edges) + 1


def check_tensor(content: MomentsContent | StatsContent, array: Any) -> None:
    """Checks one step's tensor against its tag's content message.

    A moments tensor must be a float array of `moments_shape`; a stats tensor a 1-D
    numeric (float or integer) array of `stats_length`. Accepts anything array-like.

    Raises:
      FormatError: saying what was expected and what came.
    """
    shape = tuple(getattr(array, "shape", ()))
    dtype = getattr(array, "dtype", None)
    kind = getattr(dtype, "kind", "?")
    if isinstance(content, MomentsContent):
        want_shape = moments_shape(content)
        if shape != want_shape or kind != "f":
            raise FormatError(
                f"the stored tensor has shape {list(shape)} and dtype {dtype}, but its metadata "
                f"says float [{', '.join(map(str, want_shape))}]; the event file is corrupt or was "
                "written by another tool"
            )
        return
    want = stats_length(content)
    if shape != (want,) or kind not in "fiu":
        raise FormatError(
            f"the stats tensor has shape {list(shape)} and dtype {dtype}, but its metadata says "
            f"a number vector [{want}] ({len(content.fields)} sums and "
            f"{len(content.hist_edges) + 1} histogram counts)"
        )


# Tensor dtypes a reader accepts (numpy item size, and the TensorProto field holding values
# when they are not packed in `tensor_content`). Moments are floats; stats may be integers.
_FLOAT_DTYPES = {
    types_pb2.DT_HALF: (2, "half_val"),
    types_pb2.DT_FLOAT: (4, "float_val"),
    types_pb2.DT_DOUBLE: (8, "double_val"),
}
_NUMBER_DTYPES = {
    **_FLOAT_DTYPES,
    types_pb2.DT_INT32: (4, "int_val"),
    types_pb2.DT_INT64: (8, "int64_val"),
}


def check_tensor_proto(content: MomentsContent | StatsContent, proto: Any) -> None:
    """Checks a `TensorProto` against its tag's content message before it is decoded.

    Its shape must be the tag's (`moments_shape`, or ``[stats_length]``), its dtype a float
    (moments) or a number (stats), and its values as many as the shape says (packed in
    ``tensor_content``, one value repeated, or one per element). A proto may declare any
    shape with a single value, which decoding repeats to fill it: checking first bounds what
    `tensor_util.make_ndarray` can allocate by what the content allows.

    Raises:
      FormatError: saying what was expected and what came.
    """
    dims = [int(d.size) for d in proto.tensor_shape.dim[: MAX_RANK + 2]]
    if isinstance(content, MomentsContent):
        want, dtypes, what = list(moments_shape(content)), _FLOAT_DTYPES, "float"
    else:
        want, dtypes, what = [stats_length(content)], _NUMBER_DTYPES, "number"
    if dims != want or proto.tensor_shape.unknown_rank:
        raise FormatError(
            f"the stored tensor has shape {dims}, but its metadata says {what} {want}; the "
            "event file is corrupt or was written by another tool"
        )
    if proto.dtype not in dtypes:
        name = types_pb2.DataType.Name(proto.dtype) if proto.dtype in _DTYPE_NAMES else "?"
        raise FormatError(f"the stored tensor has dtype {name}, but its metadata says {what}")
    itemsize, field_name = dtypes[proto.dtype]
    count = math.prod(want)
    packed = len(proto.tensor_content)  # a copy of the bytes: read once
    if packed:
        if packed != count * itemsize:
            raise FormatError(
                f"the stored tensor holds {packed} bytes for {count} values of {itemsize} bytes"
            )
    elif len(getattr(proto, field_name)) not in (1, count):
        raise FormatError(
            f"the stored tensor holds {len(getattr(proto, field_name))} values for {count}"
        )


_DTYPE_NAMES = frozenset(types_pb2.DataType.values())


def stats_tag(variable_tag: str) -> str:
    """The stats tag that belongs to a moments tag."""
    return variable_tag + STATS_SUFFIX
