"""Who holds which device: the attach/detach front, the warm pool, reconciliation of the ledger
with the fabric, orphans, and the device-seconds they cost. They reach the fabric only through the
operation driver."""
