"""Plans and hardware the cost-model tests share (tests/test_cost*.py)."""

from service.hardware.cost import Cost, estimate_cost
from service.hardware.model import HardwareModel
from service.hardware.profiles import get_profile
from service.ir.graph import tag_tileable_ops
from service.ir.mlir import context
from service.ir.parse import parse_module
from service.ir.plan import Plan
from service.ir.transform import apply_plan

from _shared import WORKLOADS, reference_host


def cost_of(workload: str, anchor: int, fuse: list[int], levels: list[tuple[list[int], str]], hw: str = "host-cpu") -> Cost:
    plan = Plan.model_validate({"groups": [{"anchor": anchor, "fuse": fuse, "levels": [{"tile_sizes": t, "loop": k} for t, k in levels]}]})
    with context():
        tagged = tag_tileable_ops(parse_module((WORKLOADS / f"{workload}.mlir").read_text()))
        tiled = apply_plan(tagged, plan).module
        return estimate_cost(tiled, get_profile(hw), original=tagged)


GOOD_MATMUL = [([64, 64, 0], "forall"), ([8, 32, 0], "for"), ([0, 0, 16], "for")]


def matmul_plan(dist: list[int], vec: list[int], red: int) -> Plan:
    return Plan.model_validate({"groups": [{"anchor": 1, "fuse": [0], "levels": [
        {"tile_sizes": dist + [0], "loop": "forall"},
        {"tile_sizes": vec + [0], "loop": "for"},
        {"tile_sizes": [0, 0, red], "loop": "for"}]}]})


def avx512_host() -> HardwareModel:
    """The AVX-512 reference host's profile, whatever machine runs the tests: the register-tile
    numbers assume AVX-512."""
    return reference_host()
