"""The graph core (TensorFlow): exact moments of per-example gradients in the traced graph.

Planning (`plan`: the variables' sites, the rule each takes, its proven example axis, the batch
evidence) and execution (`moments`: the backward pass, the rules' power sums, the exact
fallback, the all-reduce under tf.distribute). `axes` proves which axis of every tensor holds
the examples, `loss` finds the per-example losses behind the scalar loss, `rules/` holds one
rule per op family. The public names are re-exported by `tb_gradmom`.
"""
