"""Variables used inside a ``while`` loop: Keras recurrent layers (LSTM, GRU, ConvLSTM, ...).

Keras 3 on TensorFlow runs a recurrent layer as one ``While`` op. Its variables enter the loop as
loop-invariant resource handles, and the body reads them and uses each value in a few ops, e.g.
for an LSTM::

    z_t = x_t K + h_{t-1} R + b        (MatMul, MatMul, AddV2, BiasAdd; then the gates)

A use ``z_t = a_t D`` of a loop-invariant parameter ``D`` gives example ``j`` the gradient
``g_j(D) = sum_t a_{t,j}^T delta_{t,j}`` (``delta_t = dL/dz_t``), a bias added to ``z_t`` the
gradient ``g_j = sum_t delta_{t,j}``: the positions (here the steps) are summed before any power,
as for Dense on sequences (`tb_gradmom.core.rules.matmul`). ``D`` may be a slice, a split or an
unstacked part of the variable (GRU); its per-example gradient is scattered back into the
variable's shape. A convolution ``z_t = conv(x_t, F)`` (ConvLSTM1D/2D/3D) gives ``g_j(F) =
sum_t`` of the conv rule's per-example filter gradient of ``(x_{t,j}, delta_{t,j})``
(`tb_gradmom.core.rules.conv`). A parameter as the initial value of a loop variable (a learned
state tiled to the batch) is `init_rule`'s.

The parts, one module each:

* `body`: the analysis of the loop's body (the proof of the examples' axes inside it, the uses
  of each variable, the taps and records they need); anything it cannot prove raises
  `RuleError` and the core takes the exact fallback;
* `graphdef`: the copy of the loop, built by editing the body's ``GraphDef`` (a tap ``z_t +
  P[t]`` at each use, each use's other operand recorded), whose gradient with respect to ``P``
  is ``delta_t`` for every step at once;
* `chunks`: the copy run on chunks of examples, the power sums summed in parts (the budgets);
* `gradients`: the per-example math on the copy's stacks;
* `loop`: one analysed loop (`Loop`: the registered uses, the copies built) and the loops of one
  plan (`Loops`, owned by the plan);
* `rule`: the entry point `recurrent_rule` that `tb_gradmom.core.rules.REGISTRY` uses.
"""

from __future__ import annotations

from tb_gradmom.core.rules.loops.loop import Loop, Loops
from tb_gradmom.core.rules.loops.rule import (
    LOOP_OPS,
    RECURRENT_RULE,
    LoopGrads,
    loop_outputs,
    num_original_outputs,
    recurrent_rule,
)

__all__ = [
    "LOOP_OPS",
    "RECURRENT_RULE",
    "Loop",
    "LoopGrads",
    "Loops",
    "loop_outputs",
    "num_original_outputs",
    "recurrent_rule",
]
