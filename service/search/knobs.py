"""Knob names: made and read here only.

A knob is named "<group>.<kind>.<item>": the group is "g<anchor uid>"; the kind is a tiling
level ("outer": distribution, "inner": vector parallel, "red": vector reduction) or "fuse"; the
item is "d<dim>" for a tile size, "loop" for the outer level's loop kind, or the uid of the
boundary op a fuse switch is for. E.g. "g7.outer.d0", "g7.outer.loop", "g7.fuse.9".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

TileLevel = Literal["outer", "inner", "red"]
KnobKind = Literal["outer", "inner", "red", "fuse"]


def group_name(anchor: int) -> str:
    """The name of the group anchored at op `anchor`."""
    return f"g{anchor}"


def tile_knob(group: str, level: TileLevel, dim: int) -> str:
    return f"{group}.{level}.d{dim}"


def loop_knob(group: str) -> str:
    return f"{group}.outer.loop"


def fuse_knob(group: str, uid: int) -> str:
    return f"{group}.fuse.{uid}"


def group_of(knob: str) -> str:
    """The group a knob belongs to."""
    return knob.partition(".")[0]


def is_fuse_knob(knob: str, group: str) -> bool:
    """Is `knob` one of `group`'s fuse switches."""
    return knob.startswith(f"{group}.fuse.")


@dataclass(frozen=True)
class KnobName:
    """A knob name, read."""

    group: str
    kind: KnobKind
    item: str  # "d<dim>", "loop", or a boundary op's uid

    @classmethod
    def parse(cls, name: str) -> KnobName:
        group, kind, item = name.split(".")
        return cls(group, kind, item)  # type: ignore[arg-type]

    @property
    def role(self) -> tuple[str, str]:
        """What the knob does, whatever its group: the same for a repeated layer's knobs. A fuse
        switch names an op uid, so only its kind counts."""
        return (self.kind, "" if self.kind == "fuse" else self.item)

    def __str__(self) -> str:
        return f"{self.group}.{self.kind}.{self.item}"
