//! The sandbox, end to end: real plugins (plugins/testing) in a real host, against a
//! temporary host root. Every misbehaviour is its own test asserting its own typed
//! error, and each then runs the well-behaved plugin on the same host to show the host
//! keeps working.

use crate::support;

use bosun_api::grants::{Access, ExecGrant, Grants, HttpGrant, ServiceAction, ServiceGrant};
use bosun_host::{
    CallFailure, Error, Host, LoadedPlugin, NodeContext, PluginError, PluginPin, RunOptions,
    RunReport,
};
use bosun_trust::{Digest, TrustError};
use std::time::Duration;
use support::{Node, exec_grant, fs, is_root, node, plugins, require_root, run_on};

fn greet_grant(args: &[&[&str]]) -> ExecGrant {
    exec_grant("/usr/bin/greet", args)
}

/// The grants of the happy path: read /data, run greet with one argument.
fn happy_grants() -> Grants {
    Grants {
        filesystem: vec![fs("/data", Access::ReadOnly)],
        exec: vec![greet_grant(&[&["*"]])],
        ..Grants::default()
    }
}

/// Grants for the cross-domain filesystem tests.
fn split_grants() -> Grants {
    Grants {
        filesystem: vec![
            fs("/data", Access::ReadOnly),
            fs("/ro", Access::ReadOnly),
            fs("/rw", Access::ReadWrite),
        ],
        ..Grants::default()
    }
}

fn node_ctx() -> NodeContext {
    NodeContext {
        node_name: "cp-1".into(),
        roles: vec!["control-plane".into()],
        kubelet_version: Some("v1.34.1".into()),
    }
}

fn run(
    host: &Host,
    p: &LoadedPlugin,
    grants: &Grants,
    action: &str,
    params: &str,
) -> Result<RunReport, CallFailure> {
    run_on(host, p, grants, &node_ctx(), action, params)
}

/// Runs a `bad` action that must be refused by the plugin's own error path (the host
/// call or WASI operation failed inside the sandbox) and returns that error.
fn refused(
    host: &Host,
    p: &LoadedPlugin,
    grants: &Grants,
    action: &str,
    params: &str,
) -> (PluginError, RunReport) {
    let report = run(host, p, grants, action, params)
        .unwrap_or_else(|f| panic!("{action} {params}: host failure {f}"));
    match &report.result {
        Err(e) => (e.clone(), report),
        Ok(o) => panic!("{action} {params} was NOT refused: {}", o.message),
    }
}

/// The happy path on `host`: proves the host still works after a misbehaving plugin.
fn assert_happy(node: &Node, host: &Host) {
    let good = node.load(host, &plugins().good, "good");
    assert_happy_with(host, &good);
}

fn assert_happy_with(host: &Host, good: &LoadedPlugin) {
    let report = run(
        host,
        good,
        &happy_grants(),
        "happy",
        r#"{"file":"/data/input.txt","command":"/usr/bin/greet","args":["world"]}"#,
    )
    .unwrap();
    let outcome = report.result.expect("happy path succeeds");
    let out = |k: &str| {
        outcome
            .outputs
            .iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.clone())
            .unwrap()
    };
    assert_eq!(out("file"), "hello from the node");
    assert_eq!(out("exit-code"), "0");
    if is_root() {
        // Chrooted: the script read /usr/share/bosun/marker from the node's root, not the machine's.
        assert_eq!(out("stdout"), "hello world from inside-the-root\n");
    } else {
        assert!(
            out("stdout").starts_with("hello world from "),
            "{}",
            out("stdout")
        );
    }
    assert_eq!(report.captured.lines.len(), 1);
    assert_eq!(report.captured.lines[0].message, "read granted file");
    assert_eq!(
        report.captured.progress.as_ref().map(|p| (p.done, p.total)),
        Some((2, 2))
    );
    assert!(report.captured.denied.is_empty());
}

fn failure(r: Result<RunReport, CallFailure>) -> CallFailure {
    match r {
        Ok(report) => panic!(
            "expected the host to stop the call, got {:?}",
            report.result
        ),
        Err(f) => f,
    }
}

/// Runs `action` of `p` with no grants, no parameters and `deadline`.
fn run_with_deadline(
    host: &Host,
    p: &LoadedPlugin,
    action: &str,
    deadline: Duration,
) -> Result<RunReport, CallFailure> {
    host.run(
        p,
        &Grants::default(),
        &node_ctx(),
        action,
        "{}",
        RunOptions {
            dry_run: false,
            resumed: false,
            deadline: Some(deadline),
        },
    )
}

/// The call failed as `deadline` exceeded, and said so.
fn assert_deadline_exceeded(r: Result<RunReport, CallFailure>, deadline: Duration) {
    let f = failure(r);
    assert!(
        matches!(f.error, Error::DeadlineExceeded { deadline: d } if d == deadline),
        "{f}"
    );
}

fn cached_entries(node: &Node) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(node.cache())
        .map(|d| {
            d.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "cwasm"))
                .collect()
        })
        .unwrap_or_default()
}

// ---------------------------------------------------------------- happy path

#[test]
fn happy_path_reads_a_granted_file_and_runs_a_granted_command() {
    let node = node();
    let host = node.host();
    assert_happy(&node, &host);
    let good = node.load(&host, &plugins().good, "good");
    assert_eq!(good.metadata().name, "good");
    assert_eq!(good.metadata().abi_version, bosun_host::ABI_VERSION);
    assert!(good.verified().is_some());
    let pre = host
        .preflight(&good, &happy_grants(), &node_ctx(), "happy", "{}")
        .unwrap();
    assert_eq!(pre.result.unwrap()[0].name, "happy-ready");
}

/// A call records the grants it exercised (what `kubectl bosun plugin test` checks every
/// grant against): the filesystem grant a path operation went through, the exec grant and
/// argument pattern that admitted a command, the service grant and action. Grants the call
/// did not touch are not recorded, and refused calls record nothing.
#[test]
fn a_call_records_the_grants_it_used_and_no_others() {
    use bosun_host::GrantUse;
    let node = node();
    let host = node.host();
    let good = node.load(&host, &plugins().good, "good");
    let mut grants = split_grants();
    grants.exec = vec![
        greet_grant(&[&["never", "this"]]),
        greet_grant(&[&["nor", "this"], &["*"]]),
    ];
    grants.services = vec![ServiceGrant {
        unit: "kubelet.service".into(),
        actions: vec![ServiceAction::Restart, ServiceAction::Stop],
    }];
    let report = run(
        &host,
        &good,
        &grants,
        "happy",
        r#"{"file":"/data/input.txt","command":"/usr/bin/greet","args":["world"]}"#,
    )
    .unwrap();
    assert!(report.result.is_ok(), "{:?}", report.result);
    assert_eq!(
        report.captured.used,
        [
            GrantUse::Filesystem("/data".into()),
            GrantUse::Exec {
                grant: 1,
                pattern: Some(1)
            },
        ]
        .into_iter()
        .collect()
    );
    assert!(report.captured.memory_bytes > 0);
    assert!(report.captured.memory_bytes <= host.config().limits.max_memory_bytes);

    let restart = run(
        &host,
        &good,
        &grants,
        "service",
        r#"{"unit":"kubelet.service","action":"restart"}"#,
    )
    .unwrap();
    assert!(restart.result.is_ok(), "{:?}", restart.result);
    let refused = run(
        &host,
        &good,
        &grants,
        "service",
        r#"{"unit":"containerd.service","action":"restart"}"#,
    )
    .unwrap();
    assert!(refused.result.is_err());
    assert_eq!(
        restart.captured.used,
        [GrantUse::Service {
            unit: "kubelet.service".into(),
            action: "restart".into()
        }]
        .into_iter()
        .collect()
    );
    assert!(
        refused.captured.used.is_empty(),
        "{:?}",
        refused.captured.used
    );
}

/// `RunOptions::resumed` and `dry_run` reach the plugin as `run-context.resumed` and
/// `dry-run`, each on its own: the `good` plugin's `context` action echoes what it got.
#[test]
fn the_run_context_reaches_the_plugin_as_given() {
    let node = node();
    let host = node.host();
    let good = node.load(&host, &plugins().good, "good");
    let seen = |dry_run: bool, resumed: bool| {
        let outcome = host
            .run(
                &good,
                &Grants::default(),
                &node_ctx(),
                "context",
                "{}",
                RunOptions {
                    dry_run,
                    resumed,
                    deadline: None,
                },
            )
            .unwrap()
            .result
            .unwrap();
        let get = |key: &str| {
            outcome
                .outputs
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.clone())
                .unwrap_or_else(|| panic!("no output {key}: {outcome:?}"))
        };
        (get("dry-run"), get("resumed"))
    };
    for dry_run in [false, true] {
        for resumed in [false, true] {
            assert_eq!(
                seen(dry_run, resumed),
                (dry_run.to_string(), resumed.to_string())
            );
        }
    }
}

#[test]
fn dry_run_never_reports_a_change() {
    let node = node();
    let host = node.host();
    let good = node.load(&host, &plugins().good, "good");
    let grants = Grants {
        filesystem: vec![fs("/rw", Access::ReadWrite)],
        ..Grants::default()
    };
    let wet = run(
        &host,
        &good,
        &grants,
        "write",
        r#"{"path":"/rw/out.txt","content":"x"}"#,
    )
    .unwrap()
    .result
    .unwrap();
    assert!(wet.changed);
    assert_eq!(
        std::fs::read_to_string(node.root().join("rw/out.txt")).unwrap(),
        "x"
    );
    // The test plugin writes whatever the mode: in a dry run the host makes every grant
    // read-only, so the write is refused and the file keeps its content.
    let params = r#"{"path":"/rw/out.txt","content":"written by a dry run"}"#;
    let dry = host
        .run(
            &good,
            &grants,
            &node_ctx(),
            "write",
            params,
            RunOptions {
                dry_run: true,
                resumed: false,
                deadline: None,
            },
        )
        .unwrap()
        .result;
    let err = dry.expect_err("a dry run's write must be refused by the host");
    assert_eq!(err.code, "io", "{err:?}");
    assert!(err.message.contains("Operation not permitted"), "{err:?}");
    assert_eq!(
        std::fs::read_to_string(node.root().join("rw/out.txt")).unwrap(),
        "x"
    );
}

#[test]
fn facts_come_from_the_host_root_and_the_caller() {
    let node = node();
    let host = node.host();
    let good = node.load(&host, &plugins().good, "good");
    let o = run(&host, &good, &Grants::default(), "facts", "{}")
        .unwrap()
        .result
        .unwrap();
    let out = |k: &str| {
        o.outputs
            .iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.as_str())
            .unwrap()
    };
    assert_eq!(out("node-name"), "cp-1");
    assert_eq!(out("roles"), "control-plane");
    assert_eq!(out("os-id"), "rocky");
    assert_eq!(out("os-id-like"), "rhel,centos,fedora");
    assert_eq!(out("os-version-id"), "9.4");
    assert_eq!(out("kubelet"), "v1.34.1");
    assert_eq!(out("kubeadm"), "", "no /usr/bin/kubeadm in this root");
    assert!(["amd64", "arm64"].contains(&out("arch")));
    assert!(!out("kernel").is_empty());
}

#[test]
fn granted_service_actions_reach_the_backend_and_others_are_refused() {
    let node = node();
    let host = node.host();
    let good = node.load(&host, &plugins().good, "good");
    let grants = Grants {
        services: vec![ServiceGrant {
            unit: "kubelet.service".into(),
            actions: vec![ServiceAction::Restart],
        }],
        ..Grants::default()
    };
    let o = run(
        &host,
        &good,
        &grants,
        "service",
        r#"{"unit":"kubelet.service","action":"restart"}"#,
    )
    .unwrap();
    assert_eq!(
        o.result.unwrap().outputs[0],
        ("active-state".into(), "active".into())
    );
    let stop = run(
        &host,
        &good,
        &grants,
        "service",
        r#"{"unit":"kubelet.service","action":"stop"}"#,
    )
    .unwrap();
    let e = stop.result.unwrap_err();
    assert_eq!(e.code, "not-granted");
    assert!(e.message.contains("stop kubelet.service"), "{}", e.message);
    let other = run(
        &host,
        &good,
        &grants,
        "service",
        r#"{"unit":"containerd.service","action":"status"}"#,
    )
    .unwrap();
    assert!(
        other
            .result
            .unwrap_err()
            .message
            .contains("service: containerd.service")
    );
    assert_eq!(node.services.calls(), ["restart kubelet.service"]);
    let logged =
        std::fs::read_to_string(bosun_host::RecordingBackend::log_path(&node.root())).unwrap();
    assert_eq!(logged, "restart kubelet.service\n");
}

#[test]
fn http_reaches_a_granted_loopback_host_only() {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = std::thread::spawn(move || {
        // Serves exactly the one request the granted run makes.
        let (mut conn, _) = listener.accept().unwrap();
        // Read the whole request head before answering: closing a socket with unread
        // request bytes makes the kernel send RST, and the client would see a reset.
        let mut head = Vec::new();
        let mut buf = [0u8; 1024];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = conn.read(&mut buf).unwrap();
            assert!(n > 0, "the client closed before finishing its request");
            head.extend_from_slice(&buf[..n]);
        }
        conn.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello")
            .unwrap();
    });
    let node = node();
    let host = node.host();
    let p = node.load(&host, &plugins().http, "http");
    assert!(p.imports_http());
    let url = format!(r#"{{"url":"http://127.0.0.1:{port}/file"}}"#);

    // Without an http grant the plugin does not run at all.
    let f = failure(run(&host, &p, &Grants::default(), "get", &url));
    assert!(
        matches!(&f.error, Error::NotGranted { capability } if capability.starts_with("http")),
        "{f}"
    );

    // A grant for another port is not this host.
    let other = Grants {
        http: vec![HttpGrant {
            host: "127.0.0.1:1".into(),
            max_bytes: None,
        }],
        ..Grants::default()
    };
    let e = run(&host, &p, &other, "get", &url)
        .unwrap()
        .result
        .unwrap_err();
    assert_eq!(e.code, "host:not-granted", "{e:?}");

    let granted = Grants {
        http: vec![HttpGrant {
            host: format!("127.0.0.1:{port}"),
            max_bytes: Some(1024),
        }],
        ..Grants::default()
    };
    let o = run(&host, &p, &granted, "get", &url)
        .unwrap()
        .result
        .unwrap();
    assert_eq!(o.outputs[0].1, "hello");
    server.join().unwrap();
    assert_happy(&node, &host);
}

// ---------------------------------------------------------------- load-time refusals

#[test]
fn only_the_exact_pin_a_load_verified_is_served_from_memory() {
    let node = node();
    let host = node.host();
    let bytes = &plugins().good;
    let pin = node.signer.pin(bytes, "good", "1.0.0");
    assert!(host.loaded(&pin).is_none(), "nothing was verified yet");
    let stranger = support::Signer::new();
    assert!(
        host.load(bytes, &stranger.pin(bytes, "good", "1.0.0"))
            .is_err()
    );
    assert!(
        host.loaded(&stranger.pin(bytes, "good", "1.0.0")).is_none(),
        "a refused pin is never served"
    );

    let first = host.load(bytes, &pin).unwrap();
    let again = host
        .loaded(&pin)
        .expect("the pin load verified is served from memory");
    assert_eq!(again.digest(), first.digest());
    assert_eq!(again.verified(), first.verified());
    let report = run(&host, &again, &Grants::default(), "noop", "{}").unwrap();
    assert!(!report.result.expect("noop succeeds").changed);

    // Any other pin for the same bytes must go through `load` again.
    let mut other_version = pin.clone();
    other_version.version = "1.0.1".into();
    assert!(host.loaded(&other_version).is_none());
    let mut other_signature = pin.clone();
    other_signature.signatures = stranger.pin(bytes, "good", "1.0.0").signatures;
    assert!(host.loaded(&other_signature).is_none());
    let mut no_signature = pin.clone();
    no_signature.signatures.clear();
    assert!(host.loaded(&no_signature).is_none());

    host.evict(&pin.sha256);
    assert!(
        host.loaded(&pin).is_none(),
        "evict forgets the verification too"
    );
}

/// A plugin `Host::load` refuses: what is presented (bytes and pin, made with the node's own
/// signer unless the case says otherwise), the refusal expected, and whether it comes before
/// anything is compiled.
struct Refusal {
    case: &'static str,
    present: fn(&support::Node) -> (Vec<u8>, PluginPin),
    refused: fn(&Error) -> bool,
    before_compiling: bool,
}

fn untrusted(e: &Error, check: fn(&TrustError) -> bool) -> bool {
    matches!(e, Error::Untrusted { source, .. } if check(source))
}

const REFUSALS: &[Refusal] = &[
    Refusal {
        case: "tampered bytes (one bit of the signed bytes flipped)",
        present: |node| {
            let bytes = &plugins().good;
            let pin = node.signer.pin(bytes, "good", "1.0.0");
            let mut tampered = bytes.clone();
            let i = tampered.len() / 2;
            tampered[i] ^= 0x01;
            (tampered, pin)
        },
        refused: |e| untrusted(e, |t| matches!(t, TrustError::DigestMismatch { .. })),
        before_compiling: true,
    },
    Refusal {
        case: "a signature by an untrusted key",
        present: |_| {
            let bytes = &plugins().good;
            let stranger = support::Signer::new();
            (bytes.clone(), stranger.pin(bytes, "good", "1.0.0"))
        },
        refused: |e| untrusted(e, |t| matches!(t, TrustError::Untrusted { .. })),
        before_compiling: true,
    },
    Refusal {
        case: "signed as good, presented as certs: the statement does not match",
        present: |node| {
            let bytes = &plugins().good;
            let mut pin = node.signer.pin(bytes, "good", "1.0.0");
            pin.name = "certs".into();
            (bytes.clone(), pin)
        },
        refused: |e| untrusted(e, |t| matches!(t, TrustError::Untrusted { .. })),
        before_compiling: true,
    },
    Refusal {
        case: "signed honestly as certs, but the plugin says it is good",
        present: |node| {
            let bytes = &plugins().good;
            (bytes.clone(), node.signer.pin(bytes, "certs", "1.0.0"))
        },
        refused: |e| matches!(e, Error::MetadataMismatch { field: "name", .. }),
        before_compiling: false,
    },
    Refusal {
        case: "built for another ABI version",
        present: |node| {
            let bytes = &plugins().wrong_abi;
            (bytes.clone(), node.signer.pin(bytes, "wrong-abi", "1.0.0"))
        },
        refused: |e| {
            matches!(e, Error::AbiMismatch { expected, found }
                if *expected == "0.2.0" && found.contains("0.3.0"))
        },
        before_compiling: false,
    },
    Refusal {
        case: "importing wasi:sockets",
        present: |node| {
            let bytes = &plugins().forbidden_import;
            (
                bytes.clone(),
                node.signer.pin(bytes, "forbidden-import", "1.0.0"),
            )
        },
        refused: |e| matches!(e, Error::ForbiddenImport { import, .. } if import.starts_with("wasi:sockets/")),
        before_compiling: false,
    },
];

/// Each refusal on a node of its own: the load fails with the expected error, nothing is
/// compiled for bytes or signatures that fail verification, and the host works on after.
#[test]
fn plugins_that_fail_verification_or_the_abi_are_refused_at_load() {
    for r in REFUSALS {
        let node = node();
        let host = node.host();
        let (bytes, pin) = (r.present)(&node);
        let e = match host.load(&bytes, &pin) {
            Err(e) => e,
            Ok(_) => panic!("{}: loaded", r.case),
        };
        assert!((r.refused)(&e), "{}: refused with {e}", r.case);
        if r.before_compiling {
            assert!(
                cached_entries(&node).is_empty(),
                "{}: nothing may be compiled for refused bytes",
                r.case
            );
        }
        assert_happy(&node, &host);
    }
}

#[test]
fn unverified_plugins_are_refused_unless_explicitly_allowed() {
    let node = node();
    let host = node.host();
    assert!(matches!(
        host.load_unverified(&plugins().good),
        Err(Error::UnverifiedRefused)
    ));
    let mut config = node.config();
    config.allow_unverified = true;
    let lenient = Host::new(config).unwrap();
    let p = lenient.load_unverified(&plugins().good).unwrap();
    assert!(p.verified().is_none());
    assert_eq!(p.digest(), &Digest::of(&plugins().good));
}

#[test]
fn compiled_code_this_host_did_not_write_is_never_loaded() {
    let node = node();
    {
        let host = node.host();
        node.load(&host, &plugins().good, "good");
        node.load(&host, &plugins().bad, "bad");
    }
    let entries = cached_entries(&node);
    assert_eq!(entries.len(), 2);
    // Swap the two entries' code: each is valid compiled code, but neither matches its
    // MAC any more. A host that trusted the cache would now run `bad` as `good`.
    let (a, b) = (
        std::fs::read(&entries[0]).unwrap(),
        std::fs::read(&entries[1]).unwrap(),
    );
    std::fs::write(&entries[0], &b).unwrap();
    std::fs::write(&entries[1], &a).unwrap();
    let host = node.host();
    let good = node.load(&host, &plugins().good, "good");
    assert_eq!(good.metadata().name, "good");
    assert_happy(&node, &host);
}

#[test]
fn a_second_host_loads_from_the_on_disk_cache() {
    let node = node();
    node.load(&node.host(), &plugins().good, "good");
    let before = cached_entries(&node);
    assert_eq!(before.len(), 1);
    use std::os::unix::fs::MetadataExt;
    let identity = |p: &std::path::Path| {
        let m = std::fs::metadata(p).unwrap();
        (m.dev(), m.ino())
    };
    let (inode, content) = (identity(&before[0]), std::fs::read(&before[0]).unwrap());
    let host = node.host();
    assert_happy(&node, &host);
    // Rewriting the entry (a new file renamed over it) would give it a new inode; its
    // content must be what the first host wrote, byte for byte.
    assert_eq!(cached_entries(&node), before);
    assert_eq!(identity(&before[0]), inode, "entry reused, not rewritten");
    assert!(
        std::fs::read(&before[0]).unwrap() == content,
        "the entry's content changed"
    );
}

#[test]
fn released_memory_is_reloaded_from_the_disk_cache_and_verified_again() {
    let node = node();
    let host = node.host();
    let pin = node.signer.pin(&plugins().good, "good", "1.0.0");
    let first = host.load(&plugins().good, &pin).unwrap();
    assert!(host.loaded(&pin).is_some());
    assert_eq!(
        host.release_memory(),
        1,
        "the one compiled plugin is dropped"
    );
    assert!(host.loaded(&pin).is_none(), "nothing verified is kept");
    assert_eq!(host.release_memory(), 0, "nothing left to drop");
    // A plugin handed out before keeps working.
    assert_happy_with(&host, &first);
    // The next load verifies the bytes again: other bytes under the same pin are refused.
    let mut tampered = plugins().good.clone();
    let last = tampered.len() - 1;
    tampered[last] ^= 1;
    assert!(matches!(
        host.load(&tampered, &pin),
        Err(Error::Untrusted { .. })
    ));
    // The code comes from the cache, not from a compile: the one entry is read, not
    // rewritten (a rewrite renames a new file over it: a new inode).
    use std::os::unix::fs::MetadataExt;
    let entries = cached_entries(&node);
    assert_eq!(entries.len(), 1);
    let inode = std::fs::metadata(&entries[0]).unwrap().ino();
    let again = host.load(&plugins().good, &pin).unwrap();
    assert_eq!(again.digest(), first.digest());
    assert_eq!(cached_entries(&node), entries);
    assert_eq!(std::fs::metadata(&entries[0]).unwrap().ino(), inode);
    assert_happy_with(&host, &again);
}

#[test]
fn a_compile_subprocess_that_fails_or_answers_garbage_is_a_compile_error() {
    let node = node();
    let pin = node.signer.pin(&plugins().good, "good", "1.0.0");
    let with = |program: &str, args: &[&str]| {
        let mut config = node.config();
        config.cache_dir = None;
        config.compiler = bosun_host::Compiler::Subprocess {
            program: program.into(),
            args: args.iter().map(|a| a.to_string()).collect(),
        };
        Host::new(config).unwrap().load(&plugins().good, &pin)
    };
    // It fails, saying why on stderr: that is the message.
    match with(
        "/bin/sh",
        &[
            "-c",
            "cat >/dev/null; echo 'no room to compile' >&2; exit 3",
        ],
    ) {
        Err(Error::Compile { message }) => assert_eq!(message, "no room to compile"),
        other => panic!("expected a compile error, got {other:?}"),
    }
    // It fails silently: its exit status is the message.
    match with("/bin/sh", &["-c", "cat >/dev/null; exit 3"]) {
        Err(Error::Compile { message }) => {
            assert!(
                message.contains("failed") && message.contains('3'),
                "{message}"
            )
        }
        other => panic!("expected a compile error, got {other:?}"),
    }
    // It answers with bytes that are not wasmtime's artifact (here the component itself):
    // refused when loaded, never run.
    match with("/bin/cat", &[]) {
        Err(Error::Compile { message }) => {
            assert!(
                message.starts_with("loading the plugin's compiled code"),
                "{message}"
            )
        }
        other => panic!("expected a compile error, got {other:?}"),
    }
    // It cannot be started.
    assert!(matches!(
        with("/nonexistent/compiler", &[]),
        Err(Error::Setup { .. })
    ));
}

#[test]
fn without_a_disk_cache_nothing_is_released() {
    let node = node();
    let mut config = node.config();
    config.cache_dir = None;
    let host = Host::new(config).unwrap();
    let pin = node.signer.pin(&plugins().good, "good", "1.0.0");
    host.load(&plugins().good, &pin).unwrap();
    assert_eq!(host.release_memory(), 0);
    assert!(
        host.loaded(&pin).is_some(),
        "reloading would mean compiling again"
    );
}

// ---------------------------------------------------------------- limits

#[test]
fn an_infinite_loop_is_stopped_at_its_deadline() {
    let node = node();
    let host = node.host();
    let bad = node.load(&host, &plugins().bad, "bad");
    let deadline = Duration::from_millis(200);
    assert_deadline_exceeded(run_with_deadline(&host, &bad, "spin", deadline), deadline);
    assert_happy(&node, &host);
}

#[test]
fn an_infinite_loop_in_preflight_is_stopped_too() {
    let node = node();
    let mut config = node.config();
    config.limits.describe_deadline = Duration::from_millis(300);
    let host = Host::new(config).unwrap();
    let bad = node.load(&host, &plugins().bad, "bad");
    let f = host
        .preflight(&bad, &Grants::default(), &node_ctx(), "spin", "{}")
        .unwrap_err();
    assert!(
        matches!(f.error, Error::DeadlineExceeded { deadline } if deadline == Duration::from_millis(300)),
        "{f}"
    );
    assert_happy(&node, &host);
}

/// A plugin that breaks a limit or crashes fails with the typed error that names it, and the
/// host runs the next plugin as before. (action of the misbehaving plugin, what the failure
/// must be)
#[test]
fn a_misbehaving_run_fails_with_its_typed_error_and_the_host_lives_on() {
    type Check = fn(&Error) -> bool;
    let cases: [(&str, Check); 4] = [
        // The memory limit of the store.
        (
            "memory-bomb",
            |e| matches!(e, Error::MemoryLimit { what: "memory", limit } if *limit == 64 << 20),
        ),
        // A result over the output limit.
        (
            "output-flood",
            |e| matches!(e, Error::OutputLimit { limit, found } if *limit == 1 << 20 && found > limit),
        ),
        // A wasm trap.
        (
            "trap",
            |e| matches!(e, Error::GuestTrap { message, .. } if message.contains("unreachable")),
        ),
        // A Rust panic, reported with its message.
        (
            "panic",
            |e| matches!(e, Error::GuestTrap { stderr, .. } if stderr.contains("plugin panicked on purpose")),
        ),
    ];
    for (action, check) in cases {
        let node = node();
        let host = node.host();
        let bad = node.load(&host, &plugins().bad, "bad");
        let f = failure(run(&host, &bad, &Grants::default(), action, "{}"));
        assert!(check(&f.error), "{action}: {f}");
        assert_happy(&node, &host);
    }
}

#[test]
fn a_log_flood_hits_the_log_limit() {
    let node = node();
    let host = node.host();
    let bad = node.load(&host, &plugins().bad, "bad");
    let f = failure(run(&host, &bad, &Grants::default(), "log-flood", "{}"));
    assert!(
        matches!(f.error, Error::LogLimit { limit } if limit == 64 << 10),
        "{f}"
    );
    // What was logged before the cap is kept, and it stays under the cap.
    assert!(!f.captured.lines.is_empty());
    let kept: usize = f
        .captured
        .lines
        .iter()
        .map(|l| {
            l.message.len()
                + l.fields
                    .iter()
                    .map(|(k, v)| k.len() + v.len())
                    .sum::<usize>()
        })
        .sum();
    assert!(kept <= 64 << 10, "{kept}");
    assert_happy(&node, &host);
}

#[test]
fn a_sleep_in_the_host_is_cut_at_the_deadline() {
    // `thread::sleep` blocks on a clock pollable inside the host, where no epoch check
    // runs: the host cuts the subscription at the deadline, and the call then stops.
    let node = node();
    let host = std::sync::Arc::new(node.host());
    let bad = node.load(&host, &plugins().bad, "bad");
    let (tx, rx) = std::sync::mpsc::channel();
    let h = host.clone();
    std::thread::spawn(move || {
        let r = run_with_deadline(&h, &bad, "sleep-forever", Duration::from_millis(300));
        let _ = tx.send(r);
    });
    // A liveness bound, not a speed figure: without the cut the call never returns.
    let r = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the sleeping call was still blocked a minute after its 300 ms deadline");
    assert_deadline_exceeded(r, Duration::from_millis(300));
    assert_happy(&node, &host);

    // With an epoch tick far longer than the deadline (as when the ticker lags on a busy
    // machine) the guest wakes and returns before any epoch check: the host still reports
    // the deadline, not the guest's "woke up".
    let mut config = node.config();
    config.epoch_tick = Duration::from_secs(30);
    let host = Host::new(config).unwrap();
    let bad = node.load(&host, &plugins().bad, "bad");
    let deadline = Duration::from_millis(300);
    assert_deadline_exceeded(
        run_with_deadline(&host, &bad, "sleep-forever", deadline),
        deadline,
    );
    assert_happy(&node, &host);
}

#[test]
fn a_flood_of_empty_log_lines_hits_the_log_limit() {
    let node = node();
    let host = node.host();
    let bad = node.load(&host, &plugins().bad, "bad");
    let f = failure(run(
        &host,
        &bad,
        &Grants::default(),
        "empty-log-flood",
        "{}",
    ));
    assert!(
        matches!(f.error, Error::LogLimit { limit } if limit == 64 << 10),
        "{f}"
    );
    // Each line is charged 64 bytes: at most 1 024 empty lines fit in 64 KiB.
    assert!(
        !f.captured.lines.is_empty() && f.captured.lines.len() <= 1024,
        "{} lines kept",
        f.captured.lines.len()
    );
    assert_happy(&node, &host);
}

#[test]
fn repeated_refusals_are_kept_only_up_to_a_cap() {
    let node = node();
    let host = node.host();
    let bad = node.load(&host, &plugins().bad, "bad");
    let report = run(&host, &bad, &Grants::default(), "denial-flood", "{}").unwrap();
    assert!(report.result.is_ok(), "{:?}", report.result);
    let denied = &report.captured.denied;
    assert_eq!(
        denied.len(),
        33,
        "32 refusals and one line saying more were refused"
    );
    assert!(
        denied[..32]
            .iter()
            .all(|d| d.capability == "exec" && d.message.len() <= 1024),
        "{:?}",
        &denied[0]
    );
    assert!(
        denied[32].message.contains("more than 32"),
        "{:?}",
        denied[32]
    );
    assert_happy(&node, &host);
}

#[test]
fn a_plugin_cannot_hold_more_than_its_resource_limit_open() {
    // Far below any descriptor limit of the machine (`ulimit -n` is 1 024 at least), so
    // only the host's own table limit can stop the plugin this early.
    const LIMIT: usize = 64;
    let node = node();
    let mut config = node.config();
    config.limits.max_resources = LIMIT;
    let host = Host::new(config).unwrap();
    let bad = node.load(&host, &plugins().bad, "bad");
    let grants = Grants {
        filesystem: vec![fs("/data", Access::ReadOnly)],
        ..Grants::default()
    };
    // The open past the limit finds the host's resource table full, and the call stops
    // with that trap; the plugin logged how many files it held until then.
    let f = failure(run(
        &host,
        &bad,
        &grants,
        "open-flood",
        r#"{"path":"/data/input.txt"}"#,
    ));
    assert!(
        matches!(&f.error, Error::GuestTrap { message, .. } if message.contains("resource table has no free keys")),
        "{f}"
    );
    let n: usize = f
        .captured
        .lines
        .last()
        .and_then(|l| l.fields.iter().find(|(k, _)| k == "n"))
        .map(|(_, v)| v.parse().unwrap())
        .expect("the plugin logged no open file");
    // The table also holds the call's own resources (stdio streams, the preopen).
    assert!(
        (LIMIT - 16..LIMIT).contains(&n),
        "held {n} files open with a limit of {LIMIT} resources"
    );
    assert_happy(&node, &host);
}

#[test]
fn unknown_actions_and_malformed_params_are_refused_before_instantiating() {
    let node = node();
    let host = node.host();
    let good = node.load(&host, &plugins().good, "good");
    let f = failure(run(&host, &good, &Grants::default(), "format-disk", "{}"));
    assert!(
        matches!(&f.error, Error::UnknownAction { action, available } if action == "format-disk" && available.contains("happy")),
        "{f}"
    );
    let f = failure(run(&host, &good, &Grants::default(), "noop", "{not json"));
    assert!(matches!(f.error, Error::InvalidParams { .. }), "{f}");
    // JSON, but not what `noop` declares (`{"type":"object"}`): refused by the host with
    // where and why, before the guest sees it.
    let f = failure(run(&host, &good, &Grants::default(), "noop", "[1, 2]"));
    assert!(
        matches!(&f.error, Error::InvalidParams { message } if message.contains("`noop`") && message.contains("at `/`") && message.contains("object")),
        "{f}"
    );
    assert_happy(&node, &host);
}

// ---------------------------------------------------------------- filesystem escapes

/// Runs a `bad` filesystem action that must be refused, and checks the refusal is the
/// expected one (`io:<ErrorKind>` as the guest's standard library reports it), so that a
/// different failure (a missing file where a permission refusal is due) does not pass.
fn assert_fs_refused(
    node: &Node,
    host: &Host,
    action: &str,
    params: &str,
    expected: &str,
) -> PluginError {
    let bad = node.load(host, &plugins().bad, "bad");
    let (e, _) = refused(host, &bad, &split_grants(), action, params);
    assert_eq!(
        e.code, expected,
        "{action} {params}: expected the refusal {expected}, got {e:?}"
    );
    e
}

#[test]
fn fs_dotdot_cannot_leave_a_preopen() {
    let node = node();
    let host = node.host();
    // Past the root to the secret next to it, and sideways into an ungranted directory.
    assert_fs_refused(
        &node,
        &host,
        "read",
        r#"{"path":"/data/../../outside/secret.txt"}"#,
        "io:PermissionDenied",
    );
    assert_fs_refused(
        &node,
        &host,
        "read",
        r#"{"path":"/data/../etc/os-release"}"#,
        "io:PermissionDenied",
    );
    assert_fs_refused(
        &node,
        &host,
        "read-dir",
        r#"{"path":"/data/.."}"#,
        "io:PermissionDenied",
    );
    assert_happy(&node, &host);
}

#[test]
fn fs_absolute_paths_outside_the_grants_are_refused() {
    let node = node();
    let host = node.host();
    // No preopen covers these paths, so for the plugin they do not exist: `NotFound`,
    // although /etc/os-release is in the host root and the secret is next to it.
    assert_fs_refused(
        &node,
        &host,
        "read",
        r#"{"path":"/etc/os-release"}"#,
        "io:NotFound",
    );
    let outside = node.outside().join("secret.txt");
    assert_fs_refused(
        &node,
        &host,
        "read",
        &format!(r#"{{"path":"{}"}}"#, outside.display()),
        "io:NotFound",
    );
    assert_fs_refused(
        &node,
        &host,
        "read",
        r#"{"path":"/etc/passwd"}"#,
        "io:NotFound",
    );
    assert_happy(&node, &host);
}

#[test]
fn fs_symlinks_pointing_outside_are_not_followed() {
    let node = node();
    let host = node.host();
    assert_fs_refused(
        &node,
        &host,
        "read",
        r#"{"path":"/data/link-out"}"#,
        "io:PermissionDenied",
    );
    assert_fs_refused(
        &node,
        &host,
        "read",
        r#"{"path":"/rw/escape/secret.txt"}"#,
        "io:PermissionDenied",
    );
    assert_fs_refused(
        &node,
        &host,
        "read",
        r#"{"path":"/rw/abs-escape/secret.txt"}"#,
        "io:PermissionDenied",
    );
    assert_fs_refused(
        &node,
        &host,
        "write",
        r#"{"path":"/rw/escape/planted.txt"}"#,
        "io:PermissionDenied",
    );
    assert!(!node.outside().join("planted.txt").exists());
    assert_happy(&node, &host);
}

#[test]
fn fs_trailing_slash_symlinks_are_not_followed() {
    let node = node();
    let host = node.host();
    assert_fs_refused(
        &node,
        &host,
        "read-dir",
        r#"{"path":"/rw/escape/"}"#,
        "io:PermissionDenied",
    );
    assert_fs_refused(
        &node,
        &host,
        "read-dir",
        r#"{"path":"/rw/abs-escape/"}"#,
        "io:PermissionDenied",
    );
    assert_fs_refused(
        &node,
        &host,
        "read",
        r#"{"path":"/rw/escape/./secret.txt"}"#,
        "io:PermissionDenied",
    );
    assert_happy(&node, &host);
}

#[test]
fn fs_hardlink_from_read_only_into_read_write_is_refused() {
    let node = node();
    let host = node.host();
    assert_fs_refused(
        &node,
        &host,
        "hardlink",
        r#"{"from":"/ro/secret.txt","to":"/rw/stolen.txt"}"#,
        "io:PermissionDenied",
    );
    assert!(!node.root().join("rw/stolen.txt").exists());
    // And the other direction: planting a link inside the read-only domain.
    std::fs::write(node.root().join("rw/mine.txt"), "mine").unwrap();
    assert_fs_refused(
        &node,
        &host,
        "hardlink",
        r#"{"from":"/rw/mine.txt","to":"/ro/planted.txt"}"#,
        "io:PermissionDenied",
    );
    assert!(!node.root().join("ro/planted.txt").exists());
    assert_happy(&node, &host);
}

#[test]
fn fs_rename_across_permission_domains_is_refused() {
    let node = node();
    let host = node.host();
    assert_fs_refused(
        &node,
        &host,
        "rename",
        r#"{"from":"/ro/secret.txt","to":"/rw/moved.txt"}"#,
        "io:PermissionDenied",
    );
    assert_eq!(
        std::fs::read_to_string(node.root().join("ro/secret.txt")).unwrap(),
        "read-only content"
    );
    std::fs::write(node.root().join("rw/mine.txt"), "mine").unwrap();
    assert_fs_refused(
        &node,
        &host,
        "rename",
        r#"{"from":"/rw/mine.txt","to":"/ro/secret.txt"}"#,
        "io:PermissionDenied",
    );
    assert_eq!(
        std::fs::read_to_string(node.root().join("ro/secret.txt")).unwrap(),
        "read-only content"
    );
    assert_happy(&node, &host);
}

#[test]
fn fs_create_in_a_read_only_grant_is_refused() {
    let node = node();
    let host = node.host();
    assert_fs_refused(
        &node,
        &host,
        "create",
        r#"{"path":"/ro/new.txt"}"#,
        "io:PermissionDenied",
    );
    assert!(!node.root().join("ro/new.txt").exists());
    assert_fs_refused(
        &node,
        &host,
        "write",
        r#"{"path":"/data/new.txt"}"#,
        "io:PermissionDenied",
    );
    assert!(!node.root().join("data/new.txt").exists());
    assert_happy(&node, &host);
}

#[test]
fn fs_truncate_in_a_read_only_grant_is_refused() {
    let node = node();
    let host = node.host();
    assert_fs_refused(
        &node,
        &host,
        "truncate",
        r#"{"path":"/ro/secret.txt"}"#,
        "io:PermissionDenied",
    );
    assert_fs_refused(
        &node,
        &host,
        "write",
        r#"{"path":"/ro/secret.txt"}"#,
        "io:PermissionDenied",
    );
    assert_eq!(
        std::fs::read_to_string(node.root().join("ro/secret.txt")).unwrap(),
        "read-only content"
    );
    assert_happy(&node, &host);
}

#[test]
fn fs_read_write_grant_does_allow_writing() {
    // The refusals above are not because writing never works.
    let node = node();
    let host = node.host();
    let good = node.load(&host, &plugins().good, "good");
    let o = run(
        &host,
        &good,
        &split_grants(),
        "write",
        r#"{"path":"/rw/ok.txt","content":"fine"}"#,
    )
    .unwrap();
    o.result.unwrap();
    assert_eq!(
        std::fs::read_to_string(node.root().join("rw/ok.txt")).unwrap(),
        "fine"
    );
}

#[test]
fn a_grant_reaching_outside_the_root_is_refused() {
    let node = node();
    let host = node.host();
    let good = node.load(&host, &plugins().good, "good");
    let grants = Grants {
        filesystem: vec![fs("/rw/escape", Access::ReadOnly)],
        ..Grants::default()
    };
    let f = failure(run(&host, &good, &grants, "noop", "{}"));
    assert!(matches!(f.error, Error::InvalidGrant { .. }), "{f}");
    let grants = Grants {
        filesystem: vec![fs("/data/../..", Access::ReadOnly)],
        ..Grants::default()
    };
    let f = failure(run(&host, &good, &grants, "noop", "{}"));
    assert!(matches!(f.error, Error::InvalidGrant { .. }), "{f}");
    assert_happy(&node, &host);
}

// ---------------------------------------------------------------- exec

#[test]
fn exec_of_an_ungranted_command_is_refused() {
    let node = node();
    let host = node.host();
    let bad = node.load(&host, &plugins().bad, "bad");
    let (e, report) = refused(
        &host,
        &bad,
        &happy_grants(),
        "exec",
        r#"{"command":"/bin/sh","args":["-c","echo pwned > /pwned"]}"#,
    );
    assert_eq!(e.code, "host:not-granted");
    assert!(e.message.starts_with("exec: /bin/sh"), "{}", e.message);
    assert_eq!(report.captured.denied.len(), 1);
    assert_eq!(report.captured.denied[0].capability, "exec");
    assert!(!node.root().join("pwned").exists());
    // Without any exec grant at all, too.
    let (e, _) = refused(
        &host,
        &bad,
        &Grants::default(),
        "exec",
        r#"{"command":"/usr/bin/greet","args":["x"]}"#,
    );
    assert_eq!(e.code, "host:not-granted");
    assert_happy(&node, &host);
}

#[test]
fn exec_with_an_argument_outside_the_pattern_is_refused() {
    let node = node();
    let host = node.host();
    let bad = node.load(&host, &plugins().bad, "bad");
    let grants = Grants {
        exec: vec![greet_grant(&[&["world"], &["v1.*", "**"]])],
        ..Grants::default()
    };
    for args in [
        r#"["--evil"]"#,
        r#"["world","extra"]"#,
        r#"["v2.0"]"#,
        r#"[]"#,
    ] {
        let params = format!(r#"{{"command":"/usr/bin/greet","args":{args}}}"#);
        let (e, _) = refused(&host, &bad, &grants, "exec", &params);
        assert_eq!(e.code, "host:not-granted", "{args}");
        assert!(
            e.message
                .contains("arguments match none of the granted patterns"),
            "{}",
            e.message
        );
    }
    // Matching arguments do run (so the refusals are about the arguments).
    let ok = run(
        &host,
        &bad,
        &grants,
        "exec",
        r#"{"command":"/usr/bin/greet","args":["v1.34","a","b"]}"#,
    )
    .unwrap();
    assert!(ok.result.unwrap().message.contains("hello v1.34"));
    assert_happy(&node, &host);
}

#[test]
fn exec_with_too_many_arguments_is_an_invalid_argument() {
    let node = node();
    let host = node.host();
    let bad = node.load(&host, &plugins().bad, "bad");
    let grants = Grants {
        exec: vec![greet_grant(&[&["**"]])],
        ..Grants::default()
    };
    let (e, _) = refused(
        &host,
        &bad,
        &grants,
        "exec-flood-args",
        r#"{"command":"/usr/bin/greet"}"#,
    );
    assert_eq!(e.code, "host:invalid-argument");
    assert!(e.message.contains("100000 arguments"), "{}", e.message);
    assert_happy(&node, &host);
}

#[test]
fn exec_paths_with_dotdot_are_invalid_not_resolved() {
    let node = node();
    let host = node.host();
    let bad = node.load(&host, &plugins().bad, "bad");
    let (e, _) = refused(
        &host,
        &bad,
        &happy_grants(),
        "exec",
        r#"{"command":"/usr/bin/../bin/greet","args":["x"]}"#,
    );
    assert_eq!(e.code, "host:invalid-argument");
    assert_happy(&node, &host);
}

/// Outer pids of the processes whose command line contains `marker`.
fn processes_with(marker: &str) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(marker))
        })
        .collect()
}

#[test]
fn exec_that_outlives_its_grant_timeout_is_killed() {
    let node = node();
    let root = node.root();
    std::fs::write(
        root.join("usr/bin/spin-marked"),
        "#!/bin/sh\necho started > /run/spin.started\nwhile :; do :; done\n",
    )
    .unwrap();
    std::fs::create_dir_all(root.join("run")).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(
        root.join("usr/bin/spin-marked"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    let host = std::sync::Arc::new(node.host());
    let bad = node.load(&host, &plugins().bad, "bad");
    let grants = Grants {
        exec: vec![ExecGrant {
            command: "/usr/bin/spin-marked".into(),
            args: vec![vec!["*".into()]],
            timeout_seconds: Some(1),
            max_output_bytes: None,
            dry_run: false,
            optional: false,
            // Where the script says it started.
            sandbox: bosun_api::grants::CommandSandbox {
                filesystem: vec![bosun_api::grants::CommandPath {
                    path: "/run".into(),
                    access: Access::ReadWrite,
                    execute: false,
                    optional: false,
                    writable_in_dry_run: false,
                }],
                ..Default::default()
            },
        }],
        ..Grants::default()
    };
    // The script's command line carries a marker no other process has, so the test can
    // find the spinning process by it while the call waits.
    let marker = format!(
        "spin-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    )
    .replace(['(', ')'], "");
    let params =
        serde_json::json!({"command": "/usr/bin/spin-marked", "args": [marker]}).to_string();
    let call = {
        let (host, grants) = (host.clone(), grants.clone());
        std::thread::spawn(move || refused(&host, &bad, &grants, "exec", &params).0)
    };
    let pid = loop {
        if let [pid] = processes_with(&marker)[..]
            && root.join("run/spin.started").exists()
        {
            break pid;
        }
        assert!(
            !call.is_finished(),
            "the call ended before the command was seen running"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    let e = call.join().unwrap();
    assert_eq!(e.code, "host:timeout");
    assert!(
        e.message
            .contains("/usr/bin/spin-marked ran longer than 1s"),
        "{}",
        e.message
    );
    // Killed and reaped by the time the call returned: no process (not even a zombie) is
    // left with that pid or that command line.
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "process {pid} outlived its timeout: {:?}",
        std::fs::read_to_string(format!("/proc/{pid}/status"))
    );
    assert_eq!(processes_with(&marker), Vec::<u32>::new());
    assert_happy(&node, &host);
}

// ---------------------------------------------------------------- what plugins and commands get

#[test]
fn granted_commands_run_confined_to_the_host_root() {
    require_root("granted_commands_run_confined_to_the_host_root");
    let node = node();
    let host = node.host();
    let good = node.load(&host, &plugins().good, "good");
    let report = run(
        &host,
        &good,
        &happy_grants(),
        "happy",
        r#"{"file":"/data/input.txt","command":"/usr/bin/greet","args":["world"]}"#,
    )
    .unwrap();
    let outcome = report.result.unwrap();
    // greet reads /usr/share/bosun/marker, which exists only inside the host root.
    assert!(
        outcome
            .outputs
            .contains(&("stdout".into(), "hello world from inside-the-root\n".into())),
        "{:?}",
        outcome.outputs
    );
}

#[test]
fn granted_commands_get_an_empty_environment_but_path() {
    let node = node();
    let host = node.host();
    let bad = node.load(&host, &plugins().bad, "bad");
    let grants = Grants {
        exec: vec![exec_grant("/bin/sh", &[&["-c", "export -p"]])],
        ..Grants::default()
    };
    let message = run(
        &host,
        &bad,
        &grants,
        "exec",
        r#"{"command":"/bin/sh","args":["-c","export -p"]}"#,
    )
    .unwrap()
    .result
    .unwrap()
    .message;
    let listing = message
        .strip_prefix("ESCAPED: ran command, exit 0: ")
        .unwrap_or_else(|| panic!("{message}"));
    // The shell exports what it got, and PWD, which it sets itself.
    let names: Vec<&str> = listing
        .lines()
        .map(|l| {
            let l = l.strip_prefix("export ").unwrap_or(l);
            l.split('=').next().unwrap()
        })
        .collect();
    assert_eq!(names, ["PATH", "PWD"], "{listing}");
    assert!(
        listing.contains(
            "export PATH='/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'\n"
        ),
        "{listing}"
    );
    assert_happy(&node, &host);
}

#[test]
fn the_plugin_gets_an_empty_environment() {
    // This test process has plenty of variables (HOME, PATH, CARGO_*): none may reach the
    // plugin.
    assert!(std::env::vars_os().count() > 0);
    let node = node();
    let host = node.host();
    let bad = node.load(&host, &plugins().bad, "bad");
    let o = run(&host, &bad, &Grants::default(), "environment", "{}")
        .unwrap()
        .result
        .unwrap();
    assert_eq!(o.message, "0 variables", "{:?}", o.outputs);
    assert!(o.outputs.is_empty(), "{:?}", o.outputs);
    assert_happy(&node, &host);
}

#[test]
fn each_result_entry_is_charged_even_when_empty() {
    // 32 bytes per output entry: 40 000 empty entries are 1 280 000 bytes, over the
    // 1 MiB result limit although they hold no text at all; 30 000 (960 000) fit.
    let node = node();
    let host = node.host();
    let bad = node.load(&host, &plugins().bad, "bad");
    let f = match run(
        &host,
        &bad,
        &Grants::default(),
        "empty-output-flood",
        r#"{"n":40000}"#,
    ) {
        Err(f) => f,
        Ok(report) => panic!(
            "40 000 empty outputs were accepted: {:?}",
            report.result.map(|o| o.outputs.len())
        ),
    };
    assert!(
        matches!(f.error, Error::OutputLimit { limit, found } if limit == 1 << 20 && found == 40_000 * 32),
        "{f}"
    );
    let o = run(
        &host,
        &bad,
        &Grants::default(),
        "empty-output-flood",
        r#"{"n":30000}"#,
    )
    .unwrap()
    .result
    .unwrap();
    assert_eq!(o.outputs.len(), 30_000);
    assert_happy(&node, &host);
}
