"""The run: the conf validated into a RunSpec, its shape (topology), recipes, deployment, owners and schedules."""
