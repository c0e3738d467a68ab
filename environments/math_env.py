"""Math problems with verifiable answers as multi-attempt R3L episodes (``r3l/Math``).

Problem sources, in order of precedence:

- ``data_files``: local parquet / jsonl / json / csv files read with pandas. A dict
  ``{"train": ..., "dev": ..., "test": ...}`` gives each split its files; a path or list is split
  into disjoint folds by a hash of the question (80/10/10) unless ``partition=False`` (then every
  split sees all rows: for evaluation-only benchmarks). ``question_key`` / ``answer_key`` name the
  columns (dotted paths reach into dicts, e.g. ``reward_model.ground_truth``); ``preset`` fills
  them for GSM8K, MATH, MATH500, AIME24/25, AMC23, Minerva, OlympiadBench and DAPO files.
- ``hf_dataset``: a dataset already in the local Hugging Face ``datasets`` cache (offline; needs
  the optional ``datasets`` package).
- otherwise a built-in offline generator: arithmetic word problems (``difficulty`` 1-3, the
  default 1), or bare one-operation arithmetic such as ``What is 37 + 48?`` (``difficulty=0``: a
  task a ~100M-parameter model solves part of the time, so its groups have a reward spread).

Answers are checked with ``math-verify`` (``\\boxed{}`` preferred). Up to ``max_attempts``
(default 3) answers per episode with "incorrect, try again" feedback; reward 1.0 when correct.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import re
import threading
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from environments._attempts import MultiAttemptEnv
from environments._common import SPLITS
from environments.math_generator import fold_of as _fold_of
from environments.math_generator import generate_problem

# ---------------------------------------------------------------------------------- verification
_MV_LOCK = threading.Lock()
_MV = None


class _DropTimeoutDisabled(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Timeout is disabled")


def _math_verify():
    global _MV
    with _MV_LOCK:
        if _MV is None:
            try:
                import math_verify
            except ImportError as e:
                raise ImportError("r3l/Math checks answers with math-verify: `pip install math-verify`") from e
            for name in ("math_verify.parser", "math_verify.grader"):
                logging.getLogger(name).addFilter(_DropTimeoutDisabled())
            _MV = math_verify
    return _MV


def _timeout() -> Optional[int]:
    # math-verify's timeouts use signal.alarm, which only works on the main thread.
    return 5 if threading.current_thread() is threading.main_thread() else None


_BOXED = re.compile(r"\\boxed\s*\{")


def last_boxed(text: str) -> Optional[str]:
    """The content of the last ``\\boxed{...}`` (balanced braces), or None."""
    starts = [m.end() for m in _BOXED.finditer(text)]
    if not starts:
        return None
    i = starts[-1]
    depth, j = 1, i
    while j < len(text) and depth:
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
        j += 1
    return text[i : j - 1].strip() if depth == 0 else None


def parse_gold(answer: Any):
    """Parse a reference answer (number or LaTeX) with math-verify; raises ValueError if unreadable."""
    mv = _math_verify()
    text = str(answer).strip()
    boxed = last_boxed(text)
    if boxed is not None:
        text = boxed
    t = _timeout()
    for candidate in (f"${text}$", text, f"\\boxed{{{text}}}"):
        parsed = mv.parse(candidate, parsing_timeout=t)
        if parsed:
            return parsed
    raise ValueError(f"cannot parse the reference answer {answer!r}")


def check_math_answer(response: str, gold: Any, require_boxed: bool = False) -> Tuple[bool, Optional[str], str]:
    """(correct, extracted answer or None, reason). ``gold`` is raw text or ``parse_gold``'s result."""
    mv = _math_verify()
    text = response[-4000:]  # the answer is at the end; bounds the parsing cost without a timeout
    t = _timeout()
    boxed = last_boxed(text)
    if boxed is not None:
        pred = mv.parse(f"${boxed}$", parsing_timeout=t) or mv.parse(boxed, parsing_timeout=t)
    elif require_boxed:
        return False, None, "put your final answer in \\boxed{}."
    else:
        pred = mv.parse(text, parsing_timeout=t)
    if not pred:
        return False, None, "write your final answer in \\boxed{}."
    gold_parsed = gold if isinstance(gold, list) else parse_gold(gold)
    extracted = str(pred[-1]) if len(pred) > 1 else str(pred[0])
    ok = bool(mv.verify(gold_parsed, pred, timeout_seconds=t))
    return ok, extracted, ""


# ---------------------------------------------------------------------------------- presets
# question columns, answer columns (first present wins), answer extractor name
PRESETS: Dict[str, Dict[str, Any]] = {
    "gsm8k": {"question": ["question"], "answer": ["answer"], "extract": "gsm8k"},
    "math": {"question": ["problem"], "answer": ["answer", "solution"], "extract": "boxed"},
    "math500": {"question": ["problem"], "answer": ["answer", "solution"], "extract": "boxed"},
    "aime24": {"question": ["problem", "Problem", "question"], "answer": ["answer", "Answer"], "extract": "plain"},
    "aime25": {"question": ["problem", "question", "Problem"], "answer": ["answer", "Answer"], "extract": "plain"},
    "amc23": {"question": ["question", "problem"], "answer": ["answer"], "extract": "plain"},
    "minerva": {"question": ["question", "problem"], "answer": ["answer", "solution"], "extract": "boxed"},
    "olympiadbench": {"question": ["question", "problem"], "answer": ["final_answer", "answer"], "extract": "first"},
    "dapo": {
        "question": ["prompt", "problem"],
        "answer": ["reward_model.ground_truth", "solution", "answer"],
        "extract": "plain",
    },
}
_ALIASES = {
    "math-500": "math500",
    "aime2024": "aime24",
    "aime_2024": "aime24",
    "aime2025": "aime25",
    "aime_2025": "aime25",
    "amc": "amc23",
    "minervamath": "minerva",
    "minerva_math": "minerva",
    "olympiad": "olympiadbench",
    "dapo-math-17k": "dapo",
    "dapo17k": "dapo",
}


def extract_reference(value: Any, how: str) -> str:
    """The final answer out of a preset's answer column."""
    if isinstance(value, (list, tuple)) or (hasattr(value, "tolist") and not isinstance(value, str)):
        seq = list(value.tolist() if hasattr(value, "tolist") else value)
        value = seq[0] if seq else ""
    text = str(value).strip()
    if how == "gsm8k":
        if "####" not in text:
            raise ValueError(f"GSM8K answer without '####': {text[:80]!r}")
        return text.split("####")[-1].strip().replace(",", "")
    if how == "boxed":
        boxed = last_boxed(text)
        return boxed if boxed is not None else text
    return text


def _get(row: Mapping[str, Any], key: str) -> Any:
    cur: Any = row
    for part in key.split("."):
        if isinstance(cur, Mapping) and part in cur:
            cur = cur[part]
        else:
            raise KeyError(key)
    return cur


def _question_text(value: Any) -> str:
    """Plain text, or the last user message of a chat-format prompt (DAPO)."""
    if hasattr(value, "tolist") and not isinstance(value, str):
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        msgs = [m for m in value if isinstance(m, Mapping)]
        users = [m for m in msgs if m.get("role") == "user"] or msgs
        if users:
            return str(users[-1].get("content", "")).strip()
        return " ".join(str(v) for v in value).strip()
    return str(value).strip()


def _read_table(path: str):
    import pandas as pd

    low = path.lower()
    if low.endswith(".parquet"):
        return pd.read_parquet(path)
    if low.endswith((".jsonl", ".jsonl.gz")):
        return _read_json_lines(path)
    if low.endswith((".json", ".json.gz")):
        try:
            return pd.read_json(path)
        except ValueError:
            return _read_json_lines(path)
    if low.endswith((".csv", ".csv.gz")):
        return pd.read_csv(path)
    raise ValueError(f"data_files: unsupported file type {path!r} (parquet, jsonl, json or csv)")


def _read_json_lines(path: str):
    """A JSON-lines file as a DataFrame; a malformed line is reported with the file and line number."""
    import pandas as pd

    try:
        return pd.read_json(path, lines=True)
    except ValueError as e:
        reason = str(e)
    opener = gzip.open if path.lower().endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError as e:
                raise ValueError(
                    f"data_files: {path}:{lineno}: not valid JSON ({e}); fix or remove that line"
                ) from None
            if not isinstance(record, dict):
                raise ValueError(
                    f"data_files: {path}:{lineno}: expected one JSON object per line, got "
                    f"{type(record).__name__}; fix or remove that line"
                )
    raise ValueError(f"data_files: {path}: not readable as JSON lines ({reason})")


def load_problems(
    files: Sequence[str], question_keys: Sequence[str], answer_keys: Sequence[str], extract: str
) -> List[Tuple[str, str]]:
    rows: List[Tuple[str, str]] = []
    for path in files:
        if not os.path.isfile(path):
            raise ValueError(f"data_files: no such file {path!r}")
        df = _read_table(path)
        records = df.to_dict("records")
        if not records:
            continue
        cols = set(df.columns)

        def pick(keys: Sequence[str], field: str, cols: set = cols, path: str = path) -> str:
            for k in keys:
                if k in cols or ("." in k and k.split(".")[0] in cols):
                    return k
            raise ValueError(f"{field}: none of {list(keys)} is a column of {path!r}; columns: {sorted(cols)}")

        qk, ak = pick(question_keys, "question_key"), pick(answer_keys, "answer_key")
        for rec in records:
            q = _question_text(_get(rec, qk))
            a = extract_reference(_get(rec, ak), extract)
            if q:
                rows.append((q, a))
    return rows


# ---------------------------------------------------------------------------------- environment
class MathEnv(MultiAttemptEnv):
    """Math word problems / competition problems with ``math-verify`` answer checking."""

    rules = (
        "Solve the math problem. Reason step by step, then give the final answer in \\boxed{}. "
        "If the answer is wrong you may try again."
    )
    instruction = "Put your final answer within \\boxed{}."

    option_bounds = {"difficulty": (0, 3)}

    def __init__(
        self,
        data_files: Union[None, str, Sequence[str], Mapping[str, Any]] = None,
        preset: Optional[str] = None,
        question_key: Optional[str] = None,
        answer_key: Optional[str] = None,
        partition: bool = True,
        hf_dataset: Optional[str] = None,
        hf_config: Optional[str] = None,
        hf_splits: Optional[Mapping[str, str]] = None,
        difficulty: int = 1,
        split: str = "train",
        max_attempts: int = 3,
        require_boxed: bool = False,
        reveal_answer: bool = False,
    ) -> None:
        super().__init__(split=split, max_attempts=max_attempts, reveal_answer=reveal_answer)
        if isinstance(difficulty, bool) or not isinstance(difficulty, int) or not 0 <= difficulty <= 3:
            raise ValueError(f"difficulty must be 0 (bare arithmetic), 1, 2 or 3 (word problems); got {difficulty!r}")
        self.difficulty = difficulty
        self.require_boxed = bool(require_boxed)
        if preset is not None:
            key = str(preset).lower().replace(" ", "")
            key = _ALIASES.get(key, key)
            if key not in PRESETS:
                raise ValueError(f"preset must be one of {sorted(PRESETS)}; got {preset!r}")
            spec = PRESETS[key]
        else:
            spec = {
                "question": ["question", "problem", "prompt"],
                "answer": ["answer", "final_answer", "solution"],
                "extract": "boxed",
            }
        self.preset = preset
        qkeys = [question_key] if question_key else spec["question"]
        akeys = [answer_key] if answer_key else spec["answer"]
        for name, v in (("question_key", question_key), ("answer_key", answer_key)):
            if v is not None and not isinstance(v, str):
                raise ValueError(f"{name} must be a column name; got {v!r}")
        self._rows: Optional[List[Tuple[str, str]]] = None
        _math_verify()  # a clear error now if math-verify is missing
        if data_files is not None:
            self.source = "files"
            if isinstance(data_files, Mapping):
                bad = [k for k in data_files if k not in SPLITS]
                if bad:
                    raise ValueError(f"data_files keys must be train/dev/test; got {bad}")
                files = data_files.get(self.split)
                if not files:
                    raise ValueError(f"data_files has no files for split {self.split!r}")
                self._rows = load_problems(self._as_list(files), qkeys, akeys, spec["extract"])
            else:
                rows = load_problems(self._as_list(data_files), qkeys, akeys, spec["extract"])
                self._rows = [r for r in rows if _fold_of(r[0]) == self.split] if partition else rows
        elif hf_dataset is not None:
            self.source = "hf"
            self._rows = self._load_hf(hf_dataset, hf_config, hf_splits, qkeys, akeys, spec["extract"])
        else:
            self.source = "generator"
        if self._rows is not None and not self._rows:
            raise ValueError(f"data_files: no problems for split {self.split!r}")

    @staticmethod
    def _as_list(files: Union[str, Sequence[str]]) -> List[str]:
        if isinstance(files, str):
            return [os.path.expanduser(files)]
        if not isinstance(files, (list, tuple)) or not all(isinstance(f, str) for f in files):
            raise ValueError(f"data_files must be a path, a list of paths or a dict of them; got {files!r}")
        return [os.path.expanduser(f) for f in files]

    def _load_hf(
        self,
        name: str,
        config: Optional[str],
        hf_splits: Optional[Mapping[str, str]],
        qkeys: Sequence[str],
        akeys: Sequence[str],
        extract: str,
    ) -> List[Tuple[str, str]]:
        try:
            import datasets
        except ImportError as e:
            raise ImportError(
                "hf_dataset needs the optional `datasets` package (pip install datasets) and the "
                "dataset in its local cache; or pass data_files"
            ) from e
        splits = {"train": "train", "dev": "validation", "test": "test"}
        splits.update(hf_splits or {})
        os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
        try:
            ds = datasets.load_dataset(name, config, split=splits[self.split])
        except Exception as e:
            raise ValueError(
                f"hf_dataset: cannot load {name!r} split {splits[self.split]!r} from the local cache (offline): {e}"
            ) from e
        cols = set(ds.column_names)
        qk = next((k for k in qkeys if k.split(".")[0] in cols), None)
        ak = next((k for k in akeys if k.split(".")[0] in cols), None)
        if qk is None or ak is None:
            raise ValueError(
                f"question_key/answer_key: columns {sorted(cols)} hold none of {list(qkeys)} / {list(akeys)}"
            )
        return [(_question_text(_get(r, qk)), extract_reference(_get(r, ak), extract)) for r in ds]

    def num_problems(self) -> Optional[int]:
        return None if self._rows is None else len(self._rows)

    def _problem(self, seed: int):
        if self._rows is None:
            q, a = generate_problem(seed, self.split, self.difficulty)
            idx = seed
        else:
            idx = seed % len(self._rows)
            q, a = self._rows[idx]
        return q, a, {"problem_index": idx, "source": self.source}

    def _check(self, response: str, gold: Any):
        return check_math_answer(response, gold, self.require_boxed)

    def reference_answer(self) -> str:
        """The current problem's reference answer (for tests and evaluation scripts)."""
        return str(self._gold)


__all__ = [
    "MathEnv",
    "check_math_answer",
    "parse_gold",
    "last_boxed",
    "generate_problem",
    "PRESETS",
    "extract_reference",
    "load_problems",
]
