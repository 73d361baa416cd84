"""What changes the fabric: binds and unbinds in any Redfish style, tasks, injected faults and the
events they raise, each change durable before it is reported. Independent of HTTP."""
