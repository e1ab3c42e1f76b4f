# Control-plane protection: change one control-plane node at a time, and stop when
# another control-plane node is not Ready (losing it too could cost etcd its quorum).
#
# Applies to steps on control-plane nodes. Reads input.cluster.controlPlane, which lists
# every control-plane node with its readiness and whether a step is running on it.
#
# Written to be cheap to evaluate (it runs before every step): each deny rule reads the
# input directly, with no helper rules to resolve.
package bosun.step.control_plane

deny contains msg if {
	"control-plane" in input.node.roles
	some n in input.cluster.controlPlane
	n.name != input.node.name
	n.inProgress
	msg := sprintf("control-plane node %s is being changed; change one control-plane node at a time (wait before starting %s on %s)", [n.name, input.step.name, input.node.name])
}

deny contains msg if {
	"control-plane" in input.node.roles
	some n in input.cluster.controlPlane
	n.name != input.node.name
	not n.ready
	msg := sprintf("control-plane node %s is NotReady; changing %s now could cost the control plane its quorum: bring %s back first", [n.name, input.node.name, n.name])
}

deny contains msg if {
	"control-plane" in input.node.roles
	count(input.cluster.controlPlane) == 0
	msg := sprintf("no control-plane nodes are listed in the input while %s is one; refusing to guess their state", [input.node.name])
}
