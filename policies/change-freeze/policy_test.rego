package bosun.step.change_freeze_test

import data.bosun.step.change_freeze

doc(annotations) := {
	"operation": {"kind": "Upgrade"},
	"cluster": {"annotations": annotations},
	"now": "2026-11-28T22:30:00Z",
}

test_no_annotation_is_allowed if {
	count(change_freeze.deny) == 0 with input as doc({})
}

test_true_freezes if {
	change_freeze.deny == {"the cluster is in a change freeze: remove the bosun.dev/change-freeze annotation from the kube-system Namespace to go on"} with input as doc({"bosun.dev/change-freeze": "true"})
}

test_reason_is_shown if {
	change_freeze.deny == {"the cluster is in a change freeze (Black Friday, INC-1234): remove the bosun.dev/change-freeze annotation from the kube-system Namespace to go on"} with input as doc({"bosun.dev/change-freeze": "Black Friday, INC-1234"})
}

test_false_does_not_freeze if {
	count(change_freeze.deny) == 0 with input as doc({"bosun.dev/change-freeze": "false"})
}

test_until_a_time if {
	count(change_freeze.deny) == 1 with input as doc({"bosun.dev/change-freeze": "2026-12-01T00:00:00Z"})
	count(change_freeze.deny) == 0 with input as doc({"bosun.dev/change-freeze": "2026-11-28T00:00:00Z"})
}

test_exempt_kinds_go_on if {
	count(change_freeze.deny) == 0 with input as doc({"bosun.dev/change-freeze": "true"})
		with data.change_freeze as {"exempt_kinds": ["Upgrade"]}
}
