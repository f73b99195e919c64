"""Lesson 01: the chain rule. Local gradients multiply along a chain and add where paths meet.

What it teaches
    1. A chain of simple functions, x -> a = 3x -> b = sin(a) -> c = b^2 -> L = log(1 + c):
       the forward values, the local derivative of each link, and their product dL/dx.
    2. The backward pass computes that product from the END: dL/dc, then dL/db, dL/da, dL/dx,
       each one the previous times one local derivative. That is what every `_bwd` kernel does.
    3. The product agrees with a float64 centred difference (L(x+h) - L(x-h)) / 2h.
    4. A fork: when one value feeds two paths (x -> a, then p = sin(a) and q = a^2, L = p * q),
       the gradients of the two paths ADD. Forgetting one path gives a wrong gradient, and the
       centred difference catches it. The model has such forks: the residual stream feeds both
       a block and the skip connection, and the tied `wte` is used by the embedding and the loss.

How to run (no GPU, no kernels: plain Python and NumPy)

    python lessons/01_chain_rule.py                    # prints the worked example and exits
    python lessons/01_chain_rule.py --interactive      # waits for Enter between steps
    python lessons/01_chain_rule.py --figures figs/    # where the PNG goes (default: a temp dir)

Open it in Jupyter or VS Code as a notebook: the `# %%` lines are cells.
"""
# %%
import math

import _common as C

args = C.start(__doc__)

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

x0 = 0.7


def chain(x):
    """Forward through the chain; returns every intermediate value."""
    a = 3.0 * x
    b = math.sin(a)
    c = b * b
    L = math.log(1.0 + c)
    return a, b, c, L


# %%
C.step("Forward: compute every value along the chain")
a, b, c, L = chain(x0)
C.say("""
    The chain is x -> a = 3x -> b = sin(a) -> c = b^2 -> L = log(1 + c). The forward pass computes
    the values in order and KEEPS them: the backward pass will need a (for cos a), b (for 2b) and
    c (for 1 / (1 + c)). Keeping what the backward needs is exactly what the model's forward does
    with its "saved activations".
""")
C.table([("x", x0), ("a = 3x", a), ("b = sin(a)", b), ("c = b^2", c), ("L = log(1 + c)", L)],
        header=("value", "number"), fmt=("", ".10f"))

# %%
C.step("Local derivatives: each link on its own")
da_dx = 3.0
db_da = math.cos(a)
dc_db = 2.0 * b
dL_dc = 1.0 / (1.0 + c)
C.say("""
    Each link knows only its own derivative, evaluated at the values saved by the forward pass.
    None of them needs to know anything about the rest of the chain.
""")
C.table([("da/dx = 3", da_dx), ("db/da = cos(a)", db_da), ("dc/db = 2b", dc_db),
         ("dL/dc = 1 / (1 + c)", dL_dc)], header=("local derivative", "value"), fmt=("", ".10f"))

# %%
C.step("Backward: multiply the local derivatives, starting from the loss")
g_c = dL_dc                     # dL/dc
g_b = g_c * dc_db               # dL/db = dL/dc * dc/db
g_a = g_b * db_da               # dL/da = dL/db * db/da
g_x = g_a * da_dx               # dL/dx = dL/da * da/dx
C.say("""
    The chain rule says dL/dx = dL/dc * dc/db * db/da * da/dx. The backward pass evaluates this
    product from the loss end: it starts with dL/dL = 1 and, at each link, multiplies the gradient
    arriving from above ("grad_output") by the link's local derivative, passing the result down
    ("grad_input"). Every _bwd function of reference/ and every _bwd kernel does this one move.
""")
C.table([("dL/dc", "dL/dc", g_c), ("dL/db", "dL/dc * 2b", g_b), ("dL/da", "dL/db * cos(a)", g_a),
         ("dL/dx", "dL/da * 3", g_x)], header=("gradient", "computed as", "value"), fmt=("", "", ".10f"))

# %%
C.step("Check: a float64 centred difference")
h = 1e-6
numeric = (chain(x0 + h)[-1] - chain(x0 - h)[-1]) / (2 * h)
rel = abs(g_x - numeric) / max(1e-12, abs(g_x) + abs(numeric))
C.say(f"""
    Nudge x by h = {h:g} both ways and measure how much L moves: (L(x+h) - L(x-h)) / 2h. Its error
    shrinks like h^2 (the first error terms of the two sides cancel), so in float64 it agrees with
    the exact derivative to about 9 or 10 digits. andrea_numba.gradcheck does the same for every
    op and for the whole model.
""")
C.table([("chain rule (product)", g_x), ("centred difference", numeric), ("relative error", rel)],
        header=("dL/dx by", "value"), fmt=("", ".12g"))
assert rel < 1e-8, rel
C.say(f"The two agree to a relative error of {rel:.1e}: the product of local derivatives IS the derivative.")

xs = np.linspace(0.0, 1.4, 300)
fig, ax = plt.subplots(figsize=(7, 4))
ax.plot(xs, [chain(v)[-1] for v in xs], label="L(x) = log(1 + sin(3x)^2)")
ax.plot(xs, L + g_x * (xs - x0), "--", label=f"tangent at x = {x0}: slope dL/dx = {g_x:.4f}")
ax.plot([x0], [L], "o", color="black")
ax.set_ylim(-0.1, 0.9)
ax.set_xlabel("x")
ax.set_ylabel("L")
ax.set_title("the chain-rule product is the slope of L at x")
ax.legend(frameon=False)
C.savefig(fig, "01_chain_tangent.png")

# %%
C.step("A fork: one value feeds two paths, and the gradients add")


def fork(x):
    a = 3.0 * x
    p = math.sin(a)        # path 1
    q = a * a              # path 2
    L = p * q              # the paths meet again
    return a, p, q, L


a, p, q, L2 = fork(x0)
C.say("""
    Now a = 3x feeds TWO functions, p = sin(a) and q = a^2, and they meet again in L = p * q.
    A small change in a moves L through p AND through q, so dL/da is the sum of two chain-rule
    products, one per path:

        dL/da = dL/dp * dp/da  +  dL/dq * dq/da  =  q * cos(a)  +  p * 2a

    In code, a backward pass writes this as `+=` into one gradient buffer: each path adds its share.
""")
dL_dp, dL_dq = q, p                      # L = p * q
path_p = dL_dp * math.cos(a)             # through p = sin(a)
path_q = dL_dq * 2.0 * a                 # through q = a^2
g_a = path_p + path_q
g_x = g_a * 3.0
numeric = (fork(x0 + h)[-1] - fork(x0 - h)[-1]) / (2 * h)
C.table([("a", a), ("p = sin(a)", p), ("q = a^2", q), ("L = p * q", L2),
         ("path through p: q * cos(a)", path_p), ("path through q: p * 2a", path_q),
         ("dL/da = sum of both paths", g_a), ("dL/dx = dL/da * 3", g_x), ("centred difference dL/dx", numeric)],
        header=("quantity", "value"), fmt=("", ".10f"))
assert abs(g_x - numeric) < 1e-8 * max(1.0, abs(numeric))

# %%
C.step("Forget one path and the check fails")
C.table([("path p only", 3.0 * path_p, abs(3.0 * path_p - numeric)),
         ("path q only", 3.0 * path_q, abs(3.0 * path_q - numeric)),
         ("both paths, added", g_x, abs(g_x - numeric))],
        header=("dL/dx using", "value", "|error| vs centred difference"), fmt=("", ".10f", ".2e"))
C.say("""
    Only the sum matches. In the model the same thing happens in three places: the residual
    stream x feeds both the block and the skip connection (GPUModel.backward adds them with
    residual_add: "both paths into x_mid"), the LayerNorm statistics make every element of a row
    depend on every other, and the token embedding wte is used twice, at the input (embedding)
    and at the output (the tied projection in the loss), so its gradient is the sum of both
    shares. That is also why gradient buffers are accumulated with += and must be zeroed between
    optimiser steps (lesson 05).
""")

C.finish()
