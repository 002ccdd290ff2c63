"""A Keras callback that logs per-example gradient moments during ``model.fit``.

    model.fit(x, y, callbacks=[gradmom.keras.GradMoments("runs/exp1", every_n_steps=100)])

Keras callbacks never see gradients. The callback leaves the model alone (its ``train_step``,
``jit_compile`` and train function) and builds, beside Keras' own train function, a second one
for the steps it logs: the same step under a context that a `tb_gradmom.GradientTape` reads.

* A model that keeps Keras' default ``train_step`` runs, on logged steps, a copy of that step
  with `tb_gradmom.GradientTape` in place of ``tf.GradientTape``: the same loss, the same
  gradients (bit for bit) and the moments from the same backward pass.
* A model whose ``train_step`` was written by the user (GANs, VAEs, contrastive learning,
  custom losses) runs that step on every step, unchanged. Its ``gradmom.GradientTape`` calls
  log with the callback's writer, step and interval; with ``tf.GradientTape`` nothing is logged
  and the callback says, once, the one-line change that logs it.

The steps that do not log run Keras' own train function. Everything is put back at the end of
``fit``, and also at the start of the next ``fit`` after one that raised or was interrupted.
"""

from __future__ import annotations

import os
import sys
import warnings
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import keras
import tensorflow as tf

from tb_gradmom.core import moments as _moments
from tb_gradmom.core import validate as _validate
from tb_gradmom.core.plan import check_orders
from tb_gradmom.writers import summary as _summary
from tb_gradmom.writers import tape as _tape

__all__ = ["GradMoments"]


class GradMoments(keras.callbacks.Callback):
    """Logs gradient moments to ``log_dir`` every ``every_n_steps`` training steps.

    A step is logged when the optimizer's iteration count *before* the update is a multiple of
    ``every_n_steps``: steps 0, N, 2N, ... (the step written is that count). The other steps run
    Keras' own train function, untouched. With gradient accumulation the count is of updates,
    and the last micro-batch of a logged update is logged.

    Args:
      log_dir: the run directory to write event files to (``tensorboard --logdir`` its parent,
        or the directory itself). When a ``keras.callbacks.TensorBoard`` of the same ``fit``
        writes to the same directory, the moments go to its ``train`` run beside its scalars.
      every_n_steps: how often to log.
      orders: moment orders (1 and 2 are always logged).
      variables: the variables to log (default: every variable a step differentiates). Their
        gradients come from the same backward pass as the others'.
      max_elements, map_dtype: see `tb_gradmom.writers.summary.moments` (``max_elements=None``:
        every variable at full resolution, float32; ``map_dtype="float32"``: pooled maps too).
      per_variable_scalars: also write per-variable scalars for the Scalars dashboard.
      log_learning_rate: pass the optimizer's learning rate so the CABS batch size is logged.
      fallback: ``"exact"`` or ``"error"`` for layers without an exact rule (see
        `tb_gradmom.gradients_and_moments`).
      coupled: ``"exact"`` or ``"rules"`` for layers used before an op that couples the
        examples, a training-mode BatchNormalization above all (see
        `tb_gradmom.gradients_and_moments`): ``"rules"`` is much cheaper on a network with
        batch normalisation in training, and its higher moments are of another split.
      log_examples: also log each logged step's per-example squared gradient norms (whole
        model and per layer) and losses, under ``_examples`` (see
        `tb_gradmom.writers.summary.moments`). For example ids, write a ``train_step`` that
        unpacks them from the data and passes them to
        ``gradmom.GradientTape(example_ids=ids)`` (README, "Per-example norms").
      max_examples: at most this many examples logged per step (the largest and smallest
        norms always kept).
      per_variable_norms: also log each variable's per-example norms.
      mode: ``"moments"`` (default) or ``"norms"``: only the noise statistics, from the batch
        gradient and the per-example squared gradient norms, no element-wise moments and no
        maps (see `tb_gradmom.writers.summary.moments`). With gradient accumulation the
        micro-batches' sums are added as the moments are. (``"replicas"``, McCandlish et al.'s
        per-replica estimator, needs each replica's gradient: use ``summary.moments(...,
        mode="replicas")`` in a custom ``strategy.run`` loop.)

    Under mixed precision the optimizer's loss scale is taken out of the moments; under a
    ``tf.distribute`` strategy the moments are over the global batch, written by replica 0.
    """

    def __init__(
        self,
        log_dir: str,
        every_n_steps: int = 100,
        orders: Sequence[int] = (1, 2),
        variables: Sequence[tf.Variable] | None = None,
        max_elements: int | None = _summary.DEFAULT_MAX_ELEMENTS,
        per_variable_scalars: bool = True,
        log_learning_rate: bool = True,
        fallback: str = "exact",
        coupled: str = "exact",
        map_dtype: str = _summary.DEFAULT_MAP_DTYPE,
        log_examples: bool = False,
        max_examples: int = _summary.DEFAULT_MAX_EXAMPLES,
        per_variable_norms: bool = False,
        mode: str = "moments",
    ) -> None:
        super().__init__()
        self.every_n_steps = _validate.positive_int("every_n_steps", every_n_steps)
        self.log_dir = os.fspath(log_dir)
        if not self.log_dir:
            raise ValueError(
                "log_dir is empty: pass the run directory to write to, e.g. 'runs/exp1'"
            )
        if os.path.exists(self.log_dir) and not os.path.isdir(self.log_dir):
            raise ValueError(
                f"log_dir '{self.log_dir}' is a file, not a directory; pass a directory for "
                "the run's event files (it is created if missing)"
            )
        self.orders = check_orders(orders)
        self.variables = None if variables is None else list(variables)
        if self.variables is not None and not self.variables:
            raise ValueError(
                "variables is empty: pass None to log every trainable variable, or the "
                "variables to log (e.g. model.layers[-1].trainable_variables)"
            )
        self.max_elements = _summary._check_max_elements(max_elements)
        self.map_dtype = _summary._check_map_dtype(map_dtype)
        self.per_variable_scalars = _validate.boolean("per_variable_scalars", per_variable_scalars)
        self.log_learning_rate = _validate.boolean("log_learning_rate", log_learning_rate)
        if fallback not in ("exact", "error"):
            raise ValueError(f"fallback must be 'exact' or 'error', got {fallback!r}")
        self.fallback = fallback
        if coupled not in ("exact", "rules"):
            raise ValueError(f"coupled must be 'exact' or 'rules', got {coupled!r}")
        self.coupled = coupled
        self.log_examples = _validate.boolean("log_examples", log_examples)
        self.max_examples = _validate.positive_int("max_examples", max_examples)
        self.per_variable_norms = _validate.boolean("per_variable_norms", per_variable_norms)
        self.mode = _moments.check_log_mode(mode)
        if self.mode == "replicas":
            raise ValueError(
                "GradMoments(mode='replicas') is not supported: the per-replica estimator needs "
                "each tf.distribute replica's gradient before the all-reduce, which Keras' "
                "train step does not hand out. Use mode='norms' (exact, from per-example "
                "norms), or a custom loop calling gradmom.summary.moments(..., "
                "mode='replicas') inside strategy.run."
            )
        if self.mode != "moments" and set(self.orders) - {1, 2}:
            raise ValueError(
                f"orders={tuple(self.orders)} needs the element-wise moments: mode="
                f"{self.mode!r} logs no maps. Pass mode='moments' for higher orders."
            )
        self._writer: tf.summary.SummaryWriter | None = None  # while training
        self._run_dir = self.log_dir
        self._context: _tape.CallbackContext | None = None
        self._switch: _Switch | None = None
        self._warned_tape = False

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        model = self.model
        if keras.backend.backend() != "tensorflow":
            raise RuntimeError(
                "gradmom.keras.GradMoments needs the TensorFlow backend of Keras "
                f"(KERAS_BACKEND=tensorflow); this Keras runs on {keras.backend.backend()!r}"
            )
        if getattr(model, "optimizer", None) is None:
            raise RuntimeError(
                "gradmom.keras.GradMoments: the model has no optimizer; call "
                "model.compile(optimizer=..., loss=...) before model.fit"
            )
        _restore(model)  # what an earlier fit that raised left behind
        if self.variables is not None:
            known = {id(v) for v in model.trainable_variables}
            known |= {id(getattr(v, "value", v)) for v in model.trainable_variables}
            missing = [
                getattr(v, "path", getattr(v, "name", repr(v)))
                for v in self.variables
                if id(v) not in known and id(getattr(v, "value", v)) not in known
            ]
            if missing:
                raise ValueError(
                    f"GradMoments(variables=...) holds {missing[:3]}, not trainable variables "
                    "of the model being fit; pass variables of this model "
                    "(e.g. model.layers[-1].trainable_variables) or None for all"
                )
        optimizer = model.optimizer
        self._run_dir = _run_dir(self.log_dir, _fit_callbacks())
        self._writer = tf.summary.create_file_writer(self._run_dir)
        # tags another open writer Grad Moments made logs to this directory: refused when traced
        _summary._register_writer(
            self._writer, self._run_dir, f"GradMoments({self._run_dir!r})", fit=True
        )
        self._context = _tape.CallbackContext(
            writer=self._writer,
            every_n_steps=self.every_n_steps,
            orders=self.orders,
            variables=self.variables,
            max_elements=self.max_elements,
            map_dtype=self.map_dtype,
            per_variable_scalars=self.per_variable_scalars,
            log_learning_rate=self.log_learning_rate,
            fallback=self.fallback,
            optimizer=optimizer,
            coupled=self.coupled,
            log_examples=self.log_examples,
            max_examples=self.max_examples,
            per_variable_norms=self.per_variable_norms,
            mode=self.mode,
        )
        user_step = _user_train_step(model)
        step = _default_train_step(model) if user_step is None else user_step
        context = self._context

        def logged_step(data: Any) -> Any:
            with _tape.callback_context(context):
                context.collected = []
                context.errors = []
                out = step(data)
                collected = [c.logged.values() for c in context.collected]
                # what the writer needs besides the values: no tensors of this graph
                context.layout = [
                    (c.group, c.logged.with_values(_EMPTY)) for c in context.collected
                ]
            return out, collected

        model.make_train_function()
        plain = model.train_function
        strategy = model.distribute_strategy

        # the logged steps' dry run only computes moments (its updates are undone): it runs
        # without XLA, and the training step itself keeps the model's own jit_compile
        @tf.function(reduce_retracing=True, autograph=False)
        def logged(data: Any) -> Any:
            out, collected = strategy.run(logged_step, args=(data,))
            # all-reduced moments: every replica holds the same, take the first's
            first = strategy.experimental_local_results
            return tf.nest.map_structure(lambda t: first(t)[0], collected)

        self._switch = _Switch(self, plain, logged)
        model.train_function = self._switch
        _ATTACHED[model] = self
        # the next fit calls make_train_function before any callback: put the model back there
        # if this fit never reaches on_train_end (an error, an interrupt)
        self._made = model.__dict__.get("make_train_function")

        def make_train_function(force: bool = False) -> Any:
            _restore(model)
            return model.make_train_function(force=force)

        model.make_train_function = make_train_function

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        _restore(self.model)

    def _detach(self) -> None:
        model = self.model
        if self._switch is not None and model.__dict__.get("train_function") is self._switch:
            model.train_function = self._switch.plain
        self._switch = None
        made = model.__dict__.get("make_train_function")
        if made is not None and getattr(made, "__name__", "") == "make_train_function":
            del model.__dict__["make_train_function"]
            if self._made is not None:
                model.make_train_function = self._made
        self._context = None
        if self._writer is not None:
            _summary._release_writer(self._writer)
            try:
                self._writer.flush()
                self._writer.close()
            except tf.errors.OpError as e:
                warnings.warn(
                    f"GradMoments could not flush '{self._run_dir}': {_first_message(e.message)}",
                    stacklevel=2,
                )
            self._writer = None

    def _warn_unused(self) -> None:
        if self._warned_tape:
            return
        self._warned_tape = True
        warnings.warn(
            "GradMoments logged nothing: the model's train_step takes its gradients with "
            "tf.GradientTape. To log them, replace `tf.GradientTape()` with "
            "`gradmom.GradientTape()` in that train_step (import tb_gradmom as gradmom); it "
            "returns the same gradients. Training is unchanged either way.",
            stacklevel=3,
        )


# the values of a `Logged` record kept as the writer's template (no tensors of the trace)
_EMPTY = ((), (), (), (), (), (), ())

# model -> the GradMoments attached to it, until its fit ends or the next fit starts
_ATTACHED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _restore(model: keras.Model) -> None:
    """Detaches the GradMoments attached to ``model``, if any."""
    cb = _ATTACHED.pop(model, None)
    if cb is not None:
        cb._detach()


class _Accumulated:
    """The moments of one logged update, summed over its micro-batches (one without gradient
    accumulation): ``sum_j g_j ** p`` over all their examples."""

    def __init__(self) -> None:
        self.groups: list[Any] = []  # (group, Logged without values) per tape call
        self.sums: list[list[dict[int, tf.Tensor]]] = []
        self.n: list[tf.Tensor] = []
        self.loss: list[tf.Tensor] = []
        # per tape call, the micro-batches' per-example (sq_norms, losses, ids), or ()
        self.examples: list[list[Any]] = []
        # per tape call (norms mode), per variable: sum_j ||g_j||^2 over the micro-batches
        self.raw: list[list[tf.Tensor] | None] = []

    def add(self, layout: list[Any], collected: list[Any]) -> None:
        if not self.sums:
            self.groups = list(layout)
            self.sums = [[{} for _ in values[0]] for values in collected]
            self.n = [tf.zeros([], tf.int64) for _ in collected]
            self.loss = [tf.zeros([], tf.float64) for _ in collected]
            self.examples = [[] for _ in collected]
            self.raw = [None for _ in collected]
        for k, (moments, n, loss, *extra) in enumerate(collected):
            if isinstance(extra[0], list):  # per-example norms
                self.examples[k].append(extra[:3])
            nf = tf.cast(n, tf.float64)
            if isinstance(extra[3], list):  # the norms mode's sums: add sum_j ||g_j||^2
                raw = [s["sum_m2_raw"] * nf for s in extra[3]]
                old = self.raw[k]
                self.raw[k] = raw if old is None else [a + b for a, b in zip(old, raw)]
            for sums, m in zip(self.sums[k], moments):
                for p, t in m.items():
                    s = t * tf.cast(nf, t.dtype)
                    sums[p] = sums[p] + s if p in sums else s
            self.n[k] = self.n[k] + n
            self.loss[k] = self.loss[k] + loss * nf

    def examples_of(self, k: int) -> tuple:
        """The per-example values of tape call ``k`` over the update's micro-batches, in
        order: ``(sq_norms, losses, ids)`` (``()`` for what was not logged)."""
        parts = self.examples[k] if self.examples else []
        if not parts:
            return (), (), ()
        norms = [tf.concat([p[0][v] for p in parts], 0) for v in range(len(parts[0][0]))]
        losses = tf.concat([p[1] for p in parts], 0)
        has_ids = not (isinstance(parts[0][2], tuple) and not parts[0][2])
        ids = tf.concat([p[2] for p in parts], 0) if has_ids else ()
        return norms, losses, ids


class _Switch:
    """The model's train function while the callback is attached.

    Per call (one execution of up to ``steps_per_execution`` batches): when no step of it is
    due, Keras' own function on the iterator. Otherwise the batches are taken one at a time;
    before a due step, the logged step runs on its batch as a dry run (every variable its
    traced graph captures - weights, normalisation statistics, random seeds' states, the
    optimizer's and the metrics' - saved before and put back after: the moments are of that
    step, at the weights it starts from), then Keras' own function runs the step. Training
    is therefore the same, bit for bit, with or without the callback, wherever TensorFlow
    repeats its own step bit for bit (where it does not, e.g. when Grappler's memory optimizer
    sums an AddN in the order its inputs arrive, neither does the callback make it: README,
    "Model zoo", InceptionV3 through ``fit``). With gradient
    accumulation, the micro-batches of a due update are summed and written once, at the
    update's step, over all their examples.
    """

    def __init__(self, cb: GradMoments, plain: Callable, logged: Any) -> None:
        self.cb = cb
        self.plain = plain
        self.logged_fn = logged
        self.keepers: dict[Any, tuple[Callable, Callable]] = {}
        self.writes: dict[Any, Callable] = {}
        self.acc: _Accumulated | None = None
        self.failed = False
        self.warned_errors = False
        self.write_failed = False
        # the step count: the optimizer's; or, when the step does not use the model's
        # optimizer (a GAN's train_step with optimizers of its own), the steps run here
        self.start: int | None = None
        self.executed = 0

    def _counts(self) -> tuple[int, int]:
        """(micro-batches applied, micro-batches per update) of the optimizer."""
        optimizer = self.cb.model.optimizer
        # a LossScaleOptimizer counts with its inner optimizer's variables
        inner = getattr(optimizer, "inner_optimizer", optimizer)
        per_update = int(getattr(inner, "gradient_accumulation_steps", None) or 1)
        if per_update == 1:
            return int(optimizer.iterations.numpy()), 1
        # Keras' private count of micro-batches (``iterations`` counts the updates)
        return int(inner._iterations.numpy()), per_update

    def __call__(self, iterator: Any) -> Any:
        model = self.cb.model
        ctx = self.cb._context
        if ctx is None or self.failed:
            return self.plain(iterator)
        applied, per_update = self._counts()
        if self.start is None:
            self.start = applied
        elif applied == self.start and self.executed:
            # the model's optimizer counted none of the steps run: count them here
            applied = self.start + self.executed
        count = max(1, int(getattr(model, "steps_per_execution", 1) or 1))
        due = [((applied + k) // per_update) % ctx.every_n_steps == 0 for k in range(count)]
        if not any(due):
            self.executed += count
            return self.plain(iterator)
        batches = []
        for _ in range(count):
            try:
                batches.append(next(iterator))
            except (StopIteration, tf.errors.OutOfRangeError):
                break
        if not batches:
            raise StopIteration
        out = None
        for k, batch in enumerate(batches):
            if due[k]:
                self._log(batch, applied + k, per_update)
            out = self.plain(_replay(batch, iterator))
            self.executed += 1
        return out

    def _log(self, batch: Any, applied: int, per_update: int) -> None:
        ctx = self.cb._context
        assert ctx is not None
        lr = None
        if ctx.log_learning_rate:
            lr = tf.cast(self.cb.model.optimizer.learning_rate, tf.float64)
        concrete = self.logged_fn.get_concrete_function(batch)
        if ctx.errors and not self.warned_errors:
            self.warned_errors = True
            what = "this step's moments" if not ctx.collected else "some of its tapes' moments"
            warnings.warn(
                f"GradMoments cannot log {what}, and training goes on without them: "
                + "; ".join(ctx.errors),
                stacklevel=3,
            )
        if not ctx.collected:
            self.failed = True  # no more dry runs: there is nothing to log
            if not ctx.used:
                self.cb._warn_unused()
            return
        save, put_back = self._keeper(concrete.variables)
        saved = save()
        try:
            collected = self.logged_fn(batch)
        except tf.errors.OpError as e:
            # a check of the moments failed at run time (the batch size): never training
            self.failed = True
            warnings.warn(
                "GradMoments stops logging, and training goes on: computing the moments "
                f"failed at step {applied // per_update}: {_first_message(e.message)}",
                stacklevel=3,
            )
            return
        finally:
            put_back(saved)
        if self.acc is None:
            self.acc = _Accumulated()
        self.acc.add(ctx.layout, collected)
        if applied % per_update == per_update - 1 or per_update == 1:
            self._write(self.acc, applied // per_update, lr)
            self.acc = None

    def _keeper(self, variables: Sequence[Any]) -> tuple[Callable, Callable]:
        """Functions that save and put back ``variables`` (one copy of each)."""
        key = tuple(id(v) for v in variables)
        if key not in self.keepers:
            state = list(variables)

            def put_back(values: list) -> None:
                for v, value in zip(state, values):
                    v.assign(value)

            self.keepers[key] = (
                tf.function(lambda: [tf.identity(v) for v in state], autograph=False),
                tf.function(put_back, autograph=False),
            )
        return self.keepers[key]

    def _write(self, acc: _Accumulated, step: int, lr: Any) -> None:
        writer = self.cb._writer
        ctx = self.cb._context
        assert writer is not None and ctx is not None
        for k, (group, template) in enumerate(acc.groups):
            key = (k, group, tuple(id(v) for v in template.variables))
            if key not in self.writes:
                self.writes[key] = _write_function(writer, ctx, group, template)
            try:
                self.writes[key](
                    acc.sums[k],
                    acc.n[k],
                    acc.loss[k],
                    lr,
                    tf.constant(step, tf.int64),
                    acc.examples_of(k),
                    () if not acc.raw or acc.raw[k] is None else acc.raw[k],
                )
                writer.flush()
                self.write_failed = False
            except tf.errors.OpError as e:
                # a full disk, a removed directory: training goes on, logging resumes when
                # a write succeeds again, and what was written stays readable
                if not self.write_failed:
                    warnings.warn(
                        f"GradMoments could not write step {step} to '{self.cb._run_dir}' "
                        f"({_first_message(e.message)}); training goes on, and logging "
                        "resumes when writing works again.",
                        stacklevel=3,
                    )
                self.write_failed = True


def _replay(batch: Any, iterator: Any) -> Any:
    """An iterator over ``batch`` alone for Keras' train function: a ``tf.data`` iterator with
    the element spec of ``iterator`` where one can be made, so that the step runs through the
    same traced function as the other steps (the same graph, the same arithmetic); otherwise
    (a distributed iterator) a Python iterator, which Keras' function runs step by step."""
    if isinstance(iterator, tf.data.Iterator):
        spec = iterator.element_spec
        dataset = tf.data.Dataset.from_tensors(batch)
        if dataset.element_spec != spec:
            try:
                n = tf.shape(tf.nest.flatten(batch)[0], out_type=tf.int64)[0]
                dataset = dataset.unbatch().batch(n)
            except (TypeError, ValueError, tf.errors.OpError):
                pass
        if dataset.element_spec == spec:
            return iter(dataset)
    return iter([batch])


def _first_message(message: str) -> str:
    """The line of a TensorFlow run-time error that says what failed (tb_gradmom's own, an
    assertion), not its "Graph execution error:" header."""
    lines = [ln.strip() for ln in message.splitlines() if ln.strip()]
    for ln in lines:
        if "tb_gradmom" in ln or "assertion failed" in ln:
            return ln
    return next((ln for ln in lines if "Graph execution error" not in ln), message)


def _write_function(writer: Any, ctx: Any, group: str | None, template: Any) -> Callable:
    """A ``tf.function`` writing one group's summed moments at a step (``template``: the
    group's `Logged` record, whose values it fills in)."""

    def write(sums: list, n: Any, loss: Any, lr: Any, step: Any, examples: tuple, raw: Any) -> Any:
        nf = tf.cast(n, tf.float64)
        moments = [{p: t / tf.cast(nf, t.dtype) for p, t in m.items()} for m in sums]
        stats: Any = ()
        if template.mode == "norms":  # from the update's M_1 and sum_j ||g_j||^2
            stats = []
            for m, total in zip(moments, raw):
                m2 = tf.reduce_sum(tf.square(tf.cast(m[1], tf.float64)))
                mean_sq = total / nf
                var = tf.where(
                    nf > 1.0,
                    (mean_sq - m2) * nf / tf.maximum(nf - 1.0, 1.0),
                    tf.constant(float("nan"), tf.float64),
                )
                stats.append({"sum_m2": m2, "sum_var": var, "sum_m2_raw": mean_sq})
        with writer.as_default(step=step):
            return _summary.write(
                template.with_values((moments, n, loss / nf, *examples, stats)),
                learning_rate=lr,
                name=group,
                max_elements=ctx.max_elements,
                per_variable_scalars=ctx.per_variable_scalars,
                map_dtype=ctx.map_dtype,
                max_examples=ctx.max_examples,
                per_variable_norms=ctx.per_variable_norms,
            )

    return tf.function(write, autograph=False)


def _user_train_step(model: keras.Model) -> Callable[[Any], Any] | None:
    """The model's ``train_step`` when the user wrote it (on the model's class or instance),
    None when it is Keras' own."""
    from tb_gradmom._compat import keras_private

    if "train_step" in model.__dict__:
        return model.__dict__["train_step"]
    if type(model).train_step is keras_private.default_train_step():
        return None
    return model.train_step


def _fit_callbacks() -> list[Any]:
    """The callbacks of the ``fit`` calling ``on_train_begin`` (Keras' ``CallbackList``, found
    on the call stack), or [] when it cannot be found."""
    frame: Any = sys._getframe(1)
    for _ in range(8):
        if frame is None:
            break
        owner = frame.f_locals.get("self")
        if isinstance(owner, keras.callbacks.CallbackList):
            return list(owner.callbacks)
        frame = frame.f_back
    return []


def _run_dir(log_dir: str, callbacks: Sequence[Any]) -> str:
    """``log_dir``, or its ``train`` run when a ``keras.callbacks.TensorBoard`` of the same fit
    writes there (its scalars go to ``<log_dir>/train``)."""
    for cb in callbacks:
        if isinstance(cb, keras.callbacks.TensorBoard):
            if os.path.abspath(str(cb.log_dir)) == os.path.abspath(log_dir):
                return os.path.join(log_dir, "train")
    return log_dir


def _default_train_step(model: keras.Model) -> Callable[[Any], Any]:
    """Keras' default ``train_step`` (``keras/src/backend/tensorflow/trainer.py``,
    ``TensorFlowTrainer.train_step``), line for line, with `tb_gradmom.GradientTape` in place of
    ``tf.GradientTape``. Keras' private API, behind `tb_gradmom._compat.keras_private`."""
    from tb_gradmom._compat import keras_private

    def train_step(data: Any) -> Any:
        self = model
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        with _tape.GradientTape() as tape:
            if keras_private.call_has_training_arg(self):
                y_pred = self(x, training=True)
            else:
                y_pred = self(x)
            loss = keras_private.compute_loss(self, x, y, y_pred, sample_weight)
            keras_private.loss_tracker(self).update_state(
                keras_private.unscale_loss_for_distribution(loss),
                sample_weight=tf.shape(next(i for i in keras.tree.flatten(x) if i is not None))[0],
            )
            if self.optimizer is not None:
                loss = self.optimizer.scale_loss(loss)
        if self.trainable_weights:
            trainable_weights = self.trainable_weights
            gradients = tape.gradient(loss, trainable_weights)
            self.optimizer.apply_gradients(zip(gradients, trainable_weights))
        else:
            warnings.warn("The model does not have any trainable weights.", stacklevel=2)
        return self.compute_metrics(x, y, y_pred, sample_weight=sample_weight)

    return train_step
