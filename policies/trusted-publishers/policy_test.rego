package bosun.step.trusted_publishers_test

import data.bosun.step.trusted_publishers

cfg := {"signers": ["release"], "plugins": {"custom": ["team"]}}

plugin(name, signer) := {"plugin": {"name": name, "version": "1.0.0", "digest": "sha256:00", "signer": signer}}

test_trusted_signer_is_allowed if {
	count(trusted_publishers.deny) == 0 with input as plugin("certs", "release") with data.trusted_publishers as cfg
}

test_per_plugin_signer_is_allowed_for_that_plugin_only if {
	count(trusted_publishers.deny) == 0 with input as plugin("custom", "team") with data.trusted_publishers as cfg
	count(trusted_publishers.deny) == 1 with input as plugin("certs", "team") with data.trusted_publishers as cfg
}

test_unsigned_is_denied if {
	trusted_publishers.deny == {"plugin certs 1.0.0 (sha256:00) is not signed; only plugins signed by a trusted publisher may run"} with input as {"plugin": {"name": "certs", "version": "1.0.0", "digest": "sha256:00"}}
		with data.trusted_publishers as cfg
}

test_no_configuration_trusts_nobody if {
	count(trusted_publishers.deny) == 1 with input as plugin("certs", "release") with data.trusted_publishers as {}
}

# The message lists every signer trusted for the plugin, sorted and without duplicates.
test_untrusted_signer_message_lists_the_trusted_ones if {
	trusted_publishers.deny == {"plugin custom 1.0.0 is signed by mallory, which is not a trusted publisher for it (trusted: release, team)"} with input as plugin("custom", "mallory")
		with data.trusted_publishers as {"signers": ["team", "release"], "plugins": {"custom": ["team"]}}
}
