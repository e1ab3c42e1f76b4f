# Command confinement: refuse a step whose plugin may run host commands on a node whose
# kernel cannot enforce the whole boundary of a granted command (Landlock file, TCP and
# scope rules, a seccomp filter; docs/security.md, "The kernel boundary of a granted
# command").
#
# The agent reports what its kernel lacks in input.node.confinement.missing (also in the
# node's NodeReport, spec.facts.commandConfinement). Without this policy such a node still
# runs commands, with what its kernel offers, and says so at the agent's start. Plugins
# without exec grants are not affected: nothing they do depends on these features.
package bosun.step.command_confinement

deny contains msg if {
	count(object.get(input.grants, "exec", [])) > 0
	some missing in input.node.confinement.missing
	msg := sprintf("node %s cannot confine the commands plugin %s may run: its kernel lacks %s; run this step on a node with Landlock ABI 6 or later (Linux 6.12) and seccomp, or remove this policy knowingly", [input.node.name, input.plugin.name, missing])
}
