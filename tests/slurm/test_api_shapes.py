"""Version handling on real slurmrestd answers (v0.0.38 of Slurm 22.05, v0.0.40 of 23.11) and real specs."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from broker.errors import BadRequestError, CapacityError, ProviderAuthError, TransientError
from broker.models import Colocate, Fabric, IntraNode, Market
from providers.slurm import api
from providers.slurm.config import SlurmConfig
from providers.slurm.errors import raise_for
from providers.slurm.offers import OfferBuilder, gpu_model, node_traits
from providers.slurm.queue import constraint_matches, estimate_wait_hours
from providers.slurm.requests import parse_comment

V38 = "slurm/slurm-22.05-v0.0.38"
V40 = "slurm/slurm-23.11-v0.0.40"


def load(shared_data: Path, rel: str) -> Any:
    return json.loads((shared_data / rel).read_text(encoding="utf-8"))


# --------------------------------------------------------------------------- small parsers


def test_numbers_plain_and_wrapped() -> None:
    assert api.number(60) == 60.0
    assert api.number({"set": True, "infinite": False, "number": 1440}) == 1440.0
    assert api.number({"set": False, "infinite": False, "number": 0}) is None
    assert api.number({"set": False, "infinite": True, "number": 0}) == math.inf
    assert api.number(None) is None
    assert api.number(0xFFFFFFFF) == math.inf


def test_hostlists_expand_with_padding() -> None:
    assert api.expand_hostlist("gpu-node[1-3,5]") == ["gpu-node1", "gpu-node2", "gpu-node3", "gpu-node5"]
    assert api.expand_hostlist("n[0099-0101],login1") == ["n0099", "n0100", "n0101", "login1"]
    assert api.expand_hostlist("") == []


def test_gres_and_tres_strings() -> None:
    assert api.parse_gres("gpu:h100:8(S:0-1)") == {"h100": 8}
    assert api.parse_gres("gpu:h100:3(IDX:0-2),gpu:a100:1(IDX:0)") == {"h100": 3, "a100": 1}
    assert api.parse_gres("gpu:0") == {"": 0}
    assert api.parse_gres("gpu:1g.10gb:9(IDX:0-3,5-9)") == {"1g.10gb": 9}
    assert api.parse_tres_gpus("gres:gpu:h100:4") == ("h100", 4)  # 22.05
    assert api.parse_tres_gpus("gres/gpu:h100=4") == ("h100", 4)  # 23.11+
    assert api.parse_tres_gpus("gres:gpu:2") == ("", 2)
    assert api.parse_tres_gpus("gres/gpu=16") == ("", 16)
    assert api.parse_tres_gpus("") == ("", 0)


def test_states_from_both_shapes() -> None:
    assert api.states("idle", ["DRAIN"]) == {"IDLE", "DRAIN"}
    assert api.states(["DOWN", "NOT_RESPONDING"]) == {"DOWN", "NOT_RESPONDING"}
    assert api.states("mixed+drain") == {"MIXED", "DRAIN"}


# --------------------------------------------------------------------------- v0.0.38


def test_v38_nodes(shared_data: Path) -> None:
    nodes = api.parse_nodes(load(shared_data, f"{V38}/rest_nodes.json"))
    by = {n.name: n for n in nodes}
    n1 = by["gpu-node1"]
    assert (n1.gpu_type, n1.gpus_total, n1.gpus_used, n1.gpus_free) == ("h100", 8, 0, 8)
    assert n1.healthy and n1.state == {"IDLE"}
    assert n1.features == ("ib", "nvlink", "h100", "rack1")
    assert n1.partitions == ("gpu", "h100")
    assert by["gpu-node3"].gpu_type == "a100"


def test_v38_jobs_and_partitions(shared_data: Path) -> None:
    jobs = {j.job_id: j for j in api.parse_jobs(load(shared_data, f"{V38}/rest_jobs.json"))}
    running = jobs[10]
    assert running.state == "RUNNING" and not running.finished
    assert (running.gpu_type, running.gpus_per_node, running.time_limit_min) == ("h100", 4, 60.0)
    assert running.nodes == ("gpu-node1",)
    assert running.end_time == running.start_time + 3600
    assert jobs[4].nodes == ("gpu-node3", "gpu-node4") and jobs[4].state == "FAILED"
    assert jobs[1].time_limit_min is None  # no limit given: the partition's INFINITE
    parts = {p.name: p for p in api.parse_partitions(load(shared_data, f"{V38}/rest_partitions.json"))}
    assert parts["gpu"].default and not parts["h100"].default
    assert parts["gpu"].nodes == ("gpu-node1", "gpu-node2", "gpu-node3", "gpu-node4")


def test_v38_submit_errors_and_ping(shared_data: Path) -> None:
    assert api.parse_submit(load(shared_data, f"{V38}/rest_job_submit_response.json")) == 10
    assert api.parse_errors(load(shared_data, f"{V38}/rest_job_delete.json")) == []
    body = {"errors": [{"error_code": 2014, "error": "Requested node configuration is not available"}]}
    assert api.parse_errors(body) == [(2014, "Requested node configuration is not available")]


def test_submit_bodies_use_only_keys_the_specs_define(shared_data: Path) -> None:
    req = api.SubmitRequest(
        name="lockstep-j1", script="#!/bin/bash\ntrue\n", nodes=2, gpus_per_node=8, gpu_type="h100",
        time_limit_min=30, comment="lockstep:owner=x", partition="gpu", constraints="ib_ndr&rack1",
        stdout="/tmp/x-%j.out", environment={"A": "1"},
    )
    spec38 = load(shared_data, "slurm/specs/slurm_openapi_v0.0.38_plugin.json")
    props38 = spec38["components"]["schemas"]["v0.0.38_job_properties"]["properties"]
    body38 = api.submit_body("v0.0.38", req)
    assert set(body38["job"]) <= set(props38)
    # The spec says "array" for nodes, but 22.05 reads [2, 2] as one node: a count string it reads as 2-2.
    assert body38["job"]["gres"] == "gpu:h100:8" and body38["job"]["nodes"] == "2"
    assert body38["job"]["environment"]["A"] == "1"
    # The real request recorded from 22.05 has the same shape.
    recorded = load(shared_data, f"{V38}/rest_job_submit_request.json")
    assert set(recorded["job"]) <= set(props38) and "script" in recorded

    spec41 = load(shared_data, "slurm/specs/slurm_openapi_spec_v0.0.41_testsuite.json")
    props41 = spec41["components"]["schemas"]["v0.0.41_job_desc_msg"]["properties"]
    body41 = api.submit_body("v0.0.41", req)
    assert set(body41) <= set(spec41["components"]["schemas"]["v0.0.41_job_submit_req"]["properties"])
    assert set(body41["job"]) <= set(props41)
    assert body41["job"]["tres_per_node"] == "gres/gpu:h100:8"
    assert body41["job"]["time_limit"] == {"set": True, "infinite": False, "number": 30}
    assert "A=1" in body41["job"]["environment"]
    upd = spec41["components"]["schemas"]["v0.0.41_update_node_msg"]["properties"]
    assert set(api.node_update_body("v0.0.41", "DRAIN", "ecc")) <= set(upd)


def test_node_update_only_from_v39(shared_data: Path) -> None:
    spec38 = load(shared_data, "slurm/specs/slurm_openapi_v0.0.38_plugin.json")
    spec39 = load(shared_data, "slurm/specs/slurm_openapi_v0.0.39_plugin.json")
    assert "post" not in spec38["paths"]["/node/{node_name}"]
    assert "post" in spec39["paths"]["/node/{node_name}"]
    assert not api.has_node_update("v0.0.38") and api.has_node_update("v0.0.39")


def test_version_picked_from_openapi(shared_data: Path) -> None:
    spec41 = load(shared_data, "slurm/specs/slurm_openapi_spec_v0.0.41_testsuite.json")
    assert api.pick_version(spec41) == "v0.0.41"
    mixed = {"paths": {"/slurm/v0.0.38/ping": {}, "/slurm/v0.0.37/ping": {}, "/slurm/v0.0.40/jobs": {}}}
    assert api.pick_version(mixed) == "v0.0.40"
    assert api.pick_version({"paths": {"/slurm/v0.0.36/ping": {}}}) is None
    assert api.path("v0.0.38", "job", job_id=12) == "/slurm/v0.0.38/job/12"


# --------------------------------------------------------------------------- v0.0.40


def test_v40_nodes(shared_data: Path) -> None:
    by = {n.name: n for n in api.parse_nodes(load(shared_data, f"{V40}/V0040OpenapiNodesResp.json"))}
    assert not by["dtn1"].healthy  # DOWN + NOT_RESPONDING
    assert not by["n0164"].healthy  # IDLE + DRAIN
    n1000 = by["n1000"]
    assert n1000.healthy and (n1000.gpu_type, n1000.gpus_total, n1000.gpus_free) == (
        "nvidia_h100_80gb_hbm3", 8, 8,
    )
    n0162 = by["n0162"]
    assert (n0162.gpus_total, n0162.gpus_used) == (21, 9)
    assert "a100" in n0162.features and "gpu" in n0162.partitions


def test_v40_jobs_and_partitions(shared_data: Path) -> None:
    jobs = {j.job_id: j for j in api.parse_jobs(load(shared_data, f"{V40}/V0040OpenapiJobInfoResp.json"))}
    run, pend = jobs[7745162], jobs[7725337]
    assert run.state == "RUNNING" and run.time_limit_min == 1440.0 and run.nodes == ("n0180",)
    assert run.start_time == 1722274361.0 and run.exit_code == 0
    assert pend.state == "PENDING" and pend.reason == "Resources" and pend.nodes == ()
    parts = {p.name: p for p in api.parse_partitions(load(shared_data, f"{V40}/V0040OpenapiPartitionResp.json"))}
    assert len(parts["compute"].nodes) == 42 and parts["compute"].nodes[0] == "n0111"
    assert parts["compute"].state == "UP"


def test_v40_offers_skip_drained_and_unknown_models(shared_data: Path) -> None:
    nodes = api.parse_nodes(load(shared_data, f"{V40}/V0040OpenapiNodesResp.json"))
    parts = api.parse_partitions(load(shared_data, f"{V40}/V0040OpenapiPartitionResp.json"))
    offers = OfferBuilder(SlurmConfig(cluster_name="talapas"), parts, nodes, [], 1722274361.0).build()
    hosts = {o.locality.host: o for o in offers}
    assert "n0164" not in hosts and "n0999" not in hosts  # drained
    assert "n0161" not in hosts  # MIG slices: no model to price
    assert hosts["n1000"].gpu == "H100-SXM" and hosts["n1000"].gpu_count == 8
    assert hosts["n0160"].gpu == "A100-PCIe-80GB"
    assert all(o.market is Market.owned and o.divisible for o in offers)


# --------------------------------------------------------------------------- features, models, errors


def test_features_give_fabric_rack_and_link() -> None:
    t = node_traits(["ib_ndr", "nvlink", "rack1", "h100"])
    assert (t.fabric, t.fabric_gbps, t.fabric_feature, t.intra, t.rack) == (
        Fabric.infiniband, 400.0, "ib_ndr", IntraNode.nvlink, "rack1",
    )
    assert node_traits(["ib_hdr"]).fabric_gbps == 200.0
    assert node_traits(["roce", "rack2"]).fabric is Fabric.roce
    assert node_traits(["eth", "pcie"]).fabric_gbps == 100.0
    assert node_traits(["amd", "milan"]).fabric is Fabric.none


def test_gpu_models_from_gres_types() -> None:
    assert gpu_model("h100") == "H100-SXM"
    assert gpu_model("nvidia_h100_80gb_hbm3") == "H100-SXM"
    assert gpu_model("nvidia_a100_80gb_pcie") == "A100-PCIe-80GB"
    assert gpu_model("l40s") == "L40S"
    assert gpu_model("1g.10gb") is None
    assert gpu_model("", ["amd", "a100"]) == "A100-SXM-40GB"


def test_constraints() -> None:
    feats = ["ib_ndr", "nvlink", "rack1"]
    assert constraint_matches("ib_ndr&rack1", feats)
    assert constraint_matches("roce|ib_ndr", feats)
    assert not constraint_matches("ib_ndr&rack2", feats)
    assert constraint_matches(None, feats)


def test_error_mapping_never_retries_bad_requests() -> None:
    with pytest.raises(ProviderAuthError):
        raise_for(401, [], "GET nodes")
    with pytest.raises(CapacityError):
        raise_for(500, [(2014, "Requested node configuration is not available")], "submit")
    with pytest.raises(BadRequestError):
        raise_for(500, [(2000, "Invalid partition name specified")], "submit")
    with pytest.raises(BadRequestError):
        raise_for(400, [(9001, "Failure during parsing")], "submit")
    with pytest.raises(TransientError):
        raise_for(502, [], "GET jobs")
    with pytest.raises(TransientError):
        raise_for(500, [(1001, "Unable to contact slurm controller")], "GET jobs")


def test_comment_round_trip() -> None:
    tags = parse_comment("lockstep:owner=inst;lockstep:job=j-1;lockstep:token=ls-abc")
    assert tags == {"lockstep:owner": "inst", "lockstep:job": "j-1", "lockstep:token": "ls-abc"}


# --------------------------------------------------------------------------- queue model


def _node(name: str, used: int = 0, total: int = 8) -> api.NodeInfo:
    return api.NodeInfo(
        name=name, state=frozenset({"IDLE"}), gpu_type="h100", gpus_total=total, gpus_used=used,
        features=("ib_ndr", "rack1"), partitions=("gpu",),
    )


def _job(job_id: int, state: str, nodes: tuple[str, ...], n: int, gpus: int, limit: float, start: float) -> api.JobInfo:
    return api.JobInfo(
        job_id=job_id, name="x", state=state, flags=frozenset(), reason="", comment="", partition="gpu",
        nodes=nodes, node_count=n, gpu_type="h100", gpus_per_node=gpus, constraints="",
        time_limit_min=limit, submit_time=float(job_id), start_time=start,
        end_time=start + limit * 60 if state == "RUNNING" else None,
    )


def test_queue_estimate_grows_with_pending_jobs() -> None:
    now = 1_000_000.0
    nodes = [_node("a", used=8), _node("b", used=8)]
    running = [_job(1, "RUNNING", ("a", "b"), 2, 8, 60, now - 1800)]  # frees both in 30 min
    assert estimate_wait_hours([_node("a"), _node("b")], [], now, 8) == 0.0
    w0 = estimate_wait_hours(nodes, running, now, 8)
    assert w0 == pytest.approx(0.5)
    pend1 = [*running, _job(2, "PENDING", (), 2, 8, 60, 0)]
    w1 = estimate_wait_hours(nodes, pend1, now, 8)
    assert w1 == pytest.approx(1.5)
    pend2 = [*pend1, _job(3, "PENDING", (), 2, 8, 120, 0)]
    assert estimate_wait_hours(nodes, pend2, now, 8) > w1
    # A shape no node can hold never starts.
    assert math.isinf(estimate_wait_hours(nodes, running, now, 16))
    assert math.isinf(estimate_wait_hours(nodes, running, now, 8, 3))


def test_offer_groups_for_multi_node(shared_data: Path) -> None:
    nodes = [_node("a"), _node("b", used=2), _node("c", used=8)]
    parts = [api.PartitionInfo(name="gpu", nodes=("a", "b", "c"), default=True, state="UP")]
    offers = OfferBuilder(SlurmConfig(), parts, nodes, [], 0.0).build()
    multi = [o for o in offers if o.max_nodes > 1]
    # a (8 free) and b (6 free): one 2-node offer of 6 GPUs each, in the rack; the island one is dominated.
    assert [(o.max_nodes, o.gpu_count, o.colocation) for o in multi] == [(2, 6, Colocate.rack)]
    assert multi[0].locality.rack == "rack1" and multi[0].attrs["fabric_feature"] == "ib_ndr"
    single = {o.locality.host: o for o in offers if o.max_nodes == 1}
    assert single["b"].gpu_count == 6
    assert single["b"].usd_per_hour == pytest.approx(SlurmConfig().owned.usd_per_node_hour() * 6 / 8, rel=1e-4)
    assert single["c"].attrs["free_gpus"] == "0" and single["c"].gpu_count == 8  # busy: offered with a wait
