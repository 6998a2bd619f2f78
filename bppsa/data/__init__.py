"""Datasets of the paper's experiments: synthetic bitstreams and IRMAS (``bppsa.data.irmas``,
which needs the ``irmas`` extra)."""
