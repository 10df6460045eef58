# Type stub of the compiled module built from csrc/_synth.pyx. Its API is that of the pure
# twin batchbench/text/_synth_py.py (same signatures).
from typing import final

import numpy as np

MASK64: int
GOLDEN_GAMMA: int
STREAM_GAMMA: int
MIX1: int
MIX2: int
MAX_BOUND: int

def draw_indices(seed: int, n: int, bound: int) -> np.ndarray: ...

@final
class PieceAssembler:
    def __init__(self, pieces: list[str], heads: list[str] | None = None) -> None: ...
    def __len__(self) -> int: ...
    @property
    def head_count(self) -> int: ...
    def text(self, n: int, seed: int, head: bool = True) -> str: ...
