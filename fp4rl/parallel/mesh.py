"""`MeshConfig` and `make_mesh`: the 2-D device mesh (data, expert) of a run.

Axis "data" splits the batch (prompts x samples, or SFT sequences); axis "expert" splits the
routed experts of every MoE layer and, like most expert-parallel designs (GShard, DeepSpeed-MoE),
also splits the batch for everything that is not a routed expert: the batch is sharded over
both axes, so data * expert devices each hold 1/(data * expert) of the rows. A 1 x 1 mesh is
the single-device program, unchanged (no mesh context is entered at all).

Multi-host: call `jax.distributed.initialize()` before the first `jax.devices()`; the mesh is
then built over `jax.devices()` (all processes' devices) exactly as on one host.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
from jax.sharding import AxisType, Mesh

DATA, EXPERT = "data", "expert"
AXES = (DATA, EXPERT)


def _factorisations(n: int) -> list[str]:
    return [f"--mesh.data={d} --mesh.expert={n // d}" for d in range(1, n + 1) if n % d == 0]


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """data x expert devices (their product must divide the device count; the first
    data * expert devices are used). expert must divide the model's num_experts (checked by
    `check_experts` once the model is known)."""

    data: int = 1
    expert: int = 1

    def __post_init__(self):
        if self.data < 1 or self.expert < 1:
            raise ValueError(f"mesh.data={self.data} and mesh.expert={self.expert} must be >= 1")

    @property
    def size(self) -> int:
        return self.data * self.expert

    @property
    def trivial(self) -> bool:
        """One device: the code paths of a run without a mesh."""
        return self.size == 1

    def check_devices(self, num_devices: int) -> None:
        if num_devices % self.size:
            raise ValueError(f"mesh.data={self.data} x mesh.expert={self.expert} = {self.size} devices must divide the "
                             f"{num_devices} available; valid options using all of them: "
                             f"{'; '.join(_factorisations(num_devices))} (or any product dividing {num_devices})")

    def check_experts(self, num_experts: int) -> None:
        if num_experts % self.expert:
            valid = [e for e in range(1, num_experts + 1) if num_experts % e == 0]
            raise ValueError(f"mesh.expert={self.expert} must divide num_experts={num_experts}; valid options: {valid}")

    def check_rows(self, rows: int, what: str) -> None:
        """The batch is split over data x expert devices: `rows` must be a multiple of it."""
        if rows % self.size:
            raise ValueError(f"{what}={rows} must be a multiple of mesh.data * mesh.expert = {self.size} "
                             "(every device takes an equal share of the rows)")


def make_mesh(config: MeshConfig, devices=None) -> Mesh:
    """The (data, expert) mesh over the first data * expert of `devices` (default jax.devices()).

    Axes are `AxisType.Auto`: jit propagates shardings (GSPMD) outside the MoE's shard_map."""
    devices = jax.devices() if devices is None else list(devices)
    config.check_devices(len(devices))
    grid = np.asarray(devices[: config.size], dtype=object).reshape(config.data, config.expert)
    return Mesh(grid, AXES, axis_types=(AxisType.Auto, AxisType.Auto))


def active_mesh():
    """The (abstract) mesh of the enclosing `jax.set_mesh` when it is a sharded (data, expert) mesh,
    else None. It is part of jit's trace context, so a program traced under a mesh is never reused
    without one (and the reverse)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or set(mesh.axis_names) != set(AXES) or mesh.size == 1:
        return None
    return mesh
