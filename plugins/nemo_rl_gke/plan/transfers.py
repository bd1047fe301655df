"""Managed Lustre's data transfers of a run, as Lustre v1 REST requests: ``exportData`` copies the validated
checkpoint to Cloud Storage, ``importData`` puts the lineage's checkpoint on a new instance (``resume=latest``).

Both are whole ``*DataRequest`` messages (the action passes them to the client); their REST body is everything but
``name``, which is in the path. Each request id is stable per run and step, so a retried task reuses the operation it
started instead of copying twice.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

from google.cloud import lustre_v1

from nemo_rl_gke.plan.api import ApiRequest, message_body
from nemo_rl_gke.plan.ray_job import RUN_ID_PLACEHOLDER

if TYPE_CHECKING:
    from nemo_rl_gke.run.spec import RunSpec

SERVICE = "lustre"
# An import's Lustre path other than "/" must already exist (FACTS §14); on a new instance only "/" does.
IMPORT_ROOT = "/"


class LayoutError(ValueError):
    """A lineage checkpoint's export is not laid out so that importing its run's prefix puts it back in place."""


def transfer_request_id(dag_id: str, run_id: str, step: int | str, verb: str = "") -> str:
    """The request id of one transfer of one DAG run: a uuid5 of ``dag/run/[verb/]step``. The plan, which knows
    neither the run nor (with ``resume=latest``) the step, shows how it is derived instead."""
    tail = f"{verb}/{step}" if verb else str(step)
    if run_id == RUN_ID_PLACEHOLDER or not isinstance(step, int):
        return f"<uuid5 of {dag_id}/{run_id}/{tail}>"
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"{dag_id}/{run_id}/{tail}"))


def export_uri(spec: RunSpec, dag_id: str, run_id: str, step: int | str) -> str:
    """Where the run exports ``step`` (:meth:`RunSpec.export_uri`); the plan shows the run id as a placeholder."""
    if run_id == RUN_ID_PLACEHOLDER:
        where = spec.checkpoint_lustre_path(step).lstrip("/")  # type: ignore[arg-type]
        return f"gs://{spec.export_bucket_name}/{dag_id}/{RUN_ID_PLACEHOLDER}/{where}/"
    return spec.export_uri(dag_id, run_id, step)  # type: ignore[arg-type]


def _transfer(
    verb: str, spec: RunSpec, message: lustre_v1.ExportDataRequest | lustre_v1.ImportDataRequest
) -> ApiRequest:
    body = message_body(message)
    body.pop("name")  # in the path
    return ApiRequest(
        service=SERVICE,
        method=f"projects.locations.instances.{verb}",
        http_method="POST",
        path=f"/v1/{spec.lustre_path}:{verb}",
        body=body,
        resource=f"Lustre instance {spec.lustre_name}",
        message=message,
    )


def lustre_export_request(spec: RunSpec, dag_id: str, run_id: str, step: int | str) -> ApiRequest:
    """Export ``step``'s directory to :func:`export_uri` (``gcloud lustre instances export-data``)."""
    message = lustre_v1.ExportDataRequest(
        name=spec.lustre_path,
        lustre_path=lustre_v1.LustrePath(path=spec.checkpoint_lustre_path(step)),
        gcs_path=lustre_v1.GcsPath(uri=export_uri(spec, dag_id, run_id, step)),
        request_id=transfer_request_id(dag_id, run_id, step),
    )
    return _transfer("exportData", spec, message)


def import_source(spec: RunSpec, uri: str, step: int) -> str:
    """The prefix to import into Lustre's ``/`` so the lineage's ``step`` (exported at ``uri``) lands at its path.

    The export lays the step out under the exporting run's prefix at its Lustre path (:meth:`RunSpec.export_uri`),
    so that prefix, imported into ``/``, puts it back in place. Raises :class:`LayoutError` when ``uri`` is laid out
    otherwise.
    """
    layout = spec.checkpoint_lustre_path(step).lstrip("/") + "/"
    if not uri.endswith("/" + layout):
        raise LayoutError(
            f"the lineage's checkpoint {uri} is not laid out as {layout} under its run's prefix, so importing it "
            f"into a new Lustre cannot put it at {spec.checkpoint_dir}/step_{step}: it was exported with another "
            "checkpoint_dir (or by an older version of this package). Fix: trigger with the checkpoint_dir it "
            f"was exported from, or copy it to <run prefix>/{layout} (gcloud storage cp -r), or resume=none."
        )
    return uri.removesuffix(layout)


def lustre_import_request(spec: RunSpec, dag_id: str, run_id: str, source: str, step: int | str) -> ApiRequest:
    """Import ``source`` (a run's export prefix, :func:`import_source`) into Lustre's ``/`` for ``step``."""
    message = lustre_v1.ImportDataRequest(
        name=spec.lustre_path,
        gcs_path=lustre_v1.GcsPath(uri=source),
        lustre_path=lustre_v1.LustrePath(path=IMPORT_ROOT),
        request_id=transfer_request_id(dag_id, run_id, step, "import"),
    )
    return _transfer("importData", spec, message)
