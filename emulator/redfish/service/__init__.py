"""The service: the ASGI application around the resource tree, and the server that assembles
state, engine and tree and runs them."""
