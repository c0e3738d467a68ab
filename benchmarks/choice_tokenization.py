"""The main job with vLLM's choice grammar vs the tokenizer's own tokens (``choice_tokenization``).

    python benchmarks/choice_tokenization.py --pairs 4              # main jobs, alternating; resumable
    python benchmarks/choice_tokenization.py --out FOLDER --table-only

The preset ``choice_tokenization`` of ``benchmarks/main_job_ab.py`` (its table and resume), with
its results under ``benchmarks/results/choice_tokenization/<date>/``: the variants ``canonical``
and ``any`` set ``backend_options={choice_tokenization: <variant>}``.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from benchmarks import harness, main_job_ab  # noqa: E402

if __name__ == "__main__":
    sys.exit(
        main_job_ab.main(
            ["--preset", "choice_tokenization", *sys.argv[1:]],
            results=harness.RESULTS / "choice_tokenization",
            label="choices",
            description=__doc__,
            preset_in_folder=False,
        )
    )
