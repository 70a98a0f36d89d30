"""`tilesearch job submit MODEL` against a real server: IREE forms the model's dispatches on the
client and only they are sent, so a model whose weights are larger than the server takes in one
request is still one job."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from test_cli_server_errors import _serve, cli
from test_model_dispatches import _with_weight

pytestmark = pytest.mark.slow

LIMIT = 256 * 1024


def test_a_model_with_weights_over_the_servers_limit_is_submitted_as_its_dispatches(tmp_path: Path) -> None:
    model = tmp_path / "model.mlir"
    model.write_text(_with_weight(256, 512))  # a 512 KiB weight inside, printed as 1 MiB of hex
    assert model.stat().st_size > 4 * LIMIT
    with _serve(tmp_path, migrated=True, TILESEARCH_MAX_BODY_BYTES=str(LIMIT)) as base:
        sent_whole = httpx.post(f"{base}/v1/jobs", json={"model": model.read_text(), "hardware": "host-cpu"}, timeout=30)
        assert sent_whole.status_code == 413  # what `job submit` sent before

        code, stderr = cli("job", "submit", str(model), "--hardware", "host-cpu", "--budget", "2", "--server", base,
                           cwd=tmp_path)
        assert code == 0, stderr
        assert "forming model.mlir's dispatches with IREE" in stderr and "1 items" in stderr
        job = httpx.get(f"{base}/v1/jobs/{stderr.split('job ')[-1].split(':')[0]}", timeout=30).json()
        assert job["kind"] == "model" and job["notes"] == {"left_to_iree": []}
        (item,) = job["items_detail"]
        assert "matmul_16x512x256" in item["name"] and item["weight"] == 1

        code, stderr = cli("job", "watch", str(job["id"]), "--server", base, cwd=tmp_path)
        assert code == 0, stderr


def test_a_model_with_nothing_to_tune_is_refused_before_any_request(tmp_path: Path) -> None:
    model = tmp_path / "model.mlir"
    model.write_text("""
func.func @main(%x: tensor<64xf32>) -> tensor<64xf32> {
  %e = tensor.empty() : tensor<64xf32>
  %y = linalg.generic {indexing_maps = [affine_map<(d0) -> (d0)>, affine_map<(d0) -> (d0)>],
                       iterator_types = ["parallel"]} ins(%x : tensor<64xf32>) outs(%e : tensor<64xf32>) {
  ^bb0(%a: f32, %o: f32):
    %r = math.exp %a : f32
    linalg.yield %r : f32
  } -> tensor<64xf32>
  return %y : tensor<64xf32>
}
""")
    code, stderr = cli("job", "submit", str(model), "--hardware", "host-cpu", "--server", "http://127.0.0.1:9",
                       cwd=tmp_path)
    assert code == 2, stderr
    assert "model.mlir has no dispatch tilesearch tunes" in stderr and "cannot reach" not in stderr


def test_a_model_with_dynamic_inputs_is_submitted_sized_by_its_shape_hints(tmp_path: Path) -> None:
    from test_model_static_shapes import DYNAMIC_MLP

    model = tmp_path / "mlp.mlir"
    model.write_text(DYNAMIC_MLP)
    code, stderr = cli("job", "submit", str(model), "--hardware", "host-cpu", "--server", "http://127.0.0.1:9",
                       cwd=tmp_path)
    # Refused before any request, naming the inputs to size and the flag that sizes them.
    assert code == 2 and "every dispatch IREE formed from mlp.mlir has dynamic shapes" in stderr, stderr
    assert "--shape-hint arg0=1x64" in stderr and "cannot reach" not in stderr
    with _serve(tmp_path, migrated=True) as base:
        code, stderr = cli("job", "submit", str(model), "--hardware", "host-cpu", "--budget", "2", "--server", base,
                           "--shape-hint", "arg0=16x64", cwd=tmp_path)
        assert code == 0, stderr
        sized = tmp_path / "mlp.sized.mlir"
        assert f"wrote {sized.name}" in stderr and "tensor<16x64xf32>" in sized.read_text()
        job = httpx.get(f"{base}/v1/jobs/{stderr.split('job ')[-1].split(':')[0]}", timeout=30).json()
        assert job["options"]["shape_hints"] == {"arg0": [16, 64]} and job["options"]["sized_model"] == sized.name
        assert sorted(i["name"].rsplit("_", 2)[-2] for i in job["items_detail"]) == ["16x128x64", "16x64x128"]
    code, stderr = cli("job", "submit", str(tmp_path), "--hardware", "host-cpu", "--shape-hint", "arg0=16x64",
                       "--server", "http://127.0.0.1:9", cwd=tmp_path)
    assert code == 2 and "a directory's modules are tuned as written" in stderr, stderr
    # Where the sized model goes is checked before IREE runs (a missing directory was a traceback).
    for given, said in (("nodir/out.mlir", "its directory nodir does not exist"), (".", "is a directory"),
                        ("out.onnx", "the sized model is written as MLIR"), (str(model), "is the model itself")):
        code, stderr = cli("job", "submit", str(model), "--hardware", "host-cpu", "--shape-hint", "arg0=16x64",
                           "--sized-model", given, "--server", "http://127.0.0.1:9", cwd=tmp_path)
        assert code == 2 and said in stderr and "forming" not in stderr and "Traceback" not in stderr, (given, stderr)
    code, stderr = cli("job", "submit", str(model), "--hardware", "host-cpu", "--sized-model", "out.mlir",
                       "--server", "http://127.0.0.1:9", cwd=tmp_path)
    assert code == 2 and "give --shape-hint too" in stderr, stderr
