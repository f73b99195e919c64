"""A class's gradebook: one CSV row per student and exercise, and a summary that fits on a screen.

    python -m andrea_numba.exercises grade class/        # class/alice/*.py, class/bob/*.py -> class/grades.csv

The grading itself is andrea_numba/exercises.py's (grade_class); this module turns its results into
rows, writes them (to a temporary file beside the gradebook, then renamed over it: a reader never
sees half a gradebook) and draws the students x exercises matrix.

Columns: student, exercise, status (pass, fail, not implemented, refused, error, timeout, crash,
missing), passed and total (tensor rows right / checked), worst_error (the largest relative error
of any row: against the centred differences or the twin for a NumPy exercise, against the twin
for a kernel), seconds (the file's grading process, from start to end), reason (the one line: the
first failing row and its hint, or why there are no rows).
"""
from __future__ import annotations

import csv
import io
import os
import secrets
from pathlib import Path

FIELDS = ("student", "exercise", "status", "passed", "total", "worst_error", "seconds", "reason")
MARKS = {"pass": "P", "fail": "F", "not implemented": "-", "refused": "R", "error": "E",
         "timeout": "T", "crash": "C", "missing": "."}


def student_folders(folder) -> list[str]:
    """The names of the student folders in `folder`: its subdirectories, but hidden ones (.git) and
    __pycache__, sorted."""
    return sorted(p.name for p in Path(folder).iterdir()
                  if p.is_dir() and not p.name.startswith((".", "__")))


def _worst(res: dict) -> float | None:
    errs = [max(r["rel_err"], r.get("rel_err_twin", 0.0)) for r in res["rows"]]
    return max(errs) if errs else None


def reason(res: dict) -> str:
    """Why check()'s result is not a pass, in one line: the first failing row and its hint, or the
    message of a file with no rows ("" for a pass)."""
    if res["status"] == "pass":
        return ""
    bad = [r for r in res["rows"] if not r["ok"]]
    if bad:
        r = bad[0]
        text = f"{r['tensor']} {r['verdict']} (rel_err {r['rel_err']:.1e})"
        return f"{text}: {r['hint']}" if r["hint"] else text
    return res["message"] or ""


def row(student: str, exercise: str, res: dict | None) -> dict:
    """The gradebook row of one student's exercise; res: check()'s dict, None when the file is missing."""
    if res is None:
        return dict(student=student, exercise=exercise, status="missing", passed="", total="",
                    worst_error="", seconds="", reason=f"no file {exercise}.py in {student}/")
    worst = _worst(res)
    return dict(student=student, exercise=exercise, status=res["status"],
                passed=sum(r["ok"] for r in res["rows"]) if res["rows"] else "",
                total=len(res["rows"]) if res["rows"] else "",
                worst_error="" if worst is None else f"{worst:.2e}",
                seconds=f"{res.get('seconds', 0.0):.2f}", reason=" ".join(reason(res).split()))


def to_csv(rows) -> str:
    out = io.StringIO()
    w = csv.DictWriter(out, FIELDS, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return out.getvalue()


def write_csv(path, rows):
    """Write the gradebook atomically: a new temporary file in the same folder, then os.replace."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        with open(tmp, "x", encoding="utf-8", newline="") as f:
            f.write(to_csv(rows))
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def summary(students, exercises, rows, csv_shown) -> str:
    """The students x exercises matrix (one mark per file, the exercises numbered), each student's
    passes, the key of marks and exercise numbers, and the count of every status."""
    by = {(r["student"], r["exercise"]): r["status"] for r in rows}
    width = max([len(s) for s in students] + [7])
    numbers = [str(i + 1) for i in range(len(exercises))]
    cell = max([len(n) for n in numbers] + [1])
    head = f"{'student':<{width}}  " + " ".join(f"{n:>{cell}}" for n in numbers) + "  passed"
    where = f" -> {csv_shown}" if csv_shown else ""
    lines = [f"gradebook: {len(students)} students x {len(exercises)} exercises{where}", head]
    for s in students:
        marks = " ".join(f"{MARKS[by[s, e]]:>{cell}}" for e in exercises)
        passed = sum(by[s, e] == "pass" for e in exercises)
        lines.append(f"{s:<{width}}  {marks}  {passed}/{len(exercises)}")
    lines.append("exercises: " + ", ".join(f"{n} {e}" for n, e in zip(numbers, exercises)))
    lines.append("marks: " + ", ".join(f"{m} {status}" for status, m in MARKS.items()))
    counts = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    lines.append("counts: " + ", ".join(f"{status} {counts[status]}" for status in MARKS if status in counts))
    return "\n".join(lines)
