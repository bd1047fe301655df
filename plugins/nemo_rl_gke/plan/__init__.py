"""The plan layer: every request a run sends (GCP bodies, the Lustre transfers, the Ray jobs), built from the RunSpec.

Pure: nothing here does I/O. The actions (``gcp/``, ``kube/``, the operators) send what these modules build, and
:mod:`nemo_rl_gke.plan.build` prints the same objects, so the plan is what the run sends.
"""
