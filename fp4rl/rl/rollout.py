"""Rollouts: group sampling, rewards, dynamic sampling, and the training batch (host side).

Rewards need the verifier (string parsing), so they are computed on the host between the
compiled sampler and the compiled update. Dynamic sampling (DAPO) drops groups whose
correctness is all equal (no learning signal) and keeps drawing generation batches, up to a
bound, until every seed has `prompts_per_step` kept groups. A seed that is still short after
the last batch fills the remaining slots with dropped groups masked out of the loss, and
the metric `dapo/filled_frac` says how full its batch was.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from fp4rl.rl import dapo, verifier
from fp4rl.rl.codec import CHAR, TextCodec, decode_batch


@dataclasses.dataclass
class Generation:
    """One generation batch of one seed (numpy). Rows are prompt-major: row p*G + g."""

    prompt_ids_NxTp: np.ndarray
    prompt_mask_NxTp: np.ndarray
    response_NxTr: np.ndarray
    logp_NxTr: np.ndarray
    lengths_N: np.ndarray
    router_topk: np.ndarray  # [L_moe, N, Tr, k]
    answers_P: np.ndarray


def score(gen: Generation, group_size: int, max_new_tokens: int, overlong_buffer: int, codec: TextCodec = CHAR):
    """(correct_PxG in {+1,-1}, shaped_PxG): verifier reward on the text `codec` decodes (up to
    the first stop id), plus DAPO's overlong shaping."""
    texts = decode_batch(codec, gen.response_NxTr)
    answers = np.repeat(gen.answers_P, group_size)
    correct = np.array([verifier.reward(t, int(a)) for t, a in zip(texts, answers)], np.float32)
    shaping = np.asarray(verifier.overlong_penalty(gen.lengths_N, max_new_tokens, overlong_buffer), np.float32)
    p = len(gen.answers_P)
    return correct.reshape(p, group_size), (correct + shaping).reshape(p, group_size)


@dataclasses.dataclass
class GroupPool:
    """Kept groups of one seed, accumulated over generation batches."""

    capacity: int
    groups: list = dataclasses.field(default_factory=list)  # (Generation, p, shaped_G, keep)
    generated: int = 0
    dropped: int = 0
    correct: int = 0  # sampled responses that were right, over every generation batch
    sampled: int = 0
    reward_sum: float = 0.0  # shaped reward of every sampled response
    last: tuple | None = None  # (Generation, shaped_PxG, keep_P) of the latest batch

    def add(self, gen: Generation, correct_PxG, shaped_PxG) -> None:
        keep = np.asarray(dapo.dynamic_sampling_keep(correct_PxG))
        self.correct += int((correct_PxG > 0).sum())
        self.sampled += correct_PxG.size
        self.reward_sum += float(np.sum(shaped_PxG))
        self.generated += len(keep)
        self.dropped += int((~keep).sum())
        for p in np.flatnonzero(keep):
            if len(self.groups) < self.capacity:
                self.groups.append((gen, p, shaped_PxG[p], True))
        self.last = (gen, shaped_PxG, keep)

    @property
    def accuracy(self) -> float:
        """Population accuracy: all sampled responses, before dynamic sampling drops any."""
        return self.correct / max(self.sampled, 1)

    @property
    def reward_mean(self) -> float:
        """Population reward (shaped): all sampled responses, before dynamic sampling drops any."""
        return self.reward_sum / max(self.sampled, 1)

    @property
    def full(self) -> bool:
        return len(self.groups) >= self.capacity

    def filled(self) -> list:
        """The kept groups, padded with masked-out dropped groups up to capacity."""
        groups = list(self.groups)
        gen, shaped, keep = self.last
        for p in np.flatnonzero(~keep):
            if len(groups) >= self.capacity:
                break
            groups.append((gen, p, shaped[p], False))
        p = 0
        while len(groups) < self.capacity:  # only when a batch has fewer prompts than capacity
            groups.append((gen, p % len(keep), shaped[p % len(keep)], False))
            p += 1
        return groups


def balanced(groups: list, mini_batches: int) -> list:
    """Reorder `filled()` groups so that consecutive slices of len/mini_batches groups (the
    mini-batches) each get an equal share, +-1, of the kept groups: group i goes to mini-batch
    i % mini_batches. `filled()` lists the kept groups first, so without this a step that kept
    half the groups or fewer would give its last mini-batch none (an update on momentum alone)."""
    if len(groups) % mini_batches:
        raise ValueError(f"{len(groups)} groups do not split into {mini_batches} equal mini-batches")
    return [groups[i] for m in range(mini_batches) for i in range(m, len(groups), mini_batches)]


def training_arrays(groups: list, group_size: int) -> dict[str, np.ndarray]:
    """Stack the selected groups into the rollout arrays of one seed (N = groups * G rows)."""
    rows = {k: [] for k in ("tokens", "valid", "response_mask", "logp_sampler", "router_topk", "shaped", "used")}
    for gen, p, shaped_G, used in groups:
        sl = slice(p * group_size, (p + 1) * group_size)
        prompt, pmask, resp = gen.prompt_ids_NxTp[sl], gen.prompt_mask_NxTp[sl], gen.response_NxTr[sl]
        tr = resp.shape[1]
        rmask = (np.arange(tr)[None, :] < gen.lengths_N[sl][:, None]) & used
        rows["tokens"].append(np.concatenate([prompt, resp], axis=1))
        rows["valid"].append(np.concatenate([pmask, np.arange(tr)[None, :] < gen.lengths_N[sl][:, None]], axis=1))
        rows["response_mask"].append(rmask)
        rows["logp_sampler"].append(gen.logp_NxTr[sl])
        rows["router_topk"].append(gen.router_topk[:, sl])
        rows["shaped"].append(shaped_G)
        rows["used"].append(np.full(group_size, used))
    out = {k: np.concatenate(v, axis=1 if k == "router_topk" else 0) for k, v in rows.items()}
    # every group's advantages at once (a group's own row: the same values as one at a time);
    # masked-out fillers get 0
    advantages = dapo.group_advantages(out["shaped"].reshape(len(groups), group_size)).reshape(-1)
    out["advantages"] = np.where(out["used"], advantages, np.float32(0))
    return out


def routing_flip_rate(sampler_topk, trainer_topk, response_mask_NxTr) -> float:
    """Fraction of (MoE layer, response token) pairs whose top-k expert SET differs."""
    a = np.sort(np.asarray(sampler_topk), axis=-1)
    b = np.sort(np.asarray(trainer_topk), axis=-1)
    differs = np.any(a != b, axis=-1)  # [L_moe, N, Tr]
    mask = np.broadcast_to(np.asarray(response_mask_NxTr)[None], differs.shape)
    return float(differs[mask].mean()) if mask.any() else 0.0
