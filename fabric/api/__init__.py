"""The manager's REST API. Its rooms, from the ground up; a module imports only its own room or
those listed before it (``tests/unit/test_layers.py`` reads this list):

* ``ui``             the fabric map: static files that read the API as any client does;
* ``openapi``        the OpenAPI document, completed with what a client must know;
* ``auth``           who may call the manager, for what, and for which node;
* ``request_guard``  what every request passes before its body is read; errors answered once;
* ``context``        what every route is handed: the parts, the caller, bounded names and waits;
* ``routes``         the routes, each handing its request to the part that owns it;
* ``claim_calls``    the three calls of every claim answered in front of FastAPI's router, as the
                     routes answer them (anything else is handed on to it);
* ``app``            the FastAPI application that assembles them.
"""

FLOORS = ("ui", "openapi", "auth", "request_guard", "context", "routes", "claim_calls", "app")
