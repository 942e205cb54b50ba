"""The decoder, used functionally: `init` -> (graphdef, params) once, then the pure `forward`.

    graphdef, params = init(ModelConfig.from_name("tiny"), seed=0)
    logits_BxLxV, aux = forward(graphdef, params, tokens_BxL, PrecisionRecipe.from_name("full"), key=key)

`forward` is jittable with graphdef, recipe and impl static:
`jax.jit(forward, static_argnums=(0, 3), static_argnames=("impl",))`. The NNX modules give
the parameter tree its structure; `nnx.merge` inside the trace rebuilds them at no runtime cost.

Padding and positions. `valid_BxL` (default all True) marks real tokens; a padding token is
never attended to by any other token (its own output is finite garbage). Positions default to
the count of valid tokens before each token (plus the cache's per-sequence count), so a
left-padded prompt gets positions 0.. from its first real token, exactly like the same prompt
without padding. The sampler (left-padded prompts) and the trainer therefore agree on RoPE.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from flax import nnx

from fp4rl.model.config import ModelConfig
from fp4rl.model.layers import Attention, RMSNorm, SwiGLU, dtype_of, normal_init
from fp4rl.model.moe import MoE
from fp4rl.model.sites import Ctx, record_sites, site_dot
from fp4rl.recipe import SITE_KINDS, PrecisionRecipe

F32 = jnp.float32


@dataclasses.dataclass(frozen=True)
class KVCache:
    """Keys/values of every layer for a batch whose rows all write the same slot each step.

    k, v: one [B, K, S, Dh] array per layer (tuples of N) in the compute dtype; valid_BxS: slot
    holds a real token; lengths_B: real tokens so far (the next token's position); index: next slot
    to write (int32 ()).

    Layout: the attention GEMMs batch over (B, K) and contract over Dh (scores) or S (values), so
    with [B, K, S, Dh] per layer they read the cache as it lies, with no transposed copy. A buffer
    per layer (not one [N, ...] array): each layer writes its new slots into its own buffer in place
    and its GEMMs read that buffer directly, where a layer's slice of a stacked array would be
    copied at every decode step (on the H200 that copy was the largest kernel of a decode step). So
    a forward with a cache runs its layers unrolled (`forward`): the sampler's program grows with
    depth and compiles slower for deep stacks, the price of a decode step that moves no cache.
    """

    k: jax.Array
    v: jax.Array
    valid_BxS: jax.Array
    lengths_B: jax.Array
    index: jax.Array

    @property
    def size(self) -> int:
        return self.k[0].shape[2]


jax.tree_util.register_dataclass(KVCache, data_fields=["k", "v", "valid_BxS", "lengths_B", "index"], meta_fields=[])


def init_cache(config: ModelConfig, batch: int, size: int) -> KVCache:
    """An empty cache of `size` slots (prompt + new tokens), at most config.max_seq_len."""
    if not 1 <= size <= config.max_seq_len:
        raise ValueError(f"cache size={size} must be in [1, max_seq_len={config.max_seq_len}]")
    shape = (batch, config.num_kv_heads, size, config.head_dim)
    dtype = dtype_of(config.dtype)
    layers = range(config.num_layers)
    return KVCache(
        k=tuple(jnp.zeros(shape, dtype) for _ in layers), v=tuple(jnp.zeros(shape, dtype) for _ in layers),
        valid_BxS=jnp.zeros((batch, size), bool), lengths_B=jnp.zeros((batch,), jnp.int32),
        index=jnp.zeros((), jnp.int32),
    )


def grow_cache(cache: KVCache, size: int) -> KVCache:
    """`cache` with `size` slots: its slots as they are, then empty ones (a prefill on a cache of
    the prompt's width, whose attention then spans the prompt only, grown for the decode)."""
    extra = size - cache.size
    if extra < 0:
        raise ValueError(f"cannot shrink a cache of {cache.size} slots to {size}")
    grow = lambda x: jnp.pad(x, ((0, 0), (0, 0), (0, extra), (0, 0)))  # noqa: E731
    return dataclasses.replace(cache, k=tuple(map(grow, cache.k)), v=tuple(map(grow, cache.v)),
                               valid_BxS=jnp.pad(cache.valid_BxS, ((0, 0), (0, extra))))


ONE_HOT_MAX_VOCAB = 1024


def embed_lookup(embed_VxD, tokens_BxL):
    """embed[tokens]. For a small vocabulary as a one-hot matmul at full f32 precision (exact: each
    output is 1 * one row + 0 * the others), whose gradient is a matmul too. A gather's gradient is
    a scatter-add of every token onto its row: with ~100 rows and thousands of tokens per batch
    almost all updates collide, and under `--xla_gpu_deterministic_ops` (the reproducible GPU
    warm-up) XLA serialises colliding scatter updates."""
    if embed_VxD.shape[0] > ONE_HOT_MAX_VOCAB:
        return embed_VxD[tokens_BxL]
    one_hot = jax.nn.one_hot(tokens_BxL, embed_VxD.shape[0], dtype=embed_VxD.dtype)
    return jnp.einsum("blv,vd->bld", one_hot, embed_VxD, precision=jax.lax.Precision.HIGHEST)


class Block(nnx.Module):
    def __init__(self, config: ModelConfig, layer: int, rngs: nnx.Rngs):
        pd = dtype_of(config.param_dtype)
        self.attn_norm = RMSNorm(config.d_model, config.rms_eps, pd)
        self.attn = Attention(config, layer, rngs)
        self.mlp_norm = RMSNorm(config.d_model, config.rms_eps, pd)
        self.is_moe = config.is_moe(layer)
        if self.is_moe:
            self.mlp = MoE(config, layer, rngs)
        else:
            self.mlp = SwiGLU(config, layer, config.dense_d_ff, "dense_mlp", rngs)

    def __call__(self, x_BxLxD, positions_BxL, mask_BxLxS, valid_BxL, ctx: Ctx, kv_cache=None, index=None):
        a, new_kv = self.attn(self.attn_norm(x_BxLxD), positions_BxL, mask_BxLxS, ctx, kv_cache, index)
        h_BxLxD = x_BxLxD + a
        m = self.mlp_norm(h_BxLxD)
        if self.is_moe:
            y, expert_BxLxK, aux_loss, load_E = self.mlp(m, valid_BxL, ctx)
            return h_BxLxD + y, new_kv, (expert_BxLxK, aux_loss, load_E)
        return h_BxLxD + self.mlp(m, ctx), new_kv, None


def layer_runs(config: ModelConfig, recipe: PrecisionRecipe) -> list[tuple[int, int]]:
    """Maximal runs [start, stop) of consecutive layers that share their structure (MoE or dense)
    and every site's SiteConfig: one run traces one block and scans it over its layers.

    E.g. h200 + `full` (last 1 of 8 layers in BF16): [(0, 7), (7, 8)].
    """
    def signature(layer):
        return config.is_moe(layer), tuple(recipe.site(kind, layer, config.num_layers) for kind in SITE_KINDS)

    runs = []
    for layer in range(config.num_layers):
        if runs and signature(runs[-1][0]) == signature(layer):
            runs[-1] = (runs[-1][0], layer + 1)
        else:
            runs.append((layer, layer + 1))
    return runs


def run_blocks(blocks, x_BxLxD, positions_BxL, mask_BxLxS, valid_BxL, ctx: Ctx, kv=None, index=None):
    """Apply consecutive identical blocks; the MoE aux has a leading [len(blocks)] axis. With a
    cache, one block is called directly, with `kv` its layer's cache (k, v) (returned with the new
    slots written); without, several are one `lax.scan` over their stacked parameters (the stack
    is a copy per forward, small next to the layers' GEMMs), each under `jax.checkpoint` when
    `ctx.remat` (a cached forward is inference: nothing to rematerialise)."""
    def with_layer_axis(tree):
        return None if tree is None else jax.tree.map(lambda a: a[None], tree)

    if kv is not None:
        if len(blocks) > 1:
            raise ValueError("a forward with a KV cache runs its layers one by one (each owns its cache buffer)")
        x_BxLxD, kv, aux = blocks[0](x_BxLxD, positions_BxL, mask_BxLxS, valid_BxL, ctx, kv, index)
        return x_BxLxD, kv, with_layer_axis(aux)

    graphdef, _ = nnx.split(blocks[0])  # the first block's static layer index resolves the sites

    def apply_block(x, state, shift):
        block = nnx.merge(graphdef, state)
        x, _, aux = block(x, positions_BxL, mask_BxLxS, valid_BxL, dataclasses.replace(ctx, layer_shift=shift))
        return x, aux

    if ctx.remat:
        # The backward recomputes the layer from its inputs (residual stream, parameters, the
        # shared positions and mask) instead of keeping its intermediates: one layer's tensors are
        # live at a time. The recomputation runs the same operations on the same inputs (keys
        # included), so values and gradients are those without remat.
        apply_block = jax.checkpoint(apply_block, policy=jax.checkpoint_policies.nothing_saveable, prevent_cse=False)

    if len(blocks) == 1:
        x_BxLxD, aux = apply_block(x_BxLxD, nnx.split(blocks[0])[1], ctx.layer_shift)
        return x_BxLxD, None, with_layer_axis(aux)

    stacked = jax.tree.map(lambda *leaves: jnp.stack(leaves), *(nnx.split(b)[1] for b in blocks))

    def step(x, xs):
        state, shift = xs
        return apply_block(x, state, shift)

    shifts = jnp.arange(len(blocks), dtype=jnp.int32)
    x_BxLxD, aux = jax.lax.scan(step, x_BxLxD, (stacked, shifts))
    return x_BxLxD, None, aux


class Transformer(nnx.Module):
    def __init__(self, config: ModelConfig, rngs: nnx.Rngs):
        # expert_gemm "auto" becomes this platform's backend here, once: the graphdef (and the
        # sampler, which reads `model.config`) then names the backend every program runs on.
        config = config.resolved()
        pd = dtype_of(config.param_dtype)
        self.config = config
        # Untied: N(0, 1) rows (RMSNorm follows immediately). Tied: the head reuses the rows, so
        # N(0, 1/D) keeps the initial logits O(1).
        embed_std = config.d_model**-0.5 if config.tie_embeddings else 1.0
        embed_VxD = jax.random.normal(rngs.params(), (config.vocab_size, config.d_model)) * embed_std
        self.embed = nnx.Param(embed_VxD.astype(pd))
        self.layers = nnx.List([Block(config, i, rngs) for i in range(config.num_layers)])
        self.final_norm = RMSNorm(config.d_model, config.rms_eps, pd)
        if not config.tie_embeddings:
            self.head = nnx.Param(normal_init(rngs, (config.d_model, config.vocab_size), config.d_model, pd))

    def site_kinds(self) -> dict[str, str]:
        # A tied head reuses `embed`, which the gather needs raw: it is quantized inside qdot.
        return {} if self.config.tie_embeddings else {"head": "lm_head"}

    def __call__(self, tokens_BxL, ctx: Ctx, positions_BxL=None, valid_BxL=None, cache: KVCache | None = None,
                 hidden: bool = False):
        config = self.config
        B, L = tokens_BxL.shape
        dtype = dtype_of(config.dtype)
        valid_BxL = jnp.ones((B, L), bool) if valid_BxL is None else valid_BxL.astype(bool)
        before_BxL = jnp.cumsum(valid_BxL.astype(jnp.int32), axis=1) - 1  # valid tokens before each
        if cache is not None:
            before_BxL = before_BxL + cache.lengths_B[:, None]
        if positions_BxL is None:
            positions_BxL = jnp.maximum(before_BxL, 0)

        # Key visibility: causal, and never a padding key except a token's own slot (so a padding
        # query always sees one key and its softmax stays finite).
        if cache is None:
            q_slot_L = k_slot_S = jnp.arange(L)
            key_valid_BxS = valid_BxL
        else:
            q_slot_L = cache.index + jnp.arange(L)
            k_slot_S = jnp.arange(cache.size)
            key_valid_BxS = jax.lax.dynamic_update_slice_in_dim(cache.valid_BxS, valid_BxL, cache.index, axis=1)
        causal_LxS = k_slot_S[None, :] <= q_slot_L[:, None]
        own_LxS = k_slot_S[None, :] == q_slot_L[:, None]
        mask_BxLxS = causal_LxS[None] & (key_valid_BxS[:, None, :] | own_LxS[None])

        # The embedding is never a quantized site (site "embed" is BF16 in every preset).
        x_BxLxD = embed_lookup(self.embed.get_value(), tokens_BxL).astype(dtype)
        moe_aux = []
        index = None if cache is None else cache.index
        new_kv = []  # with a cache: each layer's (k, v), its new slots written
        # A forward with a cache runs its layers one by one (`KVCache`: a buffer per layer).
        scanned = ctx.scan_layers and cache is None
        runs = layer_runs(config, ctx.recipe) if scanned else [(i, i + 1) for i in range(config.num_layers)]
        for start, stop in runs:
            blocks = list(self.layers)[start:stop]
            kv = None if cache is None else (cache.k[start], cache.v[start])
            x_BxLxD, kv, run_aux = run_blocks(blocks, x_BxLxD, positions_BxL, mask_BxLxS, valid_BxL, ctx, kv, index)
            new_kv.append(kv)
            if run_aux is not None:
                moe_aux.append(run_aux)

        # The head reads the final norm's output in f32 so logits (and the RL log-probs) are never
        # rounded to bf16; a quantized head quantizes that operand anyway.
        h_BxLxD = self.final_norm(x_BxLxD).astype(F32)
        if hidden:  # the caller applies the head, e.g. to chunks of rows (`forward(hidden=True)`)
            logits_BxLxV = (h_BxLxD, functools.partial(self.head_logits, ctx=ctx))
        else:
            logits_BxLxV = self.head_logits(h_BxLxD, ctx)

        k = config.top_k
        if moe_aux:  # each run's aux has a leading [layers of the run] axis
            router_topk = jnp.concatenate([a[0] for a in moe_aux])
            aux_loss = jnp.mean(jnp.concatenate([a[1] for a in moe_aux]))
            expert_load = jnp.concatenate([a[2] for a in moe_aux])
        else:
            router_topk = jnp.zeros((0, B, L, k), jnp.int32)
            aux_loss = jnp.zeros((), F32)
            expert_load = jnp.zeros((0, config.num_experts), F32)
        new_cache = None
        if cache is not None:
            new_cache = KVCache(
                k=tuple(k for k, _ in new_kv), v=tuple(v for _, v in new_kv), valid_BxS=key_valid_BxS,
                lengths_B=cache.lengths_B + jnp.sum(valid_BxL, axis=1, dtype=jnp.int32),
                index=cache.index + L,
            )
        aux = {"router_topk": router_topk, "aux_loss": aux_loss, "expert_load": expert_load, "cache": new_cache}
        return logits_BxLxV, aux

    def head_logits(self, h_xD, ctx: Ctx):
        """The LM head's f32 logits of final-norm outputs h [..., D] (any leading shape)."""
        head = self.embed.get_value().T if self.config.tie_embeddings else self.head.get_value()
        return site_dot(h_xD, head, ctx, "lm_head", None, "lm_head").astype(F32)  # no layer


def init(config: ModelConfig, seed: int):
    """(graphdef, params): the static structure and the parameter tree (an nnx.State pytree)."""
    model = Transformer(config, nnx.Rngs(params=seed))
    graphdef, params = nnx.split(model, nnx.Param)
    return graphdef, params


def graphdef_of(config: ModelConfig):
    """The static structure of `config` without materialising parameters: for a config that
    differs from a checkpoint's only in how it computes (dtype, expert GEMM backend), whose
    parameters then fit as they are."""
    return nnx.split(nnx.eval_shape(lambda: Transformer(config, nnx.Rngs(params=0))), nnx.Param)[0]


def resolve_recipe(recipe) -> PrecisionRecipe:
    return PrecisionRecipe.from_name(recipe) if isinstance(recipe, str) else recipe


def forward(graphdef, params, tokens_BxL, recipe, *, key=None, impl: str = "auto",
            positions=None, cache: KVCache | None = None, valid=None, scan_layers: bool = True,
            remat: bool = False, attention_query_chunk: int = 0, hidden: bool = False):
    """logits_BxLxV float32 and aux, a pure function of (params, tokens, key, cache).

    recipe: PrecisionRecipe (or its name); every linear resolves its SiteConfig from it.
    key: jax.random key, required only when a site runs backward="quantized" on raw weights.
    params: from `init`, or the `sync_weights` qparams (pre-quantized weights, forward only).
    positions: int32 [B, L] RoPE positions; default: see the module docstring.
    cache: a KVCache to append to (prefill or decode); L tokens are written at cache.index.
    valid: bool [B, L], False marks padding tokens (default all True).
    scan_layers: scan each run of identical layers (`layer_runs`) instead of unrolling them;
      the values are the same (tests compare both), the compile time much shorter for deep stacks.
      A forward with a cache runs its layers unrolled whatever this says (`KVCache`).
    remat: per-layer rematerialisation (`jax.checkpoint` of each block, saving only its inputs):
      the backward keeps one layer's intermediates at a time; values and gradients unchanged.
    attention_query_chunk: > 0 computes the cache-free attention for this many queries at a time
      against all keys, each chunk rematerialised in the backward, so no [B, H, L, S] score tensor
      is live; 0 (default) computes all queries at once. A forward with a cache ignores both.
    hidden: return `(h_BxLxD, head)` in place of the logits: the final norm's f32 output and
      `head(h)`, the LM head's f32 logits of any rows of it, for a caller that never holds the
      [B, L, V] logits at once (`fp4rl.rl.chunked_head`).
    aux: router_topk int32 [L_moe, B, L, k] (MoE layers in order), aux_loss f32 () (Switch
      loss, mean over MoE layers, unscaled), expert_load f32 [L_moe, E], cache (KVCache | None).
    """
    recipe = resolve_recipe(recipe)
    tokens_BxL = jnp.asarray(tokens_BxL)
    if tokens_BxL.ndim != 2 or not jnp.issubdtype(tokens_BxL.dtype, jnp.integer):
        raise ValueError(f"tokens must be an integer array [B, L], got {tokens_BxL.dtype} {tokens_BxL.shape}")
    model = nnx.merge(graphdef, params)
    config: ModelConfig = model.config
    if cache is not None and tokens_BxL.shape[1] > cache.size:
        raise ValueError(f"{tokens_BxL.shape[1]} tokens do not fit a cache of {cache.size} slots")
    if cache is None and tokens_BxL.shape[1] > config.max_seq_len:
        raise ValueError(f"sequence length {tokens_BxL.shape[1]} exceeds max_seq_len={config.max_seq_len}")
    if attention_query_chunk < 0:
        raise ValueError(f"attention_query_chunk={attention_query_chunk} must be >= 0 (0: all queries at once)")
    ctx = Ctx(recipe=recipe, num_layers=config.num_layers, impl=impl, key=key, scan_layers=scan_layers, remat=remat,
              attention_query_chunk=attention_query_chunk)
    return model(tokens_BxL, ctx, positions_BxL=positions, valid_BxL=valid, cache=cache, hidden=hidden)


def site_map(graphdef, params, recipe, *, batch: int = 1, length: int = 32):
    """The SiteRecord of every linear (kind, layer, name, SiteConfig), traced without running.

    Shows what a recipe quantizes in this model: selective high precision at a glance.
    """
    recipe = resolve_recipe(recipe)
    key = jax.random.key(0)  # only shapes are traced: the value is never used
    tokens = jnp.zeros((batch, length), jnp.int32)
    with record_sites() as log:  # unrolled: a scanned run would trace (and record) its first layer only
        jax.eval_shape(lambda p: forward(graphdef, p, tokens, recipe, key=key, scan_layers=False), params)
    return list(log)


def flat_params(params) -> dict[str, jax.Array]:
    """The parameter leaves by path, e.g. 'layers/0/mlp/gate_up' (grad-norm groups, counting).

    A pre-quantized weight (qparams) appears as its arrays: '.../gate_up/codes', '.../scales', ...
    """
    def name(entry):
        for attr in ("key", "idx", "name"):  # DictKey, SequenceKey, GetAttrKey
            if hasattr(entry, attr):
                return str(getattr(entry, attr))
        return str(entry)

    out = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        out["/".join(n for n in map(name, path) if n != "value")] = leaf
    return out
