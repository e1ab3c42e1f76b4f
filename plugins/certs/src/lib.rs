//! The `certs` plugin: kubeadm certificate expiry and renewal on a control-plane node.
//!
//! Actions (the planner's `renewCertificates` Operation runs `renew`, then
//! `restart-control-plane`):
//!
//! - `check`: parses every kubeadm certificate and each kubeconfig's client certificate
//!   inside the plugin (x509-parser, compiled into the component) and reports NotAfter per
//!   certificate. Reads only.
//! - `renew`: renews all certificates or a named list with `kubeadm certs renew` (run through
//!   the exec grant), only those expiring within `renewBefore`, or issued before
//!   `issuedBefore` (the Operation's creation time, so the step run again renews nothing
//!   more), or both; one of the two is required; reads every
//!   certificate before and after and reports both expiries; fails if a renewed certificate's
//!   NotAfter did not move forward. With `restartControlPlane: true` it also restarts the
//!   static pods (otherwise that is the separate `restart-control-plane` step).
//! - `restart-control-plane`: restarts the control-plane static pods together by moving
//!   their manifests out of the kubelet's manifest directory (to hidden names the kubelet
//!   ignores), waiting, and moving them back. A manifest left out by an interrupted run is
//!   moved back first, so re-running converges. Together, not one at a time: on a kubeadm
//!   control plane the kubelet talks to its own node's API server, and while etcd alone is
//!   away that API server hangs every request, which stalled the kubelet's handling of the
//!   next manifests for a minute or more (measured: 112 s from the first move to `/readyz`
//!   ok one at a time, 34-36 s together; docs/plugins-first-party.md).
//!
//! Every action honours dry-run: it reads and reports, and says what it would change.
//!
//! `renew` (about 150 lines) is kept whole on purpose: one renewal in the order it happens
//! (each certificate read before, kubeadm run or the dry run reported, each read after, the
//! outcome built from the two reads), so that a reader checks in one place that nothing is
//! reported as renewed that the second read does not show.

pub mod inventory;
pub mod x509;

use bosun_plugin_sdk::exec::Command;
use bosun_plugin_sdk::prelude::*;
use bosun_plugin_sdk::{facts, fs, log};

use inventory::{Cert, Location, MANIFESTS_DIR, PKI_DIR};
use x509::{CertInfo, ClientCert};

/// How far back kubeadm dates the certificates it issues (`CertificateBackdate` in
/// kubeadm's constants, 5 minutes since v1.31): a certificate kubeadm renews at time T has
/// NotBefore T minus this.
pub const KUBEADM_BACKDATE_SECONDS: i64 = 300;

/// The kubeadm binary on the node.
pub const KUBEADM: &str = "/usr/bin/kubeadm";
/// `df` from coreutils, for the free-space preflight.
pub const DF: &str = "/usr/bin/df";
/// The arguments the free-space check runs `df` with (granted literally).
pub const DF_ARGS: [&str; 3] = ["--output=avail", "-B1", PKI_DIR];
/// The control-plane static pods, in the order they are moved out and back.
pub const CONTROL_PLANE_COMPONENTS: [&str; 4] = [
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
];
/// Suffix of a manifest moved aside; with the leading dot the kubelet ignores it.
const ASIDE_SUFFIX: &str = ".bosun-restart";

/// The actions with their params.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(tag = "action", content = "params", rename_all = "kebab-case")]
pub enum Action {
    /// Report the expiry of every certificate.
    Check(CheckParams),
    /// Renew certificates with kubeadm.
    Renew(RenewParams),
    /// Restart the control-plane static pods.
    RestartControlPlane(RestartParams),
}

/// Params of `check`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CheckParams {
    /// Warn about certificates that expire within this duration (`720h`). Default `720h`.
    #[serde(default)]
    pub warn_within: Option<String>,
}

/// Params of `renew`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RenewParams {
    /// kubeadm's certificate names (`apiserver`, `admin.conf`, ...) or `["all"]`.
    #[serde(default = "all")]
    pub certificates: Vec<String>,
    /// Renew only certificates expiring within this duration (`720h`, `90h30m`).
    #[serde(default)]
    pub renew_before: Option<String>,
    /// Renew only certificates issued before this UTC time (`2026-12-06T15:04:05Z`): one
    /// issued at or after it was renewed already (by this request, when the planner passes
    /// its Operation's creation time) and is left alone, so running `renew` again renews
    /// nothing more. kubeadm backdates what it issues by [`KUBEADM_BACKDATE_SECONDS`], and
    /// that is allowed for.
    ///
    /// At least one of `renewBefore` and `issuedBefore` must be given: without either a
    /// second run would renew everything again, and the action is declared idempotent.
    #[serde(default)]
    pub issued_before: Option<String>,
    /// A kubeadm configuration file on the node passed as `--config` (under
    /// /etc/kubernetes). Absent: kubeadm reads the cluster's `kubeadm-config` ConfigMap and
    /// falls back to its defaults.
    #[serde(default)]
    pub config: Option<String>,
    /// Also restart the control-plane static pods afterwards (the planner runs that as its
    /// own `restart-control-plane` step instead). Default false.
    #[serde(default)]
    pub restart_control_plane: bool,
    /// Seconds the manifests stay out when restarting. Default 20 (the kubelet's
    /// file-check period).
    #[serde(default = "default_wait")]
    pub wait_seconds: u64,
}

/// Params of `restart-control-plane`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RestartParams {
    /// Static pods to restart, by manifest name without `.yaml`. Default: etcd,
    /// kube-apiserver, kube-controller-manager, kube-scheduler (those present).
    #[serde(default = "default_components")]
    pub components: Vec<String>,
    /// Seconds the manifests stay out. Default 20 (the kubelet's file-check period).
    #[serde(default = "default_wait")]
    pub wait_seconds: u64,
}

fn all() -> Vec<String> {
    vec!["all".to_owned()]
}

fn default_wait() -> u64 {
    20
}

fn default_components() -> Vec<String> {
    CONTROL_PLANE_COMPONENTS
        .iter()
        .map(|s| (*s).to_owned())
        .collect()
}

/// Smallest free space on the PKI's file system the renew preflight accepts.
const MIN_FREE_BYTES: u64 = 16 << 20;
/// Default `warnWithin` of `check`.
const DEFAULT_WARN_WITHIN: &str = "720h";
/// Longest wait per manifest we accept (the host's run deadline bounds it anyway).
const MAX_WAIT_SECONDS: u64 = 300;

/// The plugin.
pub struct Certs;

impl Plugin for Certs {
    type Action = Action;

    fn metadata() -> Metadata {
        bosun_plugin_sdk::metadata!()
            .name("certs")
            .action(
                ActionInfo::new("check", "Report the expiry of every kubeadm certificate and kubeconfig client certificate")
                    .params::<CheckParams>()
                    .idempotent(),
            )
            .action(
                ActionInfo::new("renew", "Renew kubeadm certificates (all or named, optionally only those expiring soon) and report old and new expiry")
                    .params::<RenewParams>()
                    .idempotent(),
            )
            .action(
                ActionInfo::new("restart-control-plane", "Restart the control-plane static pods by moving their manifests out together and back")
                    .params::<RestartParams>()
                    .idempotent(),
            )
            .reads(inventory::KUBERNETES_DIR)
            .writes(MANIFESTS_DIR)
            .runs(KUBEADM, ["certs", "renew", "*"])
            .runs(KUBEADM, ["certs", "renew", "*", "--config", "/etc/kubernetes/*"])
            .runs(DF, DF_ARGS)
    }

    fn preflight(action: &Action) -> Result<Vec<Check>, PluginError> {
        match action {
            Action::Check(p) => {
                let parsed = p
                    .warn_within
                    .as_deref()
                    .map(x509::parse_duration)
                    .transpose();
                Ok(vec![Check::require(
                    "params",
                    parsed.is_ok(),
                    parsed
                        .err()
                        .unwrap_or_else(|| "warnWithin is a duration".into()),
                )])
            }
            Action::Renew(p) => renew_preflight(p),
            Action::RestartControlPlane(p) => {
                let present = present_manifests(&p.components)?;
                Ok(vec![Check::require(
                    "manifests-present",
                    !present.is_empty(),
                    if present.is_empty() {
                        format!(
                            "none of {:?} has a manifest in {MANIFESTS_DIR}; is this a control-plane node?",
                            p.components
                        )
                    } else {
                        format!("will restart {}", present.join(", "))
                    },
                )])
            }
        }
    }

    fn run(action: Action, ctx: &RunContext) -> Result<Outcome, PluginError> {
        match action {
            Action::Check(p) => check(&p),
            Action::Renew(p) => renew(&p, ctx),
            Action::RestartControlPlane(p) => restart(&p.components, p.wait_seconds, ctx),
        }
    }
}

/// One certificate as found on the node.
#[derive(Debug)]
pub struct Found {
    pub cert: &'static Cert,
    /// `None` when the file does not exist (external etcd, no super-admin.conf, ...).
    pub info: Option<CertInfo>,
}

/// Reads and parses `cert`; `Ok(None)` when its file does not exist.
fn read_cert(cert: &Cert) -> Result<Option<CertInfo>, PluginError> {
    let path = cert.path();
    let Some(text) = read_optional_bytes(&path)? else {
        return Ok(None);
    };
    let pem = match cert.location {
        Location::Pki(_) => text,
        Location::Kubeconfig(_) => {
            let yaml = String::from_utf8_lossy(&text);
            match x509::kubeconfig_client_cert(&yaml).map_err(|e| bad_cert(&path, &e))? {
                ClientCert::Embedded(pem) => pem,
                ClientCert::File(file) => match read_optional_bytes(&file) {
                    Ok(Some(pem)) => pem,
                    // A client certificate the kubelet rotates lives under
                    // /var/lib/kubelet, usually not granted: report, do not fail.
                    Ok(None) | Err(_) => {
                        warn!(
                            "{path}: client certificate is in {file}, which the plugin cannot read; skipped"
                        );
                        return Ok(None);
                    }
                },
            }
        }
    };
    x509::parse_pem(&pem)
        .map(Some)
        .map_err(|e| bad_cert(&path, &e))
}

fn bad_cert(path: &str, e: &x509::ParseError) -> PluginError {
    PluginError::new(
        "bad-certificate",
        format!(
            "{path}: {e}; kubeadm cannot renew it either: restore it from a backup or recreate it with `kubeadm init phase certs`"
        ),
    )
}

fn read_optional_bytes(path: &str) -> Result<Option<Vec<u8>>, PluginError> {
    match fs::read(path) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.source.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Every certificate of the inventory with what the node holds.
fn scan() -> Result<Vec<Found>, PluginError> {
    inventory::ALL
        .iter()
        .map(|cert| {
            Ok(Found {
                cert,
                info: read_cert(cert)?,
            })
        })
        .collect()
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

fn check(p: &CheckParams) -> Result<Outcome, PluginError> {
    let within = x509::parse_duration(p.warn_within.as_deref().unwrap_or(DEFAULT_WARN_WITHIN))
        .map_err(|m| PluginError::new("bad-params", format!("warnWithin: {m}")))?;
    let found = scan()?;
    let now = now();
    let mut outcome = Outcome::unchanged(String::new());
    let mut present = 0;
    let mut soon = Vec::new();
    let mut earliest: Option<(&str, i64)> = None;
    for f in &found {
        let Some(info) = &f.info else {
            debug!("{}: {} not present, skipped", f.cert.name, f.cert.path());
            continue;
        };
        present += 1;
        let expiry = x509::rfc3339(info.not_after);
        log::write(
            log::Level::Info,
            &format!("{} expires {expiry}", f.cert.name),
            &[
                ("certificate", f.cert.name),
                ("notAfter", &expiry),
                ("subject", &info.subject),
                ("issuer", &info.issuer),
            ],
        );
        if info.not_after - now < within {
            soon.push(f.cert.name);
            warn!(
                "{} expires {expiry}, within {}",
                f.cert.name,
                p.warn_within.as_deref().unwrap_or(DEFAULT_WARN_WITHIN)
            );
        }
        if f.cert.renewable && earliest.is_none_or(|(_, t)| info.not_after < t) {
            earliest = Some((f.cert.name, info.not_after));
        }
        outcome = outcome.output(f.cert.name, expiry);
    }
    if present == 0 {
        return Err(PluginError::new(
            "no-certificates",
            format!(
                "found no kubeadm certificate under {PKI_DIR} or kubeconfig in /etc/kubernetes; is this a kubeadm control-plane node, and is /etc/kubernetes granted?"
            ),
        ));
    }
    outcome.message = match earliest {
        Some((name, t)) => format!(
            "{present} certificates; earliest leaf expiry {name} at {}{}",
            x509::rfc3339(t),
            if soon.is_empty() {
                String::new()
            } else {
                format!("; expiring soon: {}", soon.join(", "))
            }
        ),
        None => format!("{present} certificates (no renewable leaf present)"),
    };
    Ok(outcome)
}

/// The certificates `names` selects, checked against the inventory.
fn select(names: &[String]) -> Result<Vec<&'static Cert>, PluginError> {
    if names.is_empty() {
        return Err(PluginError::new(
            "bad-params",
            "certificates is empty: name at least one certificate, or [\"all\"]",
        ));
    }
    if names.iter().any(|n| n == "all") {
        if names.len() > 1 {
            return Err(PluginError::new(
                "bad-params",
                "certificates: `all` cannot be combined with individual names",
            ));
        }
        return Ok(inventory::ALL.iter().filter(|c| c.renewable).collect());
    }
    names
        .iter()
        .map(|n| {
            inventory::by_name(n).filter(|c| c.renewable).ok_or_else(|| {
                PluginError::new(
                    "bad-params",
                    format!("certificates: `{n}` is not a certificate kubeadm renews; expected `all` or some of {}", inventory::renewable_names().join(", ")),
                )
            })
        })
        .collect()
}

fn renew_preflight(p: &RenewParams) -> Result<Vec<Check>, PluginError> {
    let mut checks = Vec::new();
    let selected = match select(&p.certificates) {
        Ok(s) => s,
        Err(e) => return Ok(vec![Check::fail("params", e.message)]),
    };
    if let Some(before) = &p.renew_before
        && let Err(m) = x509::parse_duration(before)
    {
        checks.push(Check::fail("params", format!("renewBefore: {m}")));
    }
    if let Some(issued) = &p.issued_before
        && let Err(m) = x509::parse_rfc3339(issued)
    {
        checks.push(Check::fail("params", format!("issuedBefore: {m}")));
    }
    if p.renew_before.is_none() && p.issued_before.is_none() {
        checks.push(Check::fail("params", NEITHER.to_owned()));
    }
    if p.wait_seconds > MAX_WAIT_SECONDS {
        checks.push(Check::fail(
            "params",
            format!(
                "waitSeconds is {}, expected at most {MAX_WAIT_SECONDS}",
                p.wait_seconds
            ),
        ));
    }

    // kubeadm present: the host reads its version from the node's /usr/bin/kubeadm.
    let facts = facts::node()?;
    checks.push(match &facts.kubeadm_version {
        Some(v) => Check::pass("kubeadm-present", format!("{KUBEADM} is {v}")),
        None => Check::fail("kubeadm-present", format!("{KUBEADM} is missing or does not run on this node; install kubeadm (the packages plugin can) before renewing")),
    });

    // The CA keys that sign the selected certificates: present, readable and a key.
    let mut keys: Vec<String> = Vec::new();
    for cert in &selected {
        if cert_file_exists(cert)
            && let Some(k) = cert.ca_key_path()
            && !keys.contains(&k)
        {
            keys.push(k);
        }
    }
    for key in &keys {
        checks.push(match fs::read(key) {
            Ok(b) if String::from_utf8_lossy(&b).contains("PRIVATE KEY-----") => {
                Check::pass("ca-key", format!("{key} is present and readable"))
            }
            Ok(_) => Check::fail("ca-key", format!("{key} does not hold a PEM private key; kubeadm cannot sign renewed certificates without it")),
            Err(e) => Check::fail(
                "ca-key",
                format!("{e}; kubeadm needs the CA key on this node to renew (a node whose CA is external must renew through the external CA)"),
            ),
        });
    }
    if keys.is_empty() {
        checks.push(Check::fail("ca-key", "none of the selected certificates exists under /etc/kubernetes, so no CA key was checked; is this a control-plane node?"));
    }

    // Free space where kubeadm writes the renewed files.
    let out = Command::new(DF).args(DF_ARGS).output()?;
    let avail = out
        .stdout_text()
        .lines()
        .filter_map(|l| l.trim().parse::<u64>().ok())
        .next();
    checks.push(match (out.success(), avail) {
        (true, Some(bytes)) => Check::require(
            "disk-space",
            bytes >= MIN_FREE_BYTES,
            format!(
                "{} MiB free on the file system of {PKI_DIR} (need {} MiB)",
                bytes >> 20,
                MIN_FREE_BYTES >> 20
            ),
        ),
        _ => Check::fail(
            "disk-space",
            format!(
                "`{DF} {}` did not report free space (exit {}): {}",
                DF_ARGS.join(" "),
                out.exit_code,
                out.stderr_text().trim()
            ),
        ),
    });
    Ok(checks)
}

fn cert_file_exists(cert: &Cert) -> bool {
    std::fs::metadata(cert.path()).is_ok()
}

/// Why `renew` with neither filter is refused.
const NEITHER: &str = "give `renewBefore` (renew what expires within it, `720h`) or `issuedBefore` (renew what was issued before that UTC time, `2026-12-06T15:04:05Z`; a renewCertificates Operation passes its creation time), or both: without either a second run would renew every certificate again";

fn renew(p: &RenewParams, ctx: &RunContext) -> Result<Outcome, PluginError> {
    let selected = select(&p.certificates)?;
    let before_window = p
        .renew_before
        .as_deref()
        .map(x509::parse_duration)
        .transpose()
        .map_err(|m| PluginError::new("bad-params", format!("renewBefore: {m}")))?;
    let issued_before = p
        .issued_before
        .as_deref()
        .map(x509::parse_rfc3339)
        .transpose()
        .map_err(|m| PluginError::new("bad-params", format!("issuedBefore: {m}")))?;
    if before_window.is_none() && issued_before.is_none() {
        return Err(PluginError::new("bad-params", NEITHER));
    }
    let now = now();

    // Before: what each selected certificate holds now; missing ones are skipped (kubeadm
    // would fail on them, and `all` skips them too).
    let mut targets: Vec<(&Cert, CertInfo)> = Vec::new();
    let mut left_alone = 0;
    for cert in selected {
        match read_cert(cert)? {
            Some(info) => {
                if let Some(window) = before_window
                    && info.not_after - now > window
                {
                    info!(
                        "{} expires {}, not within {}: left alone",
                        cert.name,
                        x509::rfc3339(info.not_after),
                        p.renew_before.as_deref().unwrap_or_default()
                    );
                    left_alone += 1;
                    continue;
                }
                if let Some(issued) = issued_before
                    && info.not_before + KUBEADM_BACKDATE_SECONDS >= issued
                {
                    info!(
                        "{} was issued at {} (NotBefore {} plus kubeadm's backdate), not before {}: renewed already, left alone",
                        cert.name,
                        x509::rfc3339(info.not_before + KUBEADM_BACKDATE_SECONDS),
                        x509::rfc3339(info.not_before),
                        p.issued_before.as_deref().unwrap_or_default()
                    );
                    left_alone += 1;
                    continue;
                }
                targets.push((cert, info));
            }
            None => debug!("{}: {} not present, skipped", cert.name, cert.path()),
        }
    }
    if targets.is_empty() {
        return Ok(Outcome::unchanged(
            match (&p.renew_before, &p.issued_before) {
                _ if left_alone == 0 => {
                    "none of the selected certificates exists on this node; nothing to renew"
                        .to_owned()
                }
                (Some(w), None) => {
                    format!("no selected certificate expires within {w}; nothing to renew")
                }
                (None, Some(t)) => format!(
                    "every selected certificate was issued at or after {t} (renewed already); nothing to renew"
                ),
                (Some(w), Some(t)) => format!(
                    "no selected certificate issued before {t} expires within {w}; nothing to renew"
                ),
                (None, None) => "nothing to renew".to_owned(),
            },
        ));
    }
    let names: Vec<&str> = targets.iter().map(|(c, _)| c.name).collect();
    if ctx.dry_run {
        let mut o = Outcome::unchanged(format!(
            "would renew {} certificate(s) with `kubeadm certs renew`: {}{}",
            names.len(),
            names.join(", "),
            if p.restart_control_plane {
                "; then restart the control-plane static pods"
            } else {
                ""
            }
        ));
        for (c, info) in &targets {
            o = o.output(format!("{}.before", c.name), x509::rfc3339(info.not_after));
        }
        return Ok(o);
    }

    // `renew all` when every renewable certificate present is due; one call per name
    // otherwise (kubeadm takes one name per call).
    let everything = p.certificates.iter().any(|n| n == "all") && left_alone == 0;
    let batches: Vec<&str> = if everything {
        vec!["all"]
    } else {
        names.clone()
    };
    for (i, name) in batches.iter().enumerate() {
        log::progress(
            i as u64,
            batches.len() as u64,
            &format!("kubeadm certs renew {name}"),
        );
        let mut cmd = Command::new(KUBEADM).args(["certs", "renew", name]);
        if let Some(config) = &p.config {
            cmd = cmd.args(["--config", config.as_str()]);
        }
        let out = cmd.run()?;
        info!(
            "{}",
            out.stdout_text()
                .lines()
                .filter(|l| l.contains("renewed"))
                .collect::<Vec<_>>()
                .join("; ")
        );
    }
    log::progress(
        batches.len() as u64,
        batches.len() as u64,
        "renewed; verifying",
    );

    // After: every renewed certificate must be newer and still signed by the same issuer.
    let mut outcome = Outcome::changed(String::new());
    let mut latest = 0;
    for (cert, before) in &targets {
        let after = read_cert(cert)?.ok_or_else(|| {
            PluginError::new(
                "renew-lost-certificate",
                format!(
                    "{} ({}) is gone after `kubeadm certs renew`; restore it from a backup",
                    cert.name,
                    cert.path()
                ),
            )
        })?;
        // A renewed certificate is a new one (kubeadm draws a fresh random serial) whose
        // NotAfter did not move back. NotAfter alone cannot tell: it has one-second
        // resolution, so a certificate issued in the same second as the one it replaces
        // (a freshly made cluster) keeps the same NotAfter.
        if after.serial == before.serial || after.not_after < before.not_after {
            return Err(PluginError::new(
                "renew-no-effect",
                format!(
                    "{}: after `kubeadm certs renew` the certificate has serial {} and NotAfter {}, before serial {} and NotAfter {}; expected a new certificate expiring no earlier; check that kubeadm writes to {PKI_DIR} (certificatesDir) on this node",
                    cert.name,
                    after.serial,
                    x509::rfc3339(after.not_after),
                    before.serial,
                    x509::rfc3339(before.not_after)
                ),
            ));
        }
        if after.issuer != before.issuer {
            return Err(PluginError::new(
                "renew-changed-issuer",
                format!(
                    "{}: issuer changed from `{}` to `{}`",
                    cert.name, before.issuer, after.issuer
                ),
            ));
        }
        latest = latest.max(after.not_after);
        outcome = outcome
            .output(
                format!("{}.before", cert.name),
                x509::rfc3339(before.not_after),
            )
            .output(
                format!("{}.after", cert.name),
                x509::rfc3339(after.not_after),
            );
    }
    outcome.message = format!(
        "renewed {} certificate(s), new expiry {}: {}",
        targets.len(),
        x509::rfc3339(latest),
        names.join(", ")
    );
    if p.restart_control_plane {
        let restarted = restart(&default_components(), p.wait_seconds, ctx)?;
        outcome.message = format!("{}; {}", outcome.message, restarted.message);
    }
    Ok(outcome)
}

fn manifest(component: &str) -> String {
    format!("{MANIFESTS_DIR}/{component}.yaml")
}

fn aside(component: &str) -> String {
    format!("{MANIFESTS_DIR}/.{component}.yaml{ASIDE_SUFFIX}")
}

fn exists(path: &str) -> bool {
    std::fs::metadata(path).is_ok()
}

/// Components of `wanted` whose manifest is in place or was left aside.
fn present_manifests(wanted: &[String]) -> Result<Vec<String>, PluginError> {
    for c in wanted {
        if c.is_empty() || c.contains('/') || c.starts_with('.') {
            return Err(PluginError::new(
                "bad-params",
                format!("components: `{c}` is not a manifest name (expected e.g. kube-apiserver)"),
            ));
        }
    }
    Ok(wanted
        .iter()
        .filter(|c| exists(&manifest(c)) || exists(&aside(c)))
        .cloned()
        .collect())
}

fn rename(from: &str, to: &str) -> Result<(), PluginError> {
    std::fs::rename(from, to).map_err(|e| {
        PluginError::retryable(
            "manifest-move-failed",
            format!(
                "moving {from} to {to}: {e}; the plugin needs a ReadWrite grant on {MANIFESTS_DIR}"
            ),
        )
    })
}

fn restart(
    components: &[String],
    wait_seconds: u64,
    ctx: &RunContext,
) -> Result<Outcome, PluginError> {
    if wait_seconds > MAX_WAIT_SECONDS {
        return Err(PluginError::new(
            "bad-params",
            format!("waitSeconds is {wait_seconds}, expected at most {MAX_WAIT_SECONDS}"),
        ));
    }
    let present = present_manifests(components)?;
    if present.is_empty() {
        return Err(PluginError::new(
            "no-manifests",
            format!(
                "none of {components:?} has a manifest in {MANIFESTS_DIR}; is this a control-plane node?"
            ),
        ));
    }
    if ctx.dry_run {
        return Ok(Outcome::unchanged(format!(
            "would restart {} by moving their manifests out of {MANIFESTS_DIR} together for {wait_seconds}s and back",
            present.join(", ")
        )));
    }
    // An interrupted run may have left manifests aside: put them back first.
    for c in &present {
        if exists(&aside(c)) && !exists(&manifest(c)) {
            warn!(
                "{} was left aside by an interrupted restart; moving it back",
                manifest(c)
            );
            rename(&aside(c), &manifest(c))?;
        }
    }
    let wait = std::time::Duration::from_secs(wait_seconds);
    log::progress(0, 2, &format!("stopping {}", present.join(", ")));
    let mut moved: Vec<&String> = Vec::new();
    for c in &present {
        if let Err(e) = rename(&manifest(c), &aside(c)) {
            // Leave nothing half done: what was moved goes back before the error.
            for m in &moved {
                let _ = rename(&aside(m), &manifest(m));
            }
            return Err(e);
        }
        moved.push(c);
    }
    info!(
        "moved {} out of {MANIFESTS_DIR}; waiting {wait_seconds}s for the kubelet to stop them",
        present.join(", ")
    );
    std::thread::sleep(wait);
    log::progress(1, 2, &format!("starting {}", present.join(", ")));
    for c in &present {
        rename(&aside(c), &manifest(c))?;
    }
    info!(
        "moved {} back; the kubelet starts them again",
        present.join(", ")
    );
    log::progress(2, 2, "restarted");
    Ok(Outcome::changed(format!(
        "restarted {} ({}s out together)",
        present.join(", "),
        wait_seconds
    ))
    .output("restarted", present.join(",")))
}

bosun_plugin_sdk::export_plugin!(Certs);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_declares_what_run_uses() {
        let m = Certs::metadata();
        assert_eq!(m.name, "certs");
        let actions: Vec<_> = m.actions.iter().map(|a| a.name.as_str()).collect();
        // The planner's well-known actions for renewCertificates.
        assert_eq!(actions, ["check", "renew", "restart-control-plane"]);
        assert!(
            m.capabilities
                .filesystem
                .iter()
                .any(|p| p.path == "/etc/kubernetes" && !p.writable)
        );
        assert!(
            m.capabilities
                .filesystem
                .iter()
                .any(|p| p.path == MANIFESTS_DIR && p.writable)
        );
        assert!(
            m.capabilities
                .exec
                .iter()
                .all(|c| c.command == KUBEADM || c.command == DF)
        );
        assert!(m.capabilities.services.is_empty() && m.capabilities.http.is_empty());
    }

    #[test]
    fn selection_rejects_unknown_names_and_mixing_all() {
        assert_eq!(select(&["all".into()]).unwrap().len(), 11);
        assert_eq!(
            select(&["apiserver".into(), "admin.conf".into()])
                .unwrap()
                .len(),
            2
        );
        let e = select(&["ca".into()]).unwrap_err();
        assert_eq!(e.code, "bad-params");
        assert!(
            e.message
                .contains("`ca` is not a certificate kubeadm renews"),
            "{}",
            e.message
        );
        assert!(select(&["all".into(), "apiserver".into()]).is_err());
        assert!(select(&[]).is_err());
    }

    #[test]
    fn planner_params_deserialize() {
        // What runtime/planner sends for renewCertificates.
        let a: Action = serde_json::from_value(serde_json::json!({
            "action": "renew",
            "params": {"certificates": ["all"], "renewBefore": "720h"}
        }))
        .unwrap();
        assert!(
            matches!(a, Action::Renew(RenewParams { ref renew_before, .. }) if renew_before.as_deref() == Some("720h"))
        );
        let a: Action = serde_json::from_value(
            serde_json::json!({"action": "restart-control-plane", "params": {}}),
        )
        .unwrap();
        assert!(matches!(
            a,
            Action::RestartControlPlane(RestartParams {
                wait_seconds: 20,
                ..
            })
        ));
    }

    #[test]
    fn manifest_names_cannot_escape_the_directory() {
        assert!(present_manifests(&["../etc/passwd".into()]).is_err());
        assert!(present_manifests(&[".hidden".into()]).is_err());
        assert_eq!(
            aside("etcd"),
            "/etc/kubernetes/manifests/.etcd.yaml.bosun-restart"
        );
    }
}
