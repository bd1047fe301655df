"""The Ray Jobs API: the sync and async hooks that submit, follow and stop a job, and the driver-log tail."""
