"""Tile-and-fuse plans: the JSON contract between search, IR core, store and API."""

from __future__ import annotations

import hashlib
import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt


class Level(BaseModel):
    """One tiling level: sizes over the ANCHOR's loop dims (0 = not tiled) and the loop kind."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tile_sizes: list[NonNegativeInt] = Field(min_length=1)
    loop: Literal["forall", "for"] = "for"


class Group(BaseModel):
    """An anchor op, the ops fused with it (producers and consumers), levels outermost first."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    anchor: NonNegativeInt
    fuse: list[NonNegativeInt] = Field(default_factory=list)
    levels: list[Level] = Field(min_length=1)

    @property
    def members(self) -> list[int]:
        return [self.anchor, *self.fuse]


class Plan(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    groups: list[Group] = Field(default_factory=list)

    def canonical_json(self) -> str:
        """Stable text: groups by anchor, fused uids sorted; the basis of `plan_hash`."""
        groups = sorted(
            (
                {"anchor": g.anchor, "fuse": sorted(g.fuse), "levels": [lv.model_dump() for lv in g.levels]}
                for g in self.groups
            ),
            key=lambda g: g["anchor"],
        )
        return json.dumps({"groups": groups}, sort_keys=True, separators=(",", ":"))

    def plan_hash(self) -> str:
        return hashlib.sha256(self.canonical_json().encode()).hexdigest()[:16]
