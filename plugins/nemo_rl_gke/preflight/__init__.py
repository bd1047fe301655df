"""Offline preflight: the rule registry and the bound, resource and NeMo RL rules, run before anything exists."""
