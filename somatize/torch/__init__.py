"""``somatize.torch``: the torch side of somatize, under the name users write.

``import somatize.torch`` registers the ``tensor`` codec (so tensors can be kept,
recalled and handed to ``Opaque``) and gives ``somatize.torch.wrap``,
``somatize.torch.freeze`` and the rest of :mod:`somatize_torch`. ``somatize``
itself never imports torch: only importing this module does.
``somatize.torch.lightning`` is the Lightning callback (the ``lightning`` extra).
"""

from somatize_torch import *  # noqa: F403 - this module is the package's other name
from somatize_torch import __all__ as __all__
