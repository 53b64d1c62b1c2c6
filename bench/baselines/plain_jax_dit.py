"""Plain-JAX DiT train step, written the obvious way: the baseline of ``bench/dit.py``.

DiT with adaLN-Zero as Peebles & Xie 2023 describe it (Sec. 3.2; LayerNorm without affine
parameters, a GELU MLP of 4 d, fixed sin-cos position embedding, patch 2), parameters in a dict
of float32 arrays stacked over layers and a ``jax.lax.scan`` over them, activations in bf16,
attention as einsum + softmax, flow-matching MSE, AdamW (optax) in one ``jax.jit``. Random
latents and labels, the same every step.

Environment: L (layers), D (width), H (heads), IMG (latent side), C (latent channels),
P (patch), B (batch), STEPS (timed steps). Prints one JSON line: ``images_s``, ``mfu``
(6 x matmul parameters x tokens + 12 L N^2 d per image, against 989.5e12 bf16 FLOP/s of an
H100/H200 SXM), ``params``, ``peak_mem_gb``.
"""

from __future__ import annotations

import json
import math
import os
import time

import jax
import jax.numpy as jnp
import optax

L = int(os.environ.get("L", 24))
D = int(os.environ.get("D", 1024))
H = int(os.environ.get("H", 16))
IMG = int(os.environ.get("IMG", 32))
C = int(os.environ.get("C", 4))
P = int(os.environ.get("P", 2))
B = int(os.environ.get("B", 64))
STEPS = int(os.environ.get("STEPS", 20))
N = (IMG // P) ** 2
PEAK = 989.5e12
BF16 = jnp.bfloat16


def init(key):
    ks = iter(jax.random.split(key, 16))
    n = lambda *shape: 0.02 * jax.random.normal(next(ks), shape, jnp.float32)  # noqa: E731
    z = lambda *shape: jnp.zeros(shape, jnp.float32)  # noqa: E731
    return {
        "patch": n(P * P * C, D),
        "t1": n(256, D),
        "t2": n(D, D),
        "y": n(1001, D),
        "qkv": n(L, D, 3 * D),
        "o": n(L, D, D),
        "fc1": n(L, D, 4 * D),
        "fc2": n(L, 4 * D, D),
        "ada": z(L, D, 6 * D),
        "final_ada": z(D, 2 * D),
        "out": z(D, P * P * C),
    }


def layer_norm(x):
    x32 = x.astype(jnp.float32)
    mean = x32.mean(-1, keepdims=True)
    var = ((x32 - mean) ** 2).mean(-1, keepdims=True)
    return ((x32 - mean) * jax.lax.rsqrt(var + 1e-6)).astype(x.dtype)


def forward(params, x, t, y):
    p = jax.tree.map(lambda a: a.astype(BF16), params)
    b = x.shape[0]
    patches = x.reshape(b, IMG // P, P, IMG // P, P, C).transpose(0, 1, 3, 2, 4, 5)
    h = patches.reshape(b, N, P * P * C).astype(BF16) @ p["patch"]
    freqs = jnp.exp(-math.log(10_000.0) * jnp.arange(128) / 128)
    tf = jnp.concatenate([jnp.cos(t[:, None] * freqs), jnp.sin(t[:, None] * freqs)], -1)
    c = jax.nn.silu(tf.astype(BF16) @ p["t1"]) @ p["t2"] + p["y"][y]

    def block(h, w):
        mod = jax.nn.silu(c) @ w["ada"]
        s1, g1, a1, s2, g2, a2 = jnp.split(mod[:, None], 6, axis=-1)
        u = layer_norm(h) * (1 + g1) + s1
        q, k, v = jnp.split((u @ w["qkv"]).reshape(b, N, 3 * H, D // H), 3, axis=2)
        s = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32) / math.sqrt(D // H)
        o = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, -1).astype(BF16), v)
        h = h + a1 * (o.reshape(b, N, D) @ w["o"])
        u = layer_norm(h) * (1 + g2) + s2
        h = h + a2 * (jax.nn.gelu(u @ w["fc1"]) @ w["fc2"])
        return h, None

    layers = {k: p[k] for k in ("qkv", "o", "fc1", "fc2", "ada")}
    h, _ = jax.lax.scan(block, h, layers)
    shift, scale = jnp.split((jax.nn.silu(c) @ p["final_ada"])[:, None], 2, axis=-1)
    return (layer_norm(h) * (1 + scale) + shift) @ p["out"]


def loss_fn(params, batch):
    pred = forward(params, batch["noisy"], batch["t"], batch["y"]).astype(jnp.float32)
    target = batch["target"].reshape(pred.shape)  # patch order differs from the image's: fine
    return jnp.mean((pred - target) ** 2)


def main():
    key = jax.random.key(0)
    params = init(key)
    tx = optax.adamw(1e-4, weight_decay=0.0)
    opt = tx.init(params)

    @jax.jit
    def step(params, opt, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        updates, opt = tx.update(grads, opt, params)
        return optax.apply_updates(params, updates), opt, loss

    k1, k2, k3 = jax.random.split(key, 3)
    batch = {
        "noisy": jax.random.normal(k1, (B, IMG, IMG, C)),
        "target": jax.random.normal(k2, (B, IMG, IMG, C)),
        "t": jax.random.uniform(k3, (B,)) * 1000,
        "y": jnp.arange(B) % 1000,
    }
    params, opt, loss = step(params, opt, batch)
    float(loss)
    start = time.perf_counter()
    for _ in range(STEPS):
        params, opt, loss = step(params, opt, batch)
    float(loss)
    seconds = (time.perf_counter() - start) / STEPS
    matmul = L * (D * 3 * D + D * D + 2 * 4 * D * D + 6 * D * D)
    flops = 6 * matmul * N + 12 * L * N * N * D
    count = sum(x.size for x in jax.tree.leaves(params))
    stats = jax.devices()[0].memory_stats() or {}
    print(
        json.dumps(
            {
                "images_s": B / seconds,
                "mfu": B / seconds * flops / PEAK,
                "params": count,
                "step_s": seconds,
                "peak_mem_gb": stats.get("peak_bytes_in_use", 0) / 1e9,
            }
        )
    )


if __name__ == "__main__":
    main()
