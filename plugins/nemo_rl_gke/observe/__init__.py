"""What a run did and costs: the log follower and metrics, the report, costs, the view's data, redaction."""
