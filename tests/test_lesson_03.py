"""Lesson 3 (one backward step, traced) runs to the end without a GPU, and its numbers agree:
the collected gradient equals reference.model_backward, every kernel matches the twin, and the
finite differences match the backward."""
import os
import re
import subprocess
import sys
from pathlib import Path

LESSON = Path(__file__).resolve().parents[1] / "lessons" / "03_one_backward_step.py"


def test_traced_backward_step(tmp_path):
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1"}
    p = subprocess.run([sys.executable, str(LESSON), "--figures", str(tmp_path)], env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    out = p.stdout
    assert "all agree" in out
    for kernel in ("k_loss_bwd", "k_layernorm_bwd", "k_mlp_bwd", "k_attn_bwd", "k_attn_qkv_bwd",
                   "k_attn_out_bwd", "k_residual_add_bwd", "k_embed_bwd"):
        assert kernel in out
    assert float(re.search(r"model_backward: max\|diff\| = (\S+)", out).group(1)) < 1e-12
    fd = [float(x) for x in re.findall(r"rel (\d\.\de-?\d+)", out)]
    assert len(fd) >= 20 and max(fd) < 1e-6
    assert (tmp_path / "03_gradients_and_attention.png").stat().st_size > 10_000
