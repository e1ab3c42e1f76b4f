//! Verification behaviour through the public API, with keys made by this crate.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use bosun_trust::{
    Algorithm, Digest, PluginSignature, PublicKey, SignatureBundle, SigningKey, Statement,
    TrustError, TrustRoots, verify, verify_digest, write_key_pair,
};

const PLUGIN: &[u8] = b"\0asm\x0d\0\x01\0 pretend component bytes";

fn roots_of(keys: &[&SigningKey]) -> TrustRoots {
    let mut roots = TrustRoots::new();
    for (i, key) in keys.iter().enumerate() {
        roots
            .add_pem(&key.public_key().to_pem(), &format!("key{i}.pub"))
            .unwrap();
    }
    roots
}

fn signed(key: &SigningKey, name: &str, version: &str, bytes: &[u8]) -> PluginSignature {
    key.sign_statement(&Statement::new(name, version, Digest::of(bytes)).unwrap())
}

#[test]
fn happy_path_both_algorithms() {
    for key in [SigningKey::generate_ed25519(), SigningKey::generate_p256()] {
        let roots = roots_of(&[&key]);
        let sig = signed(&key, "hello", "0.1.0", PLUGIN);
        assert_eq!(sig.algorithm, key.algorithm());
        let v = verify(
            PLUGIN,
            &Digest::of(PLUGIN),
            "hello",
            "0.1.0",
            &[sig],
            &roots,
        )
        .unwrap();
        assert_eq!(v.key_id, key.public_key().key_id());
        assert_eq!(v.algorithm, key.algorithm());
        assert_eq!(v.origin, "key0.pub");
        assert_eq!(v.signature_index, 0);
        assert_eq!(v.statement.name(), "hello");
    }
}

#[test]
fn tampered_bytes_are_a_digest_mismatch_before_signatures_are_looked_at() {
    let key = SigningKey::generate_ed25519();
    let roots = roots_of(&[&key]);
    let pinned = Digest::of(PLUGIN);
    let sig = signed(&key, "hello", "0.1.0", PLUGIN);
    let mut tampered = PLUGIN.to_vec();
    tampered[10] ^= 1;
    let err = verify(&tampered, &pinned, "hello", "0.1.0", &[sig], &roots).unwrap_err();
    match &err {
        TrustError::DigestMismatch { expected, found } => {
            assert_eq!(*expected, pinned);
            assert_eq!(*found, Digest::of(&tampered));
        }
        other => panic!("expected DigestMismatch, got {other:?}"),
    }
    assert!(err.to_string().contains(&pinned.to_string()), "{err}");
}

#[test]
fn signature_over_other_name_or_version_or_digest_is_untrusted() {
    let key = SigningKey::generate_p256();
    let roots = roots_of(&[&key]);
    let digest = Digest::of(PLUGIN);
    let cases = [
        signed(&key, "other", "0.1.0", PLUGIN),
        signed(&key, "hello", "0.1.1", PLUGIN),
        signed(&key, "hello", "0.1.0", b"other bytes"),
    ];
    for sig in cases {
        let err = verify_digest(&digest, "hello", "0.1.0", &[sig], &roots).unwrap_err();
        let TrustError::Untrusted { attempts, .. } = &err else {
            panic!("expected Untrusted, got {err:?}");
        };
        assert_eq!(attempts.0.len(), 1);
        assert_eq!(attempts.0[0].key_id, Some(key.public_key().key_id()));
        assert!(attempts.0[0].reason.contains("does not verify"), "{err}");
    }
}

#[test]
fn untrusted_key_is_reported_with_the_keys_tried() {
    let trusted = SigningKey::generate_ed25519();
    let stranger = SigningKey::generate_ed25519();
    let roots = roots_of(&[&trusted]);
    let mut sig = signed(&stranger, "hello", "0.1.0", PLUGIN);

    // With the stranger's key id: no root matches it, nothing is tried.
    let err = verify(
        PLUGIN,
        &Digest::of(PLUGIN),
        "hello",
        "0.1.0",
        &[sig.clone()],
        &roots,
    )
    .unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, TrustError::Untrusted { .. }), "{err:?}");
    assert!(msg.contains("not among the 1 trust roots"), "{msg}");
    assert!(
        msg.contains("add the signer's public key to the trust roots"),
        "{msg}"
    );

    // Without a key id: every Ed25519 root is tried and named.
    sig.key_id = None;
    let err = verify(
        PLUGIN,
        &Digest::of(PLUGIN),
        "hello",
        "0.1.0",
        &[sig],
        &roots,
    )
    .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains(&trusted.public_key().key_id().to_string()),
        "{msg}"
    );
    assert!(msg.contains("from key0.pub"), "{msg}");

    // A signature of an algorithm no root has.
    let mut p256 = signed(&SigningKey::generate_p256(), "hello", "0.1.0", PLUGIN);
    p256.key_id = None;
    let err = verify(
        PLUGIN,
        &Digest::of(PLUGIN),
        "hello",
        "0.1.0",
        &[p256],
        &roots,
    )
    .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("none of the trust roots is an ECDSA P-256 key"),
        "{msg}"
    );
}

#[test]
fn a_later_trusted_signature_wins_over_earlier_untrusted_ones() {
    let trusted = SigningKey::generate_p256();
    let stranger = SigningKey::generate_ed25519();
    let roots = roots_of(&[&trusted]);
    let sigs = [
        signed(&stranger, "hello", "0.1.0", PLUGIN),
        signed(&trusted, "hello", "0.1.0", PLUGIN),
    ];
    let v = verify(PLUGIN, &Digest::of(PLUGIN), "hello", "0.1.0", &sigs, &roots).unwrap();
    assert_eq!(v.signature_index, 1);
    assert_eq!(v.algorithm, Algorithm::EcdsaP256Sha256);
}

#[test]
fn key_id_may_be_shortened_but_must_match() {
    let key = SigningKey::generate_ed25519();
    let other = SigningKey::generate_ed25519();
    let roots = roots_of(&[&key, &other]);
    let mut sig = signed(&key, "hello", "0.1.0", PLUGIN);
    sig.key_id = Some(key.public_key().key_id().to_string()); // short form
    verify_digest(
        &Digest::of(PLUGIN),
        "hello",
        "0.1.0",
        &[sig.clone()],
        &roots,
    )
    .unwrap();
    sig.key_id = Some(other.public_key().key_id().full());
    let err = verify_digest(&Digest::of(PLUGIN), "hello", "0.1.0", &[sig], &roots).unwrap_err();
    let TrustError::Untrusted { attempts, .. } = err else {
        panic!()
    };
    // Only the named key was tried.
    assert_eq!(attempts.0.len(), 1);
    assert_eq!(attempts.0[0].key_id, Some(other.public_key().key_id()));
}

#[test]
fn no_signatures_and_no_roots() {
    let key = SigningKey::generate_ed25519();
    let d = Digest::of(PLUGIN);
    let err = verify_digest(&d, "hello", "0.1.0", &[], &roots_of(&[&key])).unwrap_err();
    assert!(matches!(err, TrustError::NoSignatures { .. }), "{err:?}");
    assert!(
        err.to_string().contains("kubectl bosun plugin sign"),
        "{err}"
    );
    let sig = signed(&key, "hello", "0.1.0", PLUGIN);
    let err = verify_digest(&d, "hello", "0.1.0", &[sig], &TrustRoots::new()).unwrap_err();
    assert!(matches!(err, TrustError::NoTrustRoots), "{err:?}");
}

#[test]
fn invalid_name_or_version_is_refused_before_verifying() {
    let key = SigningKey::generate_ed25519();
    let roots = roots_of(&[&key]);
    let d = Digest::of(PLUGIN);
    let sig = signed(&key, "hello", "0.1.0", PLUGIN);
    let err = verify_digest(&d, "Hello", "0.1.0", std::slice::from_ref(&sig), &roots).unwrap_err();
    assert!(matches!(err, TrustError::InvalidName { .. }), "{err:?}");
    let err = verify_digest(&d, "hello", "v0.1.0", &[sig], &roots).unwrap_err();
    assert!(matches!(err, TrustError::InvalidVersion { .. }), "{err:?}");
}

#[test]
fn malformed_signature_entries_fail_loudly() {
    let ed = SigningKey::generate_ed25519();
    let ec = SigningKey::generate_p256();
    let roots = roots_of(&[&ed, &ec]);
    let d = Digest::of(PLUGIN);
    let good_ed = signed(&ed, "hello", "0.1.0", PLUGIN);
    let good_ec = signed(&ec, "hello", "0.1.0", PLUGIN);
    let with = |base: &PluginSignature, f: &dyn Fn(&mut PluginSignature)| {
        let mut s = base.clone();
        f(&mut s);
        s
    };
    let cases = [
        (
            with(&good_ed, &|s| s.signature = "not base64!".into()),
            "not base64",
        ),
        (
            with(&good_ed, &|s| s.signature = BASE64.encode([0u8; 63])),
            "64 bytes, found 63",
        ),
        (
            with(&good_ec, &|s| {
                s.signature = BASE64.encode([0x30, 0x03, 1, 2, 3])
            }),
            "DER",
        ),
        // An Ed25519 signature labelled as ECDSA is not DER.
        (
            with(&good_ed, &|s| s.algorithm = Algorithm::EcdsaP256Sha256),
            "DER",
        ),
        (
            with(&good_ed, &|s| s.key_id = Some("md5:abcd".into())),
            "malformed key id",
        ),
        (
            with(&good_ed, &|s| s.key_id = Some("sha256:abc".into())),
            "malformed key id",
        ),
    ];
    for (bad, want) in cases {
        // The malformed entry fails verification even next to a good one.
        let err = verify_digest(&d, "hello", "0.1.0", &[good_ec.clone(), bad], &roots).unwrap_err();
        assert!(
            matches!(err, TrustError::MalformedSignature { index: 1, .. }),
            "{err:?}"
        );
        assert!(err.to_string().contains(want), "want {want:?} in: {err}");
    }
}

#[test]
fn trailing_newline_in_base64_is_accepted() {
    // `cosign sign-blob` and `base64` end their output with a newline.
    let key = SigningKey::generate_p256();
    let mut sig = signed(&key, "hello", "0.1.0", PLUGIN);
    sig.signature.push('\n');
    verify_digest(
        &Digest::of(PLUGIN),
        "hello",
        "0.1.0",
        &[sig],
        &roots_of(&[&key]),
    )
    .unwrap();
}

#[test]
fn bundle_json_shape_and_round_trip() {
    let key = SigningKey::generate_ed25519();
    let statement = Statement::new("hello", "0.1.0", Digest::of(PLUGIN)).unwrap();
    let mut bundle = SignatureBundle::new(&statement);
    assert!(bundle.add(key.sign_statement(&statement)));
    assert!(
        !bundle.add(key.sign_statement(&statement)),
        "Ed25519 is deterministic"
    );
    let mut cosign_style = SigningKey::generate_p256().sign_statement(&statement);
    cosign_style.key_id = None;
    bundle.add(cosign_style);

    let json: serde_json::Value = serde_json::from_str(&bundle.to_json()).unwrap();
    assert_eq!(json["name"], "hello");
    assert_eq!(json["version"], "0.1.0");
    assert_eq!(json["sha256"], Digest::of(PLUGIN).to_string());
    assert_eq!(json["signatures"][0]["algorithm"], "ed25519");
    assert_eq!(
        json["signatures"][0]["keyId"],
        key.public_key().key_id().full()
    );
    assert_eq!(json["signatures"][1]["algorithm"], "ecdsa-p256-sha256");
    assert!(json["signatures"][1].get("keyId").is_none());

    let back = SignatureBundle::from_json(&bundle.to_json(), "b.json").unwrap();
    assert_eq!(back, bundle);
    assert_eq!(back.statement().unwrap(), statement);
    back.verify(PLUGIN, &roots_of(&[&key])).unwrap();

    let err = SignatureBundle::from_json(r#"{"name":"hello"}"#, "b.json").unwrap_err();
    assert!(
        err.to_string()
            .starts_with("b.json: malformed signature bundle"),
        "{err}"
    );
    let err = SignatureBundle::from_json(
        &bundle.to_json().replace("\"keyId\"", "\"keyid\""),
        "b.json",
    )
    .unwrap_err();
    assert!(err.to_string().contains("keyid"), "{err}");
}

#[test]
fn bundle_files() {
    let dir = tempfile::tempdir().unwrap();
    let plugin = dir.path().join("hello.wasm");
    let path = SignatureBundle::path_for(&plugin);
    assert_eq!(path, dir.path().join("hello.wasm.sig.json"));
    let statement = Statement::new("hello", "0.1.0", Digest::of(PLUGIN)).unwrap();
    let bundle = SignatureBundle::new(&statement);
    bundle.write(&path).unwrap();
    assert_eq!(SignatureBundle::read(&path).unwrap(), bundle);
}

#[test]
fn trust_roots_from_a_directory() {
    let dir = tempfile::tempdir().unwrap();
    let a = SigningKey::generate_ed25519();
    let b = SigningKey::generate_p256();
    std::fs::write(dir.path().join("a.pub"), a.public_key().to_pem()).unwrap();
    // Two keys in one file, one of them a duplicate.
    let both = format!("{}{}", b.public_key().to_pem(), a.public_key().to_pem());
    std::fs::write(dir.path().join("b.pem"), both).unwrap();
    // Skipped: other extensions, dot files (ConfigMap mounts), private keys not named .pem/.pub.
    std::fs::write(dir.path().join("README"), "not a key").unwrap();
    std::fs::write(dir.path().join(".hidden.pub"), "garbage").unwrap();
    std::fs::write(dir.path().join("a.key"), a.to_pkcs8_pem().as_bytes()).unwrap();

    let roots = TrustRoots::load([dir.path()]).unwrap();
    assert_eq!(roots.len(), 2);
    let a_root = roots.get(&a.public_key().key_id()).unwrap();
    assert!(a_root.origin.ends_with("a.pub"), "{}", a_root.origin);
    assert!(roots.get(&b.public_key().key_id()).is_some());

    let empty = tempfile::tempdir().unwrap();
    let err = TrustRoots::load([empty.path()]).unwrap_err();
    assert!(matches!(err, TrustError::NoKeysFound { .. }), "{err:?}");
    let err = TrustRoots::load([dir.path().join("missing")]).unwrap_err();
    assert!(matches!(err, TrustError::Io { .. }), "{err:?}");
}

#[test]
fn malformed_pem_is_refused_with_the_file_named() {
    let key = SigningKey::generate_ed25519();
    let good = key.public_key().to_pem();
    let lines: Vec<&str> = good.lines().collect();
    let cases = [
        (
            good.replace(lines[1], "!!!!not base64!!!!"),
            "malformed PEM",
        ),
        (lines[..2].join("\n"), "has no `-----END PUBLIC KEY-----`"),
        ("just text\n".to_owned(), "no PUBLIC KEY found"),
        (key.to_pkcs8_pem().to_string(), "holds a private key"),
        (
            good.replace("PUBLIC KEY", "CERTIFICATE"),
            "only `PUBLIC KEY` blocks are trust roots",
        ),
    ];
    for (text, want) in cases {
        let err = TrustRoots::new().add_pem(&text, "roots/x.pub").unwrap_err();
        let msg = err.to_string();
        assert!(msg.starts_with("roots/x.pub: "), "{msg}");
        assert!(msg.contains(want), "want {want:?} in {msg}");
    }
    // A PUBLIC KEY block whose DER is not SPKI.
    let not_spki = good.replace(lines[1], &BASE64.encode([0x30, 0x03, 0x02, 0x01, 0x01]));
    let err = PublicKey::from_pem(&not_spki, "x.pub").unwrap_err();
    assert!(matches!(err, TrustError::InvalidKey { .. }), "{err:?}");
}

#[test]
fn key_ids() {
    let key = SigningKey::generate_ed25519().public_key();
    let id = key.key_id();
    let full = id.full();
    assert_eq!(full, Digest::of(&key.to_spki_der()).to_string());
    assert_eq!(format!("{id:#}"), full);
    assert_eq!(id.to_string(), full[..7 + 16]);
    assert!(id.matches(&full).unwrap());
    assert!(
        id.matches(&full[..7 + 16].to_uppercase().replace("SHA256", "sha256"))
            .unwrap()
    );
    assert!(id.matches(&full[..7 + 15]).is_err());
    assert_eq!(bosun_trust::KeyId::parse(&full).unwrap(), id);
    assert!(bosun_trust::KeyId::parse(&full[..30]).is_err());
}

#[test]
fn keygen_writes_private_0600_and_refuses_to_overwrite() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("keys");
    let key = SigningKey::generate_ed25519();
    let files = write_key_pair(&out, "bosun", &key).unwrap();
    assert_eq!(files.private_key, out.join("bosun.key"));
    assert_eq!(files.public_key, out.join("bosun.pub"));
    assert_eq!(files.key_id, key.public_key().key_id());
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&files.private_key)
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o077, 0, "private key mode {mode:o}");
    }
    let reloaded = SigningKey::read_pem_file(&files.private_key).unwrap();
    assert_eq!(reloaded.public_key(), key.public_key());
    let roots = TrustRoots::load([&files.public_key]).unwrap();
    assert!(roots.get(&files.key_id).is_some());

    let before = std::fs::read(&files.private_key).unwrap();
    let err = write_key_pair(&out, "bosun", &SigningKey::generate_ed25519()).unwrap_err();
    assert!(matches!(err, TrustError::AlreadyExists { .. }), "{err:?}");
    assert_eq!(std::fs::read(&files.private_key).unwrap(), before);
}

#[test]
fn signing_keys_round_trip_through_pkcs8_and_refuse_encrypted_keys() {
    for key in [SigningKey::generate_ed25519(), SigningKey::generate_p256()] {
        let pem = key.to_pkcs8_pem();
        assert!(pem.starts_with("-----BEGIN PRIVATE KEY-----\n"));
        let back = SigningKey::from_pem(&pem, "k").unwrap();
        assert_eq!(back.public_key(), key.public_key());
        assert!(
            !format!("{key:?}").contains(&pem[28..60]),
            "Debug must not leak the key"
        );
    }
    let fake = "-----BEGIN ENCRYPTED SIGSTORE PRIVATE KEY-----\nAAAA\n-----END ENCRYPTED SIGSTORE PRIVATE KEY-----\n";
    let err = SigningKey::from_pem(fake, "cosign.key").unwrap_err();
    assert!(err.to_string().contains("cosign sign-blob"), "{err}");
    let err = SigningKey::from_pem(
        &SigningKey::generate_ed25519().public_key().to_pem(),
        "k.pub",
    )
    .unwrap_err();
    assert!(matches!(err, TrustError::NoKeysFound { .. }), "{err:?}");
}

#[test]
fn cosign_entries_are_checked_when_made() {
    let key = SigningKey::generate_p256();
    let statement = Statement::new("hello", "0.1.0", Digest::of(PLUGIN)).unwrap();
    let b64 = BASE64.encode(key.sign_bytes(&statement.to_bytes()));
    let entry = PluginSignature::from_cosign(&format!("  {b64}\n")).unwrap();
    assert_eq!(entry.signature, b64);
    assert_eq!(entry.key_id, None);
    verify_digest(
        statement.digest(),
        "hello",
        "0.1.0",
        &[entry],
        &roots_of(&[&key]),
    )
    .unwrap();
    for bad in ["", "%%%", &BASE64.encode([0u8; 64])] {
        let err = PluginSignature::from_cosign(bad).unwrap_err();
        assert!(
            matches!(err, TrustError::MalformedSignature { .. }),
            "{bad:?}: {err:?}"
        );
    }
}
