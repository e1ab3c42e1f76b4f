//! Interoperability with keys and signatures made by the `openssl` command line, which is
//! how the formats are proven to be the standard ones (and how `cosign sign-blob`
//! signatures look: base64 of a DER ECDSA P-256 signature over SHA-256 of the blob).
//!
//! These tests need `openssl` (3.x) on PATH; they fail, rather than skip, without it.

use std::path::{Path, PathBuf};
use std::process::Command;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use bosun_trust::{
    Algorithm, Digest, PluginSignature, SigningKey, Statement, TrustError, TrustRoots, verify,
    verify_digest,
};

const PLUGIN: &[u8] = b"\0asm\x0d\0\x01\0 pretend component bytes for openssl";

/// Runs openssl in `dir`, panicking with its stderr on failure; returns stdout.
fn openssl(dir: &Path, args: &[&str]) -> Vec<u8> {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("running `openssl` (it must be installed for these tests)");
    assert!(
        out.status.success(),
        "openssl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

struct Fixture {
    dir: tempfile::TempDir,
    statement: Statement,
}

impl Fixture {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let statement = Statement::new("hello", "0.1.0", Digest::of(PLUGIN)).unwrap();
        std::fs::write(dir.path().join("statement"), statement.to_bytes()).unwrap();
        Fixture { dir, statement }
    }
    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
    fn run(&self, args: &[&str]) -> Vec<u8> {
        openssl(self.dir.path(), args)
    }
}

#[test]
fn openssl_ed25519_signature_verifies() {
    let f = Fixture::new();
    f.run(&["genpkey", "-algorithm", "ed25519", "-out", "ed.key"]);
    f.run(&["pkey", "-in", "ed.key", "-pubout", "-out", "ed.pub"]);
    f.run(&[
        "pkeyutl",
        "-sign",
        "-rawin",
        "-inkey",
        "ed.key",
        "-in",
        "statement",
        "-out",
        "sig.bin",
    ]);
    let sig = PluginSignature {
        algorithm: Algorithm::Ed25519,
        key_id: None,
        signature: BASE64.encode(std::fs::read(f.path("sig.bin")).unwrap()),
    };
    let roots = TrustRoots::load([f.path("ed.pub")]).unwrap();
    let v = verify(
        PLUGIN,
        &Digest::of(PLUGIN),
        "hello",
        "0.1.0",
        std::slice::from_ref(&sig),
        &roots,
    )
    .unwrap();

    // Our key id is the SHA-256 of the DER that openssl writes for the public key.
    let der = f.run(&["pkey", "-pubin", "-in", "ed.pub", "-outform", "DER"]);
    assert_eq!(v.key_id.full(), Digest::of(&der).to_string());

    // The same signature does not cover another version.
    let err = verify_digest(&Digest::of(PLUGIN), "hello", "0.1.1", &[sig], &roots).unwrap_err();
    assert!(matches!(err, TrustError::Untrusted { .. }), "{err:?}");

    // openssl's private key file is readable as a signing key, with the same public key.
    let key = SigningKey::read_pem_file(f.path("ed.key")).unwrap();
    assert_eq!(key.public_key().key_id(), v.key_id);
}

#[test]
fn openssl_ecdsa_p256_signatures_verify() {
    // The cosign flow: base64 of `openssl dgst -sha256 -sign` is what `cosign sign-blob`
    // prints. ECDSA signatures are randomised and about half have a "high" S value, which
    // must be accepted as cosign does; eight signatures cover both with near certainty.
    let f = Fixture::new();
    f.run(&[
        "genpkey",
        "-algorithm",
        "EC",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-out",
        "p256.key",
    ]);
    f.run(&["pkey", "-in", "p256.key", "-pubout", "-out", "p256.pub"]);
    let roots = TrustRoots::load([f.path("p256.pub")]).unwrap();
    for _ in 0..8 {
        let der = f.run(&["dgst", "-sha256", "-sign", "p256.key", "statement"]);
        // As `base64 -w0` prints it, plus the newline a shell pipeline leaves.
        let sig = PluginSignature::from_cosign(&format!("{}\n", BASE64.encode(&der))).unwrap();
        assert_eq!(sig.algorithm, Algorithm::EcdsaP256Sha256);
        verify(
            PLUGIN,
            &Digest::of(PLUGIN),
            "hello",
            "0.1.0",
            &[sig],
            &roots,
        )
        .unwrap();
    }
    let der = f.run(&["pkey", "-pubin", "-in", "p256.pub", "-outform", "DER"]);
    assert_eq!(
        roots.iter().next().unwrap().key_id.full(),
        Digest::of(&der).to_string()
    );

    // A signature by another P-256 key is untrusted.
    f.run(&[
        "genpkey",
        "-algorithm",
        "EC",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-out",
        "other.key",
    ]);
    let der = f.run(&["dgst", "-sha256", "-sign", "other.key", "statement"]);
    let sig = PluginSignature {
        algorithm: Algorithm::EcdsaP256Sha256,
        key_id: None,
        signature: BASE64.encode(&der),
    };
    let err = verify(
        PLUGIN,
        &Digest::of(PLUGIN),
        "hello",
        "0.1.0",
        &[sig],
        &roots,
    )
    .unwrap_err();
    assert!(matches!(err, TrustError::Untrusted { .. }), "{err:?}");
}

#[test]
fn openssl_verifies_our_keys_and_signatures() {
    let f = Fixture::new();

    // Ed25519: our private key file is exactly what openssl writes for the same key.
    let ed = SigningKey::generate_ed25519();
    std::fs::write(f.path("ed.key"), ed.to_pkcs8_pem().as_bytes()).unwrap();
    std::fs::write(f.path("ed.pub"), ed.public_key().to_pem()).unwrap();
    let reencoded = f.run(&["pkey", "-in", "ed.key"]);
    assert_eq!(String::from_utf8(reencoded).unwrap(), *ed.to_pkcs8_pem());
    let repub = f.run(&["pkey", "-in", "ed.key", "-pubout"]);
    assert_eq!(String::from_utf8(repub).unwrap(), ed.public_key().to_pem());
    std::fs::write(f.path("ed.sig"), ed.sign_bytes(&f.statement.to_bytes())).unwrap();
    f.run(&[
        "pkeyutl",
        "-verify",
        "-rawin",
        "-pubin",
        "-inkey",
        "ed.pub",
        "-in",
        "statement",
        "-sigfile",
        "ed.sig",
    ]);

    // P-256: openssl reads our PKCS#8 key and verifies our DER signature.
    let ec = SigningKey::generate_p256();
    std::fs::write(f.path("ec.key"), ec.to_pkcs8_pem().as_bytes()).unwrap();
    std::fs::write(f.path("ec.pub"), ec.public_key().to_pem()).unwrap();
    let repub = f.run(&["pkey", "-in", "ec.key", "-pubout"]);
    assert_eq!(String::from_utf8(repub).unwrap(), ec.public_key().to_pem());
    std::fs::write(f.path("ec.sig"), ec.sign_bytes(&f.statement.to_bytes())).unwrap();
    let out = f.run(&[
        "dgst",
        "-sha256",
        "-verify",
        "ec.pub",
        "-signature",
        "ec.sig",
        "statement",
    ]);
    assert_eq!(String::from_utf8(out).unwrap().trim(), "Verified OK");

    // And openssl rejects it over other bytes (the check above can fail).
    std::fs::write(f.path("other"), b"other statement").unwrap();
    let status = Command::new("openssl")
        .args([
            "dgst",
            "-sha256",
            "-verify",
            "ec.pub",
            "-signature",
            "ec.sig",
            "other",
        ])
        .current_dir(f.dir.path())
        .output()
        .unwrap()
        .status;
    assert!(!status.success());
}

#[test]
fn openssl_sec1_ec_private_key_signs() {
    let f = Fixture::new();
    f.run(&[
        "ecparam",
        "-name",
        "prime256v1",
        "-genkey",
        "-noout",
        "-out",
        "sec1.key",
    ]);
    let pem = std::fs::read_to_string(f.path("sec1.key")).unwrap();
    assert!(pem.starts_with("-----BEGIN EC PRIVATE KEY-----"), "{pem}");
    let key = SigningKey::read_pem_file(f.path("sec1.key")).unwrap();
    f.run(&["pkey", "-in", "sec1.key", "-pubout", "-out", "sec1.pub"]);
    let roots = TrustRoots::load([f.path("sec1.pub")]).unwrap();
    let sig = key.sign_statement(&f.statement);
    verify(
        PLUGIN,
        &Digest::of(PLUGIN),
        "hello",
        "0.1.0",
        &[sig],
        &roots,
    )
    .unwrap();
}

#[test]
fn other_key_types_are_refused_by_name() {
    let f = Fixture::new();
    let cases: [(&[&str], &str); 4] = [
        (
            &[
                "genpkey",
                "-algorithm",
                "RSA",
                "-pkeyopt",
                "rsa_keygen_bits:1024",
                "-out",
                "k",
            ],
            "RSA",
        ),
        (
            &[
                "genpkey",
                "-algorithm",
                "EC",
                "-pkeyopt",
                "ec_paramgen_curve:P-384",
                "-out",
                "k",
            ],
            "P-384",
        ),
        (&["genpkey", "-algorithm", "ed448", "-out", "k"], "Ed448"),
        (
            &[
                "genpkey",
                "-algorithm",
                "EC",
                "-pkeyopt",
                "ec_paramgen_curve:secp256k1",
                "-out",
                "k",
            ],
            "secp256k1",
        ),
    ];
    for (genkey, want) in cases {
        let _ = std::fs::remove_file(f.path("k"));
        f.run(genkey);
        let public = f.run(&["pkey", "-in", "k", "-pubout"]);
        let err = TrustRoots::new()
            .add_pem(std::str::from_utf8(&public).unwrap(), "k.pub")
            .unwrap_err();
        assert!(matches!(err, TrustError::UnsupportedKey { .. }), "{err:?}");
        assert!(err.to_string().contains(want), "want {want:?} in {err}");
        // The private key is refused for signing too.
        let err = SigningKey::read_pem_file(f.path("k")).unwrap_err();
        assert!(matches!(err, TrustError::UnsupportedKey { .. }), "{err:?}");
    }
}

#[test]
fn encrypted_pkcs8_is_refused_with_advice() {
    let f = Fixture::new();
    f.run(&[
        "genpkey",
        "-algorithm",
        "ed25519",
        "-aes-256-cbc",
        "-pass",
        "pass:secret",
        "-out",
        "enc.key",
    ]);
    let err = SigningKey::read_pem_file(f.path("enc.key")).unwrap_err();
    assert!(
        matches!(err, TrustError::EncryptedPrivateKey { .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("openssl pkey"), "{err}");
}
