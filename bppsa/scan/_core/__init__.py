"""The orchestration of ``bppsa.scan``: its custom VJP, options, forward slot and methods."""
