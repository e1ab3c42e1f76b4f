# Trusted publishers: only plugins signed by an allowed key may run steps.
#
# data.trusted_publishers:
#   signers: key ids trusted for every plugin
#   plugins: optional map plugin name -> key ids trusted for that plugin only
# Signature verification itself happens before this policy (bosun-trust); this policy
# narrows which of the cluster's trust roots may publish which plugins.
#
# Written to be cheap to evaluate (it runs before every step): a trusted signer is found
# with two lookups; the sorted list of trusted signers is built only for a deny message.
package bosun.step.trusted_publishers

config := c if {
	c := data.trusted_publishers
} else := {}

deny contains msg if {
	not is_string(input.plugin.signer)
	msg := sprintf("plugin %s %s (%s) is not signed; only plugins signed by a trusted publisher may run", [input.plugin.name, input.plugin.version, input.plugin.digest])
}

deny contains msg if {
	signer := input.plugin.signer
	is_string(signer)
	for_every_plugin := object.get(config, "signers", [])
	for_this_plugin := object.get(object.get(config, "plugins", {}), input.plugin.name, [])
	not signer in for_every_plugin
	not signer in for_this_plugin
	trusted := sort({k | some k in for_every_plugin} | {k | some k in for_this_plugin})
	msg := sprintf("plugin %s %s is signed by %s, which is not a trusted publisher for it (trusted: %s)", [input.plugin.name, input.plugin.version, signer, concat(", ", trusted)])
}
