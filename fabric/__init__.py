"""fabric-dra's fabric side: the Redfish client, binding backends and the fabric manager service."""
