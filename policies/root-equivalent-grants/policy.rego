# Root-equivalent grants: grant sets that amount to root on the node, whatever the exec
# grants' argument patterns say. The Rust twin is `root_equivalent` in
# runtime/policy/src/capabilities.rs: the same table, the same findings word for word
# (tests check both against cases.yaml, and that the two tables are equal).
#
# - A writable path that reaches a place whose writer is root: one of `table` below, a
#   command the host runs for the plugin (its exec grants' commands, and
#   /usr/bin/systemctl when it has service grants), or a path one of its commands may
#   execute (a sandbox path with `execute: true`). Writable: a read-write filesystem
#   grant (the plugin and every command it runs write it) or a read-write path of any
#   command's sandbox (that command, root with DAC_OVERRIDE, writes it). A writable path
#   reaches a place when it is the place, an ancestor or a descendant of it.
# - A command sandbox with a Unix socket (containerd's or systemd's is root; before
#   Landlock ABI 9 any Unix socket grant reaches every named socket).
# - A command sandbox with changeMetadata (chmod u+s on any file it can name).
# - A service grant that may start a unit whose start reboots, powers off or halts the
#   node (`shutdown_units`): the reboot plugin's grant is one.
#
# Some plugins are root by nature (certs writes static Pod manifests, kubeadm-upgrade
# runs kubeadm upgrade, packages installs packages). An administrator who accepts that
# names them in the data:
#
#   root_equivalent_grants:
#     allowed_plugins: [certs, kubeadm-upgrade]
#
# Without this policy the capabilities decision still reports the same findings, as
# warnings from policy `bosun`; install this one to refuse them (see docs/security.md).
package bosun.capabilities.root_equivalent

config := c if {
	c := data.root_equivalent_grants
} else := {}

# The plugins the administrator accepts as root on the node.
allowed if input.plugin.name in object.get(config, "allowed_plugins", [])

deny contains msg if {
	not allowed
	some msg in findings
}

allow_list := "root_equivalent_grants.allowed_plugins"

remedy := sprintf("or, if plugin %s is meant to be root on the node, name it in %s", [input.plugin.name, allow_list])

systemctl := "/usr/bin/systemctl"

# The node's places whose writer is root: root runs code from them, runs what they name,
# or lets someone in as root because of them, at a moment the plugin need not cause
# (every program start, every command the host runs, the kubelet's or systemd's next
# start, cron's next minute, the next login, the next package install). Keep equal to
# SENSITIVE_PLACES in runtime/policy/src/capabilities.rs, where each choice is explained.
table := [
	{
		"what": "the node's programs",
		"why": "the host starts every command with PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin, so a program written there replaces one that a command runs by name (a script's tools, apt's dpkg), and the node's services and administrators run the same programs as root",
		"paths": ["/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin", "/usr/libexec", "/usr/local/libexec"]
	},
	{
		"what": "the dynamic loader's configuration and the libraries it loads",
		"why": "every program started later, the agent's next command included, loads its shared libraries and modules through them, so it runs code written there as root",
		"paths": ["/etc/ld.so.preload", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/ld.so.cache", "/lib", "/lib32", "/lib64", "/libx32", "/usr/lib", "/usr/lib32", "/usr/lib64", "/usr/libx32", "/usr/local/lib"]
	},
	{
		"what": "the kubelet's static Pod manifests",
		"why": "the kubelet runs every Pod manifest there without asking the API server, privileged and with the node's file system mounted if the manifest says so",
		"paths": ["/etc/kubernetes/manifests"]
	},
	{
		"what": "the kubelet's configuration, credentials and state",
		"why": "the kubelet runs as root with what is there from its next start (a restart of kubelet.service by any plugin, or a reboot), and it can name another static Pod directory, another API server or a credential helper to execute",
		"paths": ["/var/lib/kubelet", "/etc/kubernetes/kubelet.conf", "/etc/kubernetes/bootstrap-kubelet.conf", "/etc/default/kubelet", "/etc/sysconfig/kubelet"]
	},
	{
		"what": "the control plane's certificate authorities and state",
		"why": "the API server, etcd and the kubelet trust the certificate authorities there, and etcd serves the cluster's objects from there, from their next start (a renewal's restart, an upgrade, a reboot): a CA written there signs a system:masters client certificate, and an object written there can be a privileged Pod, either of which is root on every node",
		"paths": ["/etc/kubernetes/pki", "/var/lib/etcd"]
	},
	{
		"what": "the container runtime's configuration, plugins and images",
		"why": "containerd and CRI-O run as root the runtime and CNI plugin binaries their configuration names, and privileged Pods run the images stored there",
		"paths": ["/etc/containerd", "/etc/crio", "/etc/containers", "/opt/cni/bin", "/var/lib/containerd", "/var/lib/containers"]
	},
	{
		"what": "systemd's units, generators and drop-ins",
		"why": "systemd runs what they define as root at the next boot or daemon-reload, and at once when a unit written there is started or restarted (a service grant)",
		"paths": ["/etc/systemd", "/run/systemd", "/lib/systemd", "/usr/lib/systemd", "/usr/local/lib/systemd", "/etc/init.d", "/etc/rc.local"]
	},
	{
		"what": "OpenRC's init scripts, their configuration and OpenRC's own",
		"why": "on an OpenRC node the agent's service actions run the service's init script as root, sourcing its conf.d file (the host refuses a service action to a plugin that can write them), and OpenRC runs them all at the next boot",
		"paths": ["/etc/conf.d", "/etc/rc.conf", "/etc/runlevels", "/usr/local/etc/init.d", "/usr/local/etc/conf.d", "/run/openrc"]
	},
	{
		"what": "cron's tables",
		"why": "cron runs the jobs there as the user they name, root included, on their schedule (every minute if they say so)",
		"paths": ["/etc/crontab", "/etc/cron.d", "/etc/cron.hourly", "/etc/cron.daily", "/etc/cron.weekly", "/etc/cron.monthly", "/etc/anacrontab", "/var/spool/cron"]
	},
	{
		"what": "accounts, sudo and authentication",
		"why": "they decide who is root and how one logs in: an account with uid 0, a known password, a sudo rule, a PAM module or an SSH key written there lets anyone in as root",
		"paths": ["/etc/passwd", "/etc/shadow", "/etc/group", "/etc/gshadow", "/etc/sudoers", "/etc/sudoers.d", "/etc/pam.d", "/etc/security", "/etc/ssh", "/root/.ssh"]
	},
	{
		"what": "root's shell start-up files",
		"why": "every root login and login shell (an administrator's, a script run with bash -l) runs them or takes its environment, LD_PRELOAD included, from them",
		"paths": ["/etc/profile", "/etc/profile.d", "/etc/environment", "/etc/bash.bashrc", "/etc/bashrc", "/root/.profile", "/root/.bashrc", "/root/.bash_profile", "/root/.bash_login"]
	},
	{
		"what": "the kernel, its modules and the helpers it runs",
		"why": "the node boots the kernel and loads the modules found there, and the kernel and udev run as root the helpers they name (a modprobe install command, a udev RUN rule, kernel.core_pattern, kernel.modprobe)",
		"paths": ["/boot", "/etc/modprobe.d", "/etc/modules-load.d", "/etc/modules", "/etc/udev", "/etc/sysctl.conf", "/etc/sysctl.d", "/proc/sys", "/sys"]
	},
	{
		"what": "the package manager's configuration",
		"why": "apt, dpkg, dnf and yum run as root with it at the next install or upgrade (unattended ones included): a hook there runs any command, and a repository marked trusted installs any package, maintainer scripts and all",
		"paths": ["/etc/apt", "/etc/dpkg", "/etc/yum.repos.d", "/etc/yum.conf", "/etc/yum", "/etc/dnf"]
	}
]

filesystem_grants := object.get(input.grants, "filesystem", [])

exec_grants := object.get(input.grants, "exec", [])

sandbox(e) := object.get(e, "sandbox", {})

# The components of an absolute path without `.`; undefined for a relative path or one
# with `..` (the host refuses such grants).
parts(p) := [x | some x in split(p, "/"); x != ""; x != "."] if {
	startswith(p, "/")
	not ".." in split(p, "/")
}

show(ps) := concat("", ["/", concat("/", ps)])

# a is b or beneath it.
under(a, b) if {
	count(a) >= count(b)
	array.slice(a, 0, count(b)) == b
}

# What a write to w can reach of place p: the deeper of the two, when one is beneath
# the other.
reach(w, p) := p if under(p, w)

reach(w, p) := w if {
	under(w, p)
	not under(p, w)
}

# [components, what makes the path writable]
writers contains [ps, "filesystem grant"] if {
	some g in filesystem_grants
	object.get(g, "access", "ReadOnly") == "ReadWrite"
	ps := parts(g.path)
}

writers contains [ps, sprintf("sandbox of exec grant %s", [e.command])] if {
	some e in exec_grants
	some p in object.get(sandbox(e), "filesystem", [])
	object.get(p, "access", "ReadOnly") == "ReadWrite"
	ps := parts(p.path)
}

writable := {ps | some [ps, _] in writers}

places contains {"what": t.what, "why": t.why, "paths": [ps | some s in t.paths; ps := parts(s)]} if {
	some t in table
}

places contains {
	"what": "commands the host runs for the plugin",
	"why": "the host runs them as root whenever the plugin asks, whatever the argument patterns say, so a program written in their place runs as root",
	"paths": commands,
} if {
	commands := {ps | some e in exec_grants; ps := parts(e.command)}
	count(commands) > 0
}

places contains {
	"what": "the systemctl the host runs for the plugin's service grants",
	"why": "the host runs it as root whenever the plugin asks for a service action, so a program written in its place runs as root",
	"paths": [parts(systemctl)],
} if {
	count(object.get(input.grants, "services", [])) > 0
	not systemctl in {e.command | some e in exec_grants}
}

# [components, command] for every path a command may execute.
executable contains [ps, e.command] if {
	some e in exec_grants
	some p in object.get(sandbox(e), "filesystem", [])
	object.get(p, "execute", false) == true
	ps := parts(p.path)
}

places contains {
	"what": sprintf("where %s may execute files", [concat(", ", sort({c | some [q, c] in executable; q == ps}))]),
	"why": "the command runs as root, so a program written there runs as root",
	"paths": [ps],
} if {
	some [ps, _] in executable
}

findings contains msg if {
	some w in writable
	some place in places
	reached := {show(r) | some p in place.paths; r := reach(w, p)}
	count(reached) > 0
	by := sort({who | some [q, who] in writers; q == w})
	msg := sprintf("root-equivalent grants: %s is writable (%s) and reaches %s (%s): %s. Make the grant read-only or narrower, %s", [show(w), concat(", ", by), concat(", ", sort(reached)), place.what, place.why, remedy])
}

# [socket, command]
sockets contains [s, e.command] if {
	some e in exec_grants
	some s in object.get(sandbox(e), "unixSockets", [])
}

findings contains msg if {
	some [s, _] in sockets
	commands := sort({c | some [q, c] in sockets; q == s})
	msg := sprintf("root-equivalent grants: the Unix socket %s is granted to %s: a socket such as containerd's or systemd's is root on the node, and before Landlock ABI 9 a Unix socket grant reaches every named Unix socket. Remove it from the sandbox, %s", [s, concat(", ", commands), remedy])
}

findings contains msg if {
	commands := {e.command | some e in exec_grants; object.get(sandbox(e), "changeMetadata", false) == true}
	count(commands) > 0
	msg := sprintf("root-equivalent grants: changeMetadata is granted to %s: a command that may change modes and owners of any file it can name (Landlock does not confine them) can make a program set-user-ID root. Remove it from the sandbox, %s", [concat(", ", sort(commands)), remedy])
}

# Units whose start reboots, powers off or halts the node. Keep equal to SHUTDOWN_UNITS in
# runtime/policy/src/capabilities.rs.
shutdown_units := {
	"reboot.target", "soft-reboot.target", "kexec.target", "poweroff.target", "halt.target",
	"exit.target", "ctrl-alt-del.target", "systemd-reboot.service", "systemd-soft-reboot.service",
	"systemd-kexec.service", "systemd-poweroff.service", "systemd-halt.service", "systemd-exit.service",
}

findings contains msg if {
	units := {g.unit |
		some g in object.get(input.grants, "services", [])
		g.unit in shutdown_units
		some a in object.get(g, "actions", [])
		a in {"start", "restart"}
	}
	count(units) > 0
	msg := sprintf("root-equivalent grants: a start of %s is granted: systemd then stops every Pod and service on the node at once, without a drain, and the node boots again (or stays off) with whatever kernel, units and configuration it has by then. Remove the grant, %s", [concat(", ", sort(units)), remedy])
}
