"""``python -m paper_figures``: lists the figures, or draws those named
(:mod:`paper_figures._catalog`)."""

import sys

from paper_figures._catalog import main

if __name__ == "__main__":
    sys.exit(main())
