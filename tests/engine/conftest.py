"""Engine tests share two cores with other work: one torch thread avoids spin-waiting on a busy machine."""

from __future__ import annotations

import torch

torch.set_num_threads(1)
