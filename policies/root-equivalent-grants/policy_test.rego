package bosun.capabilities.root_equivalent_test

import data.bosun.capabilities.root_equivalent

doc(fs, exec, services) := {
	"plugin": {"name": "p"},
	"grants": {"filesystem": fs, "exec": exec, "services": services},
	"requested": {"exec": [], "filesystem": []},
}

test_writable_bin_with_its_command_is_denied if {
	root_equivalent.deny == {"root-equivalent grants: filesystem /usr/bin is read-write to plugin p and covers /usr/bin/kubeadm, which it may execute; the plugin could replace it and have it run as root. Grant the directory read-only or more narrowly"} with input as doc([{"path": "/usr/bin", "access": "ReadWrite"}], [{"command": "/usr/bin/kubeadm"}], [])
}

test_service_grants_count_systemctl if {
	count(root_equivalent.deny) == 1 with input as doc([{"path": "/usr", "access": "ReadWrite"}], [], [{"unit": "kubelet.service", "actions": ["restart"]}])
}

test_read_only_and_siblings_are_allowed if {
	count(root_equivalent.deny) == 0 with input as doc([{"path": "/usr/bin", "access": "ReadOnly"}, {"path": "/usr/bin2", "access": "ReadWrite"}, {"path": "/usr/b", "access": "ReadWrite"}], [{"command": "/usr/bin/kubeadm"}], [])
}

test_the_whole_root_covers_everything if {
	count(root_equivalent.deny) == 1 with input as doc([{"path": "/", "access": "ReadWrite"}], [{"command": "/usr/bin/kubeadm"}], [])
}
