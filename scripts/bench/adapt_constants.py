"""step_compression.py with the acceptance record's constants overridden, to tune them.

    python scripts/bench/adapt_constants.py DECAY PRIOR_TOKENS [step_compression args...]
    python scripts/bench/adapt_constants.py 0.9 0.5 --sets mt_bench code --per-category 1 \\
        --configs tokens=16 --out /tmp/adapt_09_05

The constants are module globals read when a step is traced, so one process runs one
setting (the plain run is repeated in each).
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

from lookahead_jax.guesses import acceptance_record

if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    acceptance_record.DECAY = float(sys.argv[1])
    acceptance_record.PRIOR_TOKENS = float(sys.argv[2])
    script = Path(__file__).with_name("step_compression.py")
    sys.argv = [str(script), *sys.argv[3:]]
    runpy.run_path(str(script), run_name="__main__")
