"""Sizes as people write them ('24GiB', '16GB', '1.5TiB'): parsed exactly, and said back with their source."""

from __future__ import annotations

import re
from fractions import Fraction

from onnxmem.errors import TargetError

KiB, MiB, GiB = 2**10, 2**20, 2**30

SIZE_UNITS: dict[str, int] = {
    "B": 1,
    "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "PB": 10**15,
    "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40, "PIB": 2**50,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z]*)\s*$")


def parse_size(text: str | int) -> int:
    """Give the bytes of a size such as '24GiB', '16GB', '80000MB', '1.5TiB' or '1024B' (GB = 10^9, GiB = 2^30).

    Decimal fractions are exact (1.5TiB is 3 x 2^39 bytes); a fraction of a byte is rounded down. A number without a
    unit is refused (but 0): `--budget 24` means 24 GB to a person and 24 bytes to a parser, and a CI gate must not
    guess; bytes are written with B, or given as an int.

    Parameters
    ----------
    text
        The size: a number and a unit (B, KB/KiB, MB/MiB, GB/GiB, TB/TiB, PB/PiB; any case), or bytes as an int.

    Returns
    -------
    int
        The bytes.

    Raises
    ------
    TargetError
        Not a size, an unknown unit, or a negative number.
    """
    if isinstance(text, int):
        if text < 0:
            raise TargetError(f"size {text}: must not be negative")
        return text
    match = _SIZE.match(text)
    if not match:
        raise TargetError(f"size '{text}': expected a number and a unit, e.g. 24GiB, 16GB, 80000MB, 1.5TiB")
    number, unit = match.group(1), match.group(2).upper()
    if not unit:
        if Fraction(number) == 0:
            return 0
        raise TargetError(f"size '{text.strip()}' has no unit: write {number}GiB (2^30 bytes), {number}GB (10^9 "
                          f"bytes) or {number}B for bytes")
    if unit not in SIZE_UNITS:
        hint = " (say GB for 10^9 or GiB for 2^30)" if unit in ("K", "M", "G", "T", "P") else ""
        raise TargetError(f"size '{text}': unknown unit '{match.group(2)}'{hint}; "
                          "use B, KB, MB, GB, TB, PB (powers of 10) or KiB, MiB, GiB, TiB, PiB (powers of 2)")
    return int(Fraction(number) * SIZE_UNITS[unit])


def size_source(text: str | int) -> str:
    """Give where a size given by a person comes from, in words: 'given: 24GiB'; a size in decimal units also
    in GiB ('given: 24GB = 22.35 GiB'), since the catalogue's GPUs and most tools speak GiB."""
    words = f"given: {text}"
    if isinstance(text, str):
        match = _SIZE.match(text)
        unit = match.group(2).upper() if match else ""
        if unit in SIZE_UNITS and SIZE_UNITS[unit] % 1000 == 0:
            words += f" = {parse_size(text) / GiB:,.2f} GiB (GB, MB, TB: powers of 10)"
    return words
