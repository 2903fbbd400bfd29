"""Distributed helpers of the torch integration: where this process sits among training
processes (`capture_replica`), and rank 0's seed and plan shared with every rank (`_agree`).

Boundary: torch.distributed and the torchrun environment variables only; nothing about datasets,
plans or readers (the plan's fingerprint arrives as a dict). Docs: docs/distributed.md.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch.distributed as torch_distributed
from torch.utils.data import get_worker_info

from datasetrt.errors import ConfigError


@dataclass(frozen=True)
class Replica:
    """This process's place among training processes: `rank` of `world_size`, `local_world_size`
    processes on this machine, and whether a torch.distributed group is initialised (`group`)."""

    rank: int
    world_size: int
    local_world_size: int
    group: bool


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    if value is None or value.strip() == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"environment variable {name}={value!r} is not an integer") from None


def capture_replica() -> Replica:
    """Rank and world size from the initialised default torch.distributed group, else from the
    torchrun environment variables (RANK, WORLD_SIZE), else (0, 1); LOCAL_WORLD_SIZE (between 1
    and the world size) or the world size counts the processes sharing this machine's CPUs."""
    if get_worker_info() is not None:
        raise RuntimeError("capture_replica must run before DataLoader workers start")
    dist = torch_distributed
    group = dist.is_available() and dist.is_initialized()
    if group:
        rank, world = dist.get_rank(), dist.get_world_size()
    else:
        env_rank, env_world = _env_int("RANK"), _env_int("WORLD_SIZE")
        if env_rank is None or env_world is None:
            rank, world = 0, 1
        elif not (env_world >= 1 and 0 <= env_rank < env_world):
            raise ConfigError(f"RANK={env_rank} and WORLD_SIZE={env_world} must satisfy 0 <= RANK < WORLD_SIZE")
        else:
            rank, world = env_rank, env_world
    local = _env_int("LOCAL_WORLD_SIZE")
    if local is None:
        local = world
    elif not 1 <= local <= world:
        raise ConfigError(f"LOCAL_WORLD_SIZE must be between 1 and the world size {world}, got {local}")
    return Replica(rank, world, local, group)


def _agree(replica: Replica, fingerprint: dict, candidate: int | None) -> int | None:
    """Broadcast rank 0's (seed, plan fingerprint) to every rank (one `broadcast_object_list`);
    return rank 0's seed, or refuse on a rank whose plan differs from rank 0's."""
    objects: list[tuple[int | None, dict] | None] = [(candidate, fingerprint)] if replica.rank == 0 else [None]
    torch_distributed.broadcast_object_list(objects, src=0)
    received = objects[0]  # rank 0's pair on every rank once the broadcast returns
    if received is None:
        raise RuntimeError("broadcast_object_list returned without rank 0's seed and plan")
    seed, theirs = received
    for key, value in fingerprint.items():
        if theirs.get(key) != value:
            raise ConfigError(
                f"to_torch_dataloader on rank {replica.rank} differs from rank 0: {key} "
                f"(rank 0 {theirs.get(key)!r}, here {value!r}); every rank must build the same plan"
            )
    return seed
