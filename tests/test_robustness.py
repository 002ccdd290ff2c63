"""Hostile input: crafted content messages, tensors and event files, read back three ways.

Every probe is written into real event files (TFRecords framed as TensorBoard's writers do, hand-made `SummaryMetadata` and `TensorProto`s) next to a tag that is fine,
in a logdir that also has a run that is fine. Each is read back through a real TensorBoard data
provider (the Python loader in process; RustBoard's data server in a slow test), through
`data.load` and through ``tb-gradmom export``. A probe *survives* a reader when

* nothing raises and no route answers 500 (routes answer 200, 400 or 404);
* the bad tag (content probes) or step (tensor probes) is skipped, and what is left of the
  tag is served as documented (the latest readable complete step, the steps that remain);
* a warning names the run, the tag and the step;
* every other tag and run is intact (checked against the values written).

Counts of probes tried and survived per class and reader are printed (``pytest -s``) and must
be equal. The probes per class:

* ``json``: content that is not UTF-8, not JSON, not an object, nested 60,000 deep, 100 KB.
* ``header``: missing, wrong-typed, negative, newer and huge versions; unknown kinds.
* ``moments-content``: every field of a moments content wrong-typed, missing, negative,
  zero, NaN, infinite, huge (shapes of 2^62 elements, rank 100, 2^28+ stored values),
  inconsistent with its pooling block.
* ``stats-content``: stats fields missing a name (each of the nine, and one flipped bit),
  repeated, wrong-typed, too many; histogram specs with zero or negative buckets per decade,
  reversed or overflowing decades, 6.4M edges in 70 bytes; explicit edges that are empty,
  decreasing, NaN, too many.
* ``stats-tensor`` / ``moments-tensor``: the last step's tensor short, long, empty,
  string-, bool- or complex-typed, of the wrong rank, declaring 2^40 values with one given,
  with too few bytes or values.
* ``event-files``: zero-length, truncated, flipped bits in data and length, a length of 2^62
  with a valid checksum, garbage, a record that is not an Event.
* ``torn``: steps whose moments have no stats record (last, first, middle, whole-model), and
  stats beyond the moments.

`test_content_parsing_is_total` also feeds 3,000 random mutations of valid content messages
to `metadata.parse_plugin_content` (class ``fuzz``).
"""

from __future__ import annotations

import dataclasses
import io
import json
import logging
import math
import os
import random
import struct
import sys
import time

import numpy as np
import pytest
from tensorboard import context
from tensorboard.compat.proto import (
    event_pb2,
    summary_pb2,
    tensor_pb2,
    tensor_shape_pb2,
    types_pb2,
)
from tensorboard.util import tensor_util

from tb_gradmom import metadata
from tb_gradmom.analysis import data, encode, reductions

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import plugin_logdir as fx  # noqa: E402

P = "/data/plugin/gradmom/"
RUN = "hostile"
GOOD = "good"
OK = "ok/kernel"
SHAPE = (3, 4)
STEPS = (0, 1, 2)
DROP = object()

# ------------------------------------------------------------------------ writing events


def _proto(array) -> tensor_pb2.TensorProto:
    return tensor_util.make_tensor_proto(np.asarray(array))


def _raw_proto(dtype, dims, **fields) -> tensor_pb2.TensorProto:
    shape = tensor_shape_pb2.TensorShapeProto(
        dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=d) for d in dims]
    )
    return tensor_pb2.TensorProto(dtype=dtype, tensor_shape=shape, **fields)


def _event(tag, step, tensor, content: bytes) -> event_pb2.Event:
    md = summary_pb2.SummaryMetadata(
        plugin_data=summary_pb2.SummaryMetadata.PluginData(
            plugin_name=metadata.PLUGIN_NAME, content=content
        ),
        data_class=summary_pb2.DATA_CLASS_TENSOR,
    )
    value = summary_pb2.Summary.Value(tag=tag, metadata=md, tensor=tensor)
    return event_pb2.Event(
        wall_time=1.7e9 + step, step=step, summary=summary_pb2.Summary(value=[value])
    )


def _write(path: str, events, name: str = "events.out.tfevents.1700000000.probe") -> None:
    """A TFRecord event file, as TensorBoard's writers make it (version event first)."""
    os.makedirs(path, exist_ok=True)
    first = event_pb2.Event(wall_time=1.7e9, file_version="brain.Event:2")
    with open(os.path.join(path, name), "wb") as f:
        for e in [first, *events]:
            f.write(_frame(e.SerializeToString()))


def moments(run: str, tag: str, step: int) -> dict[int, np.ndarray]:
    return fx.raw_moments(fx.samples(run, tag, step, SHAPE), (1, 2))


def _stored(m) -> np.ndarray:
    return np.stack([m[1], m[2]]).astype(np.float32)


def _stats(m) -> np.ndarray:
    return fx.stats_values(m[1], m[2], fx.BATCH).astype(np.float32)


MOMENTS_CONTENT = json.loads(
    metadata._encode(fx.moments_content(fx.Var("x/kernel", SHAPE)))  # noqa: SLF001
)
STATS_CONTENT = json.loads(metadata._encode(metadata.StatsContent()))  # noqa: SLF001


def _content(base: dict, **changes) -> bytes:
    d = dict(base)
    for k, v in changes.items():
        if v is DROP:
            d.pop(k, None)
        else:
            d[k] = v
    return json.dumps(d).encode()


def mc(**changes) -> bytes:
    return _content(MOMENTS_CONTENT, **changes)


def sc(**changes) -> bytes:
    return _content(STATS_CONTENT, **changes)


GOOD_M = mc()
GOOD_S = sc()


def variable_events(
    run,
    tag,
    steps=STEPS,
    stats_steps=None,
    bad=None,
    m_content=GOOD_M,
    s_content=GOOD_S,
    moments_steps=None,
):
    """Events of one variable: moments and stats tags (``bad``: step -> (kind, proto))."""
    stats_steps = steps if stats_steps is None else stats_steps
    moments_steps = steps if moments_steps is None else moments_steps
    events = []
    for step in sorted(set(moments_steps) | set(stats_steps)):
        m = moments(run, tag, step)
        if step in moments_steps:
            t = bad[1] if bad and bad[0] == "moments" and step == 2 else _proto(_stored(m))
            events.append(_event(tag, step, t, m_content))
        if step in stats_steps:
            t = bad[1] if bad and bad[0] == "stats" and step == 2 else _proto(_stats(m))
            events.append(_event(metadata.stats_tag(tag), step, t, s_content))
    return events


def model_events(run, tags, steps=STEPS, content=GOOD_S):
    events = []
    for step in steps:
        total = None
        for tag in tags:
            sv = _stats(moments(run, tag, step)).astype(np.float64)
            total = sv if total is None else fx._add_stats(total, sv)  # noqa: SLF001
        events.append(
            _event(
                metadata.stats_tag(metadata.MODEL_TAG),
                step,
                _proto(total.astype(np.float32)),
                content,
            )
        )
    return events


# ------------------------------------------------------------------------------- probes


@dataclasses.dataclass(frozen=True)
class Probe:
    """One crafted input. ``target``: which record of the variable ``tag`` is bad."""

    cls: str
    id: str
    target: str  # moments-content | stats-content | stats-tensor | moments-tensor
    content: bytes | None = None
    tensor: tensor_pb2.TensorProto | None = None

    @property
    def tag(self) -> str:
        return f"p_{self.cls}_{self.id}/kernel".replace("-", "_")

    @property
    def bad_tag(self) -> str:
        return metadata.stats_tag(self.tag) if self.target.startswith("stats") else self.tag


def _json_probes():
    deep = b"[" * 60_000
    nested = b'{"a":' * 12_000 + b"1" + b"}" * 12_000
    big = mc(variable="x" * 100_000)
    raw = [
        ("empty", b""),
        ("not-json", b"not json"),
        ("not-utf8", b"\xff\xfe\x00{"),
        ("array", b"[]"),
        ("number", b"1"),
        ("string", b'"moments"'),
        ("null", b"null"),
        ("deep-array", deep),
        ("deep-object", nested),
        ("huge", big),
        ("truncated", GOOD_M[:-10]),
        ("nan-token", b"NaN"),
        ("nul-bytes", b"\x00" * 16),
        ("bom", b"\xef\xbb\xbf" + GOOD_M),
    ]
    return [Probe("json", i, "moments-content", content=c) for i, c in raw]


def _header_probes():
    out = []
    for i, v in [
        ("missing", DROP),
        ("zero", 0),
        ("negative", -1),
        ("bool", True),
        ("string", "1"),
        ("float", 1.5),
        ("newer", metadata.FORMAT_VERSION + 1),
        ("huge", 10**30),
        ("null", None),
    ]:
        out.append(Probe("header", f"version-{i}", "moments-content", content=mc(version=v)))
    for i, v in [
        ("missing", DROP),
        ("unknown", "histogram"),
        ("number", 5),
        ("list", ["moments"]),
        ("null", None),
    ]:
        out.append(Probe("header", f"kind-{i}", "moments-content", content=mc(kind=v)))
    out.append(
        Probe(
            "header",
            "stats-newer",
            "stats-content",
            content=sc(version=metadata.FORMAT_VERSION + 1),
        )
    )
    return out


def _raw_field(field: str, token: str) -> bytes:
    """Moments content whose ``field`` is the raw JSON ``token`` (NaN, 1e400, ...)."""
    d = dict(MOMENTS_CONTENT)
    d[field] = "@@"
    return json.dumps(d).replace('"@@"', token).encode()


def _moments_content_probes():
    huge = 2**62
    cases = [
        ("orders-missing", mc(orders=DROP)),
        ("orders-empty", mc(orders=[])),
        ("orders-zero", mc(orders=[0, 2])),
        ("orders-negative", mc(orders=[-1, 2])),
        ("orders-too-high", mc(orders=[1, 2, 99])),
        ("orders-repeated", mc(orders=[1, 1])),
        ("orders-string", mc(orders=["1", "2"])),
        ("orders-float", mc(orders=[1.0, 2.0])),
        ("orders-bool", mc(orders=[True, 2])),
        ("orders-nan", _raw_field("orders", "[NaN, 2]")),
        ("orders-inf", _raw_field("orders", "[1e400, 2]")),
        ("orders-scalar", mc(orders=12)),
        ("orders-nested", mc(orders=[[1], [2]])),
        ("orders-many", mc(orders=list(range(1, 200)))),
        ("shape-missing", mc(shape=DROP)),
        ("shape-negative", mc(shape=[-3, 4], stored_shape=[-3, 4])),
        ("shape-zero", mc(shape=[0, 4], stored_shape=[0, 4])),
        ("shape-inf", _raw_field("shape", "[1e400, 4]")),
        ("shape-nan", _raw_field("shape", "NaN")),
        ("shape-huge", mc(shape=[huge, huge], stored_shape=[huge, huge])),
        ("shape-rank-100", mc(shape=[1] * 100, stored_shape=[1] * 100)),
        ("shape-string", mc(shape="3x4", stored_shape="3x4")),
        ("shape-float", mc(shape=[3.5, 4], stored_shape=[3.5, 4])),
        ("shape-bigint", mc(shape=[10**30], stored_shape=[10**30])),
        ("stored-missing", mc(stored_shape=DROP)),
        ("stored-mismatch", mc(stored_shape=[4, 3])),
        ("stored-huge", mc(shape=[2**20, 2**20], stored_shape=[2**20, 2**20])),
        (
            "stored-huge-pooled",
            mc(shape=[2**30, 2**15], stored_shape=[2**15, 2**15], pooled=True, block=[2**15, 1]),
        ),
        ("pooled-string", mc(pooled="yes")),
        ("pooled-int", mc(pooled=1)),
        ("block-zero", mc(pooled=True, block=[0, 1])),
        ("block-short", mc(pooled=True, block=[2])),
        ("block-negative", mc(pooled=True, block=[-2, 2])),
        ("block-inf", _raw_field("block", "[1e400, 1]")),
        ("block-inconsistent", mc(pooled=True, block=[2, 2])),
        ("dtype-number", mc(dtype=5)),
        ("op-object", mc(op={"a": 1})),
        ("layer-list", mc(layer=[1])),
        ("variable-long", mc(variable="v" * 10_000)),
    ]
    return [Probe("moments-content", i, "moments-content", content=c) for i, c in cases]


def _stats_content_probes():
    fields = list(metadata.STATS_FIELDS)
    cases = [
        ("fields-missing", sc(fields=DROP)),
        ("fields-empty", sc(fields=[])),
        ("fields-string", sc(fields="batch_size")),
        ("fields-number", sc(fields=[*fields[:-1], 7])),
        ("fields-empty-name", sc(fields=[*fields, ""])),
        ("fields-repeated", sc(fields=[*fields, "loss"])),
        ("fields-too-many", sc(fields=[*fields, *[f"f{i}" for i in range(300)]])),
        (
            "fields-flipped-bit",
            sc(fields=[f.replace("num_elements", "num_elemdnts") for f in fields]),
        ),
    ]
    for name in fields:
        cases.append((f"fields-without-{name}", sc(fields=[f for f in fields if f != name])))
    for i, spec in [
        ("zero-per-decade", [-24, 8, 0]),
        ("negative-per-decade", [-24, 8, -4]),
        ("reversed", [8, -24, 4]),
        ("equal", [0, 0, 4]),
        ("6.4M-edges", [-100_000, 100_000, 32]),
        ("too-many-edges", [-24, 8, 1000]),
        ("overflow-high", [-24, 400, 4]),
        ("overflow-low", [-400, 8, 4]),
        ("float", [1.5, 8, 4]),
        ("bool", [True, 8, 4]),
        ("short", [-24, 8]),
        ("string", "x"),
        ("null", None),
    ]:
        cases.append((f"hist-{i}", sc(hist=spec)))
    cases.append(("hist-inf", sc().replace(b'"hist": [-24, 8, 4]', b'"hist": [-24, 8, 1e400]')))
    for i, edges in [
        ("empty", []),
        ("one", [1.0]),
        ("decreasing", [2.0, 1.0]),
        ("strings", ["a", "b"]),
        ("too-many", list(range(5000))),
        ("bool", [True, False]),
    ]:
        cases.append((f"edges-{i}", sc(hist=DROP, hist_edges=edges)))
    nan_edges = sc(hist=DROP, hist_edges=[1.0, 2.0]).replace(b"2.0", b"NaN")
    cases.append(("edges-nan", nan_edges))
    cases.append(("hist-and-edges-missing", sc(hist=DROP)))
    return [Probe("stats-content", i, "stats-content", content=c) for i, c in cases]


N_STATS = metadata.STATS_LENGTH


def _tensor_probes(kind: str):
    if kind == "stats":
        good_dims = [N_STATS]
    else:
        good_dims = [2, *SHAPE]
    n = math.prod(good_dims)
    f32 = types_pb2.DT_FLOAT
    cases = [
        ("short", _proto(np.zeros(10, np.float32))),
        ("long", _proto(np.zeros(n + 1, np.float32))),
        ("empty", _proto(np.zeros(0, np.float32))),
        ("scalar", _proto(np.float32(1.0))),
        ("rank-up", _proto(np.zeros([1, *good_dims], np.float32))),
        ("rank-down", _proto(np.zeros(good_dims[1:] or [1], np.float32))),
        ("transposed", _proto(np.zeros(good_dims[::-1] + [1], np.float32))),
        ("strings", _raw_proto(types_pb2.DT_STRING, good_dims, string_val=[b"1.5"] * n)),
        ("one-string", _raw_proto(types_pb2.DT_STRING, good_dims, string_val=[b"1.5"])),
        ("bool", _raw_proto(types_pb2.DT_BOOL, good_dims, bool_val=[True])),
        ("complex", _proto(np.zeros(good_dims, np.complex64))),
        ("uint8", _proto(np.zeros(good_dims, np.uint8))),
        ("huge-declared", _raw_proto(f32, [2**40], float_val=[1.0])),
        ("huge-declared-2d", _raw_proto(f32, [2**31, 2**31], float_val=[1.0])),
        ("negative-dim", _raw_proto(f32, [-1], float_val=[1.0])),
        ("few-bytes", _raw_proto(f32, good_dims, tensor_content=b"\x00" * 12)),
        ("many-bytes", _raw_proto(f32, good_dims, tensor_content=b"\x00" * (4 * n + 4))),
        ("few-values", _raw_proto(f32, good_dims, float_val=[1.0, 2.0, 3.0])),
        ("no-values", _raw_proto(f32, good_dims)),
    ]
    if kind == "moments":
        cases.append(("int32", _proto(np.zeros(good_dims, np.int32))))
    return [Probe(f"{kind}-tensor", i, f"{kind}-tensor", tensor=t) for i, t in cases]


# Valid variants that must be accepted and served (not counted as hostile probes).
ACCEPTED = [
    ("extra-fields", mc(unknown={"deep": [1, 2, {"x": None}]}), GOOD_S, None),
    ("explicit-edges", GOOD_M, sc(hist=DROP, hist_edges=list(metadata.HIST_EDGES)), None),
    ("int-stats", GOOD_M, GOOD_S, "int-stats"),
    ("float64-moments", GOOD_M, GOOD_S, "float64"),
]

TORN = [
    # id, moments steps, stats steps, complete steps
    ("last", (0, 1, 2), (0, 1), (0, 1)),
    ("first", (0, 1, 2), (1, 2), (1, 2)),
    ("middle", (0, 1, 2), (0, 2), (0, 2)),
    ("stats-ahead", (0, 1), (0, 1, 2), (0, 1)),
    ("two-torn", (0, 1, 2), (0,), (0,)),
]


def all_probes() -> list[Probe]:
    return [
        *_json_probes(),
        *_header_probes(),
        *_moments_content_probes(),
        *_stats_content_probes(),
        *_tensor_probes("stats"),
        *_tensor_probes("moments"),
    ]


def _frame(blob: bytes) -> bytes:
    header = struct.pack("<Q", len(blob))
    return (
        header
        + struct.pack("<I", data.masked_crc32c(header))
        + blob
        + struct.pack("<I", data.masked_crc32c(blob))
    )


def _records(path: str) -> list[tuple[int, int]]:
    blob = open(path, "rb").read()
    out, pos = [], 0
    while pos + 12 <= len(blob):
        (length,) = struct.unpack("<Q", blob[pos : pos + 8])
        out.append((pos, length))
        pos += 16 + length
    return out


def _damage(path: str, how: str) -> None:
    blob = bytearray(open(path, "rb").read())
    recs = _records(path)
    mid_pos, mid_len = recs[len(recs) // 2]
    last_pos, last_len = recs[-1]
    rng = random.Random(how)
    if how == "zero-length":
        blob = bytearray()
    elif how == "truncated-header":
        blob = blob[: last_pos + 5]
    elif how == "truncated-body":
        blob = blob[: last_pos + 12 + last_len // 2]
    elif how == "flipped-data":
        blob[mid_pos + 12 + mid_len // 2] ^= 0x10
    elif how == "flipped-length":
        blob[mid_pos + 1] ^= 0x01
    elif how == "huge-length-end":
        header = struct.pack("<Q", 2**62)
        blob += header + struct.pack("<I", data.masked_crc32c(header)) + b"x" * 100
    elif how == "huge-length-middle":
        header = struct.pack("<Q", 2**40)
        blob[mid_pos : mid_pos + 12] = header + struct.pack("<I", data.masked_crc32c(header))
    elif how == "garbage-appended":
        blob += bytes(rng.randrange(256) for _ in range(3000))
    elif how == "not-an-event":
        blob += _frame(b"\x0a\xff\xff\xff\xff\x0f" + bytes(rng.randrange(256) for _ in range(64)))
    elif how == "empty-record":
        blob += _frame(b"")
    else:
        raise ValueError(how)
    with open(path, "wb") as f:
        f.write(blob)


# These break TensorBoard's loaders themselves, before the plugin sees anything (measured with
# TensorFlow 2.21, TensorBoard 2.21, tensorboard-data-server 0.7.2): a record length of 2^40
# or 2^62 with a valid checksum is a segmentation fault in TensorFlow's record reader (which
# TensorBoard's Python loader uses when TensorFlow is installed) and aborts RustBoard's data
# server ("memory allocation of 4611686018427387908 bytes failed"); a record that is not an
# Event raises DecodeError out of the Python loader's reload (in `tensorboard` this ends its
# reload thread). They are written to a second logdir, which data.load and the export read.
TB_PYTHON_CRASHERS = ("huge-length-end", "huge-length-middle", "not-an-event")
TB_RUST_CRASHERS = ("huge-length-end", "huge-length-middle")
FILE_PROBES = [
    "zero-length",
    "truncated-header",
    "truncated-body",
    "flipped-data",
    "flipped-length",
    "huge-length-end",
    "huge-length-middle",
    "garbage-appended",
    "not-an-event",
    "empty-record",
    "zero-length-beside-good",
    "garbage-file-beside-good",
]


def write_probe_logdir(
    root: str, crash_root: str | None = None, crashers=TB_PYTHON_CRASHERS
) -> None:
    """The hostile logdir: runs `GOOD`, `RUN` (every probe beside `OK`), ``model``, ``torn``,
    ``accepted`` and one ``file_<probe>`` run per event-file probe; those that crash a
    TensorBoard loader (``crashers``) in ``crash_root`` (with a `GOOD` run) if given."""
    _write(os.path.join(root, GOOD), [*variable_events(GOOD, OK), *model_events(GOOD, [OK])])
    events = [*variable_events(RUN, OK), *model_events(RUN, [OK])]
    for p in all_probes():
        if p.target == "moments-content":
            events += variable_events(RUN, p.tag, m_content=p.content)
        elif p.target == "stats-content":
            events += variable_events(RUN, p.tag, s_content=p.content)
        else:
            events += variable_events(RUN, p.tag, bad=(p.target.split("-")[0], p.tensor))
    _write(os.path.join(root, RUN), events)
    # A whole-model stats tag missing a field name: /summary of the run still answers.
    _write(
        os.path.join(root, "model"),
        [*variable_events("model", OK), *model_events("model", [OK], content=sc(fields=["x"]))],
    )
    torn = []
    for i, ms, ss, _ in TORN:
        torn += variable_events("torn", f"t_{i}/kernel", moments_steps=ms, stats_steps=ss)
    torn += model_events("torn", [OK], steps=(0, 1))
    torn += variable_events("torn", OK)
    _write(os.path.join(root, "torn"), torn)
    acc = []
    for i, m_content, s_content, how in ACCEPTED:
        tag = f"a_{i}/kernel".replace("-", "_")
        for step in STEPS:
            m = moments("accepted", tag, step)
            mt = _stored(m).astype(np.float64 if how == "float64" else np.float32)
            st = _stats(m)
            st = np.round(np.nan_to_num(st)).astype(np.int32) if how == "int-stats" else st
            acc.append(_event(tag, step, _proto(mt), m_content))
            acc.append(_event(metadata.stats_tag(tag), step, _proto(st), s_content))
    _write(os.path.join(root, "accepted"), acc)
    if crash_root is not None:
        _write(os.path.join(crash_root, GOOD), variable_events(GOOD, OK))
    for how in FILE_PROBES:
        run = f"file_{how}"
        where = crash_root if how in crashers and crash_root is not None else root
        path = os.path.join(where, run)
        _write(path, variable_events(run, OK))
        (events_file,) = [os.path.join(path, f) for f in os.listdir(path)]
        if how == "zero-length-beside-good":
            open(events_file + "0", "wb").close()
        elif how == "garbage-file-beside-good":
            with open(events_file + "0", "wb") as f:
                f.write(bytes(random.Random(1).randrange(256) for _ in range(5000)))
        else:
            _damage(events_file, how)


@pytest.fixture(scope="module")
def logdirs(tmp_path_factory):
    """(the hostile logdir, the logdir of the probes that crash TensorBoard's Python loader)."""
    root = str(tmp_path_factory.mktemp("hostile"))
    crash = str(tmp_path_factory.mktemp("crash"))
    write_probe_logdir(root, crash)
    return root, crash


@pytest.fixture(scope="module")
def logdir(logdirs):
    return logdirs[0]


# -------------------------------------------------------------------- content parsing


def test_content_parsing_is_total():
    """Every crafted content, and 3,000 random mutations of valid ones: a content object or
    FormatError, fast, never another exception."""
    contents = [p.content for p in all_probes() if p.content is not None]
    rng = random.Random(0)
    for _ in range(3000):
        blob = bytearray(rng.choice([GOOD_M, GOOD_S, sc(hist=DROP, hist_edges=[1, 2, 3])]))
        for _ in range(rng.randint(1, 4)):
            op = rng.randrange(3)
            i = rng.randrange(len(blob))
            if op == 0:
                blob[i] ^= 1 << rng.randrange(8)
            elif op == 1:
                del blob[i : i + rng.randint(1, 8)]
            else:
                blob[i:i] = rng.choice([b"9", b"e9", b"-", b"[", b"]", b"{", b'"', b"1e400"])
        contents.append(bytes(blob))
    slowest = 0.0
    tried = survived = 0
    for blob in contents:
        tried += 1
        t = time.perf_counter()
        try:
            metadata.parse_plugin_content(blob)
        except metadata.FormatError:
            pass
        slowest = max(slowest, time.perf_counter() - t)
        survived += 1
    print(f"\nprobe class fuzz+crafted content (parse only): tried {tried}, survived {survived}")
    assert survived == tried
    assert slowest < 0.5  # the 6.4M-edge spec took 8.7 s before


def test_probe_messages_are_rejected_with_a_reason():
    for p in all_probes():
        if p.content is None:
            continue
        with pytest.raises(metadata.FormatError) as e:
            metadata.parse_plugin_content(p.content)
        assert str(e.value), p.id
    for _, m, s, _ in ACCEPTED:
        metadata.parse_plugin_content(m)
        metadata.parse_plugin_content(s)


def test_hist_spec_is_bounded():
    with pytest.raises(metadata.FormatError, match="at most 4097"):
        metadata.parse_plugin_content(sc(hist=[-300, 300, 32]))
    with pytest.raises(ValueError, match="per decade must be >= 1"):
        metadata.hist_edges((-24, 8, 0))
    assert len(metadata.hist_edges((-24, 8, 4))) == 129


# ---------------------------------------------------------------- the reference values


def _ref_variance(run, tag, step):
    g = fx.samples(run, tag, step, SHAPE)
    return g.var(0, ddof=1)


def _close(values, run, tag, step) -> bool:
    got = np.asarray([float(v) for v in values], dtype=np.float64).reshape(SHAPE)
    return bool(np.allclose(got, _ref_variance(run, tag, step), rtol=1e-5))


def _expected_steps(p: Probe):
    """Steps each reader should give for a probe's variable: (/tags, data.load)."""
    if p.target == "stats-tensor":
        return [0, 1], [0, 1]
    if p.target == "moments-tensor":
        return [0, 1, 2], [0, 1]  # /tags lists the stats steps; moments are read on demand
    return [0, 1, 2], [0, 1, 2]


# ------------------------------------------------------------------------- data.load


@pytest.fixture(scope="module")
def loaded(logdirs):
    with pytest.warns(data.DataWarning) as caught:
        runs = data.load(logdirs[0])
        crash = data.load(logdirs[1])
    runs.update({r: v for r, v in crash.items() if r != GOOD})
    assert _ok_intact(crash, GOOD)
    return runs, [str(w.message) for w in caught]


def _named(messages, run, tag, step) -> bool:
    want = f"run {run!r} tag {tag!r} step {step}"
    return any(want in m for m in messages)


def _data_survives(p: Probe, runs, messages) -> bool:
    recs = runs.get(RUN, {}).get(p.tag, [])
    if p.target == "moments-content":
        ok = all(not r.moments for r in recs)
        return ok and _named(messages, RUN, p.tag, 0)
    if p.target == "stats-content":
        ok = [r.step for r in recs] == [0, 1, 2] and all(r.stats is None for r in recs)
        return ok and _named(messages, RUN, p.bad_tag, 0)
    _, want = _expected_steps(p)
    ok = [r.step for r in recs] == want and all(
        np.allclose(r.moments[2], moments(RUN, p.tag, r.step)[2], rtol=1e-6) for r in recs
    )
    return ok and _named(messages, RUN, p.bad_tag, 2)


def _ok_intact(runs, run) -> bool:
    recs = runs.get(run, {}).get(OK, [])
    return [r.step for r in recs] == list(STEPS) and all(
        r.batch_size == fx.BATCH
        and np.allclose(
            reductions.stat_array(r.moments, r.batch_size, "variance"),
            _ref_variance(run, OK, r.step),
            rtol=1e-5,
        )
        for r in recs
    )


def _classes():
    out: dict[str, list[Probe]] = {}
    for p in all_probes():
        out.setdefault(p.cls, []).append(p)
    return out


def test_data_load_skips_every_probe_and_keeps_the_rest(loaded):
    runs, messages = loaded
    assert _ok_intact(runs, GOOD) and _ok_intact(runs, RUN)
    failed = []
    for cls, probes in _classes().items():
        survived = [p for p in probes if _data_survives(p, runs, messages)]
        print(f"\nprobe class {cls} (data.load): tried {len(probes)}, survived {len(survived)}")
        failed += [p.id for p in probes if p not in survived]
    assert not failed


def test_data_load_event_file_probes(loaded):
    runs, messages = loaded
    survived = 0
    for how in FILE_PROBES:
        run = f"file_{how}"
        recs = runs.get(run, {}).get(OK, [])
        steps = [r.step for r in recs]
        # What is left before the damage is read, and nothing wrong is: a prefix of the steps
        # (a flipped data byte drops one record: a subsequence), exact values.
        fine = set(steps) <= set(STEPS) and all(
            np.allclose(r.moments[1], moments(run, OK, r.step)[1]) for r in recs
        )
        if how.endswith("beside-good") or how in ("huge-length-end", "garbage-appended"):
            fine = fine and steps == list(STEPS)
        # An empty file or record holds nothing to lose: read silently, like TensorBoard.
        silent = how in ("zero-length", "zero-length-beside-good", "empty-record")
        warned = any(run in m for m in messages) or silent
        if not (fine and warned):
            print(f"event-file probe {how}: steps {steps}, warned {warned}")
        survived += fine and warned
    print(f"\nprobe class event-files (data.load): tried {len(FILE_PROBES)}, survived {survived}")
    assert survived == len(FILE_PROBES)
    assert _ok_intact(runs, GOOD)


def test_data_load_torn_steps(loaded):
    runs, messages = loaded
    survived = 0
    for i, ms, ss, complete in TORN:
        tag = f"t_{i}/kernel"
        recs = runs.get("torn", {}).get(tag, [])
        fine = [r.step for r in recs] == list(complete)
        fine = fine and all(r.batch_size == fx.BATCH for r in recs)
        torn_steps = [s for s in ms if s not in ss]
        fine = fine and all(_named(messages, "torn", tag, s) for s in torn_steps)
        survived += fine
    assert [r.step for r in runs["torn"]["_model"]] == [0, 1] and _ok_intact(runs, "torn")
    print(f"\nprobe class torn (data.load): tried {len(TORN)}, survived {survived}")
    assert survived == len(TORN)


def test_data_load_accepts_valid_variants(loaded):
    runs, _ = loaded
    for i, *_ in ACCEPTED:
        tag = f"a_{i}/kernel".replace("-", "_")
        recs = runs["accepted"][tag]
        assert [r.step for r in recs] == list(STEPS), i
        assert recs[-1].batch_size == fx.BATCH, i


def test_data_load_missing_field_names_skip_only_that_tag(loaded):
    runs, messages = loaded
    assert "_model" not in runs["model"] and _ok_intact(runs, "model")
    assert _named(messages, "model", "_model/_stats", 0)


def test_read_records_never_allocates_a_claimed_length(tmp_path):
    header = struct.pack("<Q", 2**62)
    path = tmp_path / "events.out.tfevents.1.x"
    path.write_bytes(header + struct.pack("<I", data.masked_crc32c(header)) + b"abc")
    with pytest.warns(data.DataWarning, match="truncated last record"):
        assert list(data.read_records(path)) == []
    os.mkfifo(tmp_path / "events.out.tfevents.2.fifo")
    with pytest.warns(data.DataWarning, match="not a regular file"):
        assert list(data.read_records(tmp_path / "events.out.tfevents.2.fifo")) == []


# --------------------------------------------------------------------------- the plugin


ROUTES_FULL = [
    ("heatmap", {}),
    ("heatmap", {"step": 1}),
    ("heatmap", {"step": 2}),
    ("heatmap", {"stat": "mean"}),
    ("histogram", {"step": "all"}),
    ("histogram", {"step": 1, "scale": "log"}),
    ("series", {}),
    ("export", {"what": "moments", "step": 1}),
    ("export", {"what": "histogram", "step": "all", "format": "json"}),
    ("export", {"what": "heatmap", "format": "npy"}),
]
# Over RustBoard each request waits on gRPC round trips (~44 ms each, benchmarks/README.md):
# the routes that decide survival only.
ROUTES_SHORT = [
    ("heatmap", {}),
    ("heatmap", {"step": 1}),
    ("heatmap", {"step": 2}),
    ("heatmap", {"stat": "mean"}),
    ("histogram", {"step": "all"}),
    ("export", {"what": "histogram", "step": "all", "format": "json"}),
]


class _ListHandler(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def _serve(plugin_get, runs_of_interest, file_probes, routes=ROUTES_FULL) -> dict:
    """Every request of the suite, through ``plugin_get(route, params) -> (status, body)``."""
    out = {"tags": plugin_get("tags", {}), "routes": {}, "route_list": routes}
    for run in runs_of_interest:
        out["routes"][(run, "summary")] = plugin_get("summary", {"run": run})
        out["routes"][(run, "series-model")] = plugin_get("series", {"run": run})
    for p in all_probes():
        for route, q in routes:
            key = (p.tag, route, json.dumps(q, sort_keys=True))
            out["routes"][key] = plugin_get(route, {"run": RUN, "tag": p.tag, **q})
    for run in (GOOD, RUN, "model", "torn"):
        out["routes"][(run, OK)] = plugin_get("heatmap", {"run": run, "tag": OK})
    for i, *_ in TORN:
        tag = f"t_{i}/kernel"
        for route, q in routes:
            key = (tag, route, json.dumps(q, sort_keys=True))
            out["routes"][key] = plugin_get(route, {"run": "torn", "tag": tag, **q})
    for i, *_ in ACCEPTED:
        tag = f"a_{i}/kernel".replace("-", "_")
        out["routes"][("accepted", tag)] = plugin_get("heatmap", {"run": "accepted", "tag": tag})
    for how in file_probes:
        out["routes"][(f"file_{how}", OK)] = plugin_get(
            "heatmap", {"run": f"file_{how}", "tag": OK}
        )
    return out


def _json(resp):
    status, body = resp
    return json.loads(body) if status == 200 else None


def _plugin_survives(p: Probe, served, logs) -> bool:
    statuses = [
        served["routes"][(p.tag, r, json.dumps(q, sort_keys=True))][0]
        for r, q in served["route_list"]
    ]
    if any(s not in (200, 400, 404) for s in statuses):
        return False
    tags = _json(served["tags"])["runs"].get(RUN, {})
    latest = _json(served["routes"][(p.tag, "heatmap", "{}")])
    step_tag = "(last 2)" if p.target.endswith("content") else 2
    named = any(f"run {RUN!r} tag {p.bad_tag!r} step {step_tag}" in m for m in logs)
    if p.target == "moments-content":
        return p.tag not in tags and latest is None and named
    if p.target == "stats-content":
        t = tags.get(p.tag)
        mean = _json(served["routes"][(p.tag, "heatmap", json.dumps({"stat": "mean"}))])
        return (
            t is not None
            and t["has_stats"] is False
            and t["steps"] == [0, 1, 2]
            and mean is not None
            and mean["step"] == 2
            and named
        )
    want_tags, want_hist = _expected_steps(p)
    t = tags.get(p.tag)
    hist = _json(served["routes"][(p.tag, "histogram", json.dumps({"step": "all"}))])
    at2 = served["routes"][(p.tag, "heatmap", json.dumps({"step": 2}))][0]
    return (
        t is not None
        and t["steps"] == want_tags
        and latest is not None
        and latest["step"] == 1
        and _close(latest["values"], RUN, p.tag, 1)
        and hist is not None
        and [s["step"] for s in hist["series"]] == want_hist
        and at2 == 404
        and named
    )


def _check_plugin(served, logs, loader: str, file_probes) -> list[str]:
    tags = _json(served["tags"])
    assert tags is not None, served["tags"]
    for run in (GOOD, RUN, "model", "torn"):
        assert tags["runs"][run][OK]["steps"] == list(STEPS), run
        d = _json(served["routes"][(run, OK)])
        assert d is not None and d["step"] == 2 and _close(d["values"], run, OK, 2), run
    for run in (GOOD, RUN, "model", "torn"):
        assert served["routes"][(run, "summary")][0] == 200, run
    summary = _json(served["routes"][("model", "summary")])
    assert summary["model"] is None and [r["tag"] for r in summary["rows"]] == [OK]
    assert served["routes"][("model", "series-model")][0] == 404
    failed = []
    for cls, probes in _classes().items():
        survived = [p for p in probes if _plugin_survives(p, served, logs)]
        print(
            f"\nprobe class {cls} (plugin, {loader}): tried {len(probes)}, survived {len(survived)}"
        )
        failed += [p.id for p in probes if p not in survived]
    # Torn steps: listed steps are the complete ones; the latest complete step is shown; the
    # all-steps histogram and its export bin the complete steps; a torn step answers 404.
    torn_ok = 0
    for i, ms, ss, complete in TORN:
        tag = f"t_{i}/kernel"

        def key(r, q, tag=tag):
            return (tag, r, json.dumps(q, sort_keys=True))

        statuses = [served["routes"][key(r, q)][0] for r, q in served["route_list"]]
        t = tags["runs"]["torn"].get(tag)
        latest = _json(served["routes"][key("heatmap", {})])
        hist = _json(served["routes"][key("histogram", {"step": "all"})])
        exported = _json(
            served["routes"][key("export", {"what": "histogram", "step": "all", "format": "json"})]
        )
        fine = all(s in (200, 400, 404) for s in statuses) and t is not None
        fine = fine and t["steps"] == list(complete)
        if complete:
            fine = fine and latest is not None and latest["step"] == complete[-1]
            fine = fine and _close(latest["values"], "torn", tag, complete[-1])
            fine = fine and [s["step"] for s in hist["series"]] == list(complete)
            fine = fine and [s["step"] for s in exported["series"]] == list(complete)
        else:
            fine = fine and latest is None
        torn_steps = [s for s in ms if s not in ss]
        fine = fine and all(
            served["routes"][key("heatmap", {"step": s})][0] == 404
            for s in torn_steps
            if s in (1, 2)
        )
        torn_ok += fine
    print(f"\nprobe class torn (plugin, {loader}): tried {len(TORN)}, survived {torn_ok}")
    files_ok = 0
    for how in file_probes:
        status, _ = served["routes"][(f"file_{how}", OK)]
        listed = f"file_{how}" in tags["runs"] or how == "zero-length"  # that one has no data
        files_ok += status in (200, 404) and listed
    print(
        f"\nprobe class event-files (plugin, {loader}): tried {len(file_probes)}, "
        f"survived {files_ok}"
    )
    for i, *_ in ACCEPTED:
        tag = f"a_{i}/kernel".replace("-", "_")
        d = _json(served["routes"][("accepted", tag)])
        assert d is not None and d["step"] == 2 and d["batch_size"] == fx.BATCH, i
    assert not failed and torn_ok == len(TORN) and files_ok == len(file_probes)
    return failed


def test_plugin_python_loader(logdir):
    """Every probe through TensorBoard's app and Python loader (`test_plugin.make_app`)."""
    from test_plugin import make_app

    handler = _ListHandler()
    log = logging.getLogger("tb_gradmom")
    log.addHandler(handler)
    try:
        client, plugin, _ = make_app(logdir)

        def plugin_get(route, q):
            r = client.get(P + route, query_string=q)
            return r.status_code, r.get_data()

        files = [h for h in FILE_PROBES if h not in TB_PYTHON_CRASHERS]
        served = _serve(plugin_get, [GOOD, RUN, "model", "torn"], files)
    finally:
        log.removeHandler(handler)
    assert plugin._reader._mux is not None  # noqa: SLF001 - the multiplexer path was taken
    _check_plugin(served, handler.messages, "python", files)


def _app_over(logdir, data_provider):
    """(werkzeug Client, plugin) of TensorBoard's app over a given data provider."""
    from tensorboard import program
    from tensorboard.backend import application
    from tensorboard.plugins.core import core_plugin
    from test_plugin import _CapturingLoader
    from werkzeug.test import Client

    loader = _CapturingLoader()
    loaders = [core_plugin.CorePluginLoader(), loader]
    tb = program.TensorBoard(plugins=loaders, assets_zip_provider=lambda: None)
    tb.configure(["", "--logdir", logdir])
    app = application.TensorBoardWSGIApp(tb.flags, loaders, data_provider, None, None)
    return Client(app), loader.plugin


@pytest.mark.slow
def test_plugin_rustboard(tmp_path):
    """Every probe through RustBoard's data server and TensorBoard's gRPC data provider."""
    import test_plugin_subprocess as tps
    from tensorboard.data import provider, server_ingester
    from tensorboard.util import grpc_util

    problem = tps._data_server_problem()  # noqa: SLF001
    if problem:
        pytest.skip(problem)
    logdir = str(tmp_path / "all")
    write_probe_logdir(logdir, str(tmp_path / "crash"), TB_RUST_CRASHERS)
    files = [h for h in FILE_PROBES if h not in TB_RUST_CRASHERS]
    ingester = server_ingester.SubprocessServerDataIngester(
        server_ingester.get_server_binary(),
        logdir,
        reload_interval=0,
        channel_creds_type=grpc_util.ChannelCredsType.LOCAL,
        samples_per_plugin={"gradmom": 500},
    )
    ingester.start()
    dp = ingester.data_provider
    ctx = context.RequestContext()
    deadline = time.time() + 120
    while time.time() < deadline:  # loading is asynchronous: wait for the last run
        got = dp.list_tensors(
            ctx,
            experiment_id="",
            plugin_name="gradmom",
            run_tag_filter=provider.RunTagFilter(runs=[GOOD, "torn", RUN]),
        )
        if all(got.get(r, {}).get(OK) and got[r][OK].max_step == 2 for r in (GOOD, "torn", RUN)):
            break
        time.sleep(0.5)
    handler = _ListHandler()
    log = logging.getLogger("tb_gradmom")
    log.addHandler(handler)
    try:
        client, plugin = _app_over(logdir, dp)
        assert plugin._reader._stub is not None  # noqa: SLF001 - protos read undecoded

        def plugin_get(route, q):
            r = client.get(P + route, query_string=q)
            return r.status_code, r.get_data()

        served = _serve(plugin_get, [GOOD, RUN, "model", "torn"], files, ROUTES_SHORT)
    finally:
        log.removeHandler(handler)
        stdin = getattr(ingester, "_stdin_handle", None)
        if stdin is not None:
            stdin.close()
    _check_plugin(served, handler.messages, "rustboard", files)


# --------------------------------------------------------------------------- the export


def test_export_skips_every_probe_and_writes_the_rest(logdir, tmp_path, capsys):
    from tb_gradmom import cli

    out = tmp_path / "out"
    code = cli.main(["export", "--logdir", logdir, "--out", str(out), "--format", "csv"])
    err = capsys.readouterr().err
    assert code == 0, err
    assert "Traceback" not in err
    files = set(os.listdir(out))
    lines = [ln for ln in err.splitlines() if ln.startswith("tb-gradmom export: warning: ")]
    for run in (GOOD, RUN, "model", "torn"):
        assert encode.file_name([run, OK, "step2", "variance"], "csv") in files, run

    def file_of(tag, step):
        return encode.file_name([RUN, tag, f"step{step}", "variance"], "csv")

    failed = []
    for cls, probes in _classes().items():
        survived = []
        for p in probes:
            named = _named(lines, RUN, p.bad_tag, 2 if p.target.endswith("tensor") else 0)
            prefix = encode.file_name([RUN, p.tag], "x")[:-2] + "-"
            mine = {f for f in files if f.startswith(prefix)}
            if p.target == "moments-content":
                fine = not mine
            elif p.target == "stats-content":  # no batch size: skipped with a warning
                fine = not mine and any(f"tag {p.tag!r} step 2 skipped" in ln for ln in lines)
            else:
                fine = mine == {file_of(p.tag, 1)}
                with open(out / file_of(p.tag, 1)) as f:
                    rows = list(csv_rows(f.read()))
                got = np.asarray([float(r[2]) for r in rows[1:]]).reshape(SHAPE)
                fine = fine and np.allclose(got, _ref_variance(RUN, p.tag, 1), rtol=1e-5)
            if fine and named:
                survived.append(p)
        print(f"\nprobe class {cls} (export): tried {len(probes)}, survived {len(survived)}")
        failed += [p.id for p in probes if p not in survived]
    torn_ok = 0
    for i, _, _, complete in TORN:
        want = (
            {encode.file_name(["torn", f"t_{i}/kernel", f"step{complete[-1]}", "variance"], "csv")}
            if complete
            else set()
        )
        mine = {f for f in files if f.startswith(f"torn-t_{i}_kernel-")}
        torn_ok += mine == want
    print(f"\nprobe class torn (export): tried {len(TORN)}, survived {torn_ok}")
    assert not failed and torn_ok == len(TORN)


def test_export_event_file_probes(logdirs, loaded, tmp_path, capsys):
    """Each damaged event file: the export writes what `data.load` reads of it, nothing else."""
    from tb_gradmom import cli

    runs, _ = loaded
    files = set()
    for i, root in enumerate(logdirs):
        out = tmp_path / f"o{i}"
        argv = ["export", "--logdir", root, "--out", str(out), "--run", "^file_", "--format", "csv"]
        code = cli.main(argv)
        err = capsys.readouterr().err
        assert code == 0 and "Traceback" not in err, err
        files |= set(os.listdir(out))
    survived = 0
    for how in FILE_PROBES:
        run = f"file_{how}"
        recs = runs.get(run, {}).get(OK, [])
        want = (
            {encode.file_name([run, OK, f"step{recs[-1].step}", "variance"], "csv")}
            if recs
            else set()
        )
        prefix = encode.file_name([run, OK], "x")[:-2] + "-"
        survived += {f for f in files if f.startswith(prefix)} == want
    print(f"\nprobe class event-files (export): tried {len(FILE_PROBES)}, survived {survived}")
    assert survived == len(FILE_PROBES)


def csv_rows(text):
    import csv

    return csv.reader(io.StringIO(text))


def test_export_all_steps_histogram_of_torn_steps(logdir, tmp_path, capsys):
    from tb_gradmom import cli

    out = tmp_path / "h"
    argv = [
        "export",
        "--logdir",
        logdir,
        "--out",
        str(out),
        "--run",
        "^torn$",
        "--plot",
        "histogram",
        "--step",
        "all",
        "--format",
        "json",
    ]
    assert cli.main(argv) == 0, capsys.readouterr().err
    names = set(os.listdir(out))
    for i, _, _, complete in TORN:
        got = {n for n in names if n.startswith(f"torn-t_{i}_kernel-")}
        assert got == {
            encode.file_name(["torn", f"t_{i}/kernel", f"step{s}", "variance", "histogram"], "json")
            for s in complete
        }, i


# ---------------------------------------------------------- TensorBoard internals used


def test_tensorboard_internals_the_plugin_relies_on(tmp_path):
    """`_tb_compat` against TensorBoard: fails loudly when TensorBoard changes them."""
    from tensorboard.backend.event_processing import data_provider as dp_module
    from test_plugin import make_app

    from tb_gradmom.plugin import _tb_compat

    for count in range(0, 40):
        for k in range(0, 45):
            xs = list(range(count))
            assert _tb_compat.downsample_indices(count, k) == dp_module._downsample(xs, k)  # noqa: SLF001
    root = str(tmp_path)
    _write(os.path.join(root, "r"), variable_events("r", OK, steps=tuple(range(30))))
    _, plugin, _ = make_app(root)
    provider = plugin._data_provider  # noqa: SLF001
    mux = plugin._reader._mux  # noqa: SLF001
    assert _tb_compat.is_python_loader(provider) and mux is not None
    ctx = context.RequestContext()
    from tensorboard.data import provider as p

    for k in (1, 7, 30, 1000):
        read = provider.read_tensors(
            ctx,
            experiment_id="",
            plugin_name="gradmom",
            downsample=k,
            run_tag_filter=p.RunTagFilter(runs=["r"], tags=[OK]),
        )["r"][OK]
        events = _tb_compat.tensor_events(mux, "r", OK)
        chosen = [events[i] for i in _tb_compat.downsample_indices(len(events), k)]
        assert [d.step for d in read] == [e.step for e in chosen]
        for d, e in zip(read, chosen):
            np.testing.assert_array_equal(d.numpy, tensor_util.make_ndarray(e.tensor_proto))
    assert _tb_compat.tensor_events(mux, "r", "nope") is None
    assert _tb_compat.multiplexer_of(None, object()) is None
