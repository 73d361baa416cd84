"""The fabric manager's API contract: request and response models (:mod:`manager_api.models`), the
error family (:mod:`manager_api.errors`), the asyncio client (:mod:`manager_api.client`) and the
inventory followed through its change feed (:mod:`manager_api.feed`).

Both sides depend on it — the manager (:mod:`fabric`) serves it, the plugin, the controller and
``status`` call it — so neither needs the other."""
