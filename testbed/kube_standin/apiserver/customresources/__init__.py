"""CustomResourceDefinitions and the custom resources they define, served as kube-apiserver's
apiextensions-apiserver serves them (docs/testing.md, "Custom resources").

* :mod:`.definitions` — what a CRD write must satisfy (names, versions, a structural schema) and
  the status the server gives it (``NamesAccepted``, ``Established``);
* :mod:`.structural` — one version's OpenAPI v3 schema, compiled: validation, pruning, defaults;
* :mod:`.durations` — the ``duration`` and ``date-time`` string formats;
* :mod:`.celrules` — the schema's ``x-kubernetes-validations`` (CEL);
* :mod:`.served` — the resources the stored CRDs define, for routing and discovery.
"""
