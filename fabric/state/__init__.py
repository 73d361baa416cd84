"""What the manager knows and records: device and host records and their names, the inventory it
serves, the ledger of why each device is bound, the operation log, the nodes of the hosts, the
cluster's ResourceClaims, the plugins' reports and the metrics. Nothing here speaks Redfish."""
