"""Datasets of the paper's experiments: synthetic bitstreams, IRMAS (``bppsa.data.irmas``,
which needs the ``irmas`` extra), CIFAR-10 (``bppsa.data.cifar10``, the python pickle batches
read from disk) and scikit-learn's bundled 8x8 digits as 32x32 images (``bppsa.data.digits``,
the ``digits`` extra); and plain text for a character-level language model
(``bppsa.data.text``: a folder or tar archive of UTF-8 files, e.g. Shakespeare's works)."""

from bppsa.data.cifar10 import CifarError, ImageSet
from bppsa.data.synthetic import Bitstreams
from bppsa.data.text import TextCorpus, TextError, Vocabulary

__all__ = ["Bitstreams", "CifarError", "ImageSet", "TextCorpus", "TextError", "Vocabulary"]
