"""A local stand-in for the Google Cloud APIs the DAG provisions with, reached by the real google-cloud clients.

``python -m sandbox serve --port N --state DIR [--latency-scale F] [--seed FILE]`` serves, on one 127.0.0.1 port and
routed by path exactly as Google's (point every client's ``api_endpoint`` at ``http://127.0.0.1:N``):

- compute v1 (:mod:`sandbox.apis.compute`): ``/compute/v1/projects/{p}/global/networks``,
  ``/regions/{r}/subnetworks``, ``/global/firewalls``, ``/global/addresses`` (insert, get, list, delete),
  ``/global/networkProfiles[/{n}]``, ``/zones/{z}/reservations[/{r}]``, ``/regions/{r}`` (quotas),
  ``/global/operations/{op}[/wait]``, ``/regions/{r}/operations/{op}[/wait]``;
- container v1 (:mod:`sandbox.apis.container`): ``/v1/projects/{p}/locations/{l}/clusters[/{c}]``,
  ``.../clusters/{c}/nodePools[/{np}]`` (create, get, list, delete);
- lustre v1 (:mod:`sandbox.apis.lustre`): ``/v1/projects/{p}/locations/{zone}/instances[?instanceId=]``,
  ``.../instances/{i}`` (get, delete), ``.../instances/{i}:exportData``, ``:importData``;
- both: ``/v1/projects/{p}/locations/{l}/operations[/{op}]`` (list, get, ``:cancel``; :mod:`sandbox.apis.locations`);
- servicenetworking v1 (:mod:`sandbox.apis.servicenetworking`): ``/v1/services/{s}/connections`` (POST create,
  GET list ``?network=``), ``/v1/services/{s}/connections/-`` (POST deleteConnection), ``/v1/operations/{op}``;
- cloudresourcemanager v1 ``/v1/projects/{p}`` and serviceusage v1 ``/v1/projects/{p}/services/{s}``,
  ``/v1/projects/{p}/services:batchGet`` (:mod:`sandbox.apis.misc`);
- the admin API under ``/sandbox/`` (:mod:`sandbox.admin`): health, faults, inventory, calls, operations, seed,
  reservations, services, latency, reset, credentials (the service-account key file), auth (token lifetime);
- the OAuth token endpoint ``/token`` (:mod:`sandbox.auth`): every call above but the admin API needs a bearer token
  it issued (or a self-signed JWT from its key), else Google's 401 / the Kubernetes API's ``Unauthorized``.

Bodies are parsed into the real message types with unknown fields rejected; names follow the APIs' rules; operations
take the time of :mod:`sandbox.operations`' latency model; state persists in the state dir (:mod:`sandbox.store`).
:mod:`sandbox.testing` starts it for tests. Not deployed to Airflow.
"""
