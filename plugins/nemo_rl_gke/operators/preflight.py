"""The validate and plan tasks: the offline gate every run passes before anything is created."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow.sdk import Context

from nemo_rl_gke.airflow_compat import AirflowFailException, AirflowSkipException
from nemo_rl_gke.operators.base import StepOperator
from nemo_rl_gke.run.topology import FINDINGS, PLAN_TEXT

if TYPE_CHECKING:
    from nemo_rl_gke.run.deployment import Deployment
    from nemo_rl_gke.run.findings import Finding
    from nemo_rl_gke.run.spec import RunSpec


def run_conf(context: Context) -> dict[str, Any]:
    """The conf a run was triggered with, on top of the Param defaults.

    Airflow accepts conf keys it has no Param for, so the raw ``dag_run.conf`` is merged in as well: the
    validator then rejects those keys instead of silently ignoring a typo.
    """
    from airflow.sdk.log import mask_secret

    # lazy: execution-only, kept out of DAG parsing
    from nemo_rl_gke.run.conf_checks import SECRET_KEY

    conf = dict(context["params"])
    dag_run = context.get("dag_run")
    conf.update(getattr(dag_run, "conf", None) or {})
    for key, value in conf.items():
        if SECRET_KEY.search(key):
            mask_secret(value, name=key)  # a token pasted into the conf is redacted from every log line
    return conf


class ValidateConfOperator(StepOperator):
    """Offline preflight of the run conf; pushes the validated spec (as conf) to XCom or fails with every finding.

    A failure is final (no retries): the same conf fails the same way, and nothing has been created.
    """

    ui_color = "#e8f4ea"

    def execute(self, context: Context) -> dict[str, Any]:
        """Validate the run's conf; return the full spec as a JSON conf."""
        # lazy: execution-only, kept out of DAG parsing
        from nemo_rl_gke.preflight.offline import check_conf
        from nemo_rl_gke.run.findings import format_findings
        from nemo_rl_gke.run.recipes import load_recipe, notices_of
        from nemo_rl_gke.run.steps import step_budget

        spec, findings = check_conf(run_conf(context), self.deployment)
        if spec is None:
            for finding in findings:
                self.log.error("%s", finding)
            # Also in XCom, so the UI and `make demo` can show them without reading the log.
            context["ti"].xcom_push(key=FINDINGS, value=[f.to_dict() for f in findings])
            raise AirflowFailException(format_findings(findings))
        self.log.info(
            "Conf is valid: recipe %s, %d x %s nodes, mode %s",
            spec.recipe,
            spec.worker_replicas,
            spec.gpu_type,
            spec.mode,
        )
        for notice in notices_of(spec):
            self.log.warning("Notice: %s", notice)
        budget = step_budget(spec, load_recipe(spec.recipe))
        if budget is None:
            self.log.info(
                "Training: max_steps=%d (the recipe's dataset size is unknown: no epoch cap computed)", spec.max_steps
            )
        elif budget.capped:
            self.log.warning("Training: %s", budget.explain())
        else:
            self.log.info("Training: %s", budget.explain())
        return spec.to_conf()


class PlanOperator(StepOperator):
    """Builds the run's plan from the validated spec, logs it as text and pushes it to XCom as JSON."""

    ui_color = "#eaf0f8"

    def execute(self, context: Context) -> dict[str, Any]:
        """Build the plan of the spec the validate task accepted."""
        # lazy: the cloud clients (gcp/, kube.client, triggers/) stay out of DAG parsing
        from nemo_rl_gke.plan.build import build_plan

        spec = self.run_spec(context)
        plan = build_plan(spec, dag_id=context["dag"].dag_id, run_id=context["run_id"], deployment=self.deployment)
        text = plan.to_text()
        self.log.info("Plan for this run (nothing has been created):\n%s", text)
        context["ti"].xcom_push(key=PLAN_TEXT, value=text)
        return plan.to_dict()


class ApplyGateOperator(StepOperator):
    """Ends a plan-mode run after the plan: it skips itself, and with it every apply task downstream.

    The teardown tasks are skipped too, since their setup (the live preflight) never ran: nothing was created.
    """

    ui_color = "#f4f1e8"

    def execute(self, context: Context) -> None:
        """Skip unless the validated spec asks for apply."""
        spec = self.run_spec(context)
        if spec.mode != "apply":
            raise AirflowSkipException(f"mode={spec.mode}: the plan is the result; nothing is created")
        self.log.info("mode=apply: provisioning starts")


def secret_findings(spec: RunSpec, deployment: Deployment) -> list[Finding]:
    """The job's secrets exist now (connection with a password), before anything is created."""
    from airflow.sdk import BaseHook

    # lazy: execution-only, kept out of DAG parsing
    from nemo_rl_gke.plan.ray_job import job_secrets
    from nemo_rl_gke.run.findings import Finding

    findings = []
    for secret in job_secrets(spec, deployment):
        param = "hf_conn_id" if secret.name == "HF_TOKEN" else "wandb_conn_id"
        try:
            password = BaseHook.get_connection(secret.conn_id).password
        except Exception:
            password = None
        if not password:
            findings.append(
                Finding(
                    "secrets.present",
                    (param,),
                    secret.conn_id,
                    f"the job needs {secret.name} from the password of Airflow connection '{secret.conn_id}', which "
                    "does not exist or has no password",
                    f"create it: airflow connections add {secret.conn_id} --conn-type generic --conn-password <token> "
                    "(or AIRFLOW_CONN_*, or your secrets backend); the token never goes in the conf",
                )
            )
    return findings


class PreflightLiveOperator(StepOperator):
    """Checks the live project before anything is created: IAM, reservation, RoCE profile, APIs, export bucket, quota.

    Fails (no retries) with every finding at once, in the same format as the offline validate task, and pushes them
    to XCom under ``findings``.
    """

    ui_color = "#e8f4ea"

    def execute(self, context: Context) -> None:
        """Run the live checks of the validated spec; fail with all findings."""
        # lazy: execution-only (the cloud clients among them), kept out of DAG parsing
        from nemo_rl_gke.gcp.live_checks import live_findings
        from nemo_rl_gke.run.findings import format_findings

        spec = self.run_spec(context)
        findings = [*live_findings(spec, self.hook), *secret_findings(spec, self.deployment)]
        if findings:
            for finding in findings:
                self.log.error("%s", finding)
            context["ti"].xcom_push(key=FINDINGS, value=[f.to_dict() for f in findings])
            raise AirflowFailException(format_findings(findings))
        self.log.info(
            "Live preflight passed in project %s: IAM, reservation %s, network profile, APIs, export bucket and quota",
            spec.project,
            spec.reservation,
        )
