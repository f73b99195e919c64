"""The README's table of the ops is built from the recipes (andrea_numba/recipes.py), the op-case
table (andrea_numba/cases.py), the exercises and the lessons, so it cannot go stale: this test fails
when the README's copy differs, and `python tests/test_readme.py --write` writes it anew.
"""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from andrea_numba.cases import CASES, OPS  # noqa: E402
from andrea_numba.exercises import EXERCISES  # noqa: E402
from andrea_numba.kernels import dropout  # noqa: E402
from andrea_numba.recipes import get  # noqa: E402

BEGIN, END = "<!-- op-table begin -->", "<!-- op-table end -->"
README = ROOT / "README.md"
# the recipe ops that run each op of the table (the residual add runs fused with the LayerNorm after it)
RUNS_AS = {"embed": ("embed",), "layernorm": ("layernorm", "residual_layernorm"), "attn_qkv": ("attn_qkv",),
           "attn": ("attention",), "attn_out": ("attn_out",), "mlp": ("mlp",), "residual": ("residual_layernorm",),
           "loss": ("loss",)}
# the lessons that teach an op beyond lesson 03 (which traces every op's backward)
LESSONS = {"embed": ("09",), "layernorm": ("04",), "attn_qkv": ("07",), "attn": ("08",), "attn_out": ("07",),
           "mlp": ("07", "10"), "residual": ("01",), "dropout": (), "loss": ("10",)}


def _lesson(number: str) -> str:
    path = next((ROOT / "lessons").glob(f"{number}_*.py"))
    return f"[{number}](lessons/{path.name})"


def _kernels(recipe, op: str) -> str:
    if op == "dropout":                                  # not a recipe's choice: one pair in every recipe
        fns = (dropout.dropout_fwd, dropout.dropout_bwd)
    else:
        fns = [f for name in RUNS_AS[op] for f in recipe.kernels[name]]
    return ", ".join(f"`{n}`" for n in dict.fromkeys(f.__name__ for f in fns))     # each once, in order


def op_table() -> str:
    fp32, bf16 = get("fp32"), get("bf16-hopper")
    rows = ["| op | twin (reference/) | engine, fp32 | engine, bf16 (Hopper) | lessons | exercises |",
            "|---|---|---|---|---|---|"]
    for op in OPS:
        case = CASES[op]
        twin = f"`{case.twin or case.fwd}`, `{case.bwd}`"
        lessons = ", ".join(_lesson(n) for n in ("03",) + LESSONS[op])
        exercises = ", ".join(f"`{e.name}`" for e in EXERCISES if e.op == op) or "-"
        rows.append(f"| {op} | {twin} | {_kernels(fp32, op)} | {_kernels(bf16, op)} | {lessons} | {exercises} |")
    return "\n".join(rows)


def _readme_table(text: str) -> str:
    assert BEGIN in text and END in text, f"README.md has no {BEGIN} ... {END} block"
    return text.split(BEGIN, 1)[1].split(END, 1)[0].strip()


def test_the_readme_op_table_is_the_recipes():
    assert _readme_table(README.read_text()) == op_table(), \
        "README.md's op table is stale: python tests/test_readme.py --write"


def test_the_readme_is_one_page():
    assert len(README.read_text().splitlines()) <= 200


def test_every_op_of_the_kernel_table_has_a_row():
    table = op_table()
    assert all(f"| {op} |" in table for op in OPS) and set(RUNS_AS) | {"dropout"} == set(OPS) == set(LESSONS)


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        text = README.read_text()
        head, rest = text.split(BEGIN, 1)
        README.write_text(head + BEGIN + "\n" + op_table() + "\n" + END + rest.split(END, 1)[1])
    else:
        print(op_table())
