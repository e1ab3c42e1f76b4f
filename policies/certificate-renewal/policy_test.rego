package bosun.step.certificate_renewal_test

import data.bosun.step.certificate_renewal

doc(not_after) := {
	"operation": {"kind": "RenewCertificates"},
	"step": {"plugin": "certs", "action": "renew"},
	"node": {"name": "cp-1", "certificates": [{"name": "apiserver", "notAfter": not_after}]},
	"now": "2026-11-28T12:00:00Z",
}

test_due_within_30_days_is_allowed if {
	count(certificate_renewal.deny) == 0 with input as doc("2026-12-20T00:00:00Z")
}

test_exactly_30_days_is_allowed if {
	count(certificate_renewal.deny) == 0 with input as doc("2026-12-28T12:00:00Z")
}

test_31_days_is_denied if {
	certificate_renewal.deny == {"no certificate on cp-1 expires within 30 days (the earliest expires 2026-12-29T12:00:00Z); renewal is allowed only within 30 days of expiry"} with input as doc("2026-12-29T12:00:00Z")
}

test_window_comes_from_data if {
	count(certificate_renewal.deny) == 0 with input as doc("2027-02-01T00:00:00Z")
		with data.certificate_renewal as {"renew_within_days": 90}
}

test_expired_certificates_may_be_renewed if {
	count(certificate_renewal.deny) == 0 with input as doc("2026-01-01T00:00:00Z")
}

test_other_operations_are_not_judged if {
	count(certificate_renewal.deny) == 0 with input as {
		"operation": {"kind": "Upgrade"},
		"step": {"plugin": "kubeadm", "action": "upgrade-node"},
		"node": {"name": "cp-1", "certificates": []},
		"now": "2026-11-28T12:00:00Z",
	}
}
