"""The resource tree over HTTP: requests and replies, nodes, rendered payloads and their ETags,
``$expand``/``$select``, accounts and sessions."""
