"""Summarise a mutmut 3.x run (scripts/mutation.sh): score per module and the survivors.

Usage: python scripts/mutation_report.py WORKDIR MODULE [MODULE ...]
Writes WORKDIR/mutation-report.json and WORKDIR/mutation-report.md and prints the table.
Score = (killed + timeout) / (all mutants - skipped); "no tests" mutants (code no fast test
runs) count as not killed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

from mutmut.stats import status_by_exit_code


def main(argv) -> int:
    work, modules = Path(argv[0]), argv[1:]
    rows, survivors = [], {}
    for m in modules:
        meta = work / "mutants" / "rllib_r3l" / f"{m}.py.meta"
        if not meta.exists():
            rows.append({"module": m, "status": "not run"})
            continue
        codes = json.loads(meta.read_text())["exit_code_by_key"]
        st = Counter(status_by_exit_code[c] for c in codes.values())
        tested = len(codes) - st["skipped"]
        killed = st["killed"] + st["timeout"]
        rows.append(
            {
                "module": m,
                "mutants": len(codes),
                "killed": st["killed"],
                "timeout": st["timeout"],
                "survived": st["survived"],
                "no_tests": st["no tests"],
                "other": tested - killed - st["survived"] - st["no tests"],
                "score": round(100.0 * killed / tested, 1) if tested else None,
            }
        )
        survivors[m] = sorted(k for k, c in codes.items() if status_by_exit_code[c] in ("survived", "no tests"))
    (work / "mutation-report.json").write_text(json.dumps({"modules": rows, "survivors": survivors}, indent=1))
    lines = [
        "| module | mutants | killed | timeout | survived | no tests | other | score |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "mutants" not in r:
            lines.append(f"| {r['module']} | not run | | | | | | |")
            continue
        lines.append(
            f"| {r['module']} | {r['mutants']} | {r['killed']} | {r['timeout']} | {r['survived']} | "
            f"{r['no_tests']} | {r['other']} | {r['score']} % |"
        )
    lines.append("")
    for m, names in survivors.items():
        lines.append(f"## survivors in {m} ({len(names)})")
        for n in names:
            diff = subprocess.run(
                [sys.executable, "-m", "mutmut", "show", n], cwd=work, capture_output=True, text=True
            ).stdout
            body = "\n".join(
                l for l in diff.splitlines() if l.startswith(("+", "-")) and not l.startswith(("+++", "---"))
            )
            lines.append(f"- `{n}`\n```diff\n{body}\n```")
    (work / "mutation-report.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[: len(rows) + 2]))
    print(f"survivors and their diffs: {work / 'mutation-report.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
