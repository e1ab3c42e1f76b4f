package bosun.capabilities.root_equivalent_test

import data.bosun.capabilities.root_equivalent

doc(fs, exec, services) := {
	"plugin": {"name": "p"},
	"grants": {"filesystem": fs, "exec": exec, "services": services},
	"requested": {"exec": [], "filesystem": []},
}

rw(path) := {"path": path, "access": "ReadWrite"}

kubeadm := {"command": "/usr/bin/kubeadm", "args": [["version"]]}

sandboxed(command, sandbox) := {"command": command, "args": [], "sandbox": sandbox}

# The one message whose kind of place is `what`.
about(msgs, what) := [m | some m in msgs; contains(m, sprintf(" (%s): ", [what]))]

test_writable_bin_with_its_command_is_denied if {
	denies := root_equivalent.deny with input as doc([rw("/usr/bin")], [kubeadm], [])
	count(denies) == 2
	[m] := about(denies, "commands the host runs for the plugin")
	m == "root-equivalent grants: /usr/bin is writable (filesystem grant) and reaches /usr/bin/kubeadm (commands the host runs for the plugin): the host runs them as root whenever the plugin asks, whatever the argument patterns say, so a program written in their place runs as root. Make the grant read-only or narrower, or, if plugin p is meant to be root on the node, name it in root_equivalent_grants.allowed_plugins"
	count(about(denies, "the node's programs")) == 1
}

test_service_grants_count_systemctl if {
	denies := root_equivalent.deny with input as doc([rw("/usr/bin/systemctl")], [], [{"unit": "kubelet.service", "actions": ["restart"]}])
	count(about(denies, "the systemctl the host runs for the plugin's service grants")) == 1
	# Without service grants only the PATH finding is left.
	count(root_equivalent.deny) == 1 with input as doc([rw("/usr/bin/systemctl")], [], [])
}

test_read_only_and_siblings_are_allowed if {
	count(root_equivalent.deny) == 0 with input as doc([{"path": "/usr/bin", "access": "ReadOnly"}, rw("/usr/bin2"), rw("/usr/b"), rw("/etc/kubernetes/tmp"), rw("/var/lib/kubelet-old"), rw("/var/lib/etcd-backup")], [kubeadm], [])
}

test_the_whole_root_covers_everything if {
	denies := root_equivalent.deny with input as doc([rw("/")], [kubeadm], [{"unit": "kubelet.service", "actions": ["restart"]}])
	# Every kind of place in the table, the commands and systemctl, once each.
	count(denies) == count(root_equivalent.table) + 2
	every t in root_equivalent.table {
		count(about(denies, t.what)) == 1
	}
}

test_a_descendant_of_a_place_reaches_it if {
	denies := root_equivalent.deny with input as doc([rw("/etc/systemd/system/kubelet.service.d/")], [], [])
	[m] := about(denies, "systemd's units, generators and drop-ins")
	startswith(m, "root-equivalent grants: /etc/systemd/system/kubelet.service.d is writable (filesystem grant) and reaches /etc/systemd/system/kubelet.service.d (")
}

test_a_command_sandbox_writes_count if {
	certs := sandboxed("/usr/bin/kubeadm", {"filesystem": [rw("/etc/kubernetes"), {"path": "/var/lib/kubelet", "access": "ReadOnly"}], "tcpConnect": [6443]})
	denies := root_equivalent.deny with input as doc([], [certs], [])
	[m] := about(denies, "the kubelet's static Pod manifests")
	startswith(m, "root-equivalent grants: /etc/kubernetes is writable (sandbox of exec grant /usr/bin/kubeadm) and reaches /etc/kubernetes/manifests (")
	count(about(denies, "the kubelet's configuration, credentials and state")) == 1
	count(about(denies, "the control plane's certificate authorities and state")) == 1
	count(denies) == 3
}

test_unix_sockets_and_change_metadata_are_root_by_themselves if {
	denies := root_equivalent.deny with input as doc([], [sandboxed("/usr/bin/crictl", {"unixSockets": ["/run/containerd/containerd.sock"]}), sandboxed("/usr/bin/chmod", {"changeMetadata": true})], [])
	count(denies) == 2
	some m in denies
	startswith(m, "root-equivalent grants: the Unix socket /run/containerd/containerd.sock is granted to /usr/bin/crictl: ")
	some n in denies
	startswith(n, "root-equivalent grants: changeMetadata is granted to /usr/bin/chmod: ")
	# TCP ports alone are not root.
	count(root_equivalent.deny) == 0 with input as doc([], [sandboxed("/usr/bin/kubeadm", {"tcpConnect": [6443]})], [])
}

test_a_writable_path_a_command_executes if {
	hooks := sandboxed("/opt/bin/tool", {"filesystem": [{"path": "/var/lib/tool/hooks", "execute": true}]})
	denies := root_equivalent.deny with input as doc([rw("/var/lib/tool")], [hooks], [])
	count(about(denies, "where /opt/bin/tool may execute files")) == 1
	count(denies) == 1
	# Executable but written by nobody: fine.
	count(root_equivalent.deny) == 0 with input as doc([], [hooks], [])
}

test_paths_the_host_refuses_are_skipped if {
	count(root_equivalent.deny) == 0 with input as doc([rw("etc/cron.d"), rw("/var/../etc/cron.d")], [], [])
}

test_a_plugin_allowed_by_name_is_not_denied if {
	input_doc := doc([rw("/etc/kubernetes/manifests")], [], [])
	count(root_equivalent.findings) == 1 with input as input_doc
	count(root_equivalent.deny) == 0 with input as input_doc with data.root_equivalent_grants as {"allowed_plugins": ["other", "p"]}
}

test_the_allow_list_is_by_exact_name if {
	input_doc := doc([rw("/etc/kubernetes/manifests")], [], [])
	count(root_equivalent.deny) == 1 with input as input_doc with data.root_equivalent_grants as {"allowed_plugins": ["P", "p2", "*"]}
	count(root_equivalent.deny) == 1 with input as input_doc with data.root_equivalent_grants as {}
	# The shipped data allows nobody.
	count(root_equivalent.deny) == 1 with input as input_doc
}
