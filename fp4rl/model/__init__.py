"""Functional Flax (NNX) MoE transformer, KV-cache sampler, weight sync and HF import."""

from fp4rl.model.config import ModelConfig, ParamCount
from fp4rl.model.hf import from_pretrained
from fp4rl.model.sampler import SampleOutput, SamplerConfig, generate
from fp4rl.model.sites import SiteRecord, record_sites
from fp4rl.model.sync import sync_weights, sync_weights_jit
from fp4rl.model.transformer import KVCache, flat_params, forward, init, init_cache, site_map

__all__ = [
    "KVCache", "ModelConfig", "ParamCount", "SampleOutput", "SamplerConfig", "SiteRecord",
    "flat_params", "forward", "from_pretrained", "generate", "init", "init_cache",
    "record_sites", "site_map", "sync_weights", "sync_weights_jit",
]
