//! The `certs` plugin against a copy of a lab control-plane node root: the PKI, kubeconfigs
//! and static pod manifests the real kubeadm made, and the real kubeadm binary, run through
//! the real sandbox with the grants of deploy/examples/plugins/certs.yaml.

use std::collections::BTreeMap;
use std::path::Path;

use bosun_plugins_tests::{
    Node, copy_tree, example_grants_for_lab, install_programs, plugins, utc_now,
};
use x509_parser::prelude::*;

/// What the test itself reads from a certificate file (independently of the plugin).
#[derive(Debug, Clone, PartialEq, Eq)]
struct OnDisk {
    not_after: i64,
    issuer: String,
    sans: Vec<String>,
    authority_key_id: Option<Vec<u8>>,
    serial: String,
}

fn read_pem_cert(pem: &[u8]) -> OnDisk {
    let (_, pem) = parse_x509_pem(pem).unwrap();
    let cert = pem.parse_x509().unwrap();
    let mut sans: Vec<String> = cert
        .subject_alternative_name()
        .unwrap()
        .map(|e| {
            e.value
                .general_names
                .iter()
                .map(|n| format!("{n}"))
                .collect()
        })
        .unwrap_or_default();
    sans.sort();
    let authority_key_id = cert
        .extensions()
        .iter()
        .find_map(|e| match e.parsed_extension() {
            ParsedExtension::AuthorityKeyIdentifier(a) => {
                a.key_identifier.as_ref().map(|k| k.0.to_vec())
            }
            _ => None,
        });
    OnDisk {
        not_after: cert.validity().not_after.timestamp(),
        issuer: cert.issuer().to_string(),
        sans,
        authority_key_id,
        serial: cert.raw_serial_as_string(),
    }
}

fn subject_key_id(pem: &[u8]) -> Vec<u8> {
    let (_, pem) = parse_x509_pem(pem).unwrap();
    let cert = pem.parse_x509().unwrap();
    cert.extensions()
        .iter()
        .find_map(|e| match e.parsed_extension() {
            ParsedExtension::SubjectKeyIdentifier(k) => Some(k.0.to_vec()),
            _ => None,
        })
        .unwrap()
}

/// kubeadm name → file holding a leaf certificate in the node root.
fn leaf_files() -> Vec<(&'static str, &'static str)> {
    vec![
        ("apiserver", "etc/kubernetes/pki/apiserver.crt"),
        (
            "apiserver-kubelet-client",
            "etc/kubernetes/pki/apiserver-kubelet-client.crt",
        ),
        (
            "apiserver-etcd-client",
            "etc/kubernetes/pki/apiserver-etcd-client.crt",
        ),
        (
            "front-proxy-client",
            "etc/kubernetes/pki/front-proxy-client.crt",
        ),
        ("etcd-server", "etc/kubernetes/pki/etcd/server.crt"),
        ("etcd-peer", "etc/kubernetes/pki/etcd/peer.crt"),
        (
            "etcd-healthcheck-client",
            "etc/kubernetes/pki/etcd/healthcheck-client.crt",
        ),
        ("admin.conf", "etc/kubernetes/admin.conf"),
        ("super-admin.conf", "etc/kubernetes/super-admin.conf"),
        (
            "controller-manager.conf",
            "etc/kubernetes/controller-manager.conf",
        ),
        ("scheduler.conf", "etc/kubernetes/scheduler.conf"),
    ]
}

/// The certificate in `file` (a PEM or a kubeconfig with embedded client certificate).
fn on_disk(root: &Path, file: &str) -> OnDisk {
    let bytes = std::fs::read(root.join(file)).unwrap();
    if file.ends_with(".conf") {
        let text = String::from_utf8(bytes).unwrap();
        let line = text
            .lines()
            .find(|l| l.trim_start().starts_with("client-certificate-data:"))
            .unwrap();
        let b64 = line.split_once(':').unwrap().1.trim();
        let out = std::process::Command::new("base64")
            .arg("-d")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .and_then(|mut c| {
                use std::io::Write;
                c.stdin.take().unwrap().write_all(b64.as_bytes())?;
                c.wait_with_output()
            })
            .unwrap();
        read_pem_cert(&out.stdout)
    } else {
        read_pem_cert(&bytes)
    }
}

fn snapshot(root: &Path) -> BTreeMap<&'static str, OnDisk> {
    leaf_files()
        .into_iter()
        .map(|(name, file)| (name, on_disk(root, file)))
        .collect()
}

/// `kubeadm certs check-expiration` chrooted into `root`: certificate name → EXPIRES column.
fn kubeadm_expiry(kubeadm: &Path, root: &Path) -> BTreeMap<String, String> {
    let out = std::process::Command::new(kubeadm)
        .arg("--rootfs")
        .arg(root)
        .args(["certs", "check-expiration"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "kubeadm certs check-expiration: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let mut map = BTreeMap::new();
    for line in text.lines() {
        let cols: Vec<&str> = line.split_whitespace().collect();
        // NAME  Mon DD, YYYY HH:MM UTC  RESIDUAL ...
        if cols.len() >= 6 && cols[5] == "UTC" && cols[0] != "CERTIFICATE" {
            map.insert(cols[0].to_owned(), cols[1..6].join(" "));
        }
    }
    map
}

/// RFC 3339 (`2027-11-30T02:35:12Z`) in kubeadm's table format (`Nov 30, 2027 02:35 UTC`).
fn kubeadm_format(rfc3339: &str) -> String {
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let (date, time) = rfc3339.trim_end_matches('Z').split_once('T').unwrap();
    let parts: Vec<&str> = date.split('-').collect();
    let month = MONTHS[parts[1].parse::<usize>().unwrap() - 1];
    format!("{month} {}, {} {} UTC", parts[2], parts[0], &time[..5])
}

/// RFC 3339 UTC (`2027-11-30T02:35:12Z`) to seconds since the epoch.
fn ts(rfc3339: &str) -> i64 {
    let (date, time) = rfc3339.trim_end_matches('Z').split_once('T').unwrap();
    let d: Vec<i64> = date.split('-').map(|p| p.parse().unwrap()).collect();
    let t: Vec<i64> = time.split(':').map(|p| p.parse().unwrap()).collect();
    // Days from civil (proleptic Gregorian), Howard Hinnant's algorithm.
    let (y, m) = if d[1] <= 2 {
        (d[0] - 1, d[1] + 9)
    } else {
        (d[0], d[1] - 3)
    };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * m + 2) / 5 + d[2] - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    days * 86_400 + t[0] * 3600 + t[1] * 60 + t[2]
}

/// Waits until the wall clock is in a later second than when called. Certificate times have
/// one-second resolution: without this, a certificate renewed in the same second as it was
/// issued (a lab made moments ago, or the previous renewal) keeps the same NotAfter, and
/// "NotAfter is later" could not be asserted. A wait, not a timed assertion.
fn next_second() {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    std::thread::sleep(
        std::time::Duration::from_nanos(u64::from(1_000_000_000 - now.subsec_nanos()))
            + std::time::Duration::from_millis(20),
    );
}

#[test]
fn renews_the_lab_pki_through_the_sandbox_and_kubeadm_agrees() {
    let (lab, cp) = bosun_plugins_tests::lab_control_plane();
    let kubeadm = lab.bin_dir.join("kubeadm");

    // A copy: the lab's own node root stays as kubeadm made it.
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    copy_tree(&cp.host_root, &root);
    install_programs(&root, &["/usr/bin/df"]);
    let ca_before = std::fs::read(root.join("etc/kubernetes/pki/ca.crt")).unwrap();
    let etcd_ca_before = std::fs::read(root.join("etc/kubernetes/pki/etcd/ca.crt")).unwrap();
    let front_proxy_ca = std::fs::read(root.join("etc/kubernetes/pki/front-proxy-ca.crt")).unwrap();
    let before = snapshot(&root);

    let node = Node::new(&root, &["control-plane"]);
    let certs = node.load(&plugins().certs, "certs");
    let grants = example_grants_for_lab("certs.yaml", lab.ports);

    // check: the plugin parses every certificate itself; kubeadm agrees on each expiry.
    let check = node.run(&certs, &grants, "check", &serde_json::json!({}), false);
    let outcome = check.outcome();
    assert!(!outcome.changed);
    let kubeadm_before = kubeadm_expiry(&kubeadm, &root);
    assert_eq!(
        kubeadm_before.len(),
        14,
        "kubeadm lists 11 certificates and 3 CAs: {kubeadm_before:?}"
    );
    for (name, expires) in &kubeadm_before {
        let ours = check
            .output(name)
            .unwrap_or_else(|| panic!("check reports no {name}: {:?}", outcome.outputs));
        assert_eq!(&kubeadm_format(&ours), expires, "{name}");
    }
    for (name, disk) in &before {
        assert_eq!(ts(&check.output(name).unwrap()), disk.not_after, "{name}");
    }
    // kubelet.conf's client certificate is a kubeconfig certificate kubeadm does not list.
    assert!(check.output("kubelet.conf").is_some());

    // Dry run: says what it would renew, changes no byte.
    let dry = node.run(
        &certs,
        &grants,
        "renew",
        &serde_json::json!({"certificates": ["all"], "issuedBefore": utc_now()}),
        true,
    );
    let o = dry.outcome();
    assert!(!o.changed);
    assert!(
        o.message.starts_with("would renew 11 certificate(s)"),
        "{}",
        o.message
    );
    assert_eq!(snapshot(&root), before);

    // A named list renews exactly those.
    next_second();
    let named = node.run(
        &certs,
        &grants,
        "renew",
        &serde_json::json!({"certificates": ["apiserver", "admin.conf"], "issuedBefore": utc_now()}),
        false,
    );
    assert!(named.outcome().changed, "{}", named.outcome().message);
    let mid = snapshot(&root);
    for (name, disk) in &mid {
        if *name == "apiserver" || *name == "admin.conf" {
            assert!(disk.not_after > before[name].not_after, "{name} renewed");
            assert_ne!(
                disk.serial, before[name].serial,
                "{name} is a new certificate"
            );
        } else {
            assert_eq!(disk, &before[name], "{name} untouched");
        }
    }

    // renewBefore: nothing expires within 30 days of a fresh lab, so nothing changes.
    let not_due = node.run(
        &certs,
        &grants,
        "renew",
        &serde_json::json!({"certificates": ["all"], "renewBefore": "720h"}),
        false,
    );
    assert!(!not_due.outcome().changed);
    assert!(
        not_due
            .outcome()
            .message
            .contains("no selected certificate expires within 720h"),
        "{}",
        not_due.outcome().message
    );
    assert_eq!(snapshot(&root), mid);

    // Neither filter: refused, saying what to give.
    let neither = node.run(
        &certs,
        &grants,
        "renew",
        &serde_json::json!({"certificates": ["all"]}),
        false,
    );
    let failed = neither.failed_checks();
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert_eq!(failed[0].0, "params");
    assert!(
        failed[0].1.starts_with(
            "give `renewBefore` (renew what expires within it, `720h`) or `issuedBefore`"
        ),
        "{failed:?}"
    );
    assert_eq!(snapshot(&root), mid);

    // All, as the planner asks (everything issued before the Operation, here now): later
    // NotAfter, same CA, SANs kept, CAs untouched.
    next_second();
    let params = serde_json::json!({"certificates": ["all"], "issuedBefore": utc_now()});
    let all = node.run(&certs, &grants, "renew", &params, false);
    let o = all.outcome();
    assert!(o.changed);
    assert!(
        o.message.starts_with("renewed 11 certificate(s)"),
        "{}",
        o.message
    );
    let after = snapshot(&root);
    let ca_key_id = subject_key_id(&ca_before);
    let etcd_key_id = subject_key_id(&etcd_ca_before);
    let front_proxy_key_id = subject_key_id(&front_proxy_ca);
    for (name, disk) in &after {
        let old = &mid[name];
        assert!(
            disk.not_after > old.not_after,
            "{name}: NotAfter {} not later than {}",
            disk.not_after,
            old.not_after
        );
        assert_eq!(disk.issuer, old.issuer, "{name}: same issuer");
        assert_eq!(
            disk.authority_key_id, old.authority_key_id,
            "{name}: signed by the same CA key"
        );
        let expected_ca = if name.contains("etcd") {
            &etcd_key_id
        } else if name.contains("front-proxy") {
            &front_proxy_key_id
        } else {
            &ca_key_id
        };
        assert_eq!(
            disk.authority_key_id.as_ref(),
            Some(expected_ca),
            "{name}: authority key id"
        );
        assert_eq!(disk.sans, old.sans, "{name}: SANs kept");
        // The plugin's report matches the files.
        assert_eq!(
            ts(&all.output(&format!("{name}.before")).unwrap()),
            old.not_after,
            "{name}.before"
        );
        assert_eq!(
            ts(&all.output(&format!("{name}.after")).unwrap()),
            disk.not_after,
            "{name}.after"
        );
    }
    assert!(!after["apiserver"].sans.is_empty());
    assert_eq!(
        std::fs::read(root.join("etc/kubernetes/pki/ca.crt")).unwrap(),
        ca_before,
        "the CA is not reissued"
    );
    let kubeadm_after = kubeadm_expiry(&kubeadm, &root);
    for name in after.keys() {
        assert_eq!(
            kubeadm_format(&all.output(&format!("{name}.after")).unwrap()),
            kubeadm_after[*name],
            "{name}: kubeadm agrees"
        );
    }
    for ca in ["ca", "etcd-ca", "front-proxy-ca"] {
        assert_eq!(kubeadm_after[ca], kubeadm_before[ca], "{ca} unchanged");
    }

    // The same step again (an agent restart, a retry): everything was issued after
    // `issuedBefore`, so nothing is renewed and no byte changes.
    let again = node.run(&certs, &grants, "renew", &params, false);
    let o = again.outcome();
    assert!(!o.changed, "{}", o.message);
    assert_eq!(
        o.message,
        format!(
            "every selected certificate was issued at or after {} (renewed already); nothing to renew",
            params["issuedBefore"].as_str().unwrap()
        )
    );
    assert_eq!(snapshot(&root), after);
}

#[test]
fn restart_moves_the_manifests_out_together_and_back_and_recovers_an_interrupted_run() {
    let (lab, cp) = bosun_plugins_tests::lab_control_plane();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    copy_tree(&cp.host_root, &root);
    let manifests = root.join("etc/kubernetes/manifests");
    let read_all = || -> BTreeMap<String, Vec<u8>> {
        std::fs::read_dir(&manifests)
            .unwrap()
            .map(|e| e.unwrap())
            .map(|e| {
                (
                    e.file_name().to_string_lossy().into_owned(),
                    std::fs::read(e.path()).unwrap(),
                )
            })
            .collect()
    };
    let before = read_all();
    assert_eq!(before.len(), 4, "{:?}", before.keys());

    let node = Node::new(&root, &["control-plane"]);
    let certs = node.load(&plugins().certs, "certs");
    let grants = example_grants_for_lab("certs.yaml", lab.ports);

    let dry = node.run(
        &certs,
        &grants,
        "restart-control-plane",
        &serde_json::json!({"waitSeconds": 1}),
        true,
    );
    assert!(
        dry.outcome().message.starts_with(
            "would restart etcd, kube-apiserver, kube-controller-manager, kube-scheduler"
        ),
        "{}",
        dry.outcome().message
    );
    assert_eq!(read_all(), before);

    // An interrupted earlier run left kube-apiserver aside (hidden name the kubelet ignores).
    std::fs::rename(
        manifests.join("kube-apiserver.yaml"),
        manifests.join(".kube-apiserver.yaml.bosun-restart"),
    )
    .unwrap();
    // How many manifests were aside at once, sampled while the step runs: together means all
    // four (one at a time would never show more than one).
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let done = done.clone();
        let manifests = manifests.clone();
        std::thread::spawn(move || {
            let mut most = 0;
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                let aside = std::fs::read_dir(&manifests)
                    .map(|d| {
                        d.filter_map(|e| e.ok())
                            .filter(|e| e.file_name().to_string_lossy().ends_with(".bosun-restart"))
                            .count()
                    })
                    .unwrap_or(0);
                most = most.max(aside);
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            most
        })
    };
    let ran = node.run(
        &certs,
        &grants,
        "restart-control-plane",
        &serde_json::json!({"waitSeconds": 2}),
        false,
    );
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let most_aside = sampler.join().unwrap();
    let o = ran.outcome();
    assert!(o.changed);
    assert_eq!(
        ran.output("restarted").unwrap(),
        "etcd,kube-apiserver,kube-controller-manager,kube-scheduler"
    );
    let log = ran
        .run
        .as_ref()
        .unwrap()
        .captured
        .lines
        .iter()
        .map(|l| l.message.clone())
        .collect::<Vec<_>>();
    assert!(
        log.iter()
            .any(|l| l.contains("left aside by an interrupted restart")),
        "{log:?}"
    );
    // Every manifest went out at once and came back.
    assert_eq!(
        o.message,
        "restarted etcd, kube-apiserver, kube-controller-manager, kube-scheduler (2s out together)"
    );
    assert!(
        log.iter().any(|l| l.starts_with(
            "moved etcd, kube-apiserver, kube-controller-manager, kube-scheduler out of /etc/kubernetes/manifests"
        )),
        "{log:?}"
    );
    assert_eq!(most_aside, 4, "the four manifests were out together");
    assert_eq!(
        read_all(),
        before,
        "every manifest is back, byte for byte, and nothing is left aside"
    );

    // Without the write grant on the manifest directory the move is refused by the sandbox.
    let mut read_only = grants.clone();
    read_only
        .filesystem
        .retain(|g| g.path != "/etc/kubernetes/manifests");
    let refused = node.run(
        &certs,
        &read_only,
        "restart-control-plane",
        &serde_json::json!({"waitSeconds": 1}),
        false,
    );
    assert_eq!(refused.error().code, "manifest-move-failed");
    assert_eq!(read_all(), before);
}
