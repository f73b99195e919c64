"""The flat parameter layout covers the vector exactly once; initialisation is GPT-2's and seeded."""
import math

import numpy as np
import pytest

from andrea_numba.config import SIZES, load_config
from andrea_numba.layout import decay_mask, init_params, n_params, param_layout, views


@pytest.mark.parametrize("size", list(SIZES))
def test_layout_covers_the_flat_vector_exactly_once(size):
    m = load_config(size).model
    specs = param_layout(m)
    covered = np.zeros(n_params(m), dtype=np.int8) if size != "120M" else None
    offset = 0
    for s in specs:
        assert s.offset == offset, f"gap or overlap before {s.name}"
        offset = s.end
        if covered is not None:
            covered[s.offset:s.end] += 1
    assert offset == n_params(m)
    if covered is not None:
        assert (covered == 1).all()
    assert len({s.name for s in specs}) == len(specs) == 2 + 10 * m.n_layer + 2


@pytest.mark.parametrize("size", list(SIZES))
def test_the_configs_parameter_count_is_the_layouts(size):
    m = load_config(size).model
    assert m.n_params == n_params(m)      # config.py counts without the layout; they must agree


def test_views_write_into_the_flat_vector():
    m = load_config("tiny").model
    flat = np.zeros(n_params(m), dtype=np.float32)
    v = views(flat, m)
    v["h1.mlp.w_2"][3, 5] = 7.0
    s = {s.name: s for s in param_layout(m)}["h1.mlp.w_2"]
    assert flat[s.offset + 3 * s.shape[1] + 5] == 7.0
    assert flat.sum() == 7.0


def test_init_is_gpt2_style_and_deterministic():
    m = load_config("12M").model
    a, b = init_params(m, seed=1), init_params(m, seed=1)
    assert a.dtype == np.float32 and np.array_equal(a, b)
    assert not np.array_equal(a, init_params(m, seed=2))
    v = views(a, m)
    assert np.all(v["h0.ln1.g"] == 1) and np.all(v["lnf.b"] == 0)
    assert abs(v["wte"].std() - 0.02) < 5e-4
    assert abs(v["h3.mlp.w_1"].std() - 0.02) < 5e-4
    scaled = 0.02 / math.sqrt(2 * m.n_layer)
    assert abs(v["h3.mlp.w_2"].std() - scaled) < 3e-4
    assert abs(v["h3.attn.w_o"].std() - scaled) < 3e-4


def test_decay_mask_marks_matrices_only():
    m = load_config("tiny").model
    mask = views(decay_mask(m), m)
    assert np.all(mask["wte"] == 1) and np.all(mask["h0.attn.w_q"] == 1)
    assert np.all(mask["h0.ln1.g"] == 0) and np.all(mask["lnf.b"] == 0)


def test_docs_layout_table_is_current():
    from pathlib import Path

    from andrea_numba.layout import layout_table
    doc = (Path(__file__).resolve().parents[1] / "docs" / "layout.md").read_text()
    assert layout_table(load_config("tiny").model) in doc, "regenerate docs/layout.md"
