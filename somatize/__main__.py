"""``python -m somatize`` is the ``somatize`` command, for an environment whose scripts
folder is not on the ``PATH`` (a virtual environment not activated, a notebook's kernel)."""

import sys

from somatize.cli import main

if __name__ == "__main__":
    sys.exit(main())
