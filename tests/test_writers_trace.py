"""Writers on one directory caught at trace time where Grad Moments knows the directory
(issue 31): the Keras callback's writer and `gradmom.summary.create_file_writer`'s, keyed by
``os.path.realpath``. TensorFlow's own writer does not expose its directory (checked below),
so writers the user makes with ``tf.summary.create_file_writer`` are told apart when read
(test_writers_collide.py, test_readers.py)."""

from __future__ import annotations

import os
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import tb_gradmom as gradmom
from tb_gradmom.analysis import data


def _model(seed=0, units=2, name="dense"):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(units, name=name)])


def _step(model, writer):
    @tf.function
    def step(x, y, i):
        with writer.as_default(step=i):
            loss = tf.reduce_mean(tf.square(model(x) - y))
            return gradmom.summary.moments(loss, model.trainable_variables)

    return step


X = tf.random.stateless_normal([8, 3], seed=[1, 2])
Y = tf.random.stateless_normal([8, 2], seed=[3, 4])


def test_tensorflows_writer_does_not_expose_its_directory(tmp_path):
    """Why only Grad Moments' own writers are checked at trace time: the directory is not an
    attribute of TensorFlow's writer (only an argument of its init op)."""
    path = str(tmp_path / "run")
    writer = tf.summary.create_file_writer(path)
    held = [v for v in vars(writer).values() if isinstance(v, (str, bytes, os.PathLike))]
    assert not held, held
    writer.close()


def test_two_writers_on_one_directory_are_refused_at_trace_time(tmp_path):
    """Two `create_file_writer` writers on one directory (the second through a symbolic link
    to it) logging the same tags: the second is refused when traced, naming both and the fix;
    once the first is closed, the second writes (a run resumed by another writer)."""
    path = tmp_path / "run"
    path.mkdir()
    os.symlink(path, tmp_path / "link")
    first = gradmom.summary.create_file_writer(str(path))
    second = gradmom.summary.create_file_writer(str(tmp_path / "link"))
    model = _model()
    _step(model, first)(X, Y, tf.constant(0, tf.int64))
    with pytest.raises(ValueError) as e:
        _step(model, second)(X, Y, tf.constant(1, tf.int64))
    msg = str(e.value)
    assert f"tag 'dense/kernel' is already logged to directory '{os.path.realpath(path)}'" in msg
    assert f"gradmom.summary.create_file_writer({str(path)!r})" in msg
    assert f"gradmom.summary.create_file_writer({str(tmp_path / 'link')!r})" in msg
    assert "Give each its own log directory" in msg and "distinct name=" in msg
    # Other variables with their own name=: their tags and model tag are their own.
    other = _model(1, 3, name="other")

    @tf.function
    def named(x, i):
        with second.as_default(step=i):
            loss = tf.reduce_mean(tf.square(other(x)))
            return gradmom.summary.moments(loss, other.trainable_variables, name="other")

    named(X, tf.constant(1, tf.int64))
    # Another model on a third writer, default group: its variables' tags differ, but both
    # writers' whole-model tag is '_model'.
    third = gradmom.summary.create_file_writer(str(path))
    with pytest.raises(ValueError, match="tag '_model' is already logged to directory"):
        _step(_model(2, 2, name="third"), third)(X, Y, tf.constant(1, tf.int64))
    third.close()
    first.close()
    _step(model, second)(X, Y, tf.constant(1, tf.int64))  # the first is closed: no mixing
    second.close()
    with pytest.warns(data.DataWarning, match="holds the records of 2 writers"):
        recs = data.load(str(path))["."]
    assert [r.step for r in recs["dense/kernel"]] == [0, 1]
    assert [r.step for r in recs["other/other/kernel"]] == [1]


def test_user_writers_on_one_directory_are_left_to_the_readers(tmp_path):
    """Two writers of ``tf.summary.create_file_writer`` on one directory: not known here, so
    no trace-time error; `data.load` tells their records apart (format 3) and says so."""
    path = str(tmp_path / "run")
    model = _model()
    a, b = tf.summary.create_file_writer(path), tf.summary.create_file_writer(path)
    _step(model, a)(X, Y, tf.constant(0, tf.int64))
    _step(model, b)(X, Y, tf.constant(0, tf.int64))
    a.close()
    b.close()
    with pytest.warns(data.DataWarning, match=r"holds the records of 2 writers .* at 1 step \(0\)"):
        data.load(path)


def _fit(model, callbacks, epochs=1):
    x = np.random.default_rng(0).normal(size=(16, 3)).astype("float32")
    y = np.random.default_rng(1).normal(size=(16, 2)).astype("float32")
    model.fit(x, y, batch_size=8, epochs=epochs, verbose=0, callbacks=callbacks)


def test_the_callback_and_a_writer_on_its_directory(tmp_path):
    """A writer of `create_file_writer` still open on a directory, then a `GradMoments`
    callback on it logging the same tags: the callback's first logged step is refused when
    traced (fit raises, naming both writers and the fix, before the first update); after the
    writer is closed, the callback logs there."""
    path = str(tmp_path / "run")
    model = _model()
    model.compile(optimizer="sgd", loss="mse")
    writer = gradmom.summary.create_file_writer(path)
    _step(model, writer)(X, Y, tf.constant(0, tf.int64))
    weights = [w.numpy() for w in model.weights]
    with pytest.raises(ValueError) as e:
        _fit(model, [gradmom.keras.GradMoments(path, every_n_steps=1)])
    said = str(e.value)
    assert f"tag 'dense/kernel' is already logged to directory '{os.path.realpath(path)}'" in said
    assert f"GradMoments({path!r})" in said and "create_file_writer" in said, said
    assert all(np.array_equal(w, v.numpy()) for w, v in zip(weights, model.weights))
    writer.close()
    _fit(model, [gradmom.keras.GradMoments(path, every_n_steps=1)])
    with pytest.warns(data.DataWarning, match="holds the records of 2 writers"):
        recs = data.load(path)["."]["dense/kernel"]
    assert [r.step for r in recs][:1] == [0] and len(recs) == 2  # 0 (writer), 0 and 1 (fit)


def test_two_callbacks_on_one_directory_in_one_fit(tmp_path):
    """Two `GradMoments` on one directory in one fit: one of them logs (the model takes one
    callback's train function), and the run holds one writer's records, with none of
    `data.load`'s warnings about several writers or steps stored twice."""
    path = str(tmp_path / "run")
    model = _model()
    model.compile(optimizer="sgd", loss="mse")
    _fit(model, [gradmom.keras.GradMoments(path, every_n_steps=1) for _ in range(2)])
    with warnings.catch_warnings():
        warnings.simplefilter("error", data.DataWarning)
        recs = data.load(path)["."]["dense/kernel"]
    assert [r.step for r in recs] == [0, 1]


def test_a_tape_with_its_own_writer_on_a_directory_another_writer_logs_to(tmp_path):
    """`gradmom.GradientTape(writer=...)` with a writer of `create_file_writer`, while another
    such writer logs the same tags to that directory: refused when traced."""
    path = str(tmp_path / "run")
    model = _model()
    first = gradmom.summary.create_file_writer(path)
    _step(model, first)(X, Y, tf.constant(0, tf.int64))
    second = gradmom.summary.create_file_writer(path)

    @tf.function
    def taped(x, y, i):
        with gradmom.GradientTape(writer=second, step=i) as tape:
            loss = tf.reduce_mean(tf.square(model(x) - y))
        return tape.gradient(loss, model.trainable_variables)

    with pytest.raises(ValueError, match="tag 'dense/kernel' is already logged to directory"):
        taped(X, Y, tf.constant(1, tf.int64))
    first.close()
    taped(X, Y, tf.constant(1, tf.int64))
    second.close()


def test_one_name_for_two_calls_in_two_step_functions(tmp_path):
    """A GAN whose discriminator and generator steps are two `tf.function`s, both logging with
    ``name="x"`` on one writer, their layers both named ``dense``: the second step is refused
    when traced (the first's tags are claimed on the writer, whatever graph wrote them), and
    nothing of it is written."""
    path = str(tmp_path / "gan")
    writer = tf.summary.create_file_writer(path)
    disc, gen = _model(0, 1), _model(1, 3)

    def step_of(model):
        @tf.function
        def step(x, i):
            with writer.as_default(step=i):
                loss = tf.reduce_mean(tf.square(model(x)))
                return gradmom.summary.moments(loss, model.trainable_variables, name="x")

        return step

    step_of(disc)(X, tf.constant(0, tf.int64))
    with pytest.raises(ValueError) as e:
        step_of(gen)(X, tf.constant(0, tf.int64))
    msg = str(e.value)
    assert "tag 'x/dense/kernel' is already logged on this summary writer" in msg, msg
    assert "distinct name=" in msg
    writer.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error", data.DataWarning)
        recs = data.load(path)["."]["x/dense/kernel"]
    assert [r.shape for r in recs] == [(3, 1)]  # the discriminator's, alone


class _Stop(keras.callbacks.Callback):
    """Raises after the first batch (an interrupted fit: no on_train_end)."""

    def on_train_batch_end(self, batch, logs=None):
        raise KeyboardInterrupt


def test_an_interrupted_fit_leaves_no_claim_on_its_directory(tmp_path):
    """A fit interrupted after its first step never closes its callback's writer (no
    on_train_end); a new model's callback on the same directory, in the same thread, logs
    there (a fit runs one at a time per thread), as does a writer of `create_file_writer`."""
    path = str(tmp_path / "run")
    first = _model()
    first.compile(optimizer="sgd", loss="mse")
    with pytest.raises(KeyboardInterrupt):
        _fit(first, [gradmom.keras.GradMoments(path, every_n_steps=1), _Stop()])
    second = _model(1)
    second.compile(optimizer="sgd", loss="mse")
    _fit(second, [gradmom.keras.GradMoments(path, every_n_steps=1)])
    writer = gradmom.summary.create_file_writer(path)
    _step(_model(2), writer)(X, Y, tf.constant(5, tf.int64))
    writer.close()
    with pytest.warns(data.DataWarning, match="holds the records of 3 writers"):
        recs = data.load(path)["."]["dense/kernel"]
    assert [r.step for r in recs] == [0, 1, 5]


def test_a_fit_running_in_another_thread_keeps_its_directory(tmp_path):
    """Two fits at once in two threads, each with a `GradMoments` on one directory: the
    second's first logged step is refused when traced, naming the first; the first logs on."""
    import threading

    path = str(tmp_path / "run")
    started, finish = threading.Event(), threading.Event()

    class Hold(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            started.set()
            finish.wait(120)

    first = _model()
    first.compile(optimizer="sgd", loss="mse")
    errors: list[BaseException] = []

    def run():
        try:
            _fit(first, [gradmom.keras.GradMoments(path, every_n_steps=1), Hold()])
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    thread = threading.Thread(target=run)
    thread.start()
    try:
        assert started.wait(120)
        second = _model(1)
        second.compile(optimizer="sgd", loss="mse")
        with pytest.raises(ValueError) as e:
            _fit(second, [gradmom.keras.GradMoments(path, every_n_steps=1)])
        assert f"is already logged to directory '{os.path.realpath(path)}' by GradMoments(" in (
            str(e.value)
        )
    finally:
        finish.set()
        thread.join(120)
    assert not errors, errors
    with warnings.catch_warnings():
        warnings.simplefilter("error", data.DataWarning)
        assert [r.step for r in data.load(path)["."]["dense/kernel"]] == [0, 1]
