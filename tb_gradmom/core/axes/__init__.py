"""Where the examples are: a dataflow analysis of the traced graph, never a guess from shapes.

For every tensor between the step's inputs and its loss, `Examples.of` says which axis (if any)
holds the examples, *proven* by following the ops from the tensors that carry the batch:

* `Axis(k, outer, inner)`: slice ``j`` of axis ``k`` (for a folded axis, the ``inner`` consecutive
  entries at ``j`` within each of the ``outer`` blocks) depends on example ``j`` alone. A pure
  example axis has ``outer == inner == 1``; Keras 3 Dense on ``[n, T, d]`` reshapes to
  ``[n * T, d]`` (``inner = T``), Swin folds ``examples x windows``, a dilated convolution's
  ``SpaceToBatchND`` puts ``blocks x examples`` on its batch axis (``outer = blocks``).
  ``batch`` says which batch: the step's inputs (0) or a union made in the step
  (``concat([real, fake])`` along the examples' axis: each row an example, `Examples.union`).
  Random numbers whose shape starts with the batch size read from an input are examples too
  (a GAN's latents, `Examples._random`).
* `FREE`: depends on no example (variables, constants, shapes, other random numbers, a
  position table looked up with ``arange(T)``, LoRA's ``A @ B``, a class token broadcast to
  the batch).
* `REDUCED`: depends on the examples only through reductions over them (batch statistics, as
  in BatchNormalization in training mode).
* `UNKNOWN`: the analysis cannot prove where the examples are (an op it does not know, a
  loop whose states do not settle, examples moved across axes); `Examples.why` names the op.

The batch-carrying tensors are the step's dense tensor arguments (axis 0; a `tf.function`'s
non-captured inputs, a TF1 graph's placeholders) and the elements an iterator yields. A shape
coincidence (batch size equal to a sequence length, a width, a vocabulary or 1) changes
nothing: axes are followed op by op, and a reshape is resolved by the strides of the examples,
with the batch size kept symbolic when it is not static.

The package, one idea per module:

* `lattice`: the states (`State`, `Axis`, `Elements`) and their `join`;
* `symbolic`: sizes that are multiples of the batch size (`Sym`) and small shape computations;
* `analysis`: the driver, `Examples`;
* `handlers`: the per-op transfer functions; `control`: calls, ``while`` loops (the fixed
  point and its bound, `MAX_LOOP_PASSES`) and ``TensorList``s;
* `registry`: the one table from op type to handler, built by family.
"""

from __future__ import annotations

from tb_gradmom.core.axes.analysis import Examples
from tb_gradmom.core.axes.control import (
    MAX_LOOP_PASSES,
    MAX_NESTING,
    call_body,
    function_graph,
    loop_body,
)
from tb_gradmom.core.axes.lattice import (
    FREE,
    REDUCED,
    UNKNOWN,
    Axis,
    Elements,
    Padded,
    State,
    describe,
    join,
)
from tb_gradmom.core.axes.symbolic import Sym

__all__ = [
    "Axis",
    "Elements",
    "Padded",
    "State",
    "FREE",
    "REDUCED",
    "UNKNOWN",
    "join",
    "describe",
    "Examples",
    "Sym",
    "MAX_LOOP_PASSES",
    "MAX_NESTING",
    "loop_body",
    "call_body",
    "function_graph",
]
