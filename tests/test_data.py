"""data.py reads event files written by real TensorFlow; cross-checked with EventAccumulator."""

import json
import os
import shutil
import struct
import subprocess
import sys

import numpy as np
import pytest
from tensorboard.compat.tensorflow_stub import pywrap_tensorflow
from tensorboard.util import tensor_util

from tb_gradmom import metadata
from tb_gradmom.analysis import data, reductions, stats

STEPS = (0, 5, 10)
# run -> tag -> (variable shape, stored shape, orders, pooled block)
LAYOUT = {
    ".": {
        "dense/kernel": ((3, 4), (3, 4), (1, 2), None),
        "dense/bias": ((4,), (4,), (1, 2, 3, 4), None),
    },
    "eval/a": {
        "conv/kernel": ((2, 2, 3, 5), (6, 3), (1, 2), (2, 2)),
    },
}


def _moments_and_stats(shape, orders, n, seed):
    rng = np.random.default_rng(seed)
    g = rng.normal(size=(n, *shape)) + 0.5
    moments = {p: (g**p).mean(axis=0) for p in orders}
    sums = stats.sums_from_moments(moments[1], moments[2], n)
    sums["loss"] = 0.25 + seed
    sums["learning_rate"] = 0.1
    counts = stats.variance_histogram(reductions.stat_array(moments, n, "variance"))
    tensor = np.concatenate([[sums[f] for f in metadata.STATS_FIELDS], counts])
    return moments, tensor.astype(np.float32)


def _pool(array, block):
    return reductions.pool_2d(
        reductions.to_2d(array),
        *(-(-s // b) for s, b in zip(reductions.to_2d(array).shape, block, strict=True)),
    )[0]


def _write_logdir(root):
    """Writes the LAYOUT with real tf.summary.write; returns what was written."""
    import tensorflow as tf

    written = {}
    seed = 0
    for run, tags in LAYOUT.items():
        writer = tf.summary.create_file_writer(os.path.join(root, run))
        with writer.as_default():
            for step in STEPS:
                n = 4 + step
                for tag, (shape, stored, orders, block) in tags.items():
                    seed += 1
                    moments, st = _moments_and_stats(shape, orders, n, seed)
                    if block is not None:
                        stack = np.stack([_pool(moments[p], block) for p in orders])
                    else:
                        stack = np.stack([moments[p] for p in orders])
                    stack = stack.astype(np.float32)
                    assert stack.shape == (len(orders), *stored)
                    content = metadata.MomentsContent(
                        orders=orders,
                        shape=shape,
                        stored_shape=stored,
                        pooled=block is not None,
                        block=block or (1, 1),
                        op="MatMul",
                        layer=tag.split("/")[0],
                        variable=tag,
                    )
                    tf.summary.write(
                        tag, stack, step=step, metadata=metadata.create_summary_metadata(content)
                    )
                    tf.summary.write(
                        metadata.stats_tag(tag),
                        st,
                        step=step,
                        metadata=metadata.create_summary_metadata(
                            metadata.StatsContent(variable=tag)
                        ),
                    )
                    written[(run, tag, step)] = (stack, st)
                if run == ".":
                    _, model_st = _moments_and_stats((7,), (1, 2), n, 100 + step)
                    tf.summary.write(
                        "_model/_stats",
                        model_st,
                        step=step,
                        metadata=metadata.create_summary_metadata(metadata.StatsContent()),
                    )
                    written[(run, "_model", step)] = (None, model_st)
                    tf.summary.scalar("loss", 1.0 / (step + 1), step=step)  # not ours
        writer.close()
    return written


@pytest.fixture(scope="module")
def logdir(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("logs"))
    written = _write_logdir(root)
    return root, written


def _event_file(root, run="."):
    return data.list_runs(root)[run][0]


def test_crc32c_known_value_and_against_tensorboard():
    assert data.crc32c(b"123456789") == 0xE3069283
    rng = np.random.default_rng(0)
    for size in (0, 1, 100, 4095, 4096, 4097, 70_001):
        blob = rng.integers(0, 256, size=size, dtype=np.uint8).tobytes()
        assert data.masked_crc32c(blob) == pywrap_tensorflow.masked_crc32c(blob), size


def test_runs_and_tags(logdir):
    root, _ = logdir
    runs = data.load(root)
    assert list(runs) == [".", "eval/a"]
    assert list(runs["."]) == ["_model", "dense/bias", "dense/kernel"]
    assert list(runs["eval/a"]) == ["conv/kernel"]
    assert [r.step for r in runs["."]["dense/kernel"]] == list(STEPS)


def test_values_equal_what_was_written(logdir):
    root, written = logdir
    runs = data.load(root)
    for (run, tag, step), (stack, st) in written.items():
        rec = {r.step: r for r in runs[run][tag]}[step]
        expected_sums = dict(zip(metadata.STATS_FIELDS, st.astype(np.float64), strict=False))
        assert rec.stats == pytest.approx(expected_sums, nan_ok=True)
        np.testing.assert_array_equal(rec.hist, st[len(metadata.STATS_FIELDS) :])
        assert rec.batch_size == 4 + step
        if stack is None:
            assert rec.moments == {} and rec.shape == ()
            continue
        shape, stored, orders, block = LAYOUT[run][tag]
        assert sorted(rec.moments) == list(orders)
        for i, p in enumerate(orders):
            np.testing.assert_array_equal(rec.moments[p], stack[i])
        assert rec.shape == shape and rec.pooled == (block is not None)
        assert rec.content.stored_shape == stored


def test_cross_check_with_event_accumulator(logdir):
    from tensorboard.backend.event_processing import event_accumulator

    root, _ = logdir
    runs = data.load(root)
    for run, tags in runs.items():
        acc = event_accumulator.EventAccumulator(
            os.path.join(root, run), size_guidance={event_accumulator.TENSORS: 0}
        )
        acc.Reload()
        ours = {
            t
            for t in acc.Tags()["tensors"]
            if acc.SummaryMetadata(t).plugin_data.plugin_name == "gradmom"
        }
        expected_tags = {t[: -len("/_stats")] if t.endswith("/_stats") else t for t in ours}
        assert set(tags) == expected_tags
        for tag in ours:
            events = acc.Tensors(tag)
            base = tag[: -len("/_stats")] if tag.endswith("/_stats") else tag
            recs = tags[base]
            assert [e.step for e in events] == [r.step for r in recs]
            for e, r in zip(events, recs, strict=True):
                arr = tensor_util.make_ndarray(e.tensor_proto)
                assert e.wall_time == pytest.approx(r.wall_time)
                if tag.endswith("/_stats"):
                    got = [r.stats[f] for f in metadata.STATS_FIELDS]
                    np.testing.assert_array_equal(np.float32(got), arr[: len(got)])
                else:
                    for i, p in enumerate(r.content.orders):
                        np.testing.assert_array_equal(r.moments[p], arr[i])


def _copy_run(root, tmp_path):
    dst = tmp_path / "copy"
    dst.mkdir()
    src = _event_file(root)
    path = dst / os.path.basename(src)
    shutil.copy(src, path)
    return dst, path


def _record_offsets(path):
    blob = path.read_bytes()
    offsets, pos = [], 0
    while pos < len(blob):
        (length,) = struct.unpack("<Q", blob[pos : pos + 8])
        offsets.append((pos, length))
        pos += 16 + length
    return offsets


def _find_record(path, step, tag):
    from tensorboard.compat.proto import event_pb2

    blob = path.read_bytes()
    for pos, length in _record_offsets(path):
        ev = event_pb2.Event.FromString(blob[pos + 12 : pos + 12 + length])
        if ev.step == step and ev.summary.value and ev.summary.value[0].tag == tag:
            return pos, length
    raise AssertionError(f"no record of {tag} at step {step}")


def test_truncated_last_record_is_skipped_with_warning(logdir, tmp_path):
    root, _ = logdir
    dst, path = _copy_run(root, tmp_path)
    # Cut the file inside the last _model/_stats record (a writer killed mid-write).
    pos, length = _find_record(path, STEPS[-1], "_model/_stats")
    with open(path, "r+b") as f:
        f.truncate(pos + 12 + length // 2)
    with pytest.warns(data.DataWarning, match="truncated last record"):
        got = data.load(dst)["."]
    assert [r.step for r in got["_model"]] == list(STEPS[:-1])
    assert [r.step for r in got["dense/kernel"]] == list(STEPS)
    with open(path, "r+b") as f:
        f.truncate(pos + 5)
    with pytest.warns(data.DataWarning, match="truncated record header"):
        got = data.load(dst)["."]
    assert [r.step for r in got["_model"]] == list(STEPS[:-1])


def test_corrupt_record_is_skipped(logdir, tmp_path):
    root, written = logdir
    dst, path = _copy_run(root, tmp_path)
    pos, length = _find_record(path, 5, "dense/kernel")
    blob = bytearray(path.read_bytes())
    blob[pos + 12 + length - 3] ^= 0xFF  # a byte of the tensor data
    path.write_bytes(bytes(blob))
    with pytest.warns(data.DataWarning, match="fails its checksum"):
        got = data.load(dst)["."]
    assert [r.step for r in got["dense/kernel"]] == [0, 10]
    assert [r.step for r in got["dense/bias"]] == list(STEPS)


def test_errors(tmp_path, logdir):
    missing = tmp_path / "nope"
    with pytest.raises(FileNotFoundError, match="nope"):
        data.load(missing)
    with pytest.raises(ValueError, match="no TensorBoard event files"):
        data.load(tmp_path)
    root, _ = logdir
    with pytest.raises(ValueError, match=r"no run 'train'.*'\.', 'eval/a'"):
        data.load(root, run="train")


def test_no_gradmom_data_and_newer_version(tmp_path):
    import tensorflow as tf

    writer = tf.summary.create_file_writer(str(tmp_path))
    with writer.as_default():
        tf.summary.scalar("loss", 1.0, step=0)
    writer.close()
    with pytest.raises(ValueError, match="no Grad Moments data in logdir"):
        data.load(tmp_path)
    newer = metadata.create_summary_metadata(metadata.StatsContent())
    content = json.loads(newer.plugin_data.content)
    content["version"] = 99
    newer.plugin_data.content = json.dumps(content).encode()
    writer = tf.summary.create_file_writer(str(tmp_path / "new"))
    with writer.as_default():
        tf.summary.write("_model/_stats", np.zeros(metadata.STATS_LENGTH), step=0, metadata=newer)
    writer.close()
    with pytest.warns(data.DataWarning, match="newer than this reader"):
        with pytest.raises(ValueError, match="no Grad Moments data.*upgrade tb_gradmom"):
            data.load(tmp_path / "new")


def test_rewritten_step_later_event_wins(tmp_path):
    import tensorflow as tf

    content = metadata.MomentsContent(orders=(1,), shape=(2,), stored_shape=(2,))
    md = metadata.create_summary_metadata(content)
    writer = tf.summary.create_file_writer(str(tmp_path))
    with writer.as_default():
        tf.summary.write("v", np.array([[1.0, 2.0]], np.float32), step=3, metadata=md)
        tf.summary.write("v", np.array([[5.0, 6.0]], np.float32), step=3, metadata=md)
    writer.close()
    recs = data.load(tmp_path)["."]["v"]
    assert len(recs) == 1 and recs[0].stats is None and recs[0].batch_size is None
    np.testing.assert_array_equal(recs[0].moments[1], [5.0, 6.0])


def test_loading_does_not_import_tensorflow(logdir):
    root, _ = logdir
    code = (
        "import sys; from tb_gradmom import data; r = data.load(sys.argv[1]); "
        "assert 'tensorflow' not in sys.modules, 'tensorflow imported'; print(len(r))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, root], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "2"
