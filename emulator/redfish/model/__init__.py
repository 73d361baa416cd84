"""What the service declares: Redfish messages and errors, resource payloads, URIs, fault specs,
latency profiles and the durable fabric state. Nothing here changes the fabric or speaks HTTP."""
