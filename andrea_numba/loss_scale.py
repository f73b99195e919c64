"""Dynamic loss scaling, for training with fp16 products (train.precision = "fp16").

fp16 keeps 11 significant bits but only 5 exponent bits: a gradient below about 6e-8 becomes 0
and one above 65504 becomes inf when a product rounds it to fp16 (lesson 10). The trainer
multiplies the loss by a scale S, a power of two, before the backward (the loss backward starts
from dloss = S), so that every gradient is S times larger and stays above fp16's floor; the
gradients are divided by S again, in fp32 and exactly (S is a power of two), before clipping and
AdamW. When S was too large, some gradient is inf or NaN, and so is the gradient norm: the AdamW
kernel then leaves the weights, m and v as they were (its divergence guard), the step is skipped,
and S is halved. After INTERVAL good steps in a row, S is doubled, to find the largest S that fits.

Every decision is one log line. The scaler's state (S, the good steps in a row, the steps skipped)
is recorded in .state.json with each checkpoint, so a resumed run makes the same decisions, bit for
bit. AdamW counts only the steps it applied (its bias corrections use step + 1 - skipped).

The constants are PyTorch's GradScaler defaults.
"""
from __future__ import annotations

import math

INIT = 2.0 ** 16
GROWTH = 2.0
BACKOFF = 0.5
INTERVAL = 2000          # good steps in a row before S doubles
MIN_SCALE, MAX_SCALE = 2.0 ** -24, 2.0 ** 64


class LossScaleError(ValueError):
    """A loss-scale record that cannot be used; str(err) is one line."""


class LossScale:
    def __init__(self, scale: float = INIT, good: int = 0, skipped: int = 0):
        self.scale, self.good, self.skipped = float(scale), int(good), int(skipped)

    def update(self, finite: bool, step: int) -> str | None:
        """After step `step`: finite is whether its gradients were (their norm). Returns the log
        line of a decision that changes S, or None."""
        if not finite:
            old = self.scale
            self.scale = max(MIN_SCALE, self.scale * BACKOFF)
            self.good = 0
            self.skipped += 1
            return (f"loss scale: step {step}'s gradients overflowed at scale {old:g}: the step was skipped "
                    f"(weights, m and v unchanged), scale -> {self.scale:g}")
        self.good += 1
        if self.good >= INTERVAL and self.scale < MAX_SCALE:
            self.good = 0
            self.scale *= GROWTH
            return f"loss scale: {INTERVAL} good steps in a row, scale -> {self.scale:g} (after step {step})"
        return None

    def to_dict(self) -> dict:
        return {"scale": self.scale, "good": self.good, "skipped": self.skipped}

    @classmethod
    def from_dict(cls, record, where: str) -> "LossScale":
        """The scaler of a run's state record, checked: one clear line when it is damaged."""
        ok = (isinstance(record, dict) and set(record) == {"scale", "good", "skipped"}
              and isinstance(record["scale"], (int, float)) and not isinstance(record["scale"], bool)
              and all(isinstance(record[k], int) and not isinstance(record[k], bool) and record[k] >= 0
                      for k in ("good", "skipped")))
        if ok:
            s = float(record["scale"])
            ok = MIN_SCALE <= s <= MAX_SCALE and math.frexp(s)[0] == 0.5     # a power of two
        if not ok:
            raise LossScaleError(f"{where}: 'loss_scale' is not a record of a loss scale (scale: a power of two "
                                 f"from 2^-24 to 2^64, good and skipped: counts): restore the file, or start a new run")
        return cls(record["scale"], record["good"], record["skipped"])
