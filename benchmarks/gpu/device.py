"""Print what the figures run on: every GPU torch sees (name, memory, compute capability, the
bf16 dense peak used for TFLOP/s shares), else the CPU's model, cores and vector extensions.
Every stage of suite.sh starts with it."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import _harness as H  # noqa: E402

print(H.device_report())
