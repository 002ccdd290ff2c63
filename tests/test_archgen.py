"""Randomly generated small Keras models (`tests/archgen.py`) against brute force.

``GRADMOM_ARCHGEN_N`` models (default 200; seeds 0..N-1), float64, orders 1-4, relative error
<= 1e-9 (`tests.zoo_worker.max_rel_err`), split over ``GRADMOM_ARCHGEN_JOBS`` child processes
(default 2; the first `FAST_SEEDS` in the quick set, the others marked slow), issue 26's
patterns included (`archgen.PATTERN_BLOCKS`: batch statistics after,
before and between the requested variables, a view used twice by one op, custom gradients,
``add_loss`` and regularisers; `archgen.REFUSED_LOSSES`, which must raise
`PerExampleLossError`). The layer kinds and batch coincidences in `archgen.UNSUPPORTED` are not
drawn. Each failure names its seed, the architecture and the command that reproduces it.
"""

from __future__ import annotations

import os

import pytest

from tests import archgen


def test_generation_is_deterministic_and_described():
    a = archgen.generate(17)
    b = archgen.generate(17)
    assert a.describe() == b.describe()
    assert a.describe().startswith("seed=17 ")
    assert archgen.generate(18).describe() != a.describe()


def test_excluded_kinds_are_never_drawn():
    exclude = {"mha", "grouped_conv2d", "embedding", "batch=seq", "bn_train", "mixing_loss"}
    for seed in range(300):
        arch = archgen.generate(seed, exclude, patterns=True)
        assert not (arch.kinds() & exclude), arch.describe()
        assert arch.batch_rule != "seq"


def test_batch_coincides_with_a_dimension():
    for seed in range(300):
        arch = archgen.generate(seed, ())
        d = arch.dims
        want = {
            "seq": d.get("T"),
            "width": d.get("D", d.get("W")),
            "vocab": d.get("V"),
            "channels": d.get("C"),
            "one": 1,
        }.get(arch.batch_rule)
        if want is not None:
            assert arch.n == want, arch.describe()
        else:
            assert 2 <= arch.n <= 4


def test_generator_covers_every_kind_and_batch_rule():
    n = int(os.environ.get("GRADMOM_ARCHGEN_N", "200"))
    exclude = set(archgen.UNSUPPORTED)
    archs = [archgen.generate(s, patterns=True) for s in range(n)]
    kinds = set().union(*(a.kinds() for a in archs))
    rules = {a.batch_rule for a in archs}
    assert set(archgen.KINDS) - exclude <= kinds, set(archgen.KINDS) - exclude - kinds
    want_rules = {r for r in archgen.BATCH_RULES if f"batch={r}" not in exclude}
    if "embedding" in exclude:  # the vocabulary-size batch needs the tokens stem
        want_rules.discard("vocab")
    assert want_rules <= rules, want_rules - rules


# Loss forms at a batch that is not 1 (where R and R / n differ), one small model each.
LOSS_FORMS = [
    ("sequence", {"reduction": "sum", "const": "left", "penalty": "l2", "total": "stack_mean"}),
    ("image", {"const": "right", "penalty": "l1", "total": "add_n"}),
    ("tokens", {"reduction": "sum", "const": "div", "penalty": "l2_loss", "total": "stack_sum"}),
    ("sequence", {"penalty": "l2", "total": "add"}),
]


@pytest.mark.parametrize(
    "stem, loss", LOSS_FORMS, ids=["-".join(map(str, f[1].values())) for f in LOSS_FORMS]
)
def test_loss_forms_match_brute_force(stem, loss):
    """Constants on either side, penalties on every kernel and the last variable, Keras'
    stacked total, sums: exact against one gradient per example of ``l_j + R`` (or
    ``l_j + R / n``), every variable on its rule."""
    blocks = ["dense_seq"] if stem != "image" else ["conv2d"]
    arch = archgen.generate(7, (), stem=stem, blocks=blocks, batch_rule="small", loss=loss)
    assert arch.n > 1 and {"penalty"} <= arch.kinds(), arch.describe()
    r = archgen.check(arch)
    assert r["ok"], f"{r['desc']}: {r['problems']}"


def test_patterns_leave_the_rest_of_the_architecture_alone():
    """Other tests (test_norms, test_integration) use the plain architectures of their seeds:
    the patterns come from a random stream of their own."""
    for seed in range(60):
        plain, drawn = archgen.generate(seed), archgen.generate(seed, patterns=True)
        kinds = [k for k, _ in drawn.blocks if k not in archgen.PATTERN_BLOCKS]
        grouped = {"grouped_conv2d", "conv2d"}
        assert [k if k not in grouped else "conv" for k, _ in plain.blocks] == [
            k if k not in grouped else "conv" for k in kinds
        ], (plain.describe(), drawn.describe())
        assert (plain.stem, plain.n, plain.dims, plain.head) == (
            drawn.stem,
            drawn.n,
            drawn.dims,
            drawn.head,
        )
        assert not (plain.kinds() & set(archgen.PATTERN_BLOCKS + archgen.REFUSED_LOSSES))


# Each pattern at an adversarial shape (the batch equal to the width, the sequence, the
# vocabulary, or 1), after a layer with variables and before the head: ``(stem, blocks,
# batch rule, loss, variables on the fallback)``. A coupling sends the variables used before it
# to the exact fallback (counted), the head keeps its rules; the refused losses raise.
PATTERNS = [
    ("sequence", ["dense_seq", "minibatch_std"], "width", {}, 2),
    ("image", ["conv2d", "batch_centre"], "one", {}, 2),
    ("tokens", ["dense_seq", ("bn_train", {"request": False})], "vocab", {}, 4),
    ("image", ["conv2d", ("bn_train", {"request": True})], "channels", {}, 2),
    ("sequence", [("bn_train", {"request": True}), "dense_seq"], "seq", {}, 0),
    ("tokens", ["dense_seq", ("custom_grad", {"backward": "centred"})], "seq", {}, 6),
    ("image", ["conv2d", ("custom_grad", {"backward": "straight"})], "width", {}, 0),
    ("sequence", ["dense_seq", ("view_twice", {"form": "mul"})], "width", {}, 0),
    ("image", [("view_twice", {"form": "matmul"}), "conv2d"], "channels", {}, 0),
    ("tokens", ["add_loss", "dense_seq"], "vocab", {"reduction": "sum"}, 0),
    ("image", ["conv2d", ("regularized", {"reg": "l1l2"})], "one", {"total": "add_n"}, 0),
    ("sequence", ["dense_seq"], "seq", {"refused": "batch_stat_loss", "stat": "left"}, 0),
    ("image", ["conv2d"], "width", {"refused": "batch_stat_loss", "stat": "right"}, 0),
    ("tokens", ["dense_seq"], "vocab", {"refused": "batch_stat_loss", "stat": "add_loss"}, 0),
    ("sequence", ["dense_seq"], "width", {"refused": "mixing_loss", "mix": "clip"}, 0),
    ("image", ["conv2d"], "one", {"refused": "mixing_loss", "mix": "prototypes"}, 0),
]


def _pattern_id(row):
    stem, blocks, rule, loss, _ = row
    names = [
        b if isinstance(b, str) else b[0] + "-" + "-".join(map(str, b[1].values())) for b in blocks
    ]
    return "-".join([stem, *names, rule, *map(str, loss.values())])


@pytest.mark.parametrize(
    "stem, blocks, rule, loss, on_fallback", PATTERNS, ids=map(_pattern_id, PATTERNS)
)
def test_patterns_match_brute_force_or_raise(stem, blocks, rule, loss, on_fallback):
    kinds = [b if isinstance(b, str) else b[0] for b in blocks]
    arch = archgen.generate(11, (), stem=stem, blocks=kinds, batch_rule=rule, loss=loss)
    arch.blocks = [
        (k, dict(p, **(b[1] if not isinstance(b, str) else {})))
        for (k, p), b in zip(arch.blocks, blocks)
    ]
    r = archgen.check(arch)
    assert r["ok"], f"{r['desc']}: {r['status']} {r['problems']}"
    if arch.expected_error:
        assert r["status"].startswith("raised as documented: PerExampleLossError"), r["status"]
        return
    paths = r["paths"]
    fallback = [p for p in paths if p.startswith("fallback")]
    assert len(fallback) == on_fallback, (r["desc"], paths)
    assert all("the examples are coupled" in p for p in fallback), paths
    assert all(p.startswith("rule") for p in paths[-2:]), paths  # the head


# The first seeds run in the quick set (``-m "not slow"``), the rest with the slow tests: the
# full run checks every seed once.
FAST_SEEDS = 20


def _check_generated(seeds) -> None:
    jobs = int(os.environ.get("GRADMOM_ARCHGEN_JOBS", "2"))
    exclude = frozenset(archgen.UNSUPPORTED)
    results = archgen.run_many(seeds, exclude, jobs)
    assert [r["seed"] for r in results] == list(seeds)
    bad = [r for r in results if not r["ok"]]
    msg = "\n".join(
        f"{r['desc']}\n    {'; '.join(r['problems'][:3])}\n    reproduce: "
        f"{archgen.reproduce_command(r['seed'], exclude)}"
        for r in bad
    )
    assert not bad, f"{len(bad)}/{len(seeds)} generated models are not exact:\n{msg}"


def test_first_generated_models_match_brute_force():
    """Seeds 0 to `FAST_SEEDS` - 1 (fewer with a smaller ``GRADMOM_ARCHGEN_N``)."""
    n = int(os.environ.get("GRADMOM_ARCHGEN_N", "200"))
    _check_generated(range(min(FAST_SEEDS, n)))


@pytest.mark.slow
def test_generated_models_match_brute_force():
    """Seeds `FAST_SEEDS` to ``GRADMOM_ARCHGEN_N`` - 1 (default 200)."""
    n = int(os.environ.get("GRADMOM_ARCHGEN_N", "200"))
    if n <= FAST_SEEDS:
        pytest.skip(f"GRADMOM_ARCHGEN_N={n}: every seed is in the quick test")
    _check_generated(range(FAST_SEEDS, n))
