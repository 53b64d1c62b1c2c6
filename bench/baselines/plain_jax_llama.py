"""Plain-JAX baseline: what a user would write without Titan.

A Llama-style decoder trained with jit(value_and_grad) + optax.adamw on one device,
fp32 master weights, bf16 compute, scan over layers, optional remat, attention through
jax.nn.dot_product_attention. Prints JSON lines: the bf16 matmul ceiling, then one line
with tokens/s and MFU under both attention-FLOP conventions (989e12 peak, H100/H200 dense bf16).

Environment: L (layers, 16), S (seq len, 2048), B (batch, 8), ATTN (cudnn | xla), REMAT (1 | 0);
the shape's D (2048), H (16), KV (8), F (5632), V (32000) and the master weights' PDT
(float32 | bfloat16).
Results: the plain-JAX baseline rows of docs/benchmarks.md (``bench/mfu.py`` runs this file).
"""

# ruff: noqa
# fmt: off
# (kept as a user would write it: terse, unformatted)
import time, json, os, sys
import jax, jax.numpy as jnp, numpy as np, optax

def log(**kw): print(json.dumps(kw), flush=True)

log(jax=jax.__version__, devices=[str(d) for d in jax.devices()])
try:
    import flax, orbax.checkpoint as ocp
    log(flax=flax.__version__, orbax=getattr(ocp, "__version__", "?"), optax=optax.__version__)
except Exception as e:
    log(err=str(e))

# 1. matmul ceiling
n = 8192
a = jnp.ones((n, n), jnp.bfloat16) * 0.01
b = jnp.ones((n, n), jnp.bfloat16) * 0.01
f = jax.jit(lambda a, b: a @ b)
f(a, b).block_until_ready()
t = time.perf_counter(); reps = 20
for _ in range(reps): c = f(a, b)
c.block_until_ready(); dt = (time.perf_counter() - t) / reps
log(matmul_tflops=2 * n**3 / dt / 1e12)

# 2. Llama-style model
env = lambda k, v: int(os.environ.get(k, v))
cfg = dict(L=env("L", 16), d=env("D", 2048), H=env("H", 16), KV=env("KV", 8), F=env("F", 5632),
           V=env("V", 32000), S=env("S", 2048), B=env("B", 8))
PDT = jnp.dtype(os.environ.get("PDT", "float32"))
L, d, H, KV, F, V, S, B = (cfg[k] for k in "L d H KV F V S B".split())
hd = d // H

def init(key):
    ks = jax.random.split(key, 8)
    s = 0.02
    layers = dict(
        wq=jax.random.normal(ks[0], (L, d, H * hd)) * s,
        wk=jax.random.normal(ks[1], (L, d, KV * hd)) * s,
        wv=jax.random.normal(ks[2], (L, d, KV * hd)) * s,
        wo=jax.random.normal(ks[3], (L, H * hd, d)) * s,
        w1=jax.random.normal(ks[4], (L, d, F)) * s,
        w3=jax.random.normal(ks[5], (L, d, F)) * s,
        w2=jax.random.normal(ks[6], (L, F, d)) * s,
        n1=jnp.ones((L, d)), n2=jnp.ones((L, d)))
    return dict(emb=jax.random.normal(ks[7], (V, d)) * s, layers=layers,
                norm=jnp.ones((d,)), head=jax.random.normal(ks[7], (d, V)) * s)

def rms(x, w): 
    x32 = x.astype(jnp.float32)
    return (x32 * jax.lax.rsqrt(jnp.mean(x32 ** 2, -1, keepdims=True) + 1e-5)).astype(x.dtype) * w.astype(x.dtype)

def rope(x, pos):
    half = x.shape[-1] // 2
    freq = 1.0 / (10000 ** (jnp.arange(half) / half))
    ang = pos[:, None] * freq[None]
    cos, sin = jnp.cos(ang)[None, :, None, :], jnp.sin(ang)[None, :, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1).astype(x.dtype)

IMPL = os.environ.get("ATTN", "cudnn")
def block(x, p):
    bf = lambda w: w.astype(jnp.bfloat16)
    h = rms(x, p["n1"])
    q = (h @ bf(p["wq"])).reshape(B, S, H, hd)
    k = (h @ bf(p["wk"])).reshape(B, S, KV, hd)
    v = (h @ bf(p["wv"])).reshape(B, S, KV, hd)
    pos = jnp.arange(S, dtype=jnp.float32)
    q, k = rope(q, pos), rope(k, pos)
    o = jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation=None if IMPL == "xla" else IMPL)
    x = x + o.reshape(B, S, d) @ bf(p["wo"])
    h = rms(x, p["n2"])
    x = x + (jax.nn.silu(h @ bf(p["w1"])) * (h @ bf(p["w3"]))) @ bf(p["w2"])
    return x

REMAT = os.environ.get("REMAT", "1") == "1"
def loss_fn(params, tokens):
    x = params["emb"].astype(jnp.bfloat16)[tokens]
    blk = jax.checkpoint(block, policy=jax.checkpoint_policies.dots_with_no_batch_dims_saveable) if REMAT else block
    x, _ = jax.lax.scan(lambda c, p: (blk(c, p), None), x, params["layers"])
    x = rms(x, params["norm"])
    logits = (x @ params["head"].astype(jnp.bfloat16)).astype(jnp.float32)
    tgt = jnp.roll(tokens, -1, axis=1)
    return optax.softmax_cross_entropy_with_integer_labels(logits, tgt).mean()

opt = optax.adamw(3e-4, weight_decay=0.1)
params = jax.tree.map(lambda x: x.astype(PDT), init(jax.random.PRNGKey(0)))
state = opt.init(params)
nparam = sum(x.size for x in jax.tree.leaves(params))

@jax.jit
def step(params, state, tokens):
    loss, g = jax.value_and_grad(loss_fn)(params, tokens)
    upd, state = opt.update(g, state, params)
    return optax.apply_updates(params, upd), state, loss

step = jax.jit(step, donate_argnums=(0, 1))
tokens = jax.random.randint(jax.random.PRNGKey(1), (B, S), 0, V)
t0 = time.perf_counter()
params, state, loss = step(params, state, tokens); loss.block_until_ready()
compile_s = time.perf_counter() - t0; first_step_unix = time.time()
for _ in range(2): params, state, loss = step(params, state, tokens)
loss.block_until_ready()
reps = 10; t = time.perf_counter()
for _ in range(reps): params, state, loss = step(params, state, tokens)
loss.block_until_ready(); dt = (time.perf_counter() - t) / reps
n_nonemb = nparam - V * d  # embedding lookup has no matmul flops
flops_tok = 6 * n_nonemb + 6 * L * S * d  # attention halved for the causal mask (MaxText)
flops_tok_palm = 6 * n_nonemb + 12 * L * S * d  # attention counted in full (PaLM, torchtitan)
tok_s = B * S / dt
mem = jax.devices()[0].memory_stats() or {}
log(cfg=cfg, attn=IMPL, remat=REMAT, params_b=nparam / 1e9, compile_s=compile_s, step_s=dt, tok_s=tok_s,
    loss=float(loss), mfu_causal=flops_tok * tok_s / 989e12, mfu_palm=flops_tok_palm * tok_s / 989e12,
    peak_mem_gb=mem.get("peak_bytes_in_use", 0) / 2**30, first_step_unix=first_step_unix)
