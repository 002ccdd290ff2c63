"""Cost of `gradmom.per_example_norms` and of the norms logging mode against a plain SGD step.

    python benchmarks/bench_norms.py                  # MLP, 3C3D, transformer block, ~3 min
    python benchmarks/bench_norms.py --quick          # smoke run
    python benchmarks/bench_norms.py --models transformer --rounds 15
    python benchmarks/bench_norms.py --models mlp,3c3d,resnet50,bert,gpt2 --logged
    python benchmarks/bench_norms.py --replicas mlp,3c3d   # MirroredStrategy, 2 logical CPUs

The models, batches and data are `bench_core.py`'s ("mlp": 784-512-512-10, batch 128;
"3c3d": batch 64, 32x32x3; "transformer": one encoder block, batch 32, sequence 64, width 128).
For each model, in ONE process, three `tf.function` training steps (jit_compile off) are timed
interleaved, round after round, the order rotating (`bench_core.time_interleaved`):

- plain:   forward + `tf.gradients` + `v.assign_sub(lr * g)`;
- moments: forward + `gradmom.gradients_and_moments(loss, vars, orders=(1, 2))` + the update,
  the second moments consumed (a scalar sum is returned);
- norms:   forward + `gradmom.per_example_norms(loss, vars)` + the update, the per-example
  squared norms consumed (their sum over variables, a [n] vector, is summed into the output).

A variant's time is the median of its steps; a ratio is the median over rounds of the per-round
ratio of medians. The per-variable form each norm took is printed (Gram or materialised for the
Dense layers on sequences).

``--logged`` adds the two logging modes of `gradmom.summary.moments`, writing every step to
a summary writer in a temporary directory (event files, statistics and scalars included):

- moments-log: ``summary.moments(loss, vars)`` (``mode="moments"``: maps, histograms, sums);
- norms-log:   ``summary.moments(loss, vars, mode="norms")`` (the statistics' sums from the
  per-example squared norms and the batch gradient; no maps);
- norms-log-fromwork: the same with ``exact_gradients=False`` (the convolution kernels'
  gradients from the per-example filter gradients the norms build, not TensorFlow's own).

``--conv-forms ghost,unfolded,native`` adds norms steps with every convolution's norms forced
to that form (``norms[native]``: TensorFlow's per-example filter gradients, the form before the
unfolded ones), side by side with the default choice.

Models "resnet50", "bert" and "gpt2" are `bench_zoo.py`'s (`bench_zoo.build`, its default
batch and size); for them only plain, moments-log and norms-log are timed. ``--coupled rules``
passes ``coupled="rules"`` to the logged steps (ResNet50's training-mode batch normalisation).

``--replicas MODELS`` runs, in a child process with 2 logical CPUs, a
``tf.distribute.MirroredStrategy`` step (``strategy.run`` of forward, ``tf.gradients`` and the
update through a Keras SGD optimizer, which all-reduces the gradients) against the same step
with ``summary.moments(..., mode="replicas")`` logging every step (McCandlish et al.'s
per-replica estimator: one squared norm per replica and variable, one all-reduce), the
estimator alone (`compute_logged(mode="replicas")`, its sums consumed, nothing written), and
the floor of any estimator that needs the all-reduced gradient inside the step: the plain step
plus one more all-reduce of the gradients (Keras' optimizer all-reduces its own copy).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import bench_core  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tb_gradmom as gradmom  # noqa: E402

LR = bench_core.LR
MODELS = ("mlp", "3c3d", "transformer")
ZOO = ("resnet50", "bert", "gpt2")
PER_ROUND = {"mlp": 20, "3c3d": 5, "transformer": 5, "resnet50": 3, "bert": 3, "gpt2": 3}
PER_ROUND_QUICK = {"mlp": 8, "3c3d": 2, "transformer": 2, "resnet50": 1, "bert": 1, "gpt2": 1}


def make_steps(
    model,
    logged: bool = False,
    core: bool = True,
    coupled: str = "exact",
    conv_forms: tuple[str, ...] = (),
) -> dict:
    variables = list(model.trainable_variables)

    def update(grads):
        for v, g in zip(variables, grads):
            # an embedding's gradient is IndexedSlices (BERT, GPT-2): applied densely
            v.assign_sub(LR * tf.convert_to_tensor(g))

    def loss_of(x, y):
        return tf.reduce_mean(bench_core.per_example_losses(model(x, training=True), y))

    @tf.function(jit_compile=False)
    def plain(x, y):
        loss = loss_of(x, y)
        update(tf.gradients(loss, variables))
        return loss

    @tf.function(jit_compile=False)
    def moments(x, y):
        loss = loss_of(x, y)
        grads, mom = gradmom.gradients_and_moments(loss, variables, orders=(1, 2))
        update(grads)
        return loss + 0.0 * tf.add_n([tf.reduce_sum(m[2]) for m in mom])

    @tf.function(jit_compile=False)
    def norms(x, y):
        loss = loss_of(x, y)
        grads, sq = gradmom.per_example_norms(loss, variables)
        update(grads)
        return loss + 0.0 * tf.reduce_sum(tf.add_n(sq))

    steps = {"plain": plain}
    if core:
        steps.update(moments=moments, norms=norms)
        for form in conv_forms:
            steps[f"norms[{form}]"] = _forced(form, make_steps(model, core=True)["norms"])
    if logged:
        for key, mode, exact in (
            ("moments-log", "moments", True),
            ("norms-log", "norms", True),
            ("norms-log-fromwork", "norms", False),
        ):
            writer = tf.summary.create_file_writer(tempfile.mkdtemp(prefix=f"bench_{mode}_"))

            @tf.function(jit_compile=False)
            def log_step(x, y, mode=mode, writer=writer, exact=exact):
                loss = loss_of(x, y)
                with writer.as_default(step=0), tf.summary.record_if(True):
                    grads = gradmom.summary.moments(
                        loss, variables, mode=mode, coupled=coupled, exact_gradients=exact
                    )
                update(grads)
                return loss

            steps[key] = log_step
    return steps


def _forced(form: str, step):
    """``step`` traced and run with the convolutions' norms in ``form`` (`conv.FORCE_NORMS_FORM`:
    "ghost", "unfolded", "native", "products"), for a before/after in one process."""
    from tb_gradmom.core.rules import conv

    def call(x, y):
        before = conv.FORCE_NORMS_FORM
        conv.FORCE_NORMS_FORM = form
        try:
            return step(x, y)
        finally:
            conv.FORCE_NORMS_FORM = before

    return call


def forms(model, x, y, batch: int) -> list[str]:
    """Per variable, the norms form its plan takes (traced once, nothing run)."""
    from tb_gradmom.core import plan as _plan
    from tb_gradmom.core.rules import base

    out: list[str] = []
    variables = list(model.trainable_variables)

    @tf.function
    def trace(x, y):
        loss = tf.reduce_mean(bench_core.per_example_losses(model(x, training=True), y))
        plan = _plan.make_plan(loss, variables, _plan.Options.check((1,)), name="forms")
        for v in plan.variables:
            if v.fallback is not None:
                form = "fallback"
            elif len(v.sites) != 1 or v.sites[0][1].sq_norms is None:
                form = "materialised (several sites or no norms form)"
            else:
                site = v.sites[0][0]
                form = f"{site.op.type} norms form"
                if site.op.type in ("Conv2D", "Conv3D") and site.index == 1:
                    form += f" ({_conv_form(site)})"
                if site.op.type in ("MatMul", "BatchMatMulV2") and site.view.shape.rank == 2:
                    t = _positions(site, batch)
                    if t is not None and t > 1:
                        d_in, d_out = (int(d) for d in site.view.shape)
                        ghost = base.ghost_form(t, d_in, d_out)
                        form += f" (T={t}: {'Gram' if ghost else 'materialised'})"
            out.append(f"{v.name} {list(v.variable.shape)}: {form}")
        return loss

    trace.get_concrete_function(x, y)
    return out


def _conv_form(site) -> str:
    """A one-group convolution's norms form (`conv._norms_form`), with its sizes."""
    from tb_gradmom.core.rules import conv

    kshape = site.view.shape.as_list()
    x = site.op.inputs[0]
    if x.shape[-1] != kshape[-2]:
        return "grouped"
    out = site.op.outputs[0].shape[1:-1]
    q = None if any(s is None for s in out) else int(np.prod(out))
    k_in = int(np.prod(kshape[:-1]))
    form = conv._norms_form(q, k_in, kshape[-1])
    name = "Gram" if form == "ghost" else "materialised, one batched matmul"
    return f"Q={q}, K c_in={k_in}, c_out={kshape[-1]}: {name}"


def _positions(site, batch: int) -> int | None:
    """Positions per example of the Dense input ``site`` reads (1 for rows), if static."""
    x = site.op.inputs[1 - site.index]
    if not x.shape.is_fully_defined():
        return None
    d_in = int(site.view.shape[0 if site.index == 1 else 1])
    return x.shape.num_elements() // (batch * d_in)


def run(
    name: str,
    rounds: int,
    quick: bool,
    logged: bool = False,
    coupled: str = "exact",
    conv_forms: tuple[str, ...] = (),
) -> dict:
    zoo = name in ZOO
    if zoo:
        import bench_zoo

        _, batch, size, _ = bench_zoo.model_spec(name)
        model, x, y = bench_zoo.build(name, batch, size)
    else:
        model = bench_core.build_model(name)
        x, y = bench_core.make_data(name)
        batch = bench_core.MODELS[name][0]
    steps = make_steps(
        model, logged=logged or zoo, core=not zoo, coupled=coupled, conv_forms=conv_forms
    )
    per = (PER_ROUND_QUICK if quick else PER_ROUND)[name]
    times = bench_core.time_interleaved(steps, x, y, rounds, dict.fromkeys(steps, per))
    per_round = {k: [statistics.median(r) for r in v] for k, v in times.items()}

    def ratio(a, b):
        if a not in per_round or b not in per_round:
            return None
        return statistics.median([p / q for p, q in zip(per_round[a], per_round[b])])

    return {
        "model": name,
        "ms": {k: 1e3 * statistics.median([t for r in v for t in r]) for k, v in times.items()},
        "norms/plain": ratio("norms", "plain"),
        "norms/moments": ratio("norms", "moments"),
        "moments/plain": ratio("moments", "plain"),
        "norms-log/plain": ratio("norms-log", "plain"),
        "moments-log/plain": ratio("moments-log", "plain"),
        "norms-log/moments-log": ratio("norms-log", "moments-log"),
        "norms-log-fromwork/plain": ratio("norms-log-fromwork", "plain"),
        **{f"norms[{f}]/plain": ratio(f"norms[{f}]", "plain") for f in conv_forms},
        "forms": [] if zoo else forms(model, x, y, batch),
    }


# ----------------------------------------------------- the replicas estimator, 2 logical CPUs


def replicas_child(name: str, rounds: int, quick: bool) -> dict:
    """In a fresh process: a plain MirroredStrategy step against the same step logging with
    ``mode="replicas"`` every step (2 logical CPUs, the global batch of `bench_core`)."""
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    import keras

    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        model = bench_core.build_model(name)
        optimizer = keras.optimizers.SGD(LR)
        optimizer.build(model.trainable_variables)
    variables = list(model.trainable_variables)
    x, y = bench_core.make_data(name)
    batch = int(x.shape[0])
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch)
    dist = next(iter(strategy.experimental_distribute_dataset(dataset)))
    writer = tf.summary.create_file_writer(tempfile.mkdtemp(prefix="bench_replicas_"))

    def loss_of(x, y):
        losses = bench_core.per_example_losses(model(x, training=True), y)
        return tf.nn.compute_average_loss(losses, global_batch_size=batch)

    from tb_gradmom.core import moments as _moments
    from tb_gradmom.core import plan as _plan

    def make(variant: str):
        @tf.function(jit_compile=False)
        def step(dist_xy):
            def replica_fn(x, y):
                loss = loss_of(x, y)
                if variant == "replicas-log":
                    with writer.as_default(step=0), tf.summary.record_if(True):
                        grads = gradmom.summary.moments(loss, variables, mode="replicas")
                elif variant == "replicas":  # the estimator alone, its sums consumed
                    plan = _plan.make_plan(loss, variables, _plan.Options.check((1,)))
                    computed = _moments.compute_logged(plan, mode="replicas")
                    grads = computed.grads
                    sums = computed.logged.sums
                    loss = loss + 0.0 * tf.cast(
                        tf.add_n([s["sum_var"] + s["sum_m2"] for s in sums]), loss.dtype
                    )
                else:
                    grads = tf.gradients(loss, variables)
                    if variant == "allreduce":  # the floor: one more all-reduce of the grads
                        ctx = tf.distribute.get_replica_context()
                        reduced = ctx.all_reduce(tf.distribute.ReduceOp.SUM, grads)
                        loss = loss + 0.0 * tf.add_n([tf.reduce_sum(g) for g in reduced])
                optimizer.apply_gradients(zip(grads, variables))
                return loss

            out = strategy.run(replica_fn, args=dist_xy)
            return strategy.reduce(tf.distribute.ReduceOp.SUM, out, axis=None)

        return lambda _x, _y: step(dist)

    variants = ("plain", "allreduce", "replicas", "replicas-log")
    steps = {k: make(k) for k in variants}
    per = (PER_ROUND_QUICK if quick else PER_ROUND)[name]
    times = bench_core.time_interleaved(steps, x, y, rounds, dict.fromkeys(steps, per))
    per_round = {k: [statistics.median(r) for r in v] for k, v in times.items()}
    return {
        "model": name,
        "ms": {k: 1e3 * statistics.median([t for r in v for t in r]) for k, v in times.items()},
        **{
            f"{k}/plain": statistics.median(
                [p / q for p, q in zip(per_round[k], per_round["plain"])]
            )
            for k in variants[1:]
        },
    }


def run_replicas(names: list[str], rounds: int, quick: bool) -> list[dict]:
    out = []
    for name in names:
        proc = subprocess.run(
            [
                sys.executable,
                os.path.abspath(__file__),
                "--replicas-child",
                name,
                "--rounds",
                str(rounds),
                *(["--quick"] if quick else []),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"the replicas child for {name} failed:\n{proc.stderr[-3000:]}")
        out.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", default=None, help="write the results to this file")
    parser.add_argument(
        "--logged",
        action="store_true",
        help="also time summary.moments logging every step, mode='moments' and mode='norms'",
    )
    parser.add_argument(
        "--replicas",
        default=None,
        help="models for the MirroredStrategy replicas-mode benchmark (2 logical CPUs)",
    )
    parser.add_argument("--replicas-child", default=None, help=argparse.SUPPRESS)
    parser.add_argument(
        "--conv-forms",
        default="",
        help="also time the norms step with every convolution's norms forced to these forms "
        "(comma-separated: ghost, unfolded, native, products), side by side",
    )
    parser.add_argument(
        "--coupled",
        default="exact",
        choices=("exact", "rules"),
        help="summary.moments' coupled= for the logged steps: ResNet50's batch normalisation "
        "in training couples the examples, and with 'exact' its 210 variables take the exact "
        "fallback (pfor jacobian rows, ~50x a plain step); 'rules' keeps the rules",
    )
    parser.add_argument(
        "--smoke", action="store_true", help="CI: the MLP, one round (checks it runs, not times)"
    )
    args = parser.parse_args(argv)
    if args.replicas_child:
        rounds = args.rounds or (3 if args.quick else 11)
        print(json.dumps(replicas_child(args.replicas_child, rounds, args.quick)))
        return 0
    if args.smoke:
        args.models, args.rounds, args.quick, args.logged = "mlp", 1, True, True
        args.replicas = "mlp"
    rounds = args.rounds or (3 if args.quick else 11)
    results = []

    def cell(r, key, width):
        v = r[key]
        return f"{'-':>{width}}" if v is None else f"{v:>{width}.2f}"

    def ms_cell(r, key, width):
        v = r["ms"].get(key)
        return f"{'-':>{width}}" if v is None else f"{v:>{width}.1f}"

    print(
        f"{'model':<12} {'plain ms':>9} {'moments ms':>11} {'norms ms':>9} "
        f"{'norms/plain':>12} {'norms/moments':>14} {'moments/plain':>14} "
        f"{'mom-log ms':>11} {'norm-log ms':>12} {'norms-log/plain':>16} "
        f"{'moments-log/plain':>18}"
    )
    for name in args.models.split(","):
        conv_forms = tuple(f for f in args.conv_forms.split(",") if f)
        r = run(name, rounds, args.quick, args.logged, args.coupled, conv_forms)
        results.append(r)
        print(
            f"{name:<12} {ms_cell(r, 'plain', 9)} {ms_cell(r, 'moments', 11)} "
            f"{ms_cell(r, 'norms', 9)} {cell(r, 'norms/plain', 12)} "
            f"{cell(r, 'norms/moments', 14)} {cell(r, 'moments/plain', 14)} "
            f"{ms_cell(r, 'moments-log', 11)} {ms_cell(r, 'norms-log', 12)} "
            f"{cell(r, 'norms-log/plain', 16)} {cell(r, 'moments-log/plain', 18)}",
            flush=True,
        )
    for r in results:
        for key, value in r.items():
            if (key.startswith("norms[") or key.startswith("norms-log-")) and value is not None:
                ms = r["ms"][key.split("/")[0]]
                print(f"{r['model']:<12} {key:<24} {value:.2f} ({ms:.1f} ms)")
    if args.replicas:
        print(
            f"\n{'model':<12} {'plain ms':>9} {'replicas ms':>12} {'replicas-log ms':>16} "
            f"{'replicas/plain':>15} {'replicas-log/plain':>19} {'allreduce/plain':>16}"
        )
        for r in run_replicas(args.replicas.split(","), rounds, args.quick):
            results.append(r)
            ms = r["ms"]
            print(
                f"{r['model']:<12} {ms['plain']:>9.1f} {ms['replicas']:>12.1f} "
                f"{ms['replicas-log']:>16.1f} {r['replicas/plain']:>15.3f} "
                f"{r['replicas-log/plain']:>19.3f} {r['allreduce/plain']:>16.3f}",
                flush=True,
            )
    for r in results:
        if r.get("forms"):
            print(f"\n{r['model']}: the form of each variable's norms")
            for line in r["forms"]:
                print("  " + line)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
