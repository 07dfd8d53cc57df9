"""Arrow extension types the data tests read and write."""

from __future__ import annotations

from typing import Any

import pyarrow


class PickledObjects(pyarrow.ExtensionType):
    """An extension type defined in Python whose values turn into Python by unpickling, as
    some libraries register."""

    name = "somatize.test.pickled"

    def __init__(self) -> None:
        super().__init__(pyarrow.large_binary(), self.name)

    def __arrow_ext_serialize__(self) -> bytes:
        return b""

    @classmethod
    def __arrow_ext_deserialize__(cls, storage: Any, serialized: bytes) -> PickledObjects:
        return cls()
