package bosun.step.version_skew_test

import data.bosun.step.version_skew

doc(target, kubelet, roles, api) := {
	"operation": {"kind": "Upgrade", "targetVersion": target},
	"node": {"name": "n1", "roles": roles, "kubeletVersion": kubelet, "kubeadmVersion": target},
	"cluster": {"version": api},
}

test_one_minor_step_is_allowed if {
	count(version_skew.deny) == 0 with input as doc("v1.34.2", "v1.33.5", ["control-plane"], "v1.33.5")
}

test_patch_upgrade_is_allowed if {
	count(version_skew.deny) == 0 with input as doc("v1.34.3", "v1.34.2", ["worker"], "v1.34.3")
}

test_two_minor_steps_are_denied if {
	version_skew.deny == {"kubelet on n1 is v1.32.9; v1.34.2 skips a minor version: upgrade one minor version at a time"} with input as doc("v1.34.2", "v1.32.9", ["control-plane"], "v1.32.9")
}

test_downgrade_is_denied if {
	version_skew.deny == {"kubelet on n1 is v1.34.2; v1.34.1 would be a downgrade, which is not supported"} with input as doc("v1.34.1", "v1.34.2", ["control-plane"], "v1.34.2")
}

test_worker_not_ahead_of_control_plane if {
	count(version_skew.deny) == 1 with input as doc("v1.34.2", "v1.33.5", ["worker"], "v1.33.5")
}

test_other_operations_are_not_judged if {
	count(version_skew.deny) == 0 with input as {"operation": {"kind": "RenewCertificates"}, "node": {"name": "n1", "roles": []}}
}

test_a_new_major_version_is_denied if {
	version_skew.deny == {"kubelet on n1 is v1.34.2; v2.0.0 skips a minor version: upgrade one minor version at a time"} with input as doc("v2.0.0", "v1.34.2", ["control-plane"], "v2.0.0")
}

test_kubeadm_downgrade_is_denied_too if {
	version_skew.deny == {"kubeadm on n1 is v1.34.2; v1.33.9 would be a downgrade, which is not supported"} with input as {
		"operation": {"kind": "Upgrade", "targetVersion": "v1.33.9"},
		"node": {"name": "n1", "roles": ["control-plane"], "kubeletVersion": "v1.33.5", "kubeadmVersion": "v1.34.2"},
		"cluster": {"version": "v1.33.9"},
	}
}
