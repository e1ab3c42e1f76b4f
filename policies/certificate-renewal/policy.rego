# Certificate renewal only when it is due: a renewal step may run only when at least one
# of the node's certificates expires within data.certificate_renewal.renew_within_days
# (default 30) of now. Renewing early is harmless for kubeadm itself but restarts the
# control plane for nothing and hides a broken renewal schedule.
#
# Applies to steps of RenewCertificates operations, and to steps whose plugin and action
# are listed in data.certificate_renewal.renewal_actions (default: certs/renew).
#
# Written to be cheap to evaluate (it runs before every step): a step that is not a
# renewal stops at the first line of each deny rule.
package bosun.step.certificate_renewal

config := c if {
	c := data.certificate_renewal
} else := {}

renewal if input.operation.kind == "RenewCertificates"

renewal if {
	some a in object.get(config, "renewal_actions", [{"plugin": "certs", "action": "renew"}])
	a.plugin == input.step.plugin
	a.action == input.step.action
}

deny contains msg if {
	renewal
	count(input.node.certificates) == 0
	msg := sprintf("node %s reports no certificate expiry dates, so it cannot be shown that renewal is due", [input.node.name])
}

deny contains msg if {
	renewal
	count(input.node.certificates) > 0
	days := object.get(config, "renew_within_days", 30)
	horizon_ns := time.parse_rfc3339_ns(input.now) + ((((days * 24) * 60) * 60) * 1000000000)
	due := [c | some c in input.node.certificates; time.parse_rfc3339_ns(c.notAfter) <= horizon_ns]
	count(due) == 0
	earliest := min({c.notAfter | some c in input.node.certificates})
	msg := sprintf("no certificate on %s expires within %d days (the earliest expires %s); renewal is allowed only within %d days of expiry", [input.node.name, days, earliest, days])
}
