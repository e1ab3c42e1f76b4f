# Change freeze: while the cluster-wide annotation bosun.dev/change-freeze is set, no
# step may start.
#
# The annotation (on the kube-system Namespace, surfaced as input.cluster.annotations):
#   "true" or any reason text  -> frozen until the annotation is removed or set to "false"
#   an RFC 3339 time           -> frozen until that time
# Operation kinds listed in data.change_freeze.exempt_kinds (for example
# RenewCertificates, so that a freeze cannot let certificates expire) go on anyway.
#
# Written to be cheap to evaluate (it runs before every step): without the annotation,
# each deny rule stops at its second line.
package bosun.step.change_freeze

config := c if {
	c := data.change_freeze
} else := {}

# Frozen with a reason (or "true"), until the annotation is removed or set to "false".
deny contains msg if {
	annotation := object.get(config, "annotation", "bosun.dev/change-freeze")
	value := trim_space(input.cluster.annotations[annotation])
	not input.operation.kind in object.get(config, "exempt_kinds", [])
	not lower(value) in {"", "false", "no", "off", "0"}
	not regex.match(`^[0-9]{4}-[0-9]{2}-[0-9]{2}T`, value)
	reasons := {"true": ""}
	reason := object.get(reasons, lower(value), sprintf(" (%s)", [value]))
	msg := sprintf("the cluster is in a change freeze%s: remove the %s annotation from the kube-system Namespace to go on", [reason, annotation])
}

# Frozen until a time (RFC 3339).
deny contains msg if {
	annotation := object.get(config, "annotation", "bosun.dev/change-freeze")
	value := trim_space(input.cluster.annotations[annotation])
	not input.operation.kind in object.get(config, "exempt_kinds", [])
	regex.match(`^[0-9]{4}-[0-9]{2}-[0-9]{2}T`, value)
	time.parse_rfc3339_ns(input.now) < time.parse_rfc3339_ns(value)
	msg := sprintf("the cluster is in a change freeze until %s (annotation %s)", [value, annotation])
}
