"""The throughput benchmark's workload mix (``--gpu-share F``): which pods of a phase ask for
GPUs and how many.

A fraction F of the pods are GPU pods (1 and 2 GPUs alternately, as the all-GPU benchmark
has them); the rest are plain pods (CPU and memory only) that the shipped ``managedResources``
keeps away from schedext. The interleave is deterministic and even: pod i is a GPU pod when
floor((i + 1) F) > floor(i F), so any prefix of the phase holds its share of GPU pods (F = 1:
every pod; F = 0.2: pods 4, 9, 14, ...). Pure: the unit tier checks it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction


@dataclass(frozen=True)
class Mix:
    """GPU pods as ``share`` of the whole (0 < share <= 1)."""

    share: float = 1.0

    def __post_init__(self) -> None:
        if not 0 < self.share <= 1 or not math.isfinite(self.share):
            raise ValueError(f"the GPU share must be in (0, 1], not {self.share}")

    @property
    def _exact(self) -> Fraction:
        # From the decimal text, so that 0.2 is 1/5 and pod 4 is a GPU pod, not pod 5.
        return Fraction(str(self.share))

    def gpu_pods_before(self, index: int) -> int:
        """How many of pods 0 .. index-1 are GPU pods."""
        return math.floor(index * self._exact)

    def gpus(self, index: int) -> int:
        """The GPUs pod ``index`` asks for: 0 for a plain pod, else 1 or 2 (alternately
        among the GPU pods)."""
        before = self.gpu_pods_before(index)
        if self.gpu_pods_before(index + 1) == before:
            return 0
        return 1 + before % 2

    def counts(self, pods: int) -> tuple[int, int]:
        """(GPU pods, plain pods) of a phase of ``pods`` pods."""
        gpu = self.gpu_pods_before(pods)
        return gpu, pods - gpu

    def describe(self, pods: int) -> str:
        gpu, plain = self.counts(pods)
        if not plain:
            return f"all {gpu} pods ask for GPUs (1 or 2, alternately)"
        return (
            f"{self.share:.0%} GPU pods: {gpu} GPU pods (1 or 2 GPUs, alternately) and "
            f"{plain} plain pods (1 CPU, 2 GiB; kube-scheduler alone places them)"
        )
