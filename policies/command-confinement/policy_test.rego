package bosun.step.command_confinement_test

import data.bosun.step.command_confinement

doc(exec, missing) := {
	"node": {"name": "n1", "confinement": {"landlockAbi": 5, "seccomp": true, "missing": missing}},
	"plugin": {"name": "certs"},
	"grants": {"exec": exec},
}

kubeadm := [{"command": "/usr/bin/kubeadm", "args": [["certs", "renew", "all"]]}]

test_a_fully_confining_node_is_allowed if {
	count(command_confinement.deny) == 0 with input as doc(kubeadm, [])
}

test_a_node_lacking_a_feature_is_refused if {
	count(command_confinement.deny) == 1 with input as doc(kubeadm, ["signals"])
}

test_plugins_without_commands_are_not_affected if {
	count(command_confinement.deny) == 0 with input as doc([], ["signals"])
}
