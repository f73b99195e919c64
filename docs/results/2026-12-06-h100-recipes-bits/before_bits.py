# Fingerprints of one forward + backward at commit bb66055 (the last with products kinds), each recipe
# run through the kind it replaced; the same parameters, tokens and sha256 as lab/bench/model_bits.py.
# Run from a checkout of bb66055 placed in old/ beside this file: python before_bits.py 12M,120M fp32,... out.json
import sys, json, hashlib
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent / "old"))
import numpy as np
from andrea_numba import gpu_model as G
from andrea_numba.kernels import matmul as MM
from andrea_numba.layout import init_params
from andrea_numba.config import load_config
MAP = {"fp32": "tf32x3w", "bf16-hopper": "bf16o", "bf16-ampere": "bf16a", "fp16": "f16w", "cublas-fp32": "cublas",
       "cublas-bf16": "cublas-bf16", "cublas-fp16": "cublas-fp16", "cublas-fp8-fwd": "cublas-fp8-fwd",
       "cublas-fp8-e5m2": "cublas-fp8-e5m2", "cublas-fp8-all": "cublas-fp8-all"}
SHAPES = {"tiny": (1, 8), "12M": (16, 512), "120M": (8, 1024)}
sizes, names, out = sys.argv[1].split(","), sys.argv[2].split(","), sys.argv[3]
res = []
for size in sizes:
    m = load_config(size).model
    B, T = SHAPES[size]
    for name in names:
        rng = np.random.default_rng(17)
        tokens, targets = (rng.integers(0, m.vocab_size, (B, T)).astype(np.int32) for _ in range(2))
        with MM.tma_matmul(18):
            model = G.GPUModel(m, B, T, products=MAP.get(name, name))
            model.params.copy_to_device(init_params(m, 3))
            model.forward(tokens, targets); model.backward(); model.stream.synchronize()
            loss, grads = model.read_loss(), model.grads.copy_to_host()
            del model
        h = hashlib.sha256(np.float32(loss).tobytes() + grads.tobytes()).hexdigest()
        res.append(dict(size=size, recipe=name, loss=loss, sha256=h)); print(size, name, loss, h[:16], flush=True)
Path(out).write_text(json.dumps(res, indent=1))
