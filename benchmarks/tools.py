"""The tools suite: looking into a finished search or retrain without running a new one.

    python benchmarks/tools.py derive_cell --run <search run dir> --max-parameter-free 2 --out capped.json
    python benchmarks/tools.py op_strength --run <search run dir> [--images 1000] [--split test|arch]
    python benchmarks/tools.py snn_latency --run <QANN train run dir> --spikes-per-step 1,4,8 [--relu-run <dir>]

derive_cell (derive_cell.py) derives a search's cell again from its α under other caps; op_strength (op_strength.py)
judges each edge's ops by the supernet's accuracy; snn_latency is the SNN suite (snn.py): the SNN's accuracy
against time steps and its energy, whose rows it appends to results/snn.csv. The arguments after the tool are its own.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Sequence

if __package__ in (None, ""):  # run as a script: the repository on the path, for `benchmarks.*`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TOOLS = {"derive_cell": "derive_cell", "op_strength": "op_strength", "snn_latency": "snn"}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in TOOLS:
        print(f"usage: tools.py {{{','.join(TOOLS)}}} [the tool's arguments]", file=sys.stderr)
        return 2
    module = __import__(f"benchmarks.{TOOLS[argv[0]]}", fromlist=["main"])
    return module.main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
