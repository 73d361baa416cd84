"""The verb handlers of the API test server, one module per verb family, as
``k8s.io/apiserver/pkg/endpoints/handlers``: :mod:`.get` (get, list), :mod:`.create`,
:mod:`.update`, :mod:`.patch`, :mod:`.delete` (delete, deletecollection), :mod:`.watch`. Each
calls what it needs itself — the store, conversion, the schemas, the strategy, admission — and
three of them end in the same write (:mod:`.write`); :mod:`.scope` holds the server's parts a
handler is given and :mod:`.scale` the ``/scale`` subresource's storage. Each handler is
``async (scope, request, info) -> Response`` and raises
:class:`~kube_standin.apiserver.status.StatusError` for the pipeline to answer."""

__all__: list[str] = []
