"""The run's decisions: its state machines as plain functions of what was read, each returning what to do.

Between the actions below (``gcp/``, ``kube/``, ``ray/``, which read and write) and the Airflow glue above
(``operators/``, ``triggers/``, the sweeper), which reads, calls a decision here, and acts on it. Nothing here
sends a request or touches Airflow: a decision's every input is an argument, so a test gives it a state and checks the
answer.

- :mod:`~nemo_rl_gke.decide.teardown`: keep or delete a resource at teardown (Lustre while a checkpoint on it is
  pending, what Lustre needs while it stays), for the DAG's delete steps and the sweeper alike.
- :mod:`~nemo_rl_gke.decide.job_stop`: when the job trigger ends its wait (the job's end, convergence, zero learning,
  the run's deadline, a stall, the job timeout), and whether that stops the job.
- :mod:`~nemo_rl_gke.decide.job_end`: what the wait task makes of that end (success or failure, the run's checkpoint).
- :mod:`~nemo_rl_gke.decide.recovery`: node-loss recovery (recover, resubmit or give up, and from which step).
- :mod:`~nemo_rl_gke.decide.ladder`: the capacity ladder's walk (the rung a pool is on, what follows a rung's wait).
- :mod:`~nemo_rl_gke.decide.sweep`: the sweeper's groups, its waves of deletions and its lease records.
"""
