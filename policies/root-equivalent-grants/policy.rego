# Root-equivalent grants: a read-write filesystem grant that covers a command the same
# plugin may run. The plugin can replace the binary and then have it run as the agent
# (root), whatever the exec grant's argument patterns say. The commands it may run are
# its exec grants' commands, and /usr/bin/systemctl when it has service grants (the host
# runs systemctl under the host root for them).
#
# Without this policy the capabilities decision still reports such grants, as warnings
# from policy `bosun`; install this one to refuse them (see docs/security.md).
package bosun.capabilities.root_equivalent

systemctl := "/usr/bin/systemctl"

under(path, dir) if startswith(path, concat("", [trim_suffix(dir, "/"), "/"]))

runs contains [c.command, "it may execute"] if some c in input.grants.exec

runs contains [systemctl, "the host runs for its service grants"] if {
	count(object.get(input.grants, "services", [])) > 0
	not systemctl in {c.command | some c in input.grants.exec}
}

deny contains msg if {
	some g in input.grants.filesystem
	g.access == "ReadWrite"
	some [cmd, why] in runs
	under(cmd, g.path)
	msg := sprintf("root-equivalent grants: filesystem %s is read-write to plugin %s and covers %s, which %s; the plugin could replace it and have it run as root. Grant the directory read-only or more narrowly", [g.path, input.plugin.name, cmd, why])
}
