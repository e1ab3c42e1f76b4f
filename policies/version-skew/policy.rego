# Version skew: an upgrade moves a node at most one minor version forward, never back,
# and never past the control plane.
#
# Applies to steps of Upgrade operations. Compares the operation's target version with
# the node's kubelet and kubeadm versions (both must be known) and, on nodes that are not
# control-plane nodes, with the API server's version (kubelets must not be newer than the
# API server: the control plane is upgraded first).
package bosun.step.version_skew

upgrade if input.operation.kind == "Upgrade"

target := trim_prefix(input.operation.targetVersion, "v")

parts(v) := [to_number(x) | some x in array.slice(split(trim_prefix(v, "v"), "."), 0, 2)]

# [major, minor] of the current and the target version.
skips_minor([cur_major, _], [new_major, _]) if new_major != cur_major

skips_minor([cur_major, cur_minor], [new_major, new_minor]) if {
	new_major == cur_major
	new_minor > cur_minor + 1
}

is_control_plane if "control-plane" in input.node.roles

component_versions contains [name, v] if {
	some [name, field] in [["kubelet", "kubeletVersion"], ["kubeadm", "kubeadmVersion"]]
	v := input.node[field]
	is_string(v)
}

deny contains msg if {
	upgrade
	not semver.is_valid(target)
	msg := sprintf("target version %q is not a semantic version like v1.34.2", [input.operation.targetVersion])
}

deny contains msg if {
	upgrade
	not is_string(input.node.kubeletVersion)
	msg := sprintf("node %s does not report its kubelet version, so version skew cannot be checked", [input.node.name])
}

deny contains msg if {
	upgrade
	semver.is_valid(target)
	some [name, v] in component_versions
	semver.compare(target, trim_prefix(v, "v")) < 0
	msg := sprintf("%s on %s is %s; %s would be a downgrade, which is not supported", [name, input.node.name, v, input.operation.targetVersion])
}

deny contains msg if {
	upgrade
	semver.is_valid(target)
	some [name, v] in component_versions
	name == "kubelet"
	skips_minor(parts(v), parts(target))
	msg := sprintf("kubelet on %s is %s; %s skips a minor version: upgrade one minor version at a time", [input.node.name, v, input.operation.targetVersion])
}

deny contains msg if {
	upgrade
	semver.is_valid(target)
	not is_control_plane
	api := input.cluster.version
	semver.compare(target, trim_prefix(api, "v")) > 0
	msg := sprintf("the API server is at %s; %s on worker %s would be newer than the control plane: upgrade the control plane first", [api, input.operation.targetVersion, input.node.name])
}
