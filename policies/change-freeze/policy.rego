# Change freeze: while the cluster-wide annotation bosun.dev/change-freeze is set, no
# step may start.
#
# The annotation (on the kube-system Namespace, surfaced as input.cluster.annotations):
#   "true" or any reason text  -> frozen until the annotation is removed or set to "false"
#   an RFC 3339 time           -> frozen until that time
# Operation kinds listed in data.change_freeze.exempt_kinds (for example
# RenewCertificates, so that a freeze cannot let certificates expire) go on anyway.
package bosun.step.change_freeze

default config := {}

config := data.change_freeze

annotation := object.get(config, "annotation", "bosun.dev/change-freeze")

value := trim_space(input.cluster.annotations[annotation])

exempt if input.operation.kind in object.get(config, "exempt_kinds", [])

is_time(v) if regex.match(`^[0-9]{4}-[0-9]{2}-[0-9]{2}T`, v)

frozen_by_reason if {
	not is_time(value)
	not lower(value) in {"", "false", "no", "off", "0"}
}

frozen_until_time if {
	is_time(value)
	time.parse_rfc3339_ns(input.now) < time.parse_rfc3339_ns(value)
}

reason := "" if lower(value) == "true"

else := sprintf(" (%s)", [value])

deny contains msg if {
	not exempt
	frozen_by_reason
	msg := sprintf("the cluster is in a change freeze%s: remove the %s annotation from the kube-system Namespace to go on", [reason, annotation])
}

deny contains msg if {
	not exempt
	frozen_until_time
	msg := sprintf("the cluster is in a change freeze until %s (annotation %s)", [value, annotation])
}
