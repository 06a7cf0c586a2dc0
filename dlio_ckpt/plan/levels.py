"""Multi-level checkpointing as pure rules: which level a checkpoint goes to, which ranks share a
node, and which checkpoints a flush must copy.

The rules follow SCR (../shared/docs/checkpoint-techniques.md, "Multi-level checkpointing"):
levels are listed fastest first, each with an interval `every` counted in checkpoints, and
checkpoint number n (counted from 1) goes to the level with the largest interval that divides n.
A level written by a flush (DeepFreeze's fast-then-PFS path, SCR's flush to the PFS) is not
written by the training ranks: the checkpoint goes to the first level and is then copied, so it
lives on both. Nothing here touches a file; engines decide with these values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence


@dataclass(frozen=True)
class Placement:
    """Where checkpoint number n goes: written directly to level `write`, then flushed (copied)
    from that level to each level in `flush`."""

    write: int
    flush: tuple[int, ...] = ()


def level_for(number: int, intervals: Sequence[int]) -> int:
    """SCR's rule: the level (index into `intervals`) with the largest interval dividing `number`.
    `number` counts checkpoints from 1; intervals are strictly increasing and the first is 1,
    so there is always one."""
    if number < 1:
        raise ValueError(f"checkpoint numbers count from 1 (got {number})")
    chosen = 0
    for level, every in enumerate(intervals):
        if number % every == 0 and every >= intervals[chosen]:
            chosen = level
    return chosen


def placement(number: int, intervals: Sequence[int], flushed: Sequence[bool]) -> Placement:
    """Checkpoint `number`'s placement; `flushed[i]`: level i is filled by a flush from level 0
    instead of being written by the ranks (level 0 itself is always written)."""
    level = level_for(number, intervals)
    if level and flushed[level]:
        return Placement(write=0, flush=(level,))
    return Placement(write=level)


def node_of(rank: int, ranks_per_node: int, host_index: Sequence[int] = ()) -> int:
    """The node that `rank` runs on: consecutive blocks of `ranks_per_node` ranks (emulated node
    boundaries on one machine), or, when `ranks_per_node` is 0, the node index of its host
    (`host_index[rank]`, the real boundaries; a serial run is node 0)."""
    if ranks_per_node > 0:
        return rank // ranks_per_node
    return host_index[rank] if host_index else 0


def ranks_on_node(node: int, size: int, ranks_per_node: int, host_index: Sequence[int] = ()) -> frozenset[int]:
    """Every rank of a job of `size` ranks that runs on `node`."""
    return frozenset(rank for rank in range(size) if node_of(rank, ranks_per_node, host_index) == node)


def node_count(size: int, ranks_per_node: int, host_index: Sequence[int] = ()) -> int:
    """Nodes a job of `size` ranks spans (at least 1)."""
    return max((node_of(rank, ranks_per_node, host_index) for rank in range(size)), default=0) + 1


def host_indices(hosts: Sequence[str]) -> list[int]:
    """Each rank's node index from its host name (hosts numbered in order of first appearance)."""
    numbers: dict[str, int] = {}
    return [numbers.setdefault(host, len(numbers)) for host in hosts]


def to_copy(step: int, chain: Iterable[int], present: Iterable[int]) -> list[int]:
    """What a flush of checkpoint `step` copies: it and the members of its chain (`chain`: the steps
    of the earlier checkpoints an encoded checkpoint needs, as its manifest lists them) that the
    target level does not hold yet (`present`: its complete checkpoints), oldest first, so that a
    chain member's manifest is on the target before that of the checkpoint that needs it."""
    have = set(present)
    return sorted({s for s in chain if s not in have} | {step})
