"""The event-file format of Grad Moments: where the writer and the reader meet.

This module imports no TensorFlow. The summary writer (`tb_gradmom.writers.summary`), the reader
(`tb_gradmom.analysis.data`) and the TensorBoard plugin (`tb_gradmom.plugin`) all go through it.
The full format is documented in `docs/format.md`.

Every Grad Moments tag is a tensor summary with plugin name ``gradmom`` and
``data_class=DATA_CLASS_TENSOR``. Its ``plugin_data.content`` is UTF-8 JSON (the *content
message*) with a ``version`` field and a ``kind``:

* ``kind="moments"``: tag ``<variable path>``, the raw moments ``M_p = (1/n) sum_j g_j**p`` for
  the ``k`` orders in ``orders``, each an array of ``stored_shape``: the variable's shape, or
  for a variable bigger than ``max_elements`` a 2-D block-pooled grid (block means of each
  moment over the 2-D view described in `to_2d_shape`). The content's ``encoding`` says how
  they are stored: ``"float32"`` (format version 1 always) a float tensor ``[k,
  *stored_shape]``, ``tensor[i] = M_{orders[i]}``; ``"float16"`` (orders 1 and 2 only) a
  half tensor ``[2, 1 + prod(stored_shape)]`` whose row ``i`` is a power-of-two exponent
  ``e_i`` followed by the values divided by ``2**e_i``, row 0 ``M_1`` and row 1 the biased
  variance ``M_2 - M_1**2`` (see `encode_float16`). `decode_moments` gives ``{p: M_p}``
  for every encoding.
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

import numpy as np
from tensorboard.compat.proto import summary_pb2, types_pb2

PLUGIN_NAME = "gradmom"
FORMAT_VERSION = 3

# How a moments tag stores its arrays (the content's `encoding`; version 1 has float32 only).
ENCODING_FLOAT32 = "float32"
ENCODING_FLOAT16 = "float16"
ENCODINGS = (ENCODING_FLOAT32, ENCODING_FLOAT16)
# The orders a float16 moments tag holds: M_1, and M_2 stored as the biased variance.
FLOAT16_ORDERS = (1, 2)
# Largest |exponent| of a float16 row's scale: float64 values are 2**-1074 to 2**1024, and
# integers this size are exact in float16 (up to 2048).
MAX_FLOAT16_EXPONENT = 1100
# The writer scales each float16 row so that its largest finite magnitude is in
# (2**(MAX16_LOG2 - 1), 2**MAX16_LOG2]: float16 holds up to 65504, full precision (11 bits)
# down to 2**-14, so each row keeps 3.3 significant digits over 29 binades below its largest
# value (8.7 decades), and subnormals 10 binades further.
FLOAT16_TOP_LOG2 = 15

KIND_MOMENTS = "moments"
KIND_STATS = "stats"
# What a stats tag's sums come from (`StatsContent.source`): the element-wise moments (the
# default, not written), the per-example norms, or the tf.distribute replicas' gradients. In
# the last two, `sum_gsnr`, `gsnr_count` and the histogram are NaN and the tags have no maps.
SOURCE_MOMENTS = "moments"
SOURCES = (SOURCE_MOMENTS, "norms", "replicas")

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

# Format version 3: where each step's records come from, stored after `STATS_FIELDS` in every
# stats tensor (its content's `fields` name them): the writer's *source token*, a random 48-bit
# number drawn once per summary writer (so two writers, or two processes, on one directory
# differ), in two 24-bit halves (exact in float32); and ``moments_sum``, the sum of the
# absolute values of the moments tensor written beside it at that step (as stored: float16 or
# float32; NaN in a whole-model stats tensor). A reader pairs a step's moments record with its
# stats record only when `same_moments` holds, so one writer's statistics are never read with
# another writer's moments, whatever records a loader keeps of a step stored twice.
SOURCE_FIELDS: tuple[str, ...] = ("source_hi", "source_lo", "moments_sum")
# The bits of each half of a source token (integers below 2**24 are exact in float32).
SOURCE_HALF_BITS = 24
# The fields of the stats tensors the writer of this version writes.
WRITER_STATS_FIELDS: tuple[str, ...] = STATS_FIELDS + SOURCE_FIELDS


def moments_sum(stored: Any) -> float:
    """``moments_sum`` of one stored moments tensor, as a reader recomputes it: the sum of the
    absolute values in float64 (NaN if any value is NaN)."""
    return float(np.abs(np.asarray(stored, dtype=np.float64)).sum())


def same_moments(logged: float, got: float) -> bool:
    """Whether a moments tensor whose `moments_sum` is ``got`` is the one a stats record
    logged with (its ``moments_sum``, ``logged``, a float32 value): equal after rounding to
    float32, within 16 float32 ulps for the order of summation (float64 sums in TensorFlow and
    numpy differ in the last bits). Two writers' moments differ far more unless they are the
    same numbers."""
    want = float(logged)
    if math.isnan(want) or math.isnan(got):
        return math.isnan(want) and math.isnan(got)
    with np.errstate(over="ignore"):
        got32 = float(np.float32(got))
    if math.isinf(want) or math.isinf(got32):
        return want == got32
    return abs(got32 - want) <= 16 * float(np.finfo(np.float32).eps) * max(abs(want), abs(got32))


def source_of(sums: dict[str, float]) -> int | None:
    """The source token of one stats record (its split fields), or None (format 1 and 2)."""
    hi, lo = sums.get("source_hi"), sums.get("source_lo")
    if hi is None or lo is None or not (math.isfinite(hi) and math.isfinite(lo)):
        return None
    return (int(hi) << SOURCE_HALF_BITS) | int(lo)


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
      encoding: how the arrays are stored: ``"float32"`` or ``"float16"`` (see the module
        docstring; format version 1 is always ``"float32"``).
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
    encoding: str = ENCODING_FLOAT32
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
    source: str = SOURCE_MOMENTS


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
        if d["source"] == SOURCE_MOMENTS:  # the default: the messages of older writers
            del d["source"]
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
    encoding = ENCODING_FLOAT32
    if version >= 2:
        encoding = d.get("encoding", ENCODING_FLOAT32)
        if encoding not in ENCODINGS:
            raise FormatError(f"`encoding` must be one of {list(ENCODINGS)}, got {_show(encoding)}")
        if encoding == ENCODING_FLOAT16 and orders != FLOAT16_ORDERS:
            raise FormatError(
                f"`encoding` float16 stores orders {list(FLOAT16_ORDERS)}, got {list(orders)}"
            )
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
        encoding=encoding,
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
            f"`fields` lacks {', '.join(missing)} (every format version has all of "
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
    source = d.get("source", SOURCE_MOMENTS)
    if source not in SOURCES:
        raise FormatError(f"`source` must be one of {', '.join(SOURCES)}, got {_show(source)}")
    return StatsContent(
        fields=tuple(fields),
        hist_edges=edges,
        variable=_text(d, "variable"),
        version=version,
        source=source,
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
    """The shape of a moments tag's decoded arrays stacked: ``[len(orders), *stored_shape]``."""
    return (len(content.orders), *content.stored_shape)


def tensor_shape(content: MomentsContent) -> tuple[int, ...]:
    """The shape of a moments tag's stored tensor: `moments_shape` for ``"float32"``,
    ``[2, 1 + prod(stored_shape)]`` for ``"float16"`` (an exponent, then the values)."""
    if content.encoding == ENCODING_FLOAT16:
        return (len(content.orders), 1 + math.prod(content.stored_shape))
    return moments_shape(content)


def stats_length(content: StatsContent) -> int:
    """The length of a stats tag's tensor: the fields, then ``len(hist_edges) + 1`` counts."""
    return len(content.fields) + len(content.hist_edges) + 1


def check_tensor(content: MomentsContent | StatsContent, array: Any) -> None:
    """Checks one step's tensor against its tag's content message.

    A moments tensor must be a float array of `tensor_shape` (float16 for the ``"float16"``
    encoding); a stats tensor a 1-D numeric (float or integer) array of `stats_length`.
    Accepts anything array-like.

    Raises:
      FormatError: saying what was expected and what came.
    """
    shape = tuple(getattr(array, "shape", ()))
    dtype = getattr(array, "dtype", None)
    kind = getattr(dtype, "kind", "?")
    if isinstance(content, MomentsContent):
        want_shape = tensor_shape(content)
        half = content.encoding == ENCODING_FLOAT16
        what = "float16" if half else "float"
        if shape != want_shape or kind != "f" or (half and getattr(dtype, "itemsize", 0) != 2):
            raise FormatError(
                f"the stored tensor has shape {list(shape)} and dtype {dtype}, but its metadata "
                f"says {what} [{', '.join(map(str, want_shape))}]; the event file is corrupt or "
                "was written by another tool"
            )
        return
    want = stats_length(content)
    if shape != (want,) or kind not in "fiu":
        raise FormatError(
            f"the stats tensor has shape {list(shape)} and dtype {dtype}, but its metadata says "
            f"a number vector [{want}] ({len(content.fields)} sums and "
            f"{len(content.hist_edges) + 1} histogram counts)"
        )


def encode_float16(m1: Any, m2: Any) -> np.ndarray:
    """The ``"float16"`` tensor of one step: ``[2, 1 + S]`` float16 from ``M_1`` and ``M_2``.

    Row 0 is ``M_1``, row 1 the biased variance ``M_2 - M_1**2`` (computed in float64 from the
    float32 moments: storing it, not ``M_2``, keeps the variance's precision where ``M_1**2``
    is close to ``M_2``). Each row is ``[e, x / 2**e ...]`` with ``e`` the exponent that puts
    the row's largest finite magnitude in ``(2**14, 2**15]`` (0 for a row with none), so no
    value overflows and nothing within 2**-29 of the largest loses precision. The writer
    builds the same tensor in TensorFlow (`tb_gradmom.writers.summary`); this numpy twin
    documents it and writes test files.

    Args:
      m1, m2: ``M_1`` and ``M_2``, any shape (flattened in C order), cast to float32 first.
    """
    x1 = np.asarray(m1, np.float32).astype(np.float64).reshape(-1)
    x2 = np.asarray(m2, np.float32).astype(np.float64).reshape(-1)
    rows = np.stack([x1, x2 - x1 * x1])
    out = np.empty([2, 1 + rows.shape[1]], np.float16)
    for i, row in enumerate(rows):
        finite = np.abs(row[np.isfinite(row)])
        top = float(finite.max()) if finite.size else 0.0
        e = math.frexp(top)[1] - FLOAT16_TOP_LOG2 if top > 0 else 0
        out[i, 0] = e
        out[i, 1:] = np.ldexp(row, -e).astype(np.float16)
    return out


def decode_moments(content: MomentsContent, array: Any) -> dict[int, np.ndarray]:
    """``{order: M_order}`` (arrays of ``stored_shape``) from a tensor `check_tensor` accepted.

    ``"float32"``: the rows of the tensor as stored. ``"float16"``: each row times ``2**e``,
    and ``M_2 = variance + M_1**2`` (float64, then float32: the variance derived from the
    result is the stored one to float32 rounding of ``M_2``).

    Raises:
      FormatError: if a float16 row's exponent is not an integer within
        `MAX_FLOAT16_EXPONENT`.
    """
    if content.encoding != ENCODING_FLOAT16:
        return {int(p): array[i] for i, p in enumerate(content.orders)}
    raw = np.asarray(array).astype(np.float64)
    exps = raw[:, 0]
    if not (
        np.all(np.isfinite(exps))
        and np.all(exps == np.round(exps))
        and np.all(np.abs(exps) <= MAX_FLOAT16_EXPONENT)
    ):
        raise FormatError(
            f"the float16 rows' exponents must be integers within {MAX_FLOAT16_EXPONENT}, got "
            f"{_show(exps.tolist())}"
        )
    values = np.ldexp(raw[:, 1:], exps.astype(np.int64)[:, None])
    m1 = values[0]
    with np.errstate(over="ignore", invalid="ignore"):
        m2 = values[1] + m1 * m1
        return {
            1: m1.astype(np.float32).reshape(content.stored_shape),
            2: m2.astype(np.float32).reshape(content.stored_shape),
        }


# Tensor dtypes a reader accepts (numpy item size, and the TensorProto field holding values
# when they are not packed in `tensor_content`). Moments are floats; stats may be integers.
_FLOAT_DTYPES = {
    types_pb2.DT_HALF: (2, "half_val"),
    types_pb2.DT_FLOAT: (4, "float_val"),
    types_pb2.DT_DOUBLE: (8, "double_val"),
}
_HALF_DTYPES = {types_pb2.DT_HALF: _FLOAT_DTYPES[types_pb2.DT_HALF]}
_NUMBER_DTYPES = {
    **_FLOAT_DTYPES,
    types_pb2.DT_INT32: (4, "int_val"),
    types_pb2.DT_INT64: (8, "int64_val"),
}


def check_tensor_proto(content: MomentsContent | StatsContent, proto: Any) -> None:
    """Checks a `TensorProto` against its tag's content message before it is decoded.

    Its shape must be the tag's (`tensor_shape`, or ``[stats_length]``), its dtype a float
    (moments; float16 for the ``"float16"`` encoding) or a number (stats), and its values as many as the shape says (packed in
    ``tensor_content``, one value repeated, or one per element). A proto may declare any
    shape with a single value, which decoding repeats to fill it: checking first bounds what
    `tensor_util.make_ndarray` can allocate by what the content allows.

    Raises:
      FormatError: saying what was expected and what came.
    """
    dims = [int(d.size) for d in proto.tensor_shape.dim[: MAX_RANK + 2]]
    if isinstance(content, MomentsContent) and content.encoding == ENCODING_FLOAT16:
        want, dtypes, what = list(tensor_shape(content)), _HALF_DTYPES, "float16"
    elif isinstance(content, MomentsContent):
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


# --------------------------------------------------------------------------- examples
# Per-example squared gradient norms (docs/format.md, "Per-example norms"). A separate block:
# these tags carry their own plugin name, so that the moments readers (the plugin's, `data.load`'s
# moments path) never list them, and their own version.

EXAMPLES_PLUGIN_NAME = "gradmom_examples"
EXAMPLES_VERSION = 1
KIND_EXAMPLES = "examples"
EXAMPLES_SUFFIX = "_examples"
# What an ``ids`` tag holds: the example ids the user passed, as given.
EXAMPLE_ID_KINDS = ("int64", "string")
# The fixed leading columns of an examples tensor; then one column per norm in ``norms``.
EXAMPLE_COLUMNS = ("batch_size", "position", "loss", "model")
MAX_EXAMPLE_COLUMNS = 1 << 16
MAX_EXAMPLE_ROWS = 1 << 24


def examples_tag(group: str | None = None) -> str:
    """The per-example norms tag of a group of tags (``_examples``, ``<group>/_examples``);
    its ids go to ``<that>/ids``."""
    return f"{group}/{EXAMPLES_SUFFIX}" if group else EXAMPLES_SUFFIX


def examples_ids_tag(tag: str) -> str:
    return tag + "/ids"


@dataclass(frozen=True)
class ExamplesContent:
    """The content message of an ``examples`` tag: tensor float64 ``[rows, len(columns)]``,
    one row per kept example of the step.

    Attributes:
      columns: ``EXAMPLE_COLUMNS`` then the names of ``norms``.
      norms: per column after the fixed ones, ``"layer"`` or ``"variable"`` (``||g_j||^2``
        summed over a layer's variables, or of one variable).
      max_examples: the cap of rows per step (`summary.moments`' ``max_examples``).
      ids: ``""`` without ids, else the kind of the ``<tag>/ids`` tensor (EXAMPLE_ID_KINDS).
    """

    columns: tuple[str, ...]
    norms: tuple[str, ...]
    max_examples: int
    ids: str = ""
    version: int = EXAMPLES_VERSION
    kind: str = field(default=KIND_EXAMPLES)


def create_examples_metadata(content: ExamplesContent) -> summary_pb2.SummaryMetadata:
    """The `SummaryMetadata` of an examples tag (and of its ids tag)."""
    d = {k: list(v) if isinstance(v, tuple) else v for k, v in content.__dict__.items()}
    return summary_pb2.SummaryMetadata(
        plugin_data=summary_pb2.SummaryMetadata.PluginData(
            plugin_name=EXAMPLES_PLUGIN_NAME,
            content=json.dumps(d, sort_keys=True, separators=(",", ":")).encode("utf-8"),
        ),
        data_class=summary_pb2.DATA_CLASS_TENSOR,
    )


def parse_examples_content(content: bytes) -> ExamplesContent:
    """Parses and checks the content message of an examples tag.

    Raises:
      FormatError: not a JSON object of kind ``examples``, a newer version than this reader,
        or a field out of its bounds; the message says which.
    """
    try:
        d = json.loads(bytes(content).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, TypeError, RecursionError) as e:
        raise FormatError(f"Grad Moments examples content is not valid JSON: {e}") from None
    if not isinstance(d, dict) or d.get("kind") != KIND_EXAMPLES:
        raise FormatError("Grad Moments examples content must be a JSON object of kind 'examples'")
    version = d.get("version")
    if not _is_int(version) or not 1 <= version <= EXAMPLES_VERSION:
        raise FormatError(
            f"Grad Moments examples content has version {_show(version)}; this reader knows "
            f"1 to {EXAMPLES_VERSION} (upgrade tb_gradmom for a newer one)"
        )
    columns, norms = d.get("columns"), d.get("norms")
    if (
        not isinstance(columns, list)
        or not isinstance(norms, list)
        or not len(EXAMPLE_COLUMNS) <= len(columns) <= MAX_EXAMPLE_COLUMNS
        or tuple(columns[: len(EXAMPLE_COLUMNS)]) != EXAMPLE_COLUMNS
        or len(norms) != len(columns) - len(EXAMPLE_COLUMNS)
        or not all(isinstance(c, str) and len(c) <= MAX_TEXT_CHARS for c in columns)
        or not all(k in ("layer", "variable") for k in norms)
    ):
        raise FormatError(
            "Grad Moments examples content: `columns` must start with "
            f"{list(EXAMPLE_COLUMNS)} and `norms` name each further column 'layer' or 'variable'"
        )
    cap = d.get("max_examples")
    if not _is_int(cap) or not 1 <= cap <= MAX_EXAMPLE_ROWS:
        raise FormatError(f"Grad Moments examples content: bad max_examples {_show(cap)}")
    ids = d.get("ids", "")
    if ids not in ("", *EXAMPLE_ID_KINDS):
        raise FormatError(f"Grad Moments examples content: bad ids kind {_show(ids)}")
    return ExamplesContent(
        columns=tuple(columns), norms=tuple(norms), max_examples=cap, ids=ids, version=version
    )
