# Trusted publishers: only plugins signed by an allowed key may run steps.
#
# data.trusted_publishers:
#   signers: key ids trusted for every plugin
#   plugins: optional map plugin name -> key ids trusted for that plugin only
# Signature verification itself happens before this policy (bosun-trust); this policy
# narrows which of the cluster's trust roots may publish which plugins.
package bosun.step.trusted_publishers

default config := {}

config := data.trusted_publishers

allowed_signers contains k if some k in object.get(config, "signers", [])

allowed_signers contains k if some k in object.get(object.get(config, "plugins", {}), input.plugin.name, [])

signer := input.plugin.signer if is_string(input.plugin.signer)

deny contains msg if {
	not signer
	msg := sprintf("plugin %s %s (%s) is not signed; only plugins signed by a trusted publisher may run", [input.plugin.name, input.plugin.version, input.plugin.digest])
}

deny contains msg if {
	not signer in allowed_signers
	signer
	msg := sprintf("plugin %s %s is signed by %s, which is not a trusted publisher for it (trusted: %s)", [input.plugin.name, input.plugin.version, signer, concat(", ", sort([k | some k in allowed_signers]))])
}
