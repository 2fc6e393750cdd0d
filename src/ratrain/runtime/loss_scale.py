"""Dynamic loss scaling for float16 compute: the loss is multiplied by a scale so that small
gradients survive float16; the fp32 masters' gradients are divided by it before the update.

A step whose gradient has an inf or a nan anywhere is skipped and the scale halved; after
`growth_interval` clean steps in a row the scale doubles. Every rank decides from the same
globally reduced gradient norm, so all ranks skip the same steps (torch's GradScaler policy,
with its defaults); under --sync diloco the norm is the replica's, and so are its skips and
its scale (a checkpoint keeps each rank's).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass


@dataclass
class DynamicLossScale:
    scale: float = 2.0 ** 16
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    clean_steps: int = 0
    skipped_steps: int = 0

    def update(self, grad_norm: float) -> bool:
        """Record one step's global norm of the *scaled* gradients; returns whether the step
        must be skipped (the norm is not finite)."""
        if not math.isfinite(grad_norm):
            self.scale *= self.backoff_factor
            self.clean_steps = 0
            self.skipped_steps += 1
            return True
        self.clean_steps += 1
        if self.clean_steps == self.growth_interval:
            self.scale *= self.growth_factor
            self.clean_steps = 0
        return False

    def state_dict(self) -> dict:
        return asdict(self)

    def load_state_dict(self, state: dict) -> None:
        for key, value in state.items():
            setattr(self, key, value)
