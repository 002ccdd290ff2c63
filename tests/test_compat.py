"""The private APIs of TensorFlow, Keras and TensorBoard that tb_gradmom uses, against the
installed versions: each test fails when one of them changes (is gone, moved, or behaves
differently). They are reached only through `tb_gradmom._compat` (TensorFlow, Keras) and
`tb_gradmom.plugin._tb_compat` (TensorBoard); `test_no_private_api_outside_compat` checks it.
"""

from __future__ import annotations

import ast
import inspect
import pathlib

import keras
import numpy as np
import pytest
import tensorflow as tf

import tb_gradmom
from tb_gradmom._compat import PrivateAPIError, keras_private, tf_private
from tb_gradmom.plugin import _tb_compat

PACKAGE = pathlib.Path(tb_gradmom.__file__).parent

# ---------------------------------------------------------------------------- TensorFlow


@pytest.mark.parametrize("name", sorted(tf_private.SYMBOLS))
def test_tf_symbol_exists(name):
    module, attribute, feature = tf_private.SYMBOLS[name]
    assert tf_private.unavailable(name) is None
    tf_private.require(name)
    assert callable(tf_private._get(name)) or name in ("summary_state", "component_specs")
    assert module.startswith("tensorflow.python.") and feature


def test_pfor_vectorises():
    x = tf.constant([1.0, -2.0, 3.0, 0.5])

    @tf.function
    def run(n):
        static = tf_private.pfor(lambda i: tf.gather(x, i) ** 2, 4)
        dynamic = tf_private.pfor(lambda i: tf.stack([tf.gather(x, i), tf.cast(i, tf.float32)]), n)
        return static, dynamic

    static, dynamic = run(tf.constant(3))
    np.testing.assert_allclose(static.numpy(), x.numpy() ** 2)
    assert dynamic.shape == (3, 2)
    np.testing.assert_allclose(dynamic.numpy(), [[1.0, 0.0], [-2.0, 1.0], [3.0, 2.0]])


def test_pfor_vectorises_a_backward_pass_as_the_fallback_does():
    w = tf.Variable([[1.0, 2.0], [3.0, -1.0]])
    x = tf.constant([[1.0, 0.0], [0.5, 2.0], [-1.0, 1.0]])

    @tf.function
    def rows():
        losses = tf.reduce_sum(tf.sin(x @ w), axis=1)

        def loop_fn(i):
            seed = tf.one_hot(i, 3)
            return tf.gradients(losses, [w], grad_ys=seed)[0]

        return tf_private.pfor(loop_fn, 3, fallback_to_while_loop=True)

    got = rows().numpy()
    for j in range(3):
        with tf.GradientTape() as tape:
            lj = tf.reduce_sum(tf.sin(x[j : j + 1] @ w))
        np.testing.assert_allclose(got[j], tape.gradient(lj, w).numpy(), rtol=1e-6)


def test_in_xla_context():
    seen = {}

    @tf.function
    def plain(x):
        seen["plain"] = tf_private.in_xla_context(tf.compat.v1.get_default_graph())
        return x + 1

    @tf.function(jit_compile=True)
    def xla(x):
        seen["xla"] = tf_private.in_xla_context(tf.compat.v1.get_default_graph())
        return x + 1

    @tf.function(jit_compile=True)
    def outer(x):
        return plain(x) * 2

    plain(tf.constant(1.0))
    xla(tf.constant(1.0))
    assert seen == {"plain": False, "xla": True}
    plain.get_concrete_function(tf.TensorSpec([2]))  # a new trace, plain
    assert seen["plain"] is False
    outer(tf.constant([1.0, 2.0, 3.0]))  # plain traced again, nested in an XLA function
    assert seen["plain"] is True


@tf.function
def _inner(x):
    return tf.matmul(x, x) + 1.0


@tf.function
def _outer(x):
    return _inner(x) * 2.0


def test_function_library_and_function_def_to_graph():
    cf = _outer.get_concrete_function(tf.TensorSpec([2, 2], tf.float32))
    (call,) = [
        op
        for op in cf.graph.get_operations()
        if op.type in ("PartitionedCall", "StatefulPartitionedCall")
    ]
    name = call.get_attr("f").name
    fn = tf_private.graph_function(call.graph, name)
    assert fn is not None and fn.definition.signature.name == name
    assert fn.graph is not None and len(fn.graph.inputs) == len(call.inputs)
    assert tf_private.graph_function(call.graph, "no_such_function") is None
    body = tf_private.function_def_to_graph(fn.definition)
    assert len(body.inputs) == 1 and len(body.outputs) == 1
    assert {"MatMul", "AddV2"} <= {op.type for op in body.get_operations()}
    # the eager context holds the same definition once the function is traced
    fdef = tf_private.eager_function_def(name)
    assert fdef.signature.name == name
    assert [a.name for a in fdef.signature.input_arg] == [
        a.name for a in fn.definition.signature.input_arg
    ]
    with pytest.raises(Exception) as err:
        tf_private.eager_function_def("no_such_function_xyz")
    assert not isinstance(err.value, PrivateAPIError)


def test_component_specs_of_a_distribution_argument():
    """What `tb_gradmom.core.axes` reads to prove a PerReplica argument's example axis."""
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    dataset = tf.data.Dataset.from_tensor_slices(tf.zeros([4, 3])).batch(2)
    batch = next(iter(strategy.experimental_distribute_dataset(dataset)))
    spec = tf.type_spec_from_value(batch) if hasattr(batch, "_type_spec") else None
    if spec is None or isinstance(spec, tf.TensorSpec):  # one device: a plain tensor
        spec = tf.RaggedTensorSpec([2, None], tf.float32)
    components = tf_private.component_specs(spec)
    assert components is not None
    leaves = tf.nest.flatten(components, expand_composites=False)
    assert leaves and all(isinstance(c, tf.TypeSpec) for c in leaves)
    assert tf_private.component_specs(object()) is None


def test_gradient_function_returns_the_registered_gradient():
    g = tf.Graph()
    with g.as_default():
        a = tf.constant([[1.0, 2.0], [0.0, -1.0]])
        b = tf.constant([[3.0, 1.0], [4.0, 2.0]])
        m = tf.matmul(a, b)
        grad_fn = tf_private.gradient_function(m.op)
        assert grad_fn is not None and "MatMul" in grad_fn.__name__
        dy = tf.constant([[1.0, 0.5], [-1.0, 2.0]])
        da, db = grad_fn(m.op, dy)
        ref_a, ref_b = tf.gradients(m, [a, b], grad_ys=dy)
        assert tf_private.gradient_function(a.op) is None  # no inputs
        with g.gradient_override_map({"MatMul": "NoSuchGradientRegistered"}):
            m2 = tf.matmul(a, b)
        assert tf_private.gradient_function(m2.op) is None  # LookupError: no gradient
    with tf.compat.v1.Session(graph=g) as sess:
        got = sess.run([da, db, ref_a, ref_b])
    np.testing.assert_allclose(got[0], got[2])
    np.testing.assert_allclose(got[1], got[3])
    np.testing.assert_allclose(got[0], [[3.5, 5.0], [-1.0, 0.0]])  # dy @ b^T


def test_probe_graph_captures_the_outer_graph_and_stays_apart():
    outer = tf.Graph()
    with outer.as_default():
        x = tf.constant([1.0, 2.0])
        probe = tf_private.probe_graph("probe")
        assert probe.outer_graph is outer
        with probe.as_default():
            y = x * 3.0
        assert y.graph is probe and y.op not in outer.get_operations()
        ((external, internal),) = probe.captures
        assert external is x and internal in probe.inputs


def test_update_input_rewires_an_op():
    g = tf.Graph()
    with g.as_default():
        a, b, c = tf.constant(1.0), tf.constant(2.0), tf.constant(10.0)
        s = tf.add(a, b)
        tf_private.update_input(s.op, 1, c)
        assert s.op.inputs[1] is c
    with tf.compat.v1.Session(graph=g) as sess:
        assert sess.run(s) == 11.0


def test_summary_state_sees_the_default_writer_in_a_tf_function(tmp_path):
    writer = tf.summary.create_file_writer(str(tmp_path))
    other = tf.summary.create_file_writer(str(tmp_path / "other"))

    def traced():
        """What the state holds while a new tf.function is traced."""
        seen = []

        @tf.function
        def step():
            seen.append(
                (tf_private.default_summary_writer(), tf_private.summary_recording_condition())
            )
            return tf.constant(0)

        step()
        return seen[0]

    assert tf_private.default_summary_writer() is None
    assert traced() == (None, None)
    with writer.as_default(step=0):
        assert traced() == (writer, None)
        with other.as_default(step=0), tf.summary.record_if(False):
            assert traced() == (other, False)
        assert tf_private.default_summary_writer() is writer
    flag = tf.Variable(True)
    with writer.as_default(step=0), tf.summary.record_if(lambda: tf.equal(flag, True)):
        got, cond = traced()
    assert got is writer and isinstance(cond, tf.Tensor) and cond.dtype == tf.bool
    assert tf_private.default_summary_writer() is None
    writer.close()
    other.close()


def test_missing_tf_symbol_raises_at_use_time(monkeypatch):
    monkeypatch.setitem(
        tf_private.SYMBOLS,
        "pfor",
        ("tensorflow.python.no_such_module", "pfor", "the exact fallback (test)"),
    )
    with pytest.raises(PrivateAPIError) as err:
        tf_private.pfor(lambda i: i, 3)
    msg = str(err.value)
    assert "tensorflow.python.no_such_module.pfor" in msg
    assert f"tensorflow {tf.__version__}" in msg
    assert "the exact fallback (test) is unavailable" in msg
    assert err.value.symbol == "tensorflow.python.no_such_module.pfor"
    assert tf_private.unavailable("pfor") == msg
    with pytest.raises(PrivateAPIError):
        tf_private.require("in_xla_context", "pfor")
    assert isinstance(err.value, RuntimeError)


def test_missing_tf_symbol_makes_a_rule_not_apply(monkeypatch):
    """A rule that needs a missing symbol refuses with the PrivateAPIError's message."""
    from tb_gradmom.core.rules.base import RuleError
    from tb_gradmom.core.rules.call import call_rule

    monkeypatch.setitem(
        tf_private.SYMBOLS,
        "graph_function",
        ("tensorflow.python.framework.ops", "Graph._no_such_method", "the call rule (test)"),
    )
    cf = _outer.get_concrete_function(tf.TensorSpec([2, 2], tf.float32))
    (call,) = [op for op in cf.graph.get_operations() if op.type.endswith("PartitionedCall")]

    class FakeSite:
        op = call

    with pytest.raises(
        RuleError, match=r"the call rule \(test\) is unavailable .*`[\w.]+Graph\._no_such_method`"
    ):
        call_rule(FakeSite())


# ---------------------------------------------------------------------------------- Keras


def _trainer_module():
    import keras.src.backend.tensorflow.trainer as trainer

    return trainer


def test_keras_train_step_still_does_what_the_callback_mirrors():
    """`tb_gradmom.writers.keras._make_train_step` mirrors Keras' TensorFlow ``train_step``."""
    trainer = _trainer_module()
    src = inspect.getsource(trainer.TensorFlowTrainer.train_step)
    for piece in (
        "data_adapter_utils.unpack_x_y_sample_weight(data)",
        "self._call_has_training_arg",
        "self(x, training=True)",
        "self._compute_loss(",
        "self._loss_tracker.update_state(",
        "loss_module.unscale_loss_for_distribution(loss)",
        "tree.flatten(x)",
        "self.optimizer.scale_loss(loss)",
        "self.optimizer.apply_gradients(zip(gradients, trainable_weights))",
        "self.compute_metrics(x, y, y_pred, sample_weight=sample_weight)",
    ):
        assert piece in src, f"Keras' train_step no longer has {piece!r}"
    # the public names the callback uses are the objects Keras' trainer uses
    assert keras.utils.unpack_x_y_sample_weight is (
        trainer.data_adapter_utils.unpack_x_y_sample_weight
    )
    assert keras.tree.flatten is trainer.tree.flatten
    assert keras_private._get("unscale_loss_for_distribution") is (
        trainer.loss_module.unscale_loss_for_distribution
    )


def test_keras_public_helpers_behave_as_the_callback_uses_them():
    x, y, w = keras.utils.unpack_x_y_sample_weight((1, 2))
    assert (x, y, w) == (1, 2, None)
    assert keras.utils.unpack_x_y_sample_weight((1, 2, 3)) == (1, 2, 3)
    assert keras.utils.unpack_x_y_sample_weight(1) == (1, None, None)
    assert keras.tree.flatten({"a": None, "b": (1, [2])}) == [None, 1, 2]


@pytest.mark.parametrize("name", sorted(keras_private.SYMBOLS))
def test_keras_symbol_exists(name):
    module, attribute, feature = keras_private.SYMBOLS[name]
    assert module.startswith("keras.src.") and feature
    if name in keras_private._INSTANCE:
        model = _compiled_model()
        assert hasattr(model, attribute.rsplit(".", 1)[1])
    else:
        assert callable(keras_private._get(name))


def _compiled_model(cls=None):
    inputs = keras.Input((3,))
    if cls is None:
        model = keras.Model(inputs, keras.layers.Dense(2)(keras.layers.Dropout(0.1)(inputs)))
    else:
        model = cls()
        model(np.zeros((1, 3), np.float32))
    model.compile(optimizer="sgd", loss="mse")
    return model


class _NoTrainingArg(keras.Model):
    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(2)

    def call(self, x):
        return self.dense(x)


class _OldComputeLoss(keras.Model):
    """``compute_loss`` overridden without ``training=`` (before Keras 3.3)."""

    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(2)

    def call(self, x, training=None):
        return self.dense(x)

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None):
        return tf.reduce_sum(y_pred) * 0.0 + 7.0


def test_keras_private_helpers():
    x = np.array([[1.0, 2.0, 3.0], [0.0, 1.0, -1.0]], np.float32)
    y = np.array([[1.0, 0.0], [0.0, 1.0]], np.float32)
    model = _compiled_model()
    assert keras_private.call_has_training_arg(model) is True
    assert keras_private.call_has_training_arg(_compiled_model(_NoTrainingArg)) is False
    tracker = keras_private.loss_tracker(model)
    assert isinstance(tracker, keras.metrics.Mean) and tracker.name == "loss"
    y_pred = model(x, training=False)
    loss = keras_private.compute_loss(model, x, y, y_pred, None)
    np.testing.assert_allclose(float(loss), float(np.mean((y_pred.numpy() - y) ** 2)), rtol=1e-6)
    old = _compiled_model(_OldComputeLoss)
    assert float(keras_private.compute_loss(old, x, y, old(x), None)) == 7.0
    v = tf.constant(3.5)
    assert float(keras_private.unscale_loss_for_distribution(v)) == 3.5  # one replica


def test_missing_keras_symbol_raises_at_use_time(monkeypatch):
    monkeypatch.setitem(
        keras_private.SYMBOLS,
        "loss_tracker",
        ("keras.src.trainers.trainer", "Trainer._no_such_tracker", "the callback (test)"),
    )
    with pytest.raises(PrivateAPIError) as err:
        keras_private.loss_tracker(_compiled_model())
    msg = str(err.value)
    assert "Trainer._no_such_tracker" in msg and f"keras {keras.__version__}" in msg
    assert "the callback (test) is unavailable" in msg


# ---------------------------------------------------------------------------- TensorBoard


def test_tensorboard_provider_classes_the_plugin_recognises():
    """`_tb_compat` recognises TensorBoard's data providers by class name and reads their
    private ``_multiplexer`` / ``_stub``."""
    from tensorboard.backend.event_processing import data_provider as dp_module
    from tensorboard.backend.event_processing import plugin_event_multiplexer
    from tensorboard.data import grpc_provider

    assert dp_module.MultiplexerDataProvider.__name__ == _tb_compat._PYTHON_PROVIDER
    assert grpc_provider.GrpcDataProvider.__name__ == _tb_compat._GRPC_PROVIDER

    mux = plugin_event_multiplexer.EventMultiplexer()
    provider = dp_module.MultiplexerDataProvider(mux, "/nowhere")
    assert _tb_compat.is_python_loader(provider)
    assert _tb_compat.multiplexer_of(None, provider) is mux
    assert _tb_compat.grpc_stub_of(provider) is None

    class Stub:
        def ReadTensors(self, req):  # noqa: N802 - the gRPC method's name
            raise AssertionError("not called here")

    stub = Stub()
    grpc = grpc_provider.GrpcDataProvider("localhost:0", stub)
    assert not _tb_compat.is_python_loader(grpc)
    assert _tb_compat.grpc_stub_of(grpc) is stub
    assert _tb_compat.multiplexer_of(None, grpc) is None


def test_grpc_read_tensors_sends_what_the_grpc_provider_sends():
    from tensorboard import context
    from tensorboard.data import grpc_provider
    from tensorboard.data import provider as p
    from tensorboard.data.proto import data_provider_pb2
    from tensorboard.util import tensor_util

    class Stub:
        def __init__(self):
            self.requests = []

        def ReadTensors(self, req):  # noqa: N802 - the gRPC method's name
            self.requests.append(req)
            res = data_provider_pb2.ReadTensorsResponse()
            run = res.runs.add(run_name="r")
            tag = run.tags.add(tag_name="t")
            tag.data.step.extend([3, 5])
            tag.data.wall_time.extend([1.5, 2.5])
            tag.data.value.extend(
                [tensor_util.make_tensor_proto(np.float32(v)) for v in (1.0, 2.0)]
            )
            return res

    stub = Stub()
    read = grpc_provider.GrpcDataProvider("localhost:0", stub).read_tensors(
        context.RequestContext(),
        experiment_id="e",
        plugin_name="gradmom",
        downsample=7,
        run_tag_filter=p.RunTagFilter(runs=["r"], tags=["t"]),
    )
    ours = _tb_compat.grpc_read_tensors(stub, "e", "gradmom", "r", ["t"], 7)
    theirs, mine = stub.requests
    assert mine == theirs
    assert [d.step for d in read["r"]["t"]] == [s for s, _, _ in ours["t"]] == [3, 5]
    assert [float(tensor_util.make_ndarray(v)) for _, _, v in ours["t"]] == [1.0, 2.0]


# ------------------------------------------------------------------- the boundary holds

_PRIVATE_MODULES = ("tensorflow.python", "keras.src")
# Private attributes of dependencies' objects, reached only through the compat modules.
_PRIVATE_ATTRS = frozenset(
    {
        "_update_input",
        "_summary_state",
        "_get_function",
        "_component_specs",
        "_compute_loss",
        "_loss_tracker",
        "_call_has_training_arg",
        "_multiplexer",
        "_stub",
    }
)
_PRIVATE_NAMES = frozenset({"MultiplexerDataProvider", "GrpcDataProvider"})
_ALLOWED = ("_compat/", "plugin/_tb_compat.py")
# Private uses in modules that another change will move behind _compat (path, what). Each
# must still be found, so the list shrinks as they move.
_KNOWN: set[tuple[str, str]] = set()


def _is_private_module(name: str) -> bool:
    return any(name == m or name.startswith(m + ".") for m in _PRIVATE_MODULES)


def private_uses(source: str) -> list[str]:
    """The private API uses in Python ``source``: imports of ``tensorflow.python``/
    ``keras.src``, attributes in `_PRIVATE_ATTRS` (other than ``self._stub``-like own
    attributes) and string constants naming either."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if _is_private_module(a.name)]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            found += [n for n in names if _is_private_module(n)][:1]
        elif isinstance(node, ast.Attribute) and node.attr in _PRIVATE_ATTRS:
            own = isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
            if not own or node.attr not in ("_stub", "_multiplexer"):
                found.append(f".{node.attr}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            v = node.value
            if _is_private_module(v) or v in _PRIVATE_ATTRS or v in _PRIVATE_NAMES:
                found.append(repr(v))
    return found


def test_the_scan_finds_private_uses():
    src = (
        "from tensorflow.python.ops import summary_ops_v2\n"
        "import keras.src.tree\n"
        "from tensorflow import python\n"
        "op._update_input(0, t)\n"
        "getattr(summary_ops_v2, '_summary_state')\n"
        "self._loss_tracker.update_state(1)\n"
        "self._stub = None\n"
        "provider._stub\n"
        "importlib.import_module('keras.src.losses')\n"
    )
    assert sorted(private_uses(src)) == sorted(
        [
            "tensorflow.python.ops",
            "keras.src.tree",
            "tensorflow.python",
            "._update_input",
            "'_summary_state'",
            "._loss_tracker",
            "._stub",
            "'keras.src.losses'",
        ]
    )
    assert private_uses('"""Uses tensorflow.python.ops and op._update_input."""\nx = 1\n') == []


def test_no_private_api_outside_compat():
    uses = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith(_ALLOWED[0]) or rel == _ALLOWED[1]:
            continue
        uses |= {(rel, what) for what in private_uses(path.read_text(encoding="utf-8"))}
    assert uses - _KNOWN == set(), "private API outside tb_gradmom/_compat"
    assert _KNOWN - uses == set(), "moved behind _compat: remove it from _KNOWN"


def test_importing_tb_gradmom_touches_no_private_api():
    """``import tb_gradmom`` and its compat package import neither TensorFlow nor Keras."""
    import subprocess
    import sys

    code = (
        "import sys, tb_gradmom, tb_gradmom._compat\n"
        "assert 'tensorflow' not in sys.modules and 'keras' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=PACKAGE.parent)
