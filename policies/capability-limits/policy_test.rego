package bosun.capabilities.limits_test

import data.bosun.capabilities.limits

doc(exec, fs) := {
	"plugin": {"name": "p"},
	"grants": {"exec": exec, "filesystem": fs},
	"requested": {"exec": [], "filesystem": []},
}

test_kubeadm_and_etc_kubernetes_are_allowed if {
	count(limits.deny) == 0 with input as doc([{"command": "/usr/bin/kubeadm"}], [{"path": "/etc/kubernetes/pki", "access": "ReadWrite"}])
}

test_shells_are_denied if {
	every sh in ["/bin/sh", "/bin/bash", "/usr/bin/dash", "/usr/bin/zsh", "/bin/busybox", "/usr/local/bin/bash5"] {
		count(limits.deny) == 1 with input as doc([{"command": sh}], [])
	}
}

test_interpreters_are_denied if {
	count(limits.deny) == 1 with input as doc([{"command": "/usr/bin/python3.12"}], [])
	count(limits.deny) == 1 with input as doc([{"command": "/usr/bin/env"}], [])
}

test_writes_outside_allowed_prefixes_are_denied if {
	limits.deny == {"filesystem: /etc/kubernetes-backup is granted read-write to plugin p; writes are allowed only under /etc/kubernetes"} with input as doc([], [{"path": "/etc/kubernetes-backup", "access": "ReadWrite"}])
		with data.capability_limits as {}
}

test_read_only_anywhere_is_allowed if {
	count(limits.deny) == 0 with input as doc([], [{"path": "/var/log", "access": "ReadOnly"}])
}

test_dot_dot_is_denied if {
	count(limits.deny) == 1 with input as doc([], [{"path": "/etc/kubernetes/../shadow", "access": "ReadWrite"}])
}
