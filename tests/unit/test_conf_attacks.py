"""One test per way a hostile conf attacked the run (issue 10), each able to fail on the code before the fix.

Servers bind 127.0.0.1 only. Before the fix (verified against main): the conf's ray_dashboard_url received the HF
token; hf_conn_id read google_cloud_default's password; a local installer path was read and quoted in the error;
any https installer URL was accepted and an https->http redirect followed; `cluster_name: "x\\n"`, 2.0 replicas,
NaN polls, 1e14 s timeouts and any image tag or machine type passed; validate raised on a zero batch size, 1e+20, a
5,000-digit integer, a list or a non-string key; wandb_key/hf/pwd/auth/session values and 500-character values were
echoed in findings.
"""

from __future__ import annotations

import contextlib
import datetime
import http.server
import ipaddress
import json
import ssl
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from sandbox.tls import new_cluster_tls

from nemo_rl_gke.kube.access import ClusterAccess, EndpointNotAllowedError, dashboard_address
from nemo_rl_gke.plan.manifests import ManifestSourceError, fetch_installer, load_nccl_installer
from nemo_rl_gke.plan.ray_job import JobRequest, SecretEnv, job_request, job_secrets
from nemo_rl_gke.preflight.offline import check_conf
from nemo_rl_gke.ray.submit import resolve_secrets
from nemo_rl_gke.run import paths as paths_module
from nemo_rl_gke.run.deployment import ConnectionNotAllowedError, Deployment, DeploymentError
from nemo_rl_gke.run.findings import ConfError, Finding
from nemo_rl_gke.run.ownership import Owner
from nemo_rl_gke.run.recipes import load_recipe
from nemo_rl_gke.run.spec import RunSpec

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "nccl-rdma-installer.yaml"
TOKEN = "hf_" + "CanaryCanaryCanaryCanary1234"
SECRET_VALUE = "s3cr3t-VALUE-987"


# --- loopback servers ---------------------------------------------------------------------------------------------
@dataclass
class Server:
    """A loopback HTTP(S) server that records every request and answers from a route table."""

    routes: dict[str, tuple[int, dict[str, str], bytes]] = field(default_factory=dict)
    hits: list[tuple[str, str, bytes]] = field(default_factory=list)
    port: int = 0
    scheme: str = "http"

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"


def _handler(server: Server) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def _answer(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            server.hits.append((self.command, self.path, body))
            default = (200, {}, b"{}") if self.command == "PUT" else (404, {}, b"{}")
            code, headers, payload = server.routes.get(self.path, default)
            self.send_response(code)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        do_GET = do_POST = do_PUT = _answer

    return Handler


@pytest.fixture
def serve() -> Iterator[Callable[..., Server]]:
    """Start loopback servers (optionally TLS); all are shut down after the test."""
    running: list[http.server.ThreadingHTTPServer] = []

    def start(context: ssl.SSLContext | None = None) -> Server:
        server = Server(scheme="https" if context else "http")
        httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(server))
        if context is not None:
            httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
        server.port = httpd.server_port
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        running.append(httpd)
        return server

    yield start
    for httpd in running:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture
def tls(tmp_path: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """A self-signed certificate for 127.0.0.1: (server context, client context that trusts only it)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(cert_file, key_file)
    return server, ssl.create_default_context(cafile=str(cert_file))


def _ids(findings: list[Finding]) -> list[str]:
    return [f.rule_id for f in findings]


# --- 1. secrets go only to endpoints the deployment controls ------------------------------------------------------
RAY_VERSION = (
    200,
    {"Content-Type": "application/json"},
    b'{"version": "1", "ray_version": "2.60.0", "ray_commit": "x"}',
)


def test_a_conf_cannot_send_the_job_and_its_token_to_a_dashboard_it_picks(serve: Callable[..., Server]) -> None:
    cluster_tls = new_cluster_tls("own")
    attacker, own_cluster = serve(), serve(cluster_tls.server_context())
    conf = {"ray_dashboard_url": attacker.url}
    spec, findings = check_conf(conf)
    assert spec is None and _ids(findings) == ["conf.deployment-setting"]
    assert attacker.url not in str(findings[0])
    with pytest.raises(ConfError):
        RunSpec.from_conf(conf)
    # The job of any valid run goes to its own cluster's API server (https under the cluster's CA, as the sandbox's).
    from nemo_rl_gke.ray.hooks import RayJobsHook

    run = RunSpec()
    own_cluster.routes[f"{run.dashboard_proxy_path}/api/version"] = RAY_VERSION
    access = ClusterAccess(own_cluster.url, cluster_tls.ca_pem)
    address = dashboard_address(run, access, Deployment())
    request = job_request(run, load_recipe(run.recipe), "dag", "run-1")
    # The stand-in answers no further than that; what matters is where the token went.
    with contextlib.suppress(Exception):
        RayJobsHook(address).submit(request, {"HF_TOKEN": TOKEN})
    assert attacker.hits == []
    assert any(TOKEN.encode() in body for _, _, body in own_cluster.hits), "control: the token went to the cluster"


@pytest.mark.parametrize(
    ("url", "google", "allowed"),
    [
        ("https://ray.internal.example:8265", None, True),
        ("http://10.0.0.7:8265", None, False),
        ("http://10.0.0.7:8265", "http://127.0.0.1:9000", False),
        ("http://127.0.0.1:8265", None, False),
        ("http://127.0.0.1:8265", "https://container.googleapis.com", False),
        ("http://127.0.0.1:8265", "http://127.0.0.1:9000", True),
        ("http://localhost:8265", "http://[::1]:9000", True),
    ],
)
def test_the_deployments_dashboard_is_https_or_sandbox_loopback(url: str, google: str | None, allowed: bool) -> None:
    if allowed:
        deployment = Deployment(ray_dashboard_url=url)
        assert dashboard_address(RunSpec(), None, deployment, google_endpoint=google).url == url
    else:
        # Plain http off loopback is refused with the settings; to loopback, at submit unless Google is loopback too.
        with pytest.raises((EndpointNotAllowedError, DeploymentError)):
            dashboard_address(RunSpec(), None, Deployment(ray_dashboard_url=url), google_endpoint=google)


@pytest.mark.parametrize("endpoint", ["http://10.1.2.3", "http://127.0.0.1:1", "http://localhost:1", "ftp://10.1.2.3"])
def test_the_bearer_token_never_goes_to_a_plain_http_cluster_endpoint(endpoint: str) -> None:
    # GKE's API server is https only, and so is the sandbox's: loopback has no exception.
    with pytest.raises(EndpointNotAllowedError, match="https only"):
        ClusterAccess.from_cluster({"status": "RUNNING", "endpoint": endpoint}, "c")
    assert ClusterAccess.from_cluster({"status": "RUNNING", "endpoint": "127.0.0.1:1"}, "c").host == (
        "https://127.0.0.1:1"
    )


@pytest.mark.parametrize(
    "conf",
    [
        {"hf_conn_id": "google_cloud_default"},
        {"hf_conn_id": "wandb_default"},
        {"wandb_conn_id": "aws_default"},
        {"wandb_conn_id": "huggingface_default"},
    ],
)
def test_a_conf_cannot_name_another_connection_for_a_secret(conf: dict[str, str]) -> None:
    spec, findings = check_conf(conf)
    assert spec is None and _ids(findings) == ["secrets.connections"]
    with pytest.raises(ConnectionNotAllowedError):
        job_secrets(RunSpec.from_conf(conf))


def test_a_connection_the_deployment_does_not_allow_is_never_read() -> None:
    read: list[str] = []

    def password_of(conn_id: str) -> str:
        read.append(conn_id)
        return "pw"

    stray = JobRequest("id", "run", {}, (SecretEnv("HF_TOKEN", "google_cloud_default"),), ())
    with pytest.raises(ConnectionNotAllowedError):
        resolve_secrets(stray, password_of)
    assert read == []
    # Control: the allowed connections are read, and a deployment may allow others.
    assert resolve_secrets(job_request(RunSpec(), load_recipe(RunSpec().recipe), "d", "r"), password_of)
    assert read == ["huggingface_default", "wandb_default"]
    team = Deployment(hf_conn_ids=("hf_team",))
    resolve_secrets(JobRequest("id", "run", {}, (SecretEnv("HF_TOKEN", "hf_team"),), ()), password_of, team)
    assert read[-1] == "hf_team"


# --- the NCCL installer: only bundled, the allowlist, or include/ --------------------------------------------------
@pytest.mark.parametrize(
    "source",
    [
        "/etc/passwd",
        "/etc/hosts.yaml",
        "file:///etc/passwd",
        "http://raw.githubusercontent.com/GoogleCloudPlatform/container-engine-accelerators/master/gpudirect-rdma/"
        "nccl-rdma-installer.yaml",
        "https://attacker.example/nccl-rdma-installer.yaml",
        "https://raw.githubusercontent.com/attacker/repo/main/nccl-rdma-installer.yaml",
        "https://raw.githubusercontent.com/GoogleCloudPlatform/container-engine-accelerators/master/gpudirect-rdma/"
        "nccl-rdma-installer.yaml/../../../../attacker/x.yaml",
        "https://user:pw@raw.githubusercontent.com/GoogleCloudPlatform/container-engine-accelerators/master/"
        "gpudirect-rdma/nccl-rdma-installer.yaml",
        "manifests/../../../etc/passwd.yaml",
        "recipes/local-cpu-gsm8k.yaml/../../conf/local.json",
    ],
)
def test_installer_sources_off_the_rules_are_refused_at_validate(source: str) -> None:
    spec, findings = check_conf({"nccl_installer_source": source})
    assert spec is None and _ids(findings) == ["kube.nccl-installer-source"]


def test_a_file_outside_include_is_never_read_nor_quoted(tmp_path: Path) -> None:
    canary = tmp_path / "canary.yaml"
    canary.write_text("CANARY-FILE-CONTENT-LINE\n")
    spec, findings = check_conf({"nccl_installer_source": str(canary)})
    assert spec is None and _ids(findings) == ["kube.nccl-installer-source"]
    with pytest.raises(ManifestSourceError) as refused:
        spec = RunSpec.from_conf({"nccl_installer_source": str(canary)})
        load_nccl_installer(spec, Owner("dep-a", spec.group_id, "d/r"))
    assert "CANARY-FILE-CONTENT" not in str(refused.value) + str(findings[0])


def test_a_symlink_in_include_that_leads_out_is_refused_at_validate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    include = tmp_path / "include"
    include.mkdir()
    monkeypatch.setattr(paths_module, "INCLUDE_DIR", include)
    (include / "inside.yaml").write_bytes(FIXTURE.read_bytes())
    (include / "link.yaml").symlink_to(tmp_path / "outside.yaml")
    (tmp_path / "outside.yaml").write_bytes(FIXTURE.read_bytes())
    assert check_conf({"nccl_installer_source": "inside.yaml"})[0] is not None, "control: a file inside is fine"
    spec, findings = check_conf({"nccl_installer_source": "link.yaml"})
    assert spec is None and "inside include/" in findings[0].rule


def test_installer_redirects_must_stay_https_and_on_the_allowlist(
    serve: Callable[..., Server], tls: tuple[ssl.SSLContext, ssl.SSLContext]
) -> None:
    server_context, client_context = tls
    plain, secure = serve(), serve(server_context)
    secure.routes = {
        "/ok/good.yaml": (200, {}, FIXTURE.read_bytes()),
        "/ok/moved.yaml": (302, {"Location": "/ok/good.yaml"}, b""),
        "/ok/to-http.yaml": (302, {"Location": f"{plain.url}/ok/good.yaml"}, b""),
        "/ok/to-other.yaml": (302, {"Location": f"{secure.url}/other/good.yaml"}, b""),
        "/other/good.yaml": (200, {}, FIXTURE.read_bytes()),
        "/ok/error.yaml": (500, {}, b"SECRET-BODY-OF-THE-ERROR"),
        "/ok/junk.yaml": (200, {}, b"root:x:0:0:JUNK-CONTENT\n  : ["),
    }
    plain.routes = {"/ok/good.yaml": (200, {}, FIXTURE.read_bytes())}
    deployment = Deployment(nccl_installer_allowlist=(f"{secure.url}/ok/",))

    def fetch(path: str) -> str:
        return fetch_installer(f"{secure.url}{path}", deployment, timeout=10, context=client_context)

    assert "DaemonSet" in fetch("/ok/good.yaml"), "control: an allowed URL is fetched"
    assert "DaemonSet" in fetch("/ok/moved.yaml"), "control: a redirect within the allowlist is followed"
    with pytest.raises(ManifestSourceError, match=r"redirected .* not allowed: the scheme is http"):
        fetch("/ok/to-http.yaml")
    assert plain.hits == []
    with pytest.raises(ManifestSourceError, match=r"redirected .* not allowed: it is not on the deployment's"):
        fetch("/ok/to-other.yaml")
    assert not [path for _, path, _ in secure.hits if path.startswith("/other/")]
    with pytest.raises(ManifestSourceError, match="HTTP 500") as error:
        fetch("/ok/error.yaml")
    assert "SECRET-BODY" not in str(error.value)
    spec = RunSpec.from_conf({"nccl_installer_source": f"{secure.url}/ok/junk.yaml"})
    with pytest.raises(ManifestSourceError, match="not valid YAML at line") as junk:
        load_nccl_installer(spec, Owner("dep-a", spec.group_id, "d/r"), deployment, context=client_context)
    assert "JUNK-CONTENT" not in str(junk.value)


def test_an_untrusted_certificate_is_refused(
    serve: Callable[..., Server], tls: tuple[ssl.SSLContext, ssl.SSLContext]
) -> None:
    secure = serve(tls[0])
    secure.routes = {"/ok/good.yaml": (200, {}, FIXTURE.read_bytes())}
    deployment = Deployment(nccl_installer_allowlist=(f"{secure.url}/ok/",))
    with pytest.raises(ManifestSourceError, match="could not be fetched"):
        fetch_installer(f"{secure.url}/ok/good.yaml", deployment, timeout=10)  # the system CAs do not know it


# --- validation is total, and refuses what would fail after provisioning -------------------------------------------
@pytest.mark.parametrize(
    ("conf", "rule_id"),
    [
        ({"cluster_name": "nemo-rl\n"}, "conf.printable"),
        ({"node_pool_name": "gpu-pool\n"}, "conf.printable"),
        ({"project": "nemo-rl-demo\n"}, "conf.printable"),
        ({"namespace": "default\r"}, "conf.printable"),
        ({"worker_replicas": 2.0, "gpu_pool_max_nodes": 2}, "conf.type"),
        ({"max_steps": 10.0}, "conf.type"),
        ({"gpu_pool_max_nodes": True}, "conf.type"),
        ({"poll_interval_s": float("nan")}, "conf.type"),
        ({"poll_interval_s": float("inf")}, "conf.type"),
        ({"poll_interval_s": 1e-300}, "conf.minimum"),
        ({"job_timeout_s": 10**14}, "conf.maximum"),
        ({"job_timeout_s": 1e14}, "conf.type"),
        ({"network_timeout_s": 86_400}, "conf.maximum"),
        ({"lustre_capacity_gib": 2**63}, "conf.maximum"),
        ({"image_tag": "v0.5.0.$(id)"}, "conf.pattern"),
        ({"image_tag": "v0.5.0\n"}, "conf.printable"),
        ({"image_tag": "-v0.5.0"}, "conf.pattern"),
        ({"system_machine_type": "n2 highmem 80"}, "conf.pattern"),
        ({"system_machine_type": "../n2-highmem-80"}, "conf.pattern"),
        ({"machine_type": "A4-HIGHGPU-8G"}, "conf.pattern"),
        ({"checkpoint_dir": "/data/ckpt dir"}, "storage.checkpoint-on-lustre"),
        ({"checkpoint_dir": "/data/./ckpt"}, "storage.checkpoint-on-lustre"),
        ({"extra_overrides": ["policy.train_global_batch_size=0"]}, "nemo.config-integers"),
        ({"extra_overrides": ["policy.train_global_batch_size=1e+20"]}, "nemo.config-integers"),
        ({"extra_overrides": ["policy.train_global_batch_size=1000000000039"]}, "nemo.config-integers"),
        ({"extra_overrides": ["~policy.train_global_batch_size"]}, "nemo.config-integers"),
    ],
)
def test_values_that_would_fail_after_provisioning_are_refused(conf: dict[str, Any], rule_id: str) -> None:
    spec, findings = check_conf(conf)
    assert spec is None and rule_id in _ids(findings), findings


@pytest.mark.parametrize(
    "conf",
    [
        {"max_steps": 10**5000},
        {"worker_replicas": -(10**400)},
        [{"mode": "plan"}],
        None,
        "mode=plan",
        {1: "x"},
        {None: "x", ("a",): 1},
        {"extra_overrides": "policy.x=1"},
        {"extra_overrides": [[[[[["deep"]]]]]]},
        {"rdma_subnet_cidrs": [None] * 8},
        {"zonee": [[[[[[[[[[[]]]]]]]]]]]},
        {"x" * 100_000: "y" * 100_000},
        {"project": "\ud800"},
    ],
)
def test_validate_reports_instead_of_raising(conf: Any) -> None:
    spec, findings = check_conf(conf)
    assert spec is None and findings
    for finding in findings:
        json.dumps(finding.to_dict(), allow_nan=False)
        assert len(str(finding)) < 1500


# --- findings never echo secrets or long values --------------------------------------------------------------------
@pytest.mark.parametrize(
    "key", ["wandb_key", "hf", "pwd", "auth", "session", "cookie", "bearer", "HF_TOKEN", "x-api-key", "credentials"]
)
def test_a_secret_looking_key_is_never_echoed(key: str) -> None:
    spec, findings = check_conf({key: SECRET_VALUE})
    assert spec is None and _ids(findings) == ["conf.secret-in-conf"]
    assert SECRET_VALUE not in str(findings[0]) + json.dumps(findings[0].to_dict())


@pytest.mark.parametrize("conf", [{"wandb_run_name": TOKEN}, {"zonee": TOKEN}, {"extra_overrides": [f"a.b={TOKEN}"]}])
def test_a_token_is_never_echoed_whatever_the_key(conf: dict[str, Any]) -> None:
    spec, findings = check_conf(conf)
    assert spec is None and findings
    assert TOKEN not in "".join(str(f) + json.dumps(f.to_dict()) for f in findings)


@pytest.mark.parametrize(
    "conf",
    [{"zonee": "x" * 500}, {"project": "a" * 500}, {"extra_overrides": ["b" * 900]}, {"export_bucket": "c" * 200}],
)
def test_long_values_are_cut_in_every_finding(conf: dict[str, Any]) -> None:
    spec, findings = check_conf(conf)
    assert spec is None and findings
    letter = str(next(iter(conf.values())))[0] if not isinstance(next(iter(conf.values())), list) else "b"
    for finding in findings:
        assert letter * 81 not in str(finding), finding
        shown = finding.value if isinstance(finding.value, str) else json.dumps(finding.value)
        assert len(shown) <= 80


def test_a_rules_own_prose_is_not_cut_between_two_apostrophes() -> None:
    from nemo_rl_gke.run.findings import safe_text

    prose = "the job's environment would reach the driver log, W&B and the exported checkpoint's config.yaml, so no"
    assert safe_text(prose) == prose
    # A quoted value that long is still cut.
    assert "x" * 81 not in safe_text("zone='" + "x" * 200 + "' is not a zone")
