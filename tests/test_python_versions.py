"""What a Python upgrade leaves alike: the code fingerprint of the same source, and the
library's reading of a value of a subclass of a builtin."""

from __future__ import annotations

from somatize.catalog._held import _AS_MADE


class _Complex(complex):
    real = 99.0  # type: ignore[assignment]

    def __complex__(self) -> complex:
        return 5j


class _Bytes(bytes):
    def __getitem__(self, at: object) -> bytes:  # type: ignore[override]
        return b"other"

    def __bytes__(self) -> bytes:
        return b"other"


def test_a_value_of_a_subclass_of_complex_or_bytes_is_read_by_the_builtin_code() -> None:
    """What such a value is as the builtin, read with what Python 3.10 has too: not by the
    subclass's own methods."""
    complex_made = _AS_MADE[complex](_Complex(1, -2))
    bytes_made = _AS_MADE[bytes](_Bytes(b"abc"))
    assert (type(complex_made), complex_made) == (complex, 1 - 2j)
    assert (type(bytes_made), bytes_made) == (bytes, b"abc")
