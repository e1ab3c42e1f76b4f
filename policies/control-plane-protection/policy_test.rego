package bosun.step.control_plane_test

import data.bosun.step.control_plane

doc(roles, cps) := {
	"node": {"name": "cp-2", "roles": roles},
	"step": {"name": "upgrade"},
	"cluster": {"controlPlane": cps},
}

healthy := [
	{"name": "cp-1", "ready": true, "inProgress": false},
	{"name": "cp-2", "ready": true, "inProgress": true},
]

test_alone_and_healthy_is_allowed if {
	count(control_plane.deny) == 0 with input as doc(["control-plane"], healthy)
}

test_another_in_progress_is_denied if {
	count(control_plane.deny) == 1 with input as doc(["control-plane"], [
		{"name": "cp-1", "ready": true, "inProgress": true},
		{"name": "cp-2", "ready": true, "inProgress": true},
	])
}

test_another_not_ready_is_denied if {
	control_plane.deny == {"control-plane node cp-1 is NotReady; changing cp-2 now could cost the control plane its quorum: bring cp-1 back first"} with input as doc(["control-plane"], [
		{"name": "cp-1", "ready": false, "inProgress": false},
		{"name": "cp-2", "ready": true, "inProgress": true},
	])
}

test_workers_are_not_judged if {
	count(control_plane.deny) == 0 with input as doc(["worker"], [{"name": "cp-1", "ready": false, "inProgress": true}])
}

test_missing_control_plane_list_is_denied if {
	count(control_plane.deny) == 1 with input as doc(["control-plane"], [])
}
