"""The maintainers' tools, apart from the paper's benchmarks: the gradient fingerprints a
refactor must keep (``fingerprint``), the fit of a machine's profile to measured times
(``fit_profile``, with the HLO cost counter ``hlo_cost`` that the speed benchmark also records),
and the measurements behind the sparse kernels' constants (``sparse_kernels``)."""
