"""docker-compose.yaml, Dockerfile and .dockerignore: the structure a broken edit would lose.

There is no Docker engine in CI, so these tests read the files. Each rule is a plain `check_*` function that raises
AssertionError; it runs once against the real files and again against deliberately broken copies, so a check that can
no longer fail is caught as well.
"""

from __future__ import annotations

import base64
import copy
import re
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_PATH = ROOT / "docker-compose.yaml"
DOCKERFILE_PATH = ROOT / "Dockerfile"
DOCKERIGNORE_PATH = ROOT / ".dockerignore"
REQUIREMENTS_PATH = ROOT / "requirements.txt"

AIRFLOW_SERVICES = (
    "airflow-init",
    "airflow-apiserver",
    "airflow-scheduler",
    "airflow-dag-processor",
    "airflow-triggerer",
)
LONG_RUNNING = AIRFLOW_SERVICES[1:]
COMMANDS = {
    "airflow-apiserver": "api-server",
    "airflow-scheduler": "scheduler",
    "airflow-dag-processor": "dag-processor",
    "airflow-triggerer": "triggerer",
}
# Container path -> host path. The triggerer needs plugins/ too: it imports trigger classes only from there (FACTS §2).
CODE_MOUNTS = {
    "/opt/airflow/dags": "./dags",
    "/opt/airflow/plugins": "./plugins",
    "/opt/airflow/include": "./include",
}
LOGS_DIR = "/opt/airflow/logs"
INCLUDE_ENV = "NEMO_RL_GKE_INCLUDE_DIR"
PYTHON_VERSION = "3.11"
SECRET_ENV = ("AIRFLOW__CORE__FERNET_KEY", "AIRFLOW__API_AUTH__JWT_SECRET", "AIRFLOW__API__SECRET_KEY")
# A whole value that is one compose variable with no default: `${X}`, `${X:?message}` or `${X:-}` (empty).
ENV_REFERENCE = re.compile(r"\$\{[A-Za-z_][A-Za-z0-9_]*(?::\?[^}]*|:-)?\}")
# The one literal credential allowed: Postgres' own, for a database without a published port.
LOCAL_ONLY_CREDENTIALS = {("postgres", "POSTGRES_PASSWORD")}
LOOPBACK = "127.0.0.1"


# --- readers -----------------------------------------------------------------------------------------------------


def load_compose() -> dict:
    return yaml.safe_load(COMPOSE_PATH.read_text())


def pinned_airflow_version(requirements: str) -> str:
    pins = re.findall(r"^apache-airflow==(\S+)\s*$", requirements, flags=re.MULTILINE)
    assert len(pins) == 1, f"requirements.txt must pin apache-airflow exactly once, found {pins}"
    return pins[0]


def env_of(service: dict) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {str(k): str(v) for k, v in env.items()}


def mounts_of(service: dict) -> dict[str, tuple[str, bool]]:
    """Container path -> (source, read_only), from short (`src:dst[:mode]`) or long volume syntax."""
    mounts = {}
    for volume in service.get("volumes") or []:
        if isinstance(volume, dict):
            mounts[volume["target"]] = (volume.get("source", ""), bool(volume.get("read_only", False)))
            continue
        parts = volume.split(":")
        if len(parts) == 1:  # anonymous volume
            mounts[parts[0]] = ("", False)
        else:
            mode = parts[2] if len(parts) > 2 else ""
            mounts[parts[1]] = (parts[0], "ro" in mode.split(","))
    return mounts


def published_ports(service: dict) -> list[tuple[str, str, str]]:
    """(host_ip, host_port, container_port) per published port; host_ip "" means every interface."""
    published = []
    for port in service.get("ports") or []:
        if isinstance(port, dict):
            published.append((str(port.get("host_ip", "")), str(port.get("published", "")), str(port["target"])))
            continue
        spec = str(port).split("/")[0]
        if spec.startswith("["):  # [ipv6]:host:container
            host_ip, rest = spec[1:].split("]:", 1)
            host_port, container_port = rest.split(":")
        else:
            parts = spec.rsplit(":", 2)
            parts = [""] * (3 - len(parts)) + parts
            host_ip, host_port, container_port = parts
        published.append((host_ip, host_port, container_port))
    return published


def command_of(service: dict) -> str:
    command = service.get("command", "")
    return " ".join(command) if isinstance(command, list) else str(command)


# --- checks ------------------------------------------------------------------------------------------------------


def check_services(compose: dict) -> None:
    services = compose.get("services") or {}
    missing = {*AIRFLOW_SERVICES, "postgres"} - set(services)
    assert not missing, f"docker-compose.yaml lost services: {sorted(missing)}"
    for name, subcommand in COMMANDS.items():
        assert subcommand in command_of(services[name]).split(), (
            f"{name} must run `airflow {subcommand}`, its command is {command_of(services[name])!r}"
        )
    assert str(services["postgres"].get("image", "")).startswith("postgres:16"), "postgres must run Postgres 16"


def check_shared_image_and_env(compose: dict) -> None:
    common = compose.get("x-airflow-common") or {}
    common_env = env_of(common)
    assert common.get("image") and common.get("build"), "x-airflow-common must define both image and build"
    build = common["build"]
    context = build if isinstance(build, str) else build.get("context", ".")
    dockerfile = "Dockerfile" if isinstance(build, str) else build.get("dockerfile", "Dockerfile")
    assert (ROOT / context).resolve() == ROOT and dockerfile == "Dockerfile", "the image must build from ./Dockerfile"
    for name in AIRFLOW_SERVICES:
        service = compose["services"][name]
        assert service.get("image") == common["image"], f"{name} uses image {service.get('image')!r}"
        assert service.get("build") == build, f"{name} does not build from the shared Dockerfile"
        env = env_of(service)
        lost = {key for key, value in common_env.items() if env.get(key) != value}
        assert not lost, f"{name} lost or overrides shared environment: {sorted(lost)}"


def check_airflow_settings(compose: dict) -> None:
    services = compose["services"]
    api_ports = {container for _, _, container in published_ports(services["airflow-apiserver"])}
    assert api_ports, "airflow-apiserver publishes no port"
    for name in AIRFLOW_SERVICES:
        service = services[name]
        env = env_of(service)
        assert env.get("AIRFLOW__CORE__EXECUTOR") == "LocalExecutor", f"{name}: executor must be LocalExecutor"
        sql_alchemy_conn = env.get("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "")
        assert re.match(r"postgresql(\+\w+)?://[^@]+@postgres[:/]", sql_alchemy_conn), (
            f"{name}: the metadata DB must be the postgres service, not {sql_alchemy_conn!r}"
        )
        assert env.get("AIRFLOW__CORE__LOAD_EXAMPLES", "").lower() == "false", f"{name}: examples must be off"
        assert env.get("AIRFLOW__CORE__EXECUTION_API_SERVER_URL") in {
            f"http://airflow-apiserver:{port}/execution/" for port in api_ports
        }, f"{name}: tasks must reach the Execution API on airflow-apiserver"
        parallelism = int(env.get("AIRFLOW__CORE__PARALLELISM", "32"))
        assert 1 <= parallelism <= 16, f"{name}: parallelism {parallelism} starts that many LocalExecutor workers"
        depends_on = service.get("depends_on") or {}
        assert isinstance(depends_on, dict), f"{name}: depends_on needs conditions"
        assert (depends_on.get("postgres") or {}).get("condition") == "service_healthy", (
            f"{name} must wait for a healthy postgres"
        )
        if name in LONG_RUNNING:
            assert (depends_on.get("airflow-init") or {}).get("condition") == "service_completed_successfully", (
                f"{name} must wait for airflow-init (db migrate) to succeed"
            )


def check_code_mounts(compose: dict) -> None:
    logs_sources = set()
    for name in LONG_RUNNING:
        mounts = mounts_of(compose["services"][name])
        for target, source in CODE_MOUNTS.items():
            assert target in mounts, f"{name} does not mount anything at {target}"
            assert mounts[target][0].rstrip("/") == source, f"{name} mounts {mounts[target][0]!r} at {target}"
            assert (ROOT / source).is_dir(), f"{source} is mounted but does not exist"
        assert LOGS_DIR in mounts, f"{name} does not mount {LOGS_DIR}"
        logs_sources.add(mounts[LOGS_DIR][0])
    # The api-server serves the logs the scheduler (tasks) and triggerer write: one volume for all.
    assert len(logs_sources) == 1, f"the Airflow services write logs to different volumes: {sorted(logs_sources)}"


def check_include_env(compose: dict) -> None:
    include_target = next(target for target, source in CODE_MOUNTS.items() if source == "./include")
    folder_env = {
        "AIRFLOW__CORE__DAGS_FOLDER": "/opt/airflow/dags",
        "AIRFLOW__CORE__PLUGINS_FOLDER": "/opt/airflow/plugins",
    }
    for name in AIRFLOW_SERVICES:
        service = compose["services"][name]
        env = env_of(service)
        assert env.get(INCLUDE_ENV) == include_target, (
            f"{name}: {INCLUDE_ENV}={env.get(INCLUDE_ENV)!r} but include/ is mounted at {include_target}"
        )
        if name in LONG_RUNNING:
            assert mounts_of(service)[include_target][0].rstrip("/") == "./include"
        for key, mounted_at in folder_env.items():  # unset means AIRFLOW_HOME/<dir>, which is where it is mounted
            assert env.get(key, mounted_at) == mounted_at, f"{name}: {key}={env[key]!r} is not where it is mounted"


def check_ports(compose: dict) -> None:
    api = published_ports(compose["services"]["airflow-apiserver"])
    assert api == [(LOOPBACK, "8080", "8080")], f"airflow-apiserver must publish 127.0.0.1:8080:8080 only, got {api}"
    for name, service in compose["services"].items():
        for host_ip, host_port, container_port in published_ports(service):
            assert host_ip == LOOPBACK, (
                f"{name} publishes {container_port} on {host_ip or 'every interface'}:{host_port}, not on {LOOPBACK}"
            )
    assert not published_ports(compose["services"]["postgres"]), "postgres must not be published"


def check_healthchecks(compose: dict) -> None:
    for name in ("postgres", *LONG_RUNNING):
        healthcheck = compose["services"][name].get("healthcheck") or {}
        test = healthcheck.get("test")
        assert test and not healthcheck.get("disable") and test != ["NONE"], f"{name} has no healthcheck"
    scheduler = compose["services"]["airflow-scheduler"]
    if "8974" in " ".join(scheduler["healthcheck"]["test"]):
        assert env_of(scheduler).get("AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK", "").lower() == "true", (
            "the scheduler healthcheck polls :8974, which needs AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK=true"
        )


def check_no_literal_secrets(compose: dict) -> None:
    for name in AIRFLOW_SERVICES:
        env = env_of(compose["services"][name])
        for key in SECRET_ENV:
            assert key in env, f"{name} does not set {key}"
    for name, service in compose["services"].items():
        for key, value in env_of(service).items():
            sensitive = key.startswith("AIRFLOW_CONN_") or re.search(r"(PASSWORD|TOKEN|SECRET|_KEY)$", key)
            if sensitive and (name, key) not in LOCAL_ONLY_CREDENTIALS:
                assert ENV_REFERENCE.fullmatch(value), (
                    f"{name}: {key} must be a ${{VARIABLE}} from .env with no default value, not {value!r}"
                )


def check_no_secret_shaped_text(text: str) -> None:
    assert not re.search(r"(?<![A-Za-z0-9_-])[A-Za-z0-9_-]{43}=", text), "a Fernet key is written in the file"
    assert "PRIVATE KEY" not in text and '"private_key"' not in text, "a service-account key is written in the file"


def check_dockerfile(dockerfile: str, requirements: str) -> None:
    joined = re.sub(r"\\\n", " ", dockerfile)  # line continuations
    instructions = [line.strip() for line in joined.splitlines() if line.strip() and not line.strip().startswith("#")]
    froms = [line for line in instructions if line.upper().startswith("FROM ")]
    assert len(froms) == 1, f"expected one FROM, got {froms}"
    match = re.fullmatch(r"FROM\s+apache/airflow:(\d+\.\d+\.\d+)-python(\d+\.\d+)", froms[0], flags=re.IGNORECASE)
    assert match, f"the base must be the official apache/airflow:<version>-python<x.y> image, got {froms[0]!r}"
    image_version, python_version = match.groups()
    assert image_version == pinned_airflow_version(requirements), (
        f"Dockerfile uses Airflow {image_version}, requirements.txt pins {pinned_airflow_version(requirements)}"
    )
    assert python_version == PYTHON_VERSION, f"the image runs Python {python_version}, the project {PYTHON_VERSION}"
    pip_install = re.compile(r"RUN\s+(?:.*&&\s*)?(?:python3?\S* -m )?pip install\b[^&;|]*\s-r\s+\S*requirements\.txt")
    user = "airflow"  # the official image's default user
    installs = 0
    for line in instructions:
        keyword = line.split()[0].upper()
        if keyword == "USER":
            user = line.split()[1].split(":")[0]
        elif keyword in {"COPY", "ADD"}:
            sources = [arg for arg in line.split()[1:-1] if not arg.startswith("--")]
            assert sources == ["requirements.txt"], f"the image copies only requirements.txt (code is mounted): {line}"
        elif keyword == "RUN":
            assert "constraint" not in line, "no constraints file: requirements.txt pins the direct dependencies"
            if pip_install.match(line):
                assert user == "airflow", f"pip must run as the airflow user, not {user}"
                installs += 1
    assert installs, "the image must pip install -r requirements.txt"
    assert user == "airflow", f"the image must end as the airflow user, not {user}"


def check_dockerignore(dockerignore: str) -> None:
    lines = [line.strip() for line in dockerignore.splitlines() if line.strip() and not line.startswith("#")]
    for entry in (".venv", ".airflow", ".git", ".env", ".pytest_cache", ".ruff_cache", "**/__pycache__"):
        assert entry in lines, f".dockerignore must exclude {entry}"
    # The last matching rule wins: requirements.txt must end up included.
    verdict = None
    for line in lines:
        pattern = line.removeprefix("!")
        if pattern in {"*", "requirements.txt", "*.txt"}:
            verdict = line.startswith("!")
    assert verdict in {None, True}, ".dockerignore excludes requirements.txt, which the Dockerfile copies"


# --- the real files ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def compose() -> dict:
    return load_compose()


@pytest.mark.parametrize(
    "check",
    [
        check_services,
        check_shared_image_and_env,
        check_airflow_settings,
        check_code_mounts,
        check_include_env,
        check_ports,
        check_healthchecks,
        check_no_literal_secrets,
    ],
    ids=lambda check: check.__name__,
)
def test_compose(compose: dict, check: Callable[[dict], None]) -> None:
    check(compose)


def test_compose_text_has_no_secrets() -> None:
    check_no_secret_shaped_text(COMPOSE_PATH.read_text())


def test_dockerfile_matches_requirements() -> None:
    check_dockerfile(DOCKERFILE_PATH.read_text(), REQUIREMENTS_PATH.read_text())


def test_dockerignore() -> None:
    check_dockerignore(DOCKERIGNORE_PATH.read_text())


# --- the checks can fail -----------------------------------------------------------------------------------------


def _drop_service(name: str) -> Callable[[dict], None]:
    return lambda compose: compose["services"].pop(name)


def _set_env(names: tuple[str, ...], key: str, value: str | None) -> Callable[[dict], None]:
    def mutate(compose: dict) -> None:
        for target in [compose["x-airflow-common"], *(compose["services"][name] for name in names)]:
            env = dict(target["environment"])  # merged envs may share objects: replace, never edit in place
            if value is None:
                env.pop(key, None)
            else:
                env[key] = value
            target["environment"] = env

    return mutate


def _set(name: str, key: str, value: object) -> Callable[[dict], None]:
    return lambda compose: compose["services"][name].__setitem__(key, value)


def _filter_volumes(name: str, keep: Callable[[str], bool]) -> Callable[[dict], None]:
    def mutate(compose: dict) -> None:
        service = compose["services"][name]
        service["volumes"] = [volume for volume in service["volumes"] if keep(volume)]

    return mutate


def _replace_volume(name: str, old: str, new: str) -> Callable[[dict], None]:
    def mutate(compose: dict) -> None:
        service = compose["services"][name]
        service["volumes"] = [new if volume.startswith(old) else volume for volume in service["volumes"]]

    return mutate


BROKEN_COMPOSE = {
    "triggerer removed": (_drop_service("airflow-triggerer"), check_services),
    "dag-processor runs the scheduler": (_set("airflow-dag-processor", "command", "scheduler"), check_services),
    "scheduler on another image": (
        _set("airflow-scheduler", "image", "apache/airflow:latest"),
        check_shared_image_and_env,
    ),
    "triggerer without build": (
        lambda compose: compose["services"]["airflow-triggerer"].pop("build"),
        check_shared_image_and_env,
    ),
    "scheduler lost the shared env": (
        _set("airflow-scheduler", "environment", {"AIRFLOW__CORE__EXECUTOR": "LocalExecutor"}),
        check_shared_image_and_env,
    ),
    "execution API on localhost": (
        _set_env(AIRFLOW_SERVICES, "AIRFLOW__CORE__EXECUTION_API_SERVER_URL", "http://localhost:8080/execution/"),
        check_airflow_settings,
    ),
    "default parallelism": (_set_env(AIRFLOW_SERVICES, "AIRFLOW__CORE__PARALLELISM", None), check_airflow_settings),
    "sqlite metadata DB": (
        _set_env(AIRFLOW_SERVICES, "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "sqlite:////tmp/airflow.db"),
        check_airflow_settings,
    ),
    "scheduler starts before migrate": (
        _set("airflow-scheduler", "depends_on", {"postgres": {"condition": "service_healthy"}}),
        check_airflow_settings,
    ),
    "triggerer without plugins": (
        _filter_volumes("airflow-triggerer", lambda volume: "/plugins" not in volume),
        check_code_mounts,
    ),
    "dag-processor mounts dags elsewhere": (
        _replace_volume("airflow-dag-processor", "./dags:", "./dags:/usr/local/airflow/dags:ro"),
        check_code_mounts,
    ),
    "api-server mounts another include": (
        _replace_volume("airflow-apiserver", "./include:", "./sandbox:/opt/airflow/include:ro"),
        check_code_mounts,
    ),
    "scheduler logs on their own": (
        _replace_volume("airflow-scheduler", "airflow-logs:", "./logs:/opt/airflow/logs"),
        check_code_mounts,
    ),
    "include env points elsewhere": (
        _set_env(AIRFLOW_SERVICES, INCLUDE_ENV, "/opt/airflow/dags/include"),
        check_include_env,
    ),
    "include env missing on the triggerer": (_set_env(("airflow-triggerer",), INCLUDE_ENV, None), check_include_env),
    "dags folder overridden": (
        _set_env(("airflow-scheduler",), "AIRFLOW__CORE__DAGS_FOLDER", "/opt/airflow/dags/nemo"),
        check_include_env,
    ),
    "api-server on every interface": (_set("airflow-apiserver", "ports", ["8080:8080"]), check_ports),
    "api-server on 0.0.0.0": (_set("airflow-apiserver", "ports", ["0.0.0.0:8080:8080"]), check_ports),
    "api-server long syntax without host_ip": (
        _set("airflow-apiserver", "ports", [{"target": 8080, "published": 8080}]),
        check_ports,
    ),
    "postgres published": (_set("postgres", "ports", ["5432:5432"]), check_ports),
    "postgres published on loopback": (_set("postgres", "ports", ["127.0.0.1:5432:5432"]), check_ports),
    "triggerer without healthcheck": (
        lambda compose: compose["services"]["airflow-triggerer"].pop("healthcheck"),
        check_healthchecks,
    ),
    "scheduler health server off": (
        _set_env(("airflow-scheduler",), "AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK", "false"),
        check_healthchecks,
    ),
    "literal fernet key": (
        _set_env(AIRFLOW_SERVICES, "AIRFLOW__CORE__FERNET_KEY", base64.urlsafe_b64encode(bytes(32)).decode()),
        check_no_literal_secrets,
    ),
    "JWT secret with a default": (
        _set_env(AIRFLOW_SERVICES, "AIRFLOW__API_AUTH__JWT_SECRET", "${AIRFLOW_JWT_SECRET:-change-me}"),
        check_no_literal_secrets,
    ),
    "JWT secret missing": (_set_env(AIRFLOW_SERVICES, "AIRFLOW__API_AUTH__JWT_SECRET", None), check_no_literal_secrets),
    "literal admin password": (
        _set_env(("airflow-init",), "_AIRFLOW_ADMIN_PASSWORD", "admin"),
        check_no_literal_secrets,
    ),
    "literal Google connection": (
        _set_env(("airflow-scheduler",), "AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT", "google-cloud-platform://?project=p"),
        check_no_literal_secrets,
    ),
}


@pytest.mark.parametrize("breakage", list(BROKEN_COMPOSE), ids=list(BROKEN_COMPOSE))
def test_compose_checks_catch(compose: dict, breakage: str) -> None:
    mutate, check = BROKEN_COMPOSE[breakage]
    broken = copy.deepcopy(compose)
    mutate(broken)
    with pytest.raises(AssertionError):
        check(broken)


def test_secret_text_check_catches_a_fernet_key() -> None:
    key = base64.urlsafe_b64encode(bytes(32)).decode()
    with pytest.raises(AssertionError):
        check_no_secret_shaped_text(COMPOSE_PATH.read_text() + f"\n# AIRFLOW__CORE__FERNET_KEY: {key}\n")


REQUIREMENTS = "apache-airflow==3.3.2\nray[default]==2.60.0\n"
GOOD_DOCKERFILE = (
    "FROM apache/airflow:3.3.2-python3.11\n"
    "USER airflow\n"
    "COPY --chown=airflow:0 requirements.txt /tmp/requirements.txt\n"
    "RUN pip install --no-cache-dir -r /tmp/requirements.txt\n"
)
BROKEN_DOCKERFILES = {
    "image older than the pin": GOOD_DOCKERFILE.replace(":3.3.2-", ":3.3.1-"),
    "other python": GOOD_DOCKERFILE.replace("python3.11", "python3.12"),
    "untagged python": GOOD_DOCKERFILE.replace("-python3.11", ""),
    "not the official image": GOOD_DOCKERFILE.replace("apache/airflow", "python"),
    "copies the code": GOOD_DOCKERFILE + "COPY plugins/ /opt/airflow/plugins/\n",
    "copies everything": GOOD_DOCKERFILE + "COPY . /opt/airflow/\n",
    "no pip install": GOOD_DOCKERFILE.replace("RUN pip", "RUN echo pip"),
    "constraints file": GOOD_DOCKERFILE.replace("--no-cache-dir", "--no-cache-dir -c constraints.txt"),
    "ends as root": GOOD_DOCKERFILE + "USER root\n",
    "installs as root": GOOD_DOCKERFILE.replace("USER airflow\n", "USER root\n") + "USER airflow\n",
}


def test_good_dockerfile_passes() -> None:
    check_dockerfile(GOOD_DOCKERFILE, REQUIREMENTS)
    continued = GOOD_DOCKERFILE.replace("--no-cache-dir -r", "--no-cache-dir \\\n    -r")
    check_dockerfile(continued, REQUIREMENTS)


@pytest.mark.parametrize("breakage", list(BROKEN_DOCKERFILES), ids=list(BROKEN_DOCKERFILES))
def test_dockerfile_check_catches(breakage: str) -> None:
    with pytest.raises(AssertionError):
        check_dockerfile(BROKEN_DOCKERFILES[breakage], REQUIREMENTS)


def test_dockerfile_check_catches_a_moved_pin() -> None:
    with pytest.raises(AssertionError):
        check_dockerfile(GOOD_DOCKERFILE, REQUIREMENTS.replace("3.3.2", "3.3.3"))


@pytest.mark.parametrize(
    "dockerignore",
    [
        DOCKERIGNORE_PATH.read_text().replace(".env\n", ""),
        DOCKERIGNORE_PATH.read_text().replace(".venv\n", ""),
        DOCKERIGNORE_PATH.read_text() + "requirements.txt\n",
        DOCKERIGNORE_PATH.read_text().replace("!requirements.txt\n", ""),
    ],
    ids=["no .env", "no .venv", "requirements excluded", "allowlist without requirements"],
)
def test_dockerignore_check_catches(dockerignore: str) -> None:
    with pytest.raises(AssertionError):
        check_dockerignore(dockerignore)
