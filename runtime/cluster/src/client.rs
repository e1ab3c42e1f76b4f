//! How both binaries reach the API server: a `User-Agent` that names the process (so an
//! audit log, or an API server's request metrics, tell one replica from another), and a
//! first contact that waits for an API server that is down instead of exiting.
//!
//! Bosun restarts the API server itself (`kubeadm upgrade apply`, a certificate renewal), so
//! a process that starts while it is down must wait for it, not crash-loop into the
//! kubelet's growing restart backoff.

use std::time::Duration;

use http::{HeaderName, HeaderValue};

/// The first wait between attempts to reach the API server at start.
pub const FIRST_CONTACT_RETRY_FIRST: Duration = Duration::from_secs(1);
/// The longest wait between attempts to reach the API server at start.
pub const FIRST_CONTACT_RETRY_MAX: Duration = Duration::from_secs(15);

/// The `User-Agent` header for `component` (`bosun-controller`, `bosun-agent`) of this
/// version, run as `identity` (a controller's leader identity, an agent's node name):
/// `bosun-controller/0.1.0 (identity)`. An identity that is not a valid header value (it
/// comes from a flag) is left out rather than failing the start.
pub fn user_agent(component: &str, identity: &str) -> (HeaderName, HeaderValue) {
    let version = env!("CARGO_PKG_VERSION");
    let value = HeaderValue::from_str(&format!("{component}/{version} ({identity})"))
        .unwrap_or_else(|_| {
            HeaderValue::from_str(&format!("{component}/{version}"))
                .unwrap_or(HeaderValue::from_static("bosun"))
        });
    (http::header::USER_AGENT, value)
}

/// Sets `config`'s `User-Agent` (see [`user_agent`]), replacing one set before.
pub fn identify(config: &mut kube::Config, component: &str, identity: &str) {
    config
        .headers
        .retain(|(name, _)| name != http::header::USER_AGENT);
    config.headers.push(user_agent(component, identity));
}

/// The wait before attempt `attempt + 1` (0: after the first failure): doubling from
/// [`FIRST_CONTACT_RETRY_FIRST`] up to [`FIRST_CONTACT_RETRY_MAX`].
pub fn first_contact_wait(attempt: u32) -> Duration {
    FIRST_CONTACT_RETRY_FIRST
        .saturating_mul(1 << attempt.min(8))
        .min(FIRST_CONTACT_RETRY_MAX)
}

/// Asks the API server for its version until it answers, logging each failure. A refused
/// credential (401, 403) is not waited out: it is returned, since no restart of the API
/// server will fix it.
pub async fn wait_for_api_server(client: &kube::Client) -> Result<(), kube::Error> {
    let mut attempt = 0u32;
    loop {
        match client.apiserver_version().await {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(s)) if s.code == 401 || s.code == 403 => {
                return Err(kube::Error::Api(s));
            }
            Err(error) => {
                let wait = first_contact_wait(attempt);
                tracing::warn!(%error, retry_in_s = wait.as_secs(), "the API server does not answer yet; waiting for it (it may be restarting)");
                tokio::time::sleep(wait).await;
                attempt = attempt.saturating_add(1);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_user_agent_names_the_component_its_version_and_the_identity() {
        let (name, value) = user_agent("bosun-controller", "replica-a");
        assert_eq!(name, http::header::USER_AGENT);
        assert_eq!(
            value.to_str().unwrap(),
            format!("bosun-controller/{} (replica-a)", env!("CARGO_PKG_VERSION"))
        );
        let (_, bad) = user_agent("bosun-agent", "line\nbreak");
        assert_eq!(
            bad.to_str().unwrap(),
            format!("bosun-agent/{}", env!("CARGO_PKG_VERSION"))
        );
    }

    #[test]
    fn identify_replaces_an_earlier_user_agent() {
        let mut config = kube::Config::new("https://127.0.0.1:6443".parse().unwrap());
        identify(&mut config, "bosun-agent", "a");
        identify(&mut config, "bosun-agent", "b");
        let agents: Vec<_> = config
            .headers
            .iter()
            .filter(|(n, _)| n == http::header::USER_AGENT)
            .collect();
        assert_eq!(agents.len(), 1);
        assert!(agents[0].1.to_str().unwrap().ends_with("(b)"));
    }

    #[test]
    fn first_contact_waits_double_up_to_the_cap() {
        let waits: Vec<u64> = (0..7).map(|a| first_contact_wait(a).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 15, 15, 15]);
        assert_eq!(first_contact_wait(u32::MAX), FIRST_CONTACT_RETRY_MAX);
    }
}
