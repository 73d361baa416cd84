"""The manager's REST API: routes, authentication, the guard every request passes, the OpenAPI
document, and the fabric map's static files (``ui``)."""
