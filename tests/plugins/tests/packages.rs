//! The `packages` plugin through the real sandbox with the grants of
//! deploy/examples/plugins/packages.yaml:
//! - apt: this machine's real apt and dpkg, chrooted into a Debian node root, against a
//!   local repository of packages built here with dpkg-deb;
//! - binary: a loopback HTTP server serving the right bytes, bytes with the wrong digest and
//!   a download cut short;
//! - a family with no backend fails preflight saying so.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bosun_api::grants::{Grants, HttpGrant};
use bosun_plugins_tests::{
    Node, build_deb, debian_root, dpkg_state, example_grants, index_repo, install_programs,
    packages_grants_with_local_repository, plugins, write,
};
use serde_json::json;

const PKG: &str = "bosun-test-kubeadm";

fn installed_file(root: &Path) -> String {
    std::fs::read_to_string(root.join(format!("usr/share/{PKG}/version")))
        .unwrap()
        .trim()
        .to_owned()
}

/// A plain `apt-get upgrade` run by the test itself (not the plugin) in the node root.
fn apt_upgrade(root: &Path) {
    let out = std::process::Command::new("/usr/sbin/chroot")
        .arg(root)
        .args(["/usr/bin/apt-get", "-q", "-y", "upgrade"])
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "apt-get upgrade: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn apt_installs_an_exact_version_holds_upgrades_and_unholds() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    debian_root(&root);
    for v in ["1.34.1-1.1", "1.34.2-1.1"] {
        build_deb(&root, PKG, v);
    }
    index_repo(&root);

    let node = Node::new(&root, &["worker"]);
    let packages = node.load(&plugins().packages, "packages");
    let grants = packages_grants_with_local_repository();

    // Exact version, held. The index is empty before the first `apt-get update`, so the
    // preflight only warns that the version is not known yet.
    let first = node.run(
        &packages,
        &grants,
        "install",
        &json!({"packages": [PKG], "version": "1.34.1-1.1"}),
        false,
    );
    assert!(
        first
            .checks
            .iter()
            .any(|c| c.name == "backend" && c.message.starts_with("apt on Debian")),
        "{:?}",
        first.checks
    );
    let o = first.outcome();
    assert!(o.changed, "{}", o.message);
    assert_eq!(first.output(&format!("{PKG}.before")).unwrap(), "none");
    assert_eq!(first.output(&format!("{PKG}.after")).unwrap(), "1.34.1-1.1");
    assert_eq!(first.output(&format!("{PKG}.held")).unwrap(), "true");
    assert_eq!(
        dpkg_state(&root, PKG),
        Some(("hold ok installed".into(), "1.34.1-1.1".into()))
    );
    assert_eq!(installed_file(&root), "1.34.1-1.1");

    // Idempotent: the same step again changes nothing.
    let again = node.run(
        &packages,
        &grants,
        "install",
        &json!({"packages": [PKG], "version": "1.34.1-1.1"}),
        false,
    );
    assert!(!again.outcome().changed, "{}", again.outcome().message);
    assert_eq!(
        again.outcome().message,
        format!("{PKG} already at 1.34.1-1.1, held")
    );

    // The hold is real: apt's own upgrade leaves the package alone although 1.34.2 is there.
    apt_upgrade(&root);
    assert_eq!(dpkg_state(&root, PKG).unwrap().1, "1.34.1-1.1");

    // Dry run of the upgrade the planner asks for: says what it would do, changes nothing.
    let planner_params = json!({"packages": [PKG], "kubernetesVersion": "v1.34.2"});
    let dry = node.run(&packages, &grants, "install", &planner_params, true);
    assert!(!dry.outcome().changed);
    assert_eq!(
        dry.outcome().message,
        format!("would install {PKG} 1.34.1-1.1 → 1.34.2-1.1 with apt")
    );
    assert_eq!(
        dpkg_state(&root, PKG).unwrap(),
        ("hold ok installed".into(), "1.34.1-1.1".into())
    );

    // Upgrade by Kubernetes version, through the hold, held again afterwards.
    let up = node.run(&packages, &grants, "install", &planner_params, false);
    assert!(up.outcome().changed);
    assert_eq!(up.output(&format!("{PKG}.before")).unwrap(), "1.34.1-1.1");
    assert_eq!(up.output(&format!("{PKG}.after")).unwrap(), "1.34.2-1.1");
    assert_eq!(
        dpkg_state(&root, PKG),
        Some(("hold ok installed".into(), "1.34.2-1.1".into()))
    );
    assert_eq!(installed_file(&root), "1.34.2-1.1");

    // Back down to an exact older version (a rollback done the package way).
    let down = node.run(
        &packages,
        &grants,
        "install",
        &json!({"packages": [PKG], "version": "1.34.1-1.1"}),
        false,
    );
    assert!(down.outcome().changed);
    assert_eq!(dpkg_state(&root, PKG).unwrap().1, "1.34.1-1.1");

    // Unhold: apt may change it again, and then its own upgrade does.
    let unhold = node.run(
        &packages,
        &grants,
        "unhold",
        &json!({"packages": [PKG]}),
        false,
    );
    assert!(unhold.outcome().changed, "{}", unhold.outcome().message);
    assert_eq!(dpkg_state(&root, PKG).unwrap().0, "install ok installed");
    let unhold_again = node.run(
        &packages,
        &grants,
        "unhold",
        &json!({"packages": [PKG]}),
        false,
    );
    assert!(!unhold_again.outcome().changed);
    apt_upgrade(&root);
    assert_eq!(dpkg_state(&root, PKG).unwrap().1, "1.34.2-1.1");

    // A version the repository does not have: the plugin says which ones it has.
    let missing = node.run(
        &packages,
        &grants,
        "install",
        &json!({"packages": [PKG], "kubernetesVersion": "v1.35.0", "update": false}),
        false,
    );
    assert!(missing.run.is_none(), "preflight must fail without update");
    let (name, msg) = &missing.failed_checks()[0];
    assert_eq!(name, "version-available");
    assert!(
        msg.contains("no bosun-test-kubeadm package for Kubernetes v1.35.0")
            && msg.contains("1.34.2-1.1, 1.34.1-1.1"),
        "{msg}"
    );

    // Package arguments that are not names are refused before anything runs.
    let sneaky = node.run(
        &packages,
        &grants,
        "install",
        &json!({"packages": ["-o=APT::Foo"], "version": "1"}),
        false,
    );
    assert!(
        sneaky.failed_checks()[0]
            .1
            .contains("is not a package name"),
        "{:?}",
        sneaky.checks
    );
}

#[test]
fn a_family_without_backend_fails_preflight_saying_so() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    write(
        &root,
        "etc/os-release",
        "NAME=\"Flatcar Container Linux by Kinvolk\"\nID=flatcar\nVERSION_ID=4081.2.0\nPRETTY_NAME=\"Flatcar Container Linux by Kinvolk 4081.2.0\"\n",
    );
    std::fs::create_dir_all(root.join("usr/bin")).unwrap();
    let node = Node::new(&root, &["worker"]);
    let packages = node.load(&plugins().packages, "packages");
    let ran = node.run(
        &packages,
        &example_grants("packages.yaml"),
        "install",
        &json!({"packages": ["kubeadm"], "kubernetesVersion": "v1.34.2"}),
        false,
    );
    assert!(ran.run.is_none());
    let (name, msg) = &ran.failed_checks()[0];
    assert_eq!(name, "backend");
    assert!(
        msg.contains(
            "no package backend for Flatcar Container Linux by Kinvolk 4081.2.0 (ID=flatcar"
        ),
        "{msg}"
    );
    assert!(msg.contains("Write a package backend"), "{msg}");
}

/// What the loopback server answers for a path.
#[derive(Clone)]
pub(crate) enum Reply {
    /// 200 with the whole body.
    Full(Vec<u8>),
    /// 200 announcing the whole body's length, then only `cut` bytes and a closed connection.
    Cut(Vec<u8>, usize),
    /// 302 to this location.
    Redirect(&'static str),
}

/// A one-thread HTTP/1.1 server on 127.0.0.1 answering GETs from a fixed table; counts
/// requests. Runs until the test process ends (no state shared between tests).
pub(crate) fn serve(routes: Vec<(&'static str, Reply)>) -> (String, Arc<AtomicUsize>) {
    serve_over(routes, None)
}

/// [`serve`] over TLS, with a certificate for `names` from a CA made here: the address, the
/// request count and the CA's certificate in PEM, which the host must be given to trust it
/// (with the names resolved to the address). A [`Reply::Cut`] ends without close_notify.
pub(crate) fn serve_tls(
    routes: Vec<(&'static str, Reply)>,
    names: &[&str],
) -> (String, Arc<AtomicUsize>, String) {
    let pki = bosun_test_pki::TestPki::new("bosun kit test CA", names);
    let (addr, hits) = serve_over(routes, Some(pki.server_config()));
    (addr, hits, pki.ca_pem)
}

fn serve_over(
    routes: Vec<(&'static str, Reply)>,
    tls: Option<Arc<rustls::ServerConfig>>,
) -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let hits = Arc::new(AtomicUsize::new(0));
    let counter = hits.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { continue };
            counter.fetch_add(1, Ordering::SeqCst);
            let _ = conn.set_read_timeout(Some(std::time::Duration::from_secs(30)));
            match &tls {
                None => {
                    let mut conn = conn;
                    answer(&mut conn, &routes);
                }
                Some(config) => {
                    let Ok(server) = rustls::ServerConnection::new(Arc::clone(config)) else {
                        continue;
                    };
                    let mut stream = rustls::StreamOwned::new(server, conn);
                    if answer(&mut stream, &routes) {
                        stream.conn.send_close_notify();
                    }
                    let _ = stream.flush();
                }
            }
        }
    });
    (addr, hits)
}

/// Reads one request head and answers it from `routes`; false when the answer was cut
/// short on purpose.
fn answer(conn: &mut (impl Read + Write), routes: &[(&'static str, Reply)]) -> bool {
    // Read the whole request head before answering.
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match conn.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    let text = String::from_utf8_lossy(&head);
    let path = text.split_whitespace().nth(1).unwrap_or("/").to_owned();
    match routes
        .iter()
        .find(|(p, _)| *p == path)
        .map(|(_, r)| r.clone())
    {
        Some(Reply::Full(body)) => {
            let _ = write!(
                conn,
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = conn.write_all(&body);
            true
        }
        Some(Reply::Cut(body, cut)) => {
            let _ = write!(
                conn,
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = conn.write_all(&body[..cut]);
            false
        }
        Some(Reply::Redirect(location)) => {
            let _ = write!(
                conn,
                "HTTP/1.1 302 Found\r\nLocation: {location}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            );
            true
        }
        None => {
            let _ = write!(
                conn,
                "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            );
            true
        }
    }
}

pub(crate) fn sha256(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    hex::encode(sha2::Sha256::digest(bytes))
}

/// A node root for the binary backend: Flatcar's os-release (no package manager) and the
/// `chmod` the backend runs.
fn binary_root(dir: &Path) -> PathBuf {
    let root = dir.join("root");
    write(
        &root,
        "etc/os-release",
        "ID=flatcar\nVERSION_ID=4081.2.0\nPRETTY_NAME=\"Flatcar 4081.2.0\"\n",
    );
    install_programs(&root, &["/usr/bin/chmod"]);
    root
}

/// The shipped grants with the loopback server at `addr` added, as an administrator adds a
/// mirror.
fn with_mirror(addr: &str, max_bytes: Option<u64>) -> Grants {
    let mut grants: Grants = example_grants("packages.yaml");
    grants.http.push(HttpGrant {
        host: addr.to_owned(),
        max_bytes,
    });
    grants
}

/// A binary the size of a real kubelet (84 MB as built here; kubeadm is 74 MB) is
/// downloaded, checked and installed with the host's default limits: the host's body cap
/// was 64 MiB, under which the binary backend could not have installed kubeadm or kubelet
/// from dl.k8s.io at all.
#[test]
fn a_binary_the_size_of_the_kubelet_installs_within_the_default_limits() {
    let dir = tempfile::tempdir().unwrap();
    let root = binary_root(dir.path());
    let kubelet: Vec<u8> = (0..21_000_000u32)
        .flat_map(|i| i.wrapping_mul(2_654_435_761).to_le_bytes())
        .collect();
    let digest = sha256(&kubelet);
    let (addr, _) = serve(vec![("/v1.34.4/kubelet", Reply::Full(kubelet))]);
    let grants = with_mirror(&addr, None);
    let node = Node::new(&root, &["worker"]);
    let packages = node.load(&plugins().packages, "packages");
    let ran = node.run(
        &packages,
        &grants,
        "install",
        &json!({"backend": "binary", "binaries": [{"name": "kubelet", "url": format!("http://{addr}/v1.34.4/kubelet"), "sha256": digest}]}),
        false,
    );
    assert!(ran.outcome().changed, "{}", ran.outcome().message);
    assert_eq!(
        std::fs::metadata(root.join("usr/bin/kubelet"))
            .unwrap()
            .len(),
        84_000_000
    );
    assert_eq!(ran.output("kubelet.sha256").unwrap(), digest);
}

#[test]
fn binary_download_checks_the_digest_replaces_atomically_and_rolls_back() {
    let dir = tempfile::tempdir().unwrap();
    let root = binary_root(dir.path());
    let old = b"#!/bin/sh\necho old\n".to_vec();
    write(&root, "usr/bin/kubeadm", std::str::from_utf8(&old).unwrap());
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(
        root.join("usr/bin/kubeadm"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();

    let new: Vec<u8> = (0..200_000u32).flat_map(|i| i.to_le_bytes()).collect();
    let wrong = b"not what the digest says".to_vec();
    let (addr, hits) = serve(vec![
        ("/v1.34.2/kubeadm", Reply::Full(new.clone())),
        (
            "/v1.34.2/kubeadm.sha256",
            Reply::Full(format!("{}  kubeadm\n", sha256(&new)).into_bytes()),
        ),
        ("/tampered/kubeadm", Reply::Full(wrong)),
        ("/cut/kubeadm", Reply::Cut(new.clone(), 300_000)),
        (
            "/moved/kubeadm.sha256",
            Reply::Redirect("/v1.34.2/kubeadm.sha256"),
        ),
        (
            "/away/kubeadm",
            Reply::Redirect("http://127.0.0.1:1/kubeadm"),
        ),
    ]);
    let grants = with_mirror(&addr, Some(16 << 20));

    let node = Node::new(&root, &["worker"]);
    let packages = node.load(&plugins().packages, "packages");
    let kubeadm = root.join("usr/bin/kubeadm");
    let spec = |path: &str, digest: Option<String>| json!({"backend": "binary", "binaries": [{"name": "kubeadm", "url": format!("http://{addr}{path}"), "sha256": digest}]});

    // Wrong digest: refused, old binary untouched, nothing staged left behind.
    let bad = node.run(
        &packages,
        &grants,
        "install",
        &spec("/tampered/kubeadm", Some(sha256(&new))),
        false,
    );
    assert_eq!(
        bad.error().code,
        "digest-mismatch",
        "{}",
        bad.error().message
    );
    assert_eq!(std::fs::read(&kubeadm).unwrap(), old);
    assert!(!root.join("usr/bin/.kubeadm.bosun-new").exists());

    // A download cut short: refused as incomplete (retryable), old binary untouched.
    let cut = node.run(
        &packages,
        &grants,
        "install",
        &spec("/cut/kubeadm", Some(sha256(&new))),
        false,
    );
    let e = cut.error();
    assert_eq!(e.code, "download-incomplete", "{}", e.message);
    assert!(e.retryable);
    assert!(
        e.message.contains("received 300000 of the 800000 bytes"),
        "{}",
        e.message
    );
    assert_eq!(std::fs::read(&kubeadm).unwrap(), old);

    // A redirect to a host no grant names: the host refuses that hop, and the message says
    // where the download was sent and what to grant.
    let away = node.run(
        &packages,
        &grants,
        "install",
        &spec("/away/kubeadm", Some(sha256(&new))),
        false,
    );
    assert!(
        away.error().message.contains(&format!(
            "downloading http://{addr}/away/kubeadm, which redirected to http://127.0.0.1:1/kubeadm: grant that host"
        )),
        "{}",
        away.error().message
    );
    assert_eq!(std::fs::read(&kubeadm).unwrap(), old);

    // Dry run: no download of the binary, no change.
    let before_hits = hits.load(Ordering::SeqCst);
    let dry = node.run(
        &packages,
        &grants,
        "install",
        &spec("/v1.34.2/kubeadm", None),
        true,
    );
    assert_eq!(
        dry.outcome().message,
        "would download and replace /usr/bin/kubeadm"
    );
    assert_eq!(
        hits.load(Ordering::SeqCst) - before_hits,
        1,
        "only the digest file was fetched"
    );
    assert_eq!(std::fs::read(&kubeadm).unwrap(), old);

    // Right digest (from the .sha256 file next to it, as dl.k8s.io publishes): replaced,
    // executable, the previous binary kept.
    let ok = node.run(
        &packages,
        &grants,
        "install",
        &spec("/v1.34.2/kubeadm", None),
        false,
    );
    assert!(ok.outcome().changed, "{}", ok.outcome().message);
    assert_eq!(ok.output("kubeadm.sha256").unwrap(), sha256(&new));
    assert_eq!(std::fs::read(&kubeadm).unwrap(), new);
    assert_eq!(
        std::fs::metadata(&kubeadm).unwrap().permissions().mode() & 0o777,
        0o755
    );
    assert_eq!(
        std::fs::read(root.join("usr/bin/.kubeadm.bosun-prev")).unwrap(),
        old
    );

    // Idempotent: same digest, nothing downloaded but the digest file, nothing changed.
    let again = node.run(
        &packages,
        &grants,
        "install",
        &spec("/v1.34.2/kubeadm", None),
        false,
    );
    assert!(!again.outcome().changed);

    // The digest file behind a redirect on the same host: followed (two GETs), the binary
    // already at that digest, nothing changed.
    let before_hits = hits.load(Ordering::SeqCst);
    let moved = node.run(
        &packages,
        &grants,
        "install",
        &spec("/moved/kubeadm", None),
        false,
    );
    assert!(!moved.outcome().changed, "{}", moved.outcome().message);
    assert_eq!(moved.output("kubeadm.sha256").unwrap(), sha256(&new));
    assert_eq!(hits.load(Ordering::SeqCst) - before_hits, 2);

    // Rollback puts the previous binary back.
    let rb = node.run(
        &packages,
        &grants,
        "rollback",
        &json!({"paths": ["/usr/bin/kubeadm"]}),
        false,
    );
    assert!(rb.outcome().changed);
    assert_eq!(std::fs::read(&kubeadm).unwrap(), old);
    let none_left = node.run(
        &packages,
        &grants,
        "rollback",
        &json!({"paths": ["/usr/bin/kubeadm"]}),
        false,
    );
    assert_eq!(none_left.failed_checks()[0].0, "previous-present");

    // Without the http grant for the server, the host refuses the download.
    let ungranted = node.run(
        &packages,
        &example_grants("packages.yaml"),
        "install",
        &spec("/v1.34.2/kubeadm", Some(sha256(&new))),
        false,
    );
    assert_eq!(
        ungranted.error().code,
        "not-granted",
        "{}",
        ungranted.error().message
    );
    assert_eq!(std::fs::read(&kubeadm).unwrap(), old);
}

/// dnf on a RHEL-family node root: this machine's real dnf 4 (with the versionlock plugin)
/// and rpm, chrooted, against a local repository built with rpmbuild and createrepo_c.
/// Needs those tools (Debian: `apt-get install dnf dnf-plugins-core rpm createrepo-c`);
/// without them the test fails saying so rather than passing untested.
#[test]
fn dnf_installs_an_exact_version_versionlocks_upgrades_and_unlocks() {
    use bosun_plugins_tests::{
        build_rpm, have_rpm_tools, index_rpm_repo, packages_grants_with_local_repository,
        rhel_root, rpm_version,
    };
    assert!(
        have_rpm_tools(),
        "dnf, dnf-plugins-core (versionlock), rpm (rpmbuild, rpmdb) and createrepo-c are needed: apt-get install dnf dnf-plugins-core rpm createrepo-c"
    );
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    rhel_root(&root);
    for v in ["1.34.1", "1.34.2"] {
        build_rpm(&root, PKG, v, "150500.1.1");
    }
    index_rpm_repo(&root);

    let node = Node::new(&root, &["worker"]);
    let packages = node.load(&plugins().packages, "packages");
    let grants = packages_grants_with_local_repository();
    let dnf_upgrade = || {
        let out = std::process::Command::new("/usr/sbin/chroot")
            .arg(&root)
            .args(["/usr/bin/dnf", "-q", "-y", "upgrade"])
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "dnf upgrade: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };

    let first = node.run(
        &packages,
        &grants,
        "install",
        &json!({"packages": [PKG], "version": "1.34.1-150500.1.1"}),
        false,
    );
    assert!(
        first
            .checks
            .iter()
            .any(|c| c.name == "backend" && c.message.starts_with("dnf on Rocky Linux 9.4")),
        "{:?}",
        first.checks
    );
    assert!(first.outcome().changed, "{}", first.outcome().message);
    assert_eq!(
        first.output(&format!("{PKG}.after")).unwrap(),
        "1.34.1-150500.1.1"
    );
    assert_eq!(first.output(&format!("{PKG}.held")).unwrap(), "true");
    assert_eq!(
        rpm_version(&root, PKG).as_deref(),
        Some("1.34.1-150500.1.1")
    );

    let again = node.run(
        &packages,
        &grants,
        "install",
        &json!({"packages": [PKG], "version": "1.34.1-150500.1.1"}),
        false,
    );
    assert!(!again.outcome().changed, "{}", again.outcome().message);

    // The versionlock is real: dnf's own upgrade leaves the package alone.
    dnf_upgrade();
    assert_eq!(
        rpm_version(&root, PKG).as_deref(),
        Some("1.34.1-150500.1.1")
    );

    // Upgrade by Kubernetes version through the lock, locked again at the new version.
    let up = node.run(
        &packages,
        &grants,
        "install",
        &json!({"packages": [PKG], "kubernetesVersion": "v1.34.2"}),
        false,
    );
    assert!(up.outcome().changed, "{}", up.outcome().message);
    assert_eq!(
        rpm_version(&root, PKG).as_deref(),
        Some("1.34.2-150500.1.1")
    );
    assert_eq!(up.output(&format!("{PKG}.held")).unwrap(), "true");

    // Downgrade to an exact older version (dnf's `downgrade`).
    let down = node.run(
        &packages,
        &grants,
        "install",
        &json!({"packages": [PKG], "version": "1.34.1-150500.1.1"}),
        false,
    );
    assert!(down.outcome().changed, "{}", down.outcome().message);
    assert_eq!(
        rpm_version(&root, PKG).as_deref(),
        Some("1.34.1-150500.1.1")
    );

    // Unlock, and dnf's upgrade moves it again.
    let unhold = node.run(
        &packages,
        &grants,
        "unhold",
        &json!({"packages": [PKG]}),
        false,
    );
    assert!(unhold.outcome().changed, "{}", unhold.outcome().message);
    dnf_upgrade();
    assert_eq!(
        rpm_version(&root, PKG).as_deref(),
        Some("1.34.2-150500.1.1")
    );

    // `backend: yum`: on this node yum is Rocky's symlink to dnf-3, and yum 3 is not driven
    // at all: preflight says so, and what to set instead.
    let yum = node.run(
        &packages,
        &grants,
        "hold",
        &json!({"packages": [PKG], "backend": "yum"}),
        false,
    );
    let failed = yum.failed_checks();
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert_eq!(failed[0].0, "backend");
    assert!(
        failed[0].1.starts_with(
            "`backend: yum`: on RHEL 8 and later yum is dnf, so leave `backend` unset or set it to `dnf`. yum 3 (RHEL and CentOS 7"
        ),
        "{}",
        failed[0].1
    );

    // A Fedora 41+ layout: dnf is dnf5 and dnf 4 is not installed.
    std::fs::remove_file(root.join("usr/bin/dnf-3")).unwrap();
    std::fs::remove_file(root.join("usr/bin/dnf")).unwrap();
    std::os::unix::fs::symlink("dnf5", root.join("usr/bin/dnf")).unwrap();
    let dnf5 = node.run(
        &packages,
        &grants,
        "hold",
        &json!({"packages": [PKG]}),
        false,
    );
    assert_eq!(
        dnf5.failed_checks(),
        vec![(
            "backend-commands".to_owned(),
            "the dnf backend chosen for this node cannot run: /usr/bin/dnf-3 (dnf 4) is missing and /usr/bin/dnf is dnf5 (dnf5, Fedora 41 and later), which this plugin does not drive: install dnf 4 (`dnf install dnf4`, which provides /usr/bin/dnf-3), or set `backend: binary`".to_owned()
        )]
    );
}
