"""The verb handlers of the API test server, one module per verb family, as
``k8s.io/apiserver/pkg/endpoints/handlers``: :mod:`.get` (get, list), :mod:`.create`,
:mod:`.update`, :mod:`.patch`, :mod:`.delete` (delete, deletecollection), :mod:`.watch`;
:mod:`.rest` holds what they share and :mod:`.scale` the ``/scale`` subresource. Each handler
is ``async (scope, request, info) -> Response`` and raises
:class:`~kube_standin.apiserver.status.StatusError` for the pipeline to answer."""

__all__: list[str] = []
