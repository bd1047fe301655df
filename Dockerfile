# The official Airflow image plus the package's pinned runtime dependencies, and nothing else: docker-compose.yaml
# mounts dags/, plugins/ and include/, so code edits show up without a rebuild (rebuild after editing requirements.txt).
# No constraints file (not reachable here, FACTS §1): requirements.txt pins the direct dependencies, apache-airflow
# included, so pip cannot move Airflow away from the image's version. tests/unit/test_compose.py keeps tag and pin equal.
FROM apache/airflow:3.3.2-python3.11

USER airflow
COPY --chown=airflow:0 requirements.txt /tmp/requirements.txt
RUN pip install --no-cache-dir -r /tmp/requirements.txt
