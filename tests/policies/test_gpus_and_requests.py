"""Issue 17 items 3-4: today's GPUs, runtimes that keep AMD and NVIDIA apart, and flexible requests
ranked by job cost — with the cost model's numbers checked by hand."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from broker.errors import SpecError
from broker.gpus import GPU_SPECS, Runtime, Vendor, accepted_models, looks_like_gpu, normalise_gpu, resolve_request
from broker.models import Colocate, Fabric, IntraNode, Locality, Market, Network, Offer, runtime_of_image
from broker.perf import MFU
from broker.specs import parse_spec, parse_spec_text
from policies.book import OfferBook
from policies.ranking import quote
from providers.catalog.offers import catalog_offers

NOW = datetime(2026, 12, 1, tzinfo=UTC)


def offer(oid: str, gpu: str, price: float, **kw: object) -> Offer:
    base: dict = dict(id=oid, provider="neo", market=Market.on_demand, sku=f"8x{gpu}", gpu=gpu, gpu_count=8,
                      usd_per_hour=price, max_nodes=1, colocation=Colocate.node,
                      locality=Locality(provider="neo", region="us-east"),
                      network=Network(intra=IntraNode.nvlink, fabric=Fabric.ethernet, fabric_gbps=100))
    base.update(kw)
    return Offer(**base)


# --------------------------------------------------------------------------- the GPU table


@pytest.mark.parametrize(("name", "vendor", "memory"), [
    ("B300", Vendor.nvidia, 288), ("GB300", Vendor.nvidia, 288), ("B200", Vendor.nvidia, 180),
    ("GB200", Vendor.nvidia, 186), ("GH200", Vendor.nvidia, 96), ("H200", Vendor.nvidia, 141),
    ("H20", Vendor.nvidia, 96), ("L20", Vendor.nvidia, 48), ("L40S", Vendor.nvidia, 48),
    ("RTX-PRO-6000", Vendor.nvidia, 96), ("MI300X", Vendor.amd, 192), ("MI325X", Vendor.amd, 256),
    ("MI355X", Vendor.amd, 288), ("W7900", Vendor.amd, 48),
])
def test_todays_parts_are_known_with_vendor_memory_and_peak(name: str, vendor: Vendor, memory: float) -> None:
    spec = GPU_SPECS[name]
    assert (spec.vendor, spec.memory_gb) == (vendor, memory)
    assert spec.tflops_bf16 > 100 and spec.mem_bw_gbps > 800 and spec.interconnect_gbps > 0
    assert spec.runtime is (Runtime.rocm if vendor is Vendor.amd else Runtime.cuda)


def test_every_table_row_names_its_source() -> None:
    from pathlib import Path

    import broker.gpus as module

    text = Path(module.__file__).read_text()
    table = text[text.index("_SPECS: tuple"):text.index("GPU_SPECS: dict")]
    rows = [line for line in table.splitlines() if line.strip().startswith("GpuSpec(")]
    assert len(rows) == len(GPU_SPECS)
    last = ""
    for line in table.splitlines():  # a row follows its source comment, or a row under the same comment
        stripped = line.strip()
        if stripped.startswith("#"):
            last = "comment"
        elif stripped.startswith("GpuSpec("):
            assert last in ("comment", "row"), line
            last = "row"
    sources = [x for x in table.splitlines() if x.strip().startswith("#") and
               any(w in x for w in ("datasheet", "whitepaper", "spec sheet", "AWS"))]
    assert len(sources) >= len({s.family for s in GPU_SPECS.values()}) // 2


@pytest.mark.parametrize(("spelling", "model"), [
    ("NVIDIA B300", "B300"), ("HGX B200", "B200"), ("GB200 NVL72", "GB200"), ("AMD Instinct MI300X", "MI300X"),
    ("mi325x", "MI325X"), ("RTX PRO 6000 Blackwell Server Edition", "RTX-PRO-6000"), ("NVIDIA H20", "H20"),
    ("Radeon PRO W7900", "W7900"), ("GH200", "GH200"),
])
def test_vendor_spellings_normalise(spelling: str, model: str) -> None:
    assert normalise_gpu(spelling) == model


def test_gpu_shaped_names_stand_for_themselves_garbage_is_refused() -> None:
    assert resolve_request("B300") == ("B300",)
    assert resolve_request("MI250") == ("MI250X", "MI250")  # a family
    assert resolve_request("MI400X") == ("MI400X",) and looks_like_gpu("Gaudi 3")
    for garbage in ("", "carrier pigeon", "!!", "H100; rm -rf /", "x" * 41 + "1"):
        assert not looks_like_gpu(garbage)
        with pytest.raises(ValueError, match="is not a GPU model name"):
            resolve_request(garbage)
    assert accepted_models("Z80") is None


def test_a_model_no_market_offers_is_an_answer_not_bad_input() -> None:
    book = OfferBook.build(catalog_offers())
    q = quote(book, parse_spec({"name": "b", "gpu": "B300", "gpus": 8, "workload": {"hours": 1}}), now=NOW)
    assert q.options == [] and q.notes == ["no market offers B300"]
    assert q.rejected_counts == {"gpu_model": len(book)}
    # Offered models are not mentioned; the one missing is.
    q = quote(book, parse_spec({"name": "b", "gpu": ["H100-SXM", "MI355X"], "gpus": 8,
                                "workload": {"hours": 1}, "runtime": "any", "image": "python:3.12"}), now=NOW)
    assert q.options and q.notes == ["no market offers MI355X"]


def test_a_family_member_missing_beside_an_offered_one_is_no_note() -> None:
    """`gpu: H100` expands to SXM, NVL and PCIe: a book with only SXM offers says nothing about the other two
    (issue 29: "no market offers H100-NVL" led the summary); with no member offered, all of them are named."""
    sxm_only = OfferBook.build([o for o in catalog_offers() if o.gpu == "H100-SXM"])
    spec = parse_spec({"name": "h", "gpu": "H100:8", "workload": {"hours": 1}})
    assert len(spec.gpu) == 3
    q = quote(sxm_only, spec, now=NOW)
    assert q.options and q.notes == []
    no_h100 = OfferBook.build([o for o in catalog_offers() if not o.gpu.startswith("H100")])
    q = quote(no_h100, spec, now=NOW)
    assert q.options == [] and q.notes == [f"no market offers {', '.join(spec.gpu)}"]


# --------------------------------------------------------------------------- runtimes


@pytest.mark.parametrize(("image", "runtime"), [
    ("nvcr.io/nvidia/pytorch:24.05-py3", Runtime.cuda), ("pytorch/pytorch:2.3.0-cuda12.1-cudnn8-runtime", Runtime.cuda),
    ("rocm/pytorch:latest", Runtime.rocm), ("ghcr.io/acme/train:rocm6.2", Runtime.rocm), ("python:3.12", None),
])
def test_runtime_read_from_the_image_name(image: str, runtime: Runtime | None) -> None:
    assert runtime_of_image(image) is runtime


def test_runtime_from_spec_image_or_gpus() -> None:
    amd = parse_spec_text("name: a\ngpu: MI300X:8\nworkload: {hours: 1}\n")
    assert amd.runtime is Runtime.rocm and amd.image is None and amd.container_image().startswith("rocm/")
    assert parse_spec(amd.model_dump(mode="json")) == amd  # stored specs read back alike
    assert parse_spec_text("name: a\ngpu: H100:8\nworkload: {hours: 1}\n").runtime is Runtime.cuda
    neutral = parse_spec_text("name: a\ngpu: any\ngpus: 1\nimage: python:3.12\nworkload: {hours: 1}\n")
    assert neutral.runtime is Runtime.any
    with pytest.raises(SpecError) as exc:
        parse_spec_text("name: a\ngpu: MI300X:8\nimage: nvcr.io/nvidia/pytorch:24.05-py3\nworkload: {hours: 1}\n")
    assert exc.value.field == "runtime" and "need(s) rocm" in exc.value.reason
    with pytest.raises(SpecError) as exc:
        parse_spec_text("name: a\ngpu: H100:8\nruntime: rocm\nimage: nvcr.io/nvidia/pytorch:1\nworkload: {hours: 1}\n")
    assert exc.value.field == "runtime" and "built for cuda" in exc.value.reason


def test_amd_jobs_never_land_on_nvidia_offers_and_back() -> None:
    book = OfferBook.build([offer("h100", "H100-SXM", 20.0), offer("mi300x", "MI300X", 10.0)])
    both = {"name": "b", "gpu": ["H100", "MI300X"], "gpus": 8, "workload": {"hours": 1}}
    cuda = quote(book, parse_spec(both), now=NOW, max_rejected=None)  # default image: CUDA
    assert [o.offer_id for o in cuda.options] == ["h100"]
    [rej] = cuda.rejected
    assert (rej.offer_id, rej.code) == ("mi300x", "runtime") and "needs a rocm image" in rej.reason
    rocm = quote(book, parse_spec({**both, "image": "rocm/pytorch:latest"}), now=NOW, max_rejected=None)
    assert [o.offer_id for o in rocm.options] == ["mi300x"] and rocm.rejected[0].code == "runtime"
    anyone = quote(book, parse_spec({**both, "runtime": "any", "image": "python:3.12"}), now=NOW)
    assert [o.offer_id for o in anyone.options] == ["mi300x", "h100"]


# --------------------------------------------------------------------------- flexible requests


def test_shorthand_equals_model_and_count() -> None:
    short = parse_spec({"name": "s", "gpu": "H100:8", "workload": {"hours": 1}})
    long = parse_spec({"name": "s", "gpu": ["H100"], "gpus": 8, "workload": {"hours": 1}})
    assert short == long and short.gpus == 8
    assert parse_spec({"name": "s", "gpu": ["H100:16", "H200:16"], "workload": {"hours": 1}}).gpus == 16
    for bad, field in ((["H100:8", "H200:4"], "gpu"), ("H100:0", "gpu"), ("H100:lots", "gpu")):
        with pytest.raises(SpecError) as exc:
            parse_spec({"name": "s", "gpu": bad, "workload": {"hours": 1}})
        assert exc.value.field == field
    with pytest.raises(SpecError) as exc:
        parse_spec({"name": "s", "gpu": "H100:8", "gpus": 16, "workload": {"hours": 1}})
    assert exc.value.field == "gpus"


def test_any_gpu_with_memory_quotes_across_models() -> None:
    book = OfferBook.build(catalog_offers())
    for gpu in ("any", None, []):
        data = {"name": "a", "gpus": 1, "min_gpu_memory_gb": 24, "workload": {"hours": 10}}
        if gpu is not None:
            data["gpu"] = gpu
        spec = parse_spec(data)
        assert spec.gpu == []
        q = quote(book, spec, now=NOW, top=50)
        models = {o.gpu for o in q.options}
        assert len(models) >= 3, models
        assert all(GPU_SPECS[m].memory_gb >= 22 for m in models)  # the catalog's A10G reports 22.4 usable
        assert "T4" not in models and q.rejected_counts["gpu_memory"] > 0 and "gpu_model" not in q.rejected_counts
        assert [o.expected_cost_usd for o in q.options] == sorted(o.expected_cost_usd for o in q.options)


def test_cost_model_weighs_a_cheap_slow_gpu_against_an_expensive_fast_one_by_hand() -> None:
    """8 × H100 SXM at $98.32/h (AWS p5 list) against 8 × RTX 4090 at $3.20/h (a marketplace box), for a 7B
    model on 50B tokens. By hand (docs/perf-model.md):
      FLOPs = 6 × 7e9 × 50e9 = 2.1e21; steps = 50e9 / 4e6 = 12,500; gradient = 7e9 × 2 B = 14 GB
      H100:  compute 2.1e21 / (8 × 989e12 × 0.40) = 663,549 s = 184.32 h;
             all-reduce over NVLink 2·7/8 × 14e9 / 220e9 = 0.1114 s × 12,500 = 0.387 h → 184.71 h, $18,160
      4090:  compute 2.1e21 / (8 × 165e12 × 0.40) = 3,977,273 s = 1,104.80 h;
             over PCIe 2·7/8 × 14e9 / 12e9 = 2.0417 s × 12,500 = 7.089 h → 1,111.89 h, $3,558
    The slow card is 5.1× cheaper for the job though 6× slower: it ranks first; an 8-day deadline
    leaves only the H100s; a 100B model's bf16 weights alone do not fit 8 × 24 GB: the 4090 box cannot run it."""
    h100 = offer("h100", "H100-SXM", 98.32)
    rtx = offer("4090", "RTX-4090", 3.20, network=Network(intra=IntraNode.pcie, fabric=Fabric.ethernet))
    book = OfferBook.build([h100, rtx])
    job = {"name": "sft", "gpu": "any", "gpus": 8, "workload": {"params_b": 7, "tokens_b": 50}}
    q = quote(book, parse_spec(job), now=NOW)
    assert MFU == 0.40
    by_id = {o.offer_id: o for o in q.options}
    assert by_id["h100"].expected_hours == pytest.approx(184.71, abs=0.01)
    assert by_id["h100"].expected_cost_usd == pytest.approx(18_160, rel=1e-3)
    assert by_id["4090"].expected_hours == pytest.approx(1111.89, abs=0.01)
    assert by_id["4090"].expected_cost_usd == pytest.approx(3_558, rel=1e-3)
    assert [o.offer_id for o in q.options] == ["4090", "h100"]
    assert by_id["4090"].breakdown.comm_hours == pytest.approx(7.089, abs=0.001)

    late = quote(book, parse_spec({**job, "deadline_in": "8d"}), now=NOW, max_rejected=None)
    assert [o.offer_id for o in late.options] == ["h100"] and late.rejected[0].code == "deadline"

    big = quote(book, parse_spec({**job, "workload": {"params_b": 100, "tokens_b": 1}}), now=NOW, max_rejected=None)
    assert [o.offer_id for o in big.options] == ["h100"]
    [rej] = big.rejected
    assert (rej.offer_id, rej.code) == ("4090", "gpu_memory")
    assert rej.reason == "24 GB per GPU < 25 GB needed (100B parameters in bf16 over 8 GPUs)"


def test_a_service_runs_its_hours_on_any_gpu_so_the_cheapest_that_fits_wins() -> None:
    book = OfferBook.build([offer("h100", "H100-SXM", 98.32), offer("l40s", "L40S", 14.0),
                            offer("t4", "T4", 4.0)])
    q = quote(book, parse_spec({"name": "svc", "gpu": "any", "gpus": 8, "min_gpu_memory_gb": 40,
                                "workload": {"hours": 100}}), now=NOW, max_rejected=None)
    assert [(o.offer_id, o.expected_cost_usd) for o in q.options] == [("l40s", 1400.0), ("h100", 9832.0)]
    assert q.rejected[0].offer_id == "t4" and q.rejected[0].code == "gpu_memory"
