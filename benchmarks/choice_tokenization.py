"""The main job with vLLM's choice grammar vs the tokenizer's own tokens (``choice_tokenization``).

    python benchmarks/choice_tokenization.py --pairs 4              # main jobs, alternating; resumable
    python benchmarks/choice_tokenization.py --table-only           # the table of what is saved

Each run is ``python -m rllib_r3l.cli.main --out RESULTS/<variant>_<k>`` (the embedded default, 3
iterations, unseeded) with ``--set backend_options={choice_tokenization: <variant>}``, run one after
the other, variants alternating, so both see the same machine. A run whose ``summary.json`` exists
is kept; its checkpoint is deleted. The table sums over runs: iterations with an update, base successes (8 base episodes an
iteration) and retries that succeeded, each with a 95 % Wilson interval, split into the first
iteration (the untrained policy) and the later ones (after one or two updates), and the seconds
after set-up. Not a test: a benchmark (docs/benchmarks.md section 0 quotes it); a preset of
``benchmarks/main_job_ab.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
OUT = ROOT / "benchmarks" / "results" / "choice_tokenization"
VARIANTS = {v: [f"backend_options={{choice_tokenization: {v}}}"] for v in ("canonical", "any")}

from benchmarks import main_job_ab  # noqa: E402  (the general A/B of main jobs)

if __name__ == "__main__":
    sys.exit(main_job_ab.main(preset=VARIANTS, results=OUT, label="choices", description=__doc__))
