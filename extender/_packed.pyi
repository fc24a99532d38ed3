# Types of the compiled extender._packed (extender/_packed.c); extender/_packed_py.py is its
# pure-Python twin with the same signatures.
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

def scan(buf: bytes, start: int, end: int, /) -> bytearray | None: ...
def render(
    buf: bytes,
    pairs: bytes | bytearray,
    codes: npt.NDArray[np.int8],
    code: int,
    suffix: bytes,
    sep: bytes,
    /,
) -> bytes: ...
def render_sections(
    buf: bytes,
    pairs: bytes | bytearray,
    codes: npt.NDArray[np.int8],
    placements: Sequence[tuple[int, bytes] | None],
    texts: Sequence[bytes],
    /,
) -> bytes: ...
def render_scores(
    buf: bytes, pairs: bytes | bytearray, scores: npt.NDArray[np.int64], /
) -> bytes: ...
def count_codes(codes: npt.NDArray[np.int8], size: int, /) -> list[int]: ...

class NameTable:
    def __init__(self, names: Sequence[str | None]) -> None: ...
    def __len__(self) -> int: ...
    def resolve(self, buf: bytes, pairs: bytes | bytearray, /) -> bytearray: ...
