"""Async triggers the triggerer runs while a task is deferred.

They live under plugins/ (not dags/) because the real triggerer imports trigger classes only from plugins/ or installed
packages; the classpath each one serializes is ``nemo_rl_gke.triggers.<module>.<Class>``.
"""
