"""Draw docs/launch_plan.png, the figure of the launch-plan guide in docs/scaling.md.

    python docs/gen_launch_plan_figure.py [output.png]

The plan is the guide's example: Llama 3 8B, 15T tokens of 8,192, 512 GPUs of 80 GB.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import tokenbatch as tb
from tokenbatch.plot import plot_launch_plan
from tokenbatch.scaling import ExtrapolationWarning, launch_plan

FIGURE = Path(__file__).resolve().parent / "launch_plan.png"


def main(path: Path = FIGURE) -> None:
    spec = tb.ModelSpec.preset("llama-3.1-8b")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExtrapolationWarning)
        plan = launch_plan(spec, 15 * 10**12, num_gpus=512, gpu_memory=80e9, seq_len=8192)
    plot_launch_plan(plan, path=path)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else FIGURE)
