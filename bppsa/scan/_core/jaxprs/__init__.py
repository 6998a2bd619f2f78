"""The one toolkit of jaxpr analyses: a walker, the calls with their own rules, a taxonomy.

* :mod:`~bppsa.scan._core.jaxprs.taxonomy`: JAX's primitives sorted by what each output element
  reads of the operands (elementwise, moves, reductions, calls, ...); every analysis builds its
  table of primitives from these sets and says which subset it handles and why.
* :mod:`~bppsa.scan._core.jaxprs.walk`: binding an equation, evaluating a jaxpr with its calls
  inlined (the fused kernel's flat steps).
* :mod:`~bppsa.scan._core.jaxprs.rules`: calls with their own derivative rules (``custom_jvp``,
  ``custom_vjp``), read by their rules wherever derivatives matter.

The analyses themselves live beside their users: :mod:`bppsa.scan._core.element_flow` (which
carry elements each element depends on), :mod:`bppsa.scan._core.diagonal_paths` (the
element-aligned derivative), and the fused kernel's padded rules, lanes and slices.
"""
