"""Randomly generated small Keras models (`tests/archgen.py`) against brute force.

``GRADMOM_ARCHGEN_N`` models (default 200; seeds 0..N-1), float64, orders 1-4, relative error
<= 1e-9 (`tests.zoo_worker.max_rel_err`), split over ``GRADMOM_ARCHGEN_JOBS`` child processes
(default 2). The layer kinds and batch coincidences in `archgen.UNSUPPORTED` are not drawn.
Each failure names its seed, the architecture and the command that reproduces it.
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
    exclude = {"mha", "grouped_conv2d", "embedding", "batch=seq"}
    for seed in range(300):
        arch = archgen.generate(seed, exclude)
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
    archs = [archgen.generate(s) for s in range(n)]
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


@pytest.mark.slow
def test_generated_models_match_brute_force():
    n = int(os.environ.get("GRADMOM_ARCHGEN_N", "200"))
    jobs = int(os.environ.get("GRADMOM_ARCHGEN_JOBS", "2"))
    exclude = frozenset(archgen.UNSUPPORTED)
    results = archgen.run_many(range(n), exclude, jobs)
    bad = [r for r in results if not r["ok"]]
    msg = "\n".join(
        f"{r['desc']}\n    {'; '.join(r['problems'][:3])}\n    reproduce: "
        f"{archgen.reproduce_command(r['seed'], exclude)}"
        for r in bad
    )
    assert not bad, f"{len(bad)}/{n} generated models are not exact:\n{msg}"
