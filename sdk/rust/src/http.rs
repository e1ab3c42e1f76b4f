//! Downloads through the optional `http` import: only from granted hosts, up to a size cap.
//! A plugin that never calls [`get`] does not import the interface at all.

use crate::HostError;
use crate::bindings::bosun::plugin::http as wit;

/// A downloaded response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response {
    /// HTTP status code.
    pub status: u16,
    /// Response headers.
    pub headers: Vec<(String, String)>,
    /// Response body.
    pub body: Vec<u8>,
}

/// GETs `url`, accepting at most `max_bytes` of body (or the grant's cap, if lower).
///
/// `https://` is verified by the host against the roots it was built with (and the
/// agent's `--http-ca-file`), never against files on the node; `http://` reaches loopback
/// addresses only. Redirects are returned as they came (`status` 3xx and a `location`
/// header, names lower-cased): following one is a new `get`, checked against the grants
/// again. The whole exchange ends at the run's deadline ([`HostError::Timeout`]).
///
/// # Errors
/// [`HostError::NotGranted`] unless the URL's host is granted; [`HostError::TooLarge`] when
/// the body exceeds the cap.
pub fn get(url: &str, max_bytes: u64) -> Result<Response, HostError> {
    let r = wit::get(url, max_bytes).map_err(HostError::from)?;
    Ok(Response {
        status: r.status,
        headers: r.headers,
        body: r.body,
    })
}
