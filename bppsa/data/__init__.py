"""Datasets of the paper's experiments: synthetic bitstreams and IRMAS (``bppsa.data.irmas``,
which needs the ``irmas`` extra)."""

from bppsa.data.synthetic import Bitstreams

__all__ = ["Bitstreams"]
