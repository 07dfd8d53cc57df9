"""somatize_torch: the torch side of somatize.

Users reach it as ``somatize.torch``; this package builds on the core's public
API like any user would, plus the codec and digest hooks.
"""

__all__: list[str] = []
