"""deploy/k8s: every overlay renders (kubectl kustomize) and validates with kubernetes-validate --strict
against the Kubernetes versions we state; the rendered objects agree with each other; a broken copy fails.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT
from tests.deploy.tools import run, tool

K8S = ROOT / "deploy" / "k8s"
OVERLAYS = sorted(p.parent.name for p in (K8S / "overlays").glob("*/kustomization.yaml"))
KUBERNETES = ("1.33.0", "1.37.0")  # the oldest we support and the newest kubernetes-validate knows
STANDALONE = [K8S / "lockstep-secrets.example.yaml"]  # made out of band, not part of the base


def render(directory: Path) -> str:
    r = run(tool("kubectl"), "kustomize", str(directory))
    assert r.returncode == 0, r.stderr
    return r.stdout


def validate(path: Path, version: str) -> tuple[int, str]:
    r = run(tool("kubernetes-validate"), "--strict", "--quiet", "-k", version, str(path))
    return r.returncode, r.stdout + r.stderr


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("k8s")
    files = {}
    for name in OVERLAYS:
        files[name] = out / f"{name}.yaml"
        files[name].write_text(render(K8S / "overlays" / name))
    return files


def objects(path: Path) -> dict[tuple[str, str], dict]:
    return {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(path.read_text()) if d}


def test_there_are_overlays_to_check() -> None:
    assert {"production", "staging"} <= set(OVERLAYS)


@pytest.mark.parametrize("version", KUBERNETES)
def test_every_overlay_and_manifest_validates_strictly(rendered: dict[str, Path], version: str) -> None:
    for path in [*rendered.values(), *STANDALONE]:
        rc, out = validate(path, version)
        assert rc == 0, f"{path.name} against Kubernetes {version}:\n{out}"


def test_a_broken_manifest_fails_validation(rendered: dict[str, Path], tmp_path: Path) -> None:
    text = rendered["production"].read_text()
    for broken_text, why in [
        (text.replace("\n  replicas: 2\n", "\n  replica: 2\n", 1), "'replica' was unexpected"),
        (text.replace("\n  replicas: 2\n", "\n  replicas: two\n", 1), "'two' is not of type 'integer'"),
        (text.replace("readOnlyRootFilesystem: true", "readOnlyRootFilesystem: yes please", 1), "not of type"),
    ]:
        assert broken_text != text
        broken = tmp_path / "broken.yaml"
        broken.write_text(broken_text)
        rc, out = validate(broken, KUBERNETES[0])
        assert rc != 0 and why in out, out


def test_a_broken_kustomization_fails_to_render(tmp_path: Path) -> None:
    copy = tmp_path / "k8s"
    shutil.copytree(K8S, copy)
    (copy / "base" / "service.yaml").unlink()  # listed in resources, gone
    r = run(tool("kubectl"), "kustomize", str(copy / "overlays" / "production"))
    assert r.returncode != 0 and "service.yaml" in r.stderr


@pytest.mark.parametrize("overlay", ["production", "staging"])
def test_the_objects_agree_with_each_other(rendered: dict[str, Path], overlay: str) -> None:
    objs = objects(rendered[overlay])
    dep = objs[("Deployment", "lockstep")]
    pod = dep["spec"]["template"]["spec"]
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert dep["spec"]["replicas"] == 2
    assert dep["spec"]["selector"]["matchLabels"].items() <= labels.items()
    # Selectors of the PDB, the Service and the NetworkPolicy pick exactly these pods.
    assert objs[("PodDisruptionBudget", "lockstep")]["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert objs[("PodDisruptionBudget", "lockstep")]["spec"]["minAvailable"] == 1
    assert objs[("Service", "lockstep")]["spec"]["selector"].items() <= labels.items()
    assert objs[("NetworkPolicy", "lockstep")]["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
    # An identity with no API rights: its own ServiceAccount, no token, and no Role bound to it.
    sa = objs[("ServiceAccount", pod["serviceAccountName"])]
    assert sa["automountServiceAccountToken"] is False and pod["automountServiceAccountToken"] is False
    assert not [k for k, _ in objs if k in ("Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding")]
    # Probes, resources, a restrictive security context, and somewhere to write.
    (c,) = pod["containers"]
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert {"cpu", "memory"} <= c["resources"]["requests"].keys() and "memory" in c["resources"]["limits"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] > 0
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    assert "emptyDir" in volumes[mounts["/tmp"]]
    # Every ConfigMap it mounts is rendered with it; every Secret key it reads is in the Secret's template.
    secret = yaml.safe_load(STANDALONE[0].read_text())
    workloads = [pod, objs[("CronJob", "lockstep-tracker")]["spec"]["jobTemplate"]["spec"]["template"]["spec"]]
    for spec in workloads:
        for v in spec["volumes"]:
            if "configMap" in v:
                assert ("ConfigMap", v["configMap"]["name"]) in objs
            if "secret" in v:
                assert v["secret"]["secretName"] == secret["metadata"]["name"]
                assert {i["key"] for i in v["secret"]["items"]} <= secret["stringData"].keys()
        for e in spec["containers"][0]["env"]:
            ref = (e.get("valueFrom") or {}).get("secretKeyRef")
            if ref:
                assert ref["name"] == secret["metadata"]["name"] and ref["key"] in secret["stringData"]
    namespace = {"production": "lockstep", "staging": "lockstep-staging"}[overlay]
    assert {d["metadata"].get("namespace") for d in objs.values()} == {namespace}
