"""Job specs: every example validates, and bad specs fail with the field and the reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.errors import SpecError
from broker.models import Colocate, FabricNeed
from broker.specs import load_spec, parse_spec_text

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))

BASE = "name: t\ngpu: A100\nworkload: {hours: 1}\n"


def test_at_least_five_examples() -> None:
    assert len(EXAMPLES) >= 5


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_validate(path: Path) -> None:
    spec = load_spec(path)
    assert spec.gpus % spec.gpus_per_node == 0


def test_70b_needs_rdma_in_one_cluster() -> None:
    spec = load_spec(EXAMPLES[0].parent / "llama-70b-pretrain.yaml")
    assert (spec.gpus, spec.nodes, spec.fabric, spec.colocate) == (64, 8, FabricNeed.rdma, Colocate.cluster)
    assert "H100-SXM" in spec.gpu and "H200" in spec.gpu


@pytest.mark.parametrize(
    ("text", "field", "words"),
    [
        (BASE + "gpus: 1\ncolour: blue\n", "colour", "unknown field"),
        (BASE + "gpus: -4\n", "gpus", "greater than 0"),
        (BASE + "gpus: 12\ngpus_per_node: 8\n", "gpus_per_node", "multiple of gpus_per_node"),
        # An unknown name shaped like a GPU model is no longer bad input (issue 17: "no market offers" instead).
        ("name: t\ngpu: '#Z80'\ngpus: 1\nworkload: {hours: 1}\n", "gpu", "'#Z80' is not a GPU model name"),
        (BASE + "gpus: 1\nfabric: carrier-pigeon\n", "fabric", "infiniband"),
        (BASE + "gpus: 1\ndeadline_in: soon\n", "deadline_in", "not a duration"),
        ("name: t\ngpu: A100\ngpus: 1\nworkload: {}\n", "workload", "reference_gpu_hours"),
    ],
)
def test_bad_specs_name_field_and_reason(text: str, field: str, words: str) -> None:
    with pytest.raises(SpecError) as exc:
        parse_spec_text(text)
    assert exc.value.field == field
    assert words in exc.value.reason


def test_malformed_yaml_says_where() -> None:
    with pytest.raises(SpecError, match=r"malformed YAML at line \d+, column \d+: expected"):
        parse_spec_text("name: t\ngpu: [A100\nfoo: {")


def test_gpu_family_expands_and_default_layout() -> None:
    spec = parse_spec_text(BASE + "gpus: 16\n")
    assert spec.gpus_per_node == 8 and spec.nodes == 2
    assert set(spec.gpu) == {"A100-SXM-80GB", "A100-SXM-40GB", "A100-PCIe-80GB", "A100-PCIe-40GB"}


def test_json_spec_is_accepted() -> None:
    spec = parse_spec_text('{"name": "j", "gpu": "H100", "gpus": 8, "workload": {"hours": 2}}')
    assert spec.gpu == ["H100-SXM", "H100-NVL", "H100-PCIe"]
