# Capability limits: what an administrator may grant a plugin at all.
#
# - No shells or other general-purpose interpreters in exec grants: a granted shell is
#   every command on the node, whatever the argument patterns say.
# - Writable filesystem grants, and writable paths of a command's sandbox, only under
#   /etc/kubernetes and the package manager's paths (data.capability_limits.writable_prefixes).
#   A package manager that installs packages writes /usr and /etc (the shipped packages
#   example's apt-get and dnf sandboxes): with this policy, add those paths knowingly.
# Evaluated at the capabilities decision point, on the grants (what the plugin would
# get) and on the requests (what it asked for).
package bosun.capabilities.limits

default config := {}

config := data.capability_limits

shells := {"sh", "bash", "dash", "zsh", "ksh", "mksh", "ash", "csh", "tcsh", "fish", "busybox", "toybox"}

# Programs that run whatever their arguments say (interpreters and launchers).
launchers := {"env", "nohup", "xargs", "nsenter", "chroot", "sudo", "su", "setsid", "timeout", "python", "python3", "perl", "ruby", "node", "lua", "awk", "gawk", "find"}

forbidden := (shells | launchers) | {x | some x in object.get(config, "forbidden_commands", [])}

writable_prefixes := object.get(config, "writable_prefixes", ["/etc/kubernetes"])

basename(path) := parts[count(parts) - 1] if parts := split(path, "/")

# python3.12 -> python3, bash5 -> bash: strip trailing version digits and dots.
program(path) := regex.replace(basename(path), `[0-9.]+$`, "")

commands contains [c.command, "granted"] if some c in input.grants.exec

commands contains [c.command, "requested"] if some c in input.requested.exec

deny contains msg if {
	some [cmd, how] in commands
	some p in {basename(cmd), program(cmd)}
	p in forbidden
	msg := sprintf("exec: %s is %s to plugin %s, but %s is forbidden in exec grants (a shell or interpreter runs any command); grant the specific programs the plugin needs instead", [cmd, how, input.plugin.name, p])
}

under(path, prefix) if path == prefix

under(path, prefix) if startswith(path, concat("", [trim_suffix(prefix, "/"), "/"]))

writable contains [g.path, "granted"] if {
	some g in input.grants.filesystem
	g.access == "ReadWrite"
}

# What a granted command may write (its kernel-enforced sandbox) counts as written too.
writable contains [p.path, sprintf("granted (to the command %s)", [c.command])] if {
	some c in input.grants.exec
	some p in object.get(object.get(c, "sandbox", {}), "filesystem", [])
	object.get(p, "access", "ReadOnly") == "ReadWrite"
}

writable contains [r.path, "requested"] if {
	some r in input.requested.filesystem
	r.writable
}

deny contains msg if {
	some [path, how] in writable
	not contains(path, "..")
	not any_prefix(path)
	msg := sprintf("filesystem: %s is %s read-write to plugin %s; writes are allowed only under %s", [path, how, input.plugin.name, concat(", ", writable_prefixes)])
}

deny contains msg if {
	some [path, how] in writable
	contains(path, "..")
	msg := sprintf("filesystem: %s is %s read-write to plugin %s and contains `..`; use a normalised absolute path", [path, how, input.plugin.name])
}

any_prefix(path) if {
	some prefix in writable_prefixes
	under(path, prefix)
}
