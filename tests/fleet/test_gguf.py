"""docs/seeds.md, "Estimating a GGUF model's memory": weights, KV cache for the context, and a stated compute
allowance, from GGUF files these tests write with the same `gguf` package (llama.cpp's)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import typer
import yaml
from gguf import GGUFWriter
from typer.testing import CliRunner

from cli.plan import plan
from fleet.deployment import GgufModel
from fleet.gguf import GgufError, read_facts
from scheduler.deployment.estimate import estimate
from workflows.deployment.spec import InvalidSpec, check_manifest

app = typer.Typer(add_completion=False)
app.command()(plan)
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "modelplane"


def write_gguf(
    path: Path,
    *,
    layers: int = 2,
    context: int = 4096,
    heads: int = 8,
    kv_heads: int | None = 2,
    embedding: int = 64,
    key_length: int | None = None,
) -> Path:
    """A tiny llama-architecture file: two tensors (32x64 f16, 64x64 f32: 4,096 + 16,384 bytes)."""
    writer = GGUFWriter(str(path), "llama")
    writer.add_block_count(layers)
    writer.add_context_length(context)
    writer.add_embedding_length(embedding)
    writer.add_head_count(heads)
    if kv_heads is not None:
        writer.add_head_count_kv(kv_heads)
    if key_length is not None:
        writer.add_key_length(key_length)
        writer.add_value_length(key_length)
    writer.add_tensor("token_embd.weight", np.zeros((32, 64), dtype=np.float16))
    writer.add_tensor("blk.0.attn_q.weight", np.zeros((64, 64), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_the_estimate_is_weights_plus_kv_cache_for_the_context_plus_the_compute_allowance(tmp_path: Path) -> None:
    facts = read_facts(write_gguf(tmp_path / "m.gguf"))
    assert (facts.architecture, facts.layers, facts.kv_heads, facts.key_length, facts.weight_bytes) == (
        "llama",
        2,
        2,
        8,
        4096 + 16384,
    )
    found = estimate(facts, GgufModel(file="m.gguf"))
    # KV: 2 layers x 4,096 tokens (the model's own context) x 2 KV heads x (8 + 8) head lengths x 2 bytes (f16)
    assert (found.weights, found.kv_cache, found.compute) == (20480, 2 * 4096 * 2 * 16 * 2, 1024**3)
    assert found.total == 20480 + 524288 + 1024**3
    assert found.quantity == "1025Mi"  # rounded up to whole MiB
    # A longer context and a q8_0 cache (32 values in 34 bytes); an explicit key length.
    longer = estimate(
        read_facts(write_gguf(tmp_path / "k.gguf", key_length=32)),
        GgufModel(file="k.gguf", contextLength=32768, cacheType="q8_0", computeBuffer="0"),
    )
    assert longer.kv_cache == int(2 * 32768 * 2 * (32 + 32) * 34 / 32)
    assert longer.compute == 0


def test_without_kv_heads_every_head_keeps_its_keys_and_values(tmp_path: Path) -> None:
    facts = read_facts(write_gguf(tmp_path / "mha.gguf", kv_heads=None))
    assert facts.kv_heads == 8


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "no such file"),
        (b"not a gguf file at all", "not a readable GGUF file"),
    ],
)
def test_a_file_that_cannot_be_estimated_says_why(tmp_path: Path, content: bytes | None, message: str) -> None:
    path = tmp_path / "bad.gguf"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(GgufError, match=message):
        read_facts(path)


def test_a_file_missing_what_the_estimate_needs_names_the_key(tmp_path: Path) -> None:
    writer = GGUFWriter(str(tmp_path / "partial.gguf"), "llama")
    writer.add_embedding_length(64)
    writer.add_head_count(8)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(GgufError, match="llama.block_count is missing or not a positive whole number"):
        read_facts(tmp_path / "partial.gguf")


def _deployment(gguf: dict[str, Any]) -> dict[str, Any]:
    member = {"role": "Standalone", "resources": {"gguf": gguf, "backend": "vllm"}}
    return {
        "apiVersion": "modelplane.ai/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": "tiny"},
        "spec": {"replicas": 1, "template": {"spec": {"engines": [{"name": "serve", "members": [member]}]}}},
    }


def test_berth_plan_places_a_gguf_member_by_its_estimate_and_shows_its_parts(tmp_path: Path) -> None:
    model = write_gguf(tmp_path / "tiny.gguf")
    # 150Gi of compute allowance: more than one 141Gi H200, so the fit takes two GPUs of one node (step 2)
    deployment = tmp_path / "d.yaml"
    deployment.write_text(yaml.safe_dump(_deployment({"file": str(model), "computeBuffer": "150Gi"})))
    result = CliRunner().invoke(app, ["-f", str(EXAMPLES / "fleet.yaml"), "-f", str(deployment), "-o", "json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)["plans"][0]
    assert document["memoryEstimates"]["serve/0"] == {
        "file": str(model),
        "contextLength": 4096,
        "cacheType": "f16",
        "weights": 20480,
        "kvCache": 524288,
        "compute": 150 * 1024**3,
        "total": 20480 + 524288 + 150 * 1024**3,
        "gpuMemory": "153601Mi",
    }
    assert document["status"]["phase"] == "FullyScheduled"
    assert document["replicas"][0]["engines"][0]["members"][0]["fit"] == "GpusOfOneNode"
    text = CliRunner().invoke(app, ["-f", str(EXAMPLES / "fleet.yaml"), "-f", str(deployment)])
    assert (
        "# tiny serve/0: GGUF estimate 150.00Gi = weights 0.00Gi + KV cache 0.00Gi (4096 tokens, f16) + "
        "compute 150.00Gi" in text.output
    )


def test_berth_plan_with_a_missing_gguf_file_exits_2_naming_it(tmp_path: Path) -> None:
    deployment = tmp_path / "d.yaml"
    deployment.write_text(yaml.safe_dump(_deployment({"file": str(tmp_path / "gone.gguf")})))
    result = CliRunner().invoke(app, ["-f", str(EXAMPLES / "fleet.yaml"), "-f", str(deployment)])
    assert result.exit_code == 2
    assert f"ModelDeployment tiny: {tmp_path / 'gone.gguf'}: no such file" in result.output


def test_the_control_plane_refuses_a_gguf_member_and_says_what_to_give_instead() -> None:
    with pytest.raises(InvalidSpec) as refused:
        check_manifest(_deployment({"file": "/models/tiny.gguf"}))
    assert [(p.field, p.message) for p in refused.value.problems] == [
        (
            "spec.template.spec.engines[0].members[0].resources.gguf",
            "is read by `berth plan` only; give resources.gpuMemory (the estimate `berth plan` prints)",
        )
    ]


def test_a_negative_compute_allowance_is_refused() -> None:
    with pytest.raises(InvalidSpec) as refused:
        check_manifest(_deployment({"file": "m.gguf", "computeBuffer": "-1Gi"}))
    assert "'-1Gi' is negative: an allowance is 0 or more" in refused.value.problems[0].message


def test_a_member_gives_exactly_one_of_gpu_memory_and_gguf() -> None:
    both = _deployment({"file": "m.gguf"})
    both["spec"]["template"]["spec"]["engines"][0]["members"][0]["resources"]["gpuMemory"] = "10Gi"
    with pytest.raises(InvalidSpec) as refused:
        check_manifest(both)
    assert "give exactly one of gpuMemory and gguf" in refused.value.problems[0].message
