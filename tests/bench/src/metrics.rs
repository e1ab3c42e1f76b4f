//! The API server's own counters, read from its `/metrics`: requests by verb and resource
//! (`apiserver_request_total`), the long-running requests open now
//! (`apiserver_longrunning_requests`, which counts the open watches), the server time spent
//! on them (`apiserver_request_duration_seconds_sum`; for a WATCH the whole time it was
//! open), the watches the watch cache closed because their client did not keep up
//! (`apiserver_terminated_watchers_total`) and the time requests waited in API Priority and
//! Fairness queues (`apiserver_flowcontrol_request_wait_duration_seconds_sum`).

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use kube::Client;

/// (verb, resource, subresource) as the API server labels a request.
pub type Key = (String, String, String);

/// The verbs that write.
pub const WRITE_VERBS: [&str; 6] = [
    "POST",
    "PUT",
    "PATCH",
    "APPLY",
    "DELETE",
    "DELETECOLLECTION",
];

/// One reading of the counters.
#[derive(Clone, Debug, Default)]
pub struct Scrape {
    /// `apiserver_request_total`, summed over codes and groups.
    pub requests: BTreeMap<Key, f64>,
    /// `apiserver_longrunning_requests` (watches open now), summed over groups and scopes.
    pub longrunning: BTreeMap<Key, f64>,
    /// `apiserver_request_duration_seconds_sum`: seconds spent serving, by request kind.
    pub seconds: BTreeMap<Key, f64>,
    /// `apiserver_terminated_watchers_total`, by resource.
    pub terminated_watchers: BTreeMap<String, f64>,
    /// `apiserver_flowcontrol_request_wait_duration_seconds_sum`, by priority level.
    pub queue_wait: BTreeMap<String, f64>,
}

impl Scrape {
    /// Open watches of `resource` now.
    pub fn watches(&self, resource: &str) -> f64 {
        self.longrunning
            .iter()
            .filter(|((verb, r, _), _)| verb == "WATCH" && r == resource)
            .map(|(_, v)| v)
            .sum()
    }
}

/// Reads `/metrics` (the client needs the `/metrics` non-resource URL: the lab's super
/// admin has it).
pub async fn scrape(client: &Client) -> Result<Scrape> {
    let request = http::Request::get("/metrics")
        .body(Vec::new())
        .context("building the /metrics request")?;
    let text = client
        .request_text(request)
        .await
        .context("reading the API server's /metrics")?;
    Ok(parse(&text))
}

/// Parses the metrics [`Scrape`] holds out of the Prometheus text format.
pub fn parse(text: &str) -> Scrape {
    const WANTED: [&str; 5] = [
        "apiserver_request_total",
        "apiserver_longrunning_requests",
        "apiserver_request_duration_seconds_sum",
        "apiserver_terminated_watchers_total",
        "apiserver_flowcontrol_request_wait_duration_seconds_sum",
    ];
    let mut out = Scrape::default();
    for line in text.lines() {
        let Some((name, rest)) = line.split_once('{') else {
            continue;
        };
        if !WANTED.contains(&name) {
            continue;
        }
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        let Ok(value) = value.trim().parse::<f64>() else {
            continue;
        };
        let labels = parse_labels(labels);
        let get = |k: &str| labels.get(k).cloned().unwrap_or_default();
        let request = || (get("verb"), get("resource"), get("subresource"));
        let (by_request, key) = match name {
            "apiserver_request_total" => (&mut out.requests, request()),
            "apiserver_longrunning_requests" => (&mut out.longrunning, request()),
            "apiserver_request_duration_seconds_sum" => (&mut out.seconds, request()),
            "apiserver_terminated_watchers_total" => {
                *out.terminated_watchers.entry(get("resource")).or_default() += value;
                continue;
            }
            _ => {
                *out.queue_wait.entry(get("priority_level")).or_default() += value;
                continue;
            }
        };
        *by_request.entry(key).or_default() += value;
    }
    out
}

fn parse_labels(s: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut rest = s;
    while let Some((key, after)) = rest.split_once("=\"") {
        let mut value = String::new();
        let mut chars = after.char_indices();
        let mut end = after.len();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => {
                    if let Some((_, n)) = chars.next() {
                        value.push(n);
                    }
                }
                '"' => {
                    end = i + 1;
                    break;
                }
                c => value.push(c),
            }
        }
        out.insert(key.trim_start_matches(',').to_string(), value);
        rest = &after[end..];
    }
    out
}

/// `after - before`, keeping only the keys that changed.
pub fn delta<K: Ord + Clone>(
    after: &BTreeMap<K, f64>,
    before: &BTreeMap<K, f64>,
) -> BTreeMap<K, f64> {
    after
        .iter()
        .filter_map(|(k, a)| {
            let d = a - before.get(k).copied().unwrap_or(0.0);
            (d > 0.0).then(|| (k.clone(), d))
        })
        .collect()
}

/// The write requests of a delta, summed by resource (subresources together).
pub fn writes_by_resource(delta: &BTreeMap<Key, f64>) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for ((verb, resource, _), n) in delta {
        if WRITE_VERBS.contains(&verb.as_str()) {
            *out.entry(resource.clone()).or_default() += n;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_and_watch_counts_are_summed_by_verb_and_resource() {
        let text = r#"# HELP apiserver_request_total x
apiserver_request_total{code="200",component="apiserver",dry_run="",group="bosun.dev",resource="nodetasks",scope="resource",subresource="status",verb="APPLY",version="v1alpha1"} 12
apiserver_request_total{code="409",component="apiserver",dry_run="",group="bosun.dev",resource="nodetasks",scope="resource",subresource="status",verb="APPLY",version="v1alpha1"} 3
apiserver_request_total{code="201",component="apiserver",dry_run="",group="",resource="nodes",scope="resource",subresource="",verb="POST",version="v1"} 2
apiserver_longrunning_requests{component="apiserver",group="bosun.dev",resource="nodetasks",scope="cluster",subresource="",verb="WATCH",version="v1alpha1"} 7
apiserver_request_total_other{verb="GET"} 5
apiserver_request_duration_seconds_sum{component="apiserver",dry_run="",group="",resource="nodes",scope="resource",subresource="",verb="GET",version="v1"} 1.5
apiserver_request_duration_seconds_count{component="apiserver",dry_run="",group="",resource="nodes",scope="resource",subresource="",verb="GET",version="v1"} 9
apiserver_terminated_watchers_total{group="bosun.dev",resource="nodetasks"} 4
apiserver_flowcontrol_request_wait_duration_seconds_sum{execute="true",flow_schema="global-default",priority_level="global-default"} 0.25
apiserver_flowcontrol_request_wait_duration_seconds_sum{execute="false",flow_schema="global-default",priority_level="global-default"} 0.5
"#;
        let s = parse(text);
        let key = |v: &str, r: &str, sub: &str| (v.to_string(), r.to_string(), sub.to_string());
        assert_eq!(s.requests[&key("APPLY", "nodetasks", "status")], 15.0);
        assert_eq!(s.requests[&key("POST", "nodes", "")], 2.0);
        assert_eq!(s.requests.len(), 2);
        assert_eq!(s.watches("nodetasks"), 7.0);
        let before = BTreeMap::from([(key("POST", "nodes", ""), 1.0)]);
        let d = delta(&s.requests, &before);
        assert_eq!(d[&key("POST", "nodes", "")], 1.0);
        let w = writes_by_resource(&d);
        assert_eq!(w["nodetasks"], 15.0);
        assert_eq!(w["nodes"], 1.0);
        assert_eq!(s.seconds[&key("GET", "nodes", "")], 1.5);
        assert_eq!(s.seconds.len(), 1);
        assert_eq!(s.terminated_watchers["nodetasks"], 4.0);
        assert_eq!(s.queue_wait["global-default"], 0.75);
    }
}
