"""The operation driver: one operation at a time per device, from the durable intent through the
attempts on the fabric to the recorded result. The one floor above the backends that is handed
them (and the Redfish task control)."""
