# Version skew: an upgrade moves a node at most one minor version forward, never back,
# and never past the control plane.
#
# Applies to steps of Upgrade operations. Compares the operation's target version with
# the node's kubelet and kubeadm versions (both must be known) and, on nodes that are not
# control-plane nodes, with the API server's version (kubelets must not be newer than the
# API server: the control plane is upgraded first).
#
# Written to be cheap to evaluate (it runs before every step): each deny rule reads what
# it needs directly, with no helper rules or functions to resolve.
package bosun.step.version_skew

deny contains msg if {
	input.operation.kind == "Upgrade"
	not semver.is_valid(trim_prefix(input.operation.targetVersion, "v"))
	msg := sprintf("target version %q is not a semantic version like v1.34.2", [input.operation.targetVersion])
}

deny contains msg if {
	input.operation.kind == "Upgrade"
	not is_string(input.node.kubeletVersion)
	msg := sprintf("node %s does not report its kubelet version, so version skew cannot be checked", [input.node.name])
}

# No downgrade of kubelet or kubeadm.
deny contains msg if {
	input.operation.kind == "Upgrade"
	target := trim_prefix(input.operation.targetVersion, "v")
	semver.is_valid(target)
	some [name, field] in [["kubelet", "kubeletVersion"], ["kubeadm", "kubeadmVersion"]]
	v := input.node[field]
	is_string(v)
	semver.compare(target, trim_prefix(v, "v")) < 0
	msg := sprintf("%s on %s is %s; %s would be a downgrade, which is not supported", [name, input.node.name, v, input.operation.targetVersion])
}

# At most one minor version forward: [major, minor] of the kubelet and of the target.
deny contains msg if {
	input.operation.kind == "Upgrade"
	target := trim_prefix(input.operation.targetVersion, "v")
	semver.is_valid(target)
	v := input.node.kubeletVersion
	is_string(v)
	cur := split(trim_prefix(v, "v"), ".")
	new := split(target, ".")
	true in {to_number(new[0]) != to_number(cur[0]), to_number(new[1]) > to_number(cur[1]) + 1}
	msg := sprintf("kubelet on %s is %s; %s skips a minor version: upgrade one minor version at a time", [input.node.name, v, input.operation.targetVersion])
}

# Workers follow the control plane: no kubelet newer than the API server.
deny contains msg if {
	input.operation.kind == "Upgrade"
	not "control-plane" in input.node.roles
	target := trim_prefix(input.operation.targetVersion, "v")
	semver.is_valid(target)
	api := input.cluster.version
	semver.compare(target, trim_prefix(api, "v")) > 0
	msg := sprintf("the API server is at %s; %s on worker %s would be newer than the control plane: upgrade the control plane first", [api, input.operation.targetVersion, input.node.name])
}
