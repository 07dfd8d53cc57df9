"""``somatize.torch.lightning``: the Lightning callback that caches frozen encoders.

The implementation is :mod:`somatize_torch.lightning`; this is its name under
``somatize.torch``. It needs the ``lightning`` extra (``pip install 'somatize[lightning]'``).
"""

from somatize_torch.lightning import *  # noqa: F403 - this module is the package's other name
from somatize_torch.lightning import __all__ as __all__
