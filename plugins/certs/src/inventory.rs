//! What kubeadm puts on a control-plane node: each certificate by kubeadm's name, where it
//! lives, which CA signs it, and whether `kubeadm certs renew` can renew it.
//!
//! The names are the ones `kubeadm certs renew NAME` and `kubeadm certs check-expiration`
//! use (and the Operation API's `CertificateName`), so a report line, a renew argument and
//! the API all speak of the same thing.

/// Where a certificate is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Location {
    /// A PEM file (`.crt`), path relative to the PKI directory.
    Pki(&'static str),
    /// A kubeconfig file whose first user's `client-certificate-data` (or
    /// `client-certificate` path) holds the certificate; path relative to the kubeadm
    /// directory (`/etc/kubernetes`).
    Kubeconfig(&'static str),
}

/// One certificate kubeadm manages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cert {
    /// kubeadm's name: `apiserver`, `admin.conf`, `ca`, ...
    pub name: &'static str,
    pub location: Location,
    /// kubeadm's name of the CA that signs it; `None` for the CAs themselves.
    pub ca: Option<&'static str>,
    /// True when `kubeadm certs renew NAME` renews it (every leaf; CAs and `kubelet.conf`,
    /// whose client certificate the kubelet rotates itself, are not).
    pub renewable: bool,
}

/// The kubeadm directory on a node.
pub const KUBERNETES_DIR: &str = "/etc/kubernetes";
/// kubeadm's default `certificatesDir`.
pub const PKI_DIR: &str = "/etc/kubernetes/pki";
/// The static pod manifests the kubelet watches.
pub const MANIFESTS_DIR: &str = "/etc/kubernetes/manifests";

const fn leaf(name: &'static str, location: Location, ca: &'static str) -> Cert {
    Cert {
        name,
        location,
        ca: Some(ca),
        renewable: true,
    }
}

const fn ca(name: &'static str, file: &'static str) -> Cert {
    Cert {
        name,
        location: Location::Pki(file),
        ca: None,
        renewable: false,
    }
}

/// Every certificate in the order `kubeadm certs check-expiration` lists them: leaves and
/// kubeconfigs first, then the CAs; `kubelet.conf` last (checked, never renewed by kubeadm).
pub const ALL: &[Cert] = &[
    leaf("admin.conf", Location::Kubeconfig("admin.conf"), "ca"),
    leaf("apiserver", Location::Pki("apiserver.crt"), "ca"),
    leaf(
        "apiserver-etcd-client",
        Location::Pki("apiserver-etcd-client.crt"),
        "etcd-ca",
    ),
    leaf(
        "apiserver-kubelet-client",
        Location::Pki("apiserver-kubelet-client.crt"),
        "ca",
    ),
    leaf(
        "controller-manager.conf",
        Location::Kubeconfig("controller-manager.conf"),
        "ca",
    ),
    leaf(
        "etcd-healthcheck-client",
        Location::Pki("etcd/healthcheck-client.crt"),
        "etcd-ca",
    ),
    leaf("etcd-peer", Location::Pki("etcd/peer.crt"), "etcd-ca"),
    leaf("etcd-server", Location::Pki("etcd/server.crt"), "etcd-ca"),
    leaf(
        "front-proxy-client",
        Location::Pki("front-proxy-client.crt"),
        "front-proxy-ca",
    ),
    leaf(
        "scheduler.conf",
        Location::Kubeconfig("scheduler.conf"),
        "ca",
    ),
    leaf(
        "super-admin.conf",
        Location::Kubeconfig("super-admin.conf"),
        "ca",
    ),
    ca("ca", "ca.crt"),
    ca("etcd-ca", "etcd/ca.crt"),
    ca("front-proxy-ca", "front-proxy-ca.crt"),
    Cert {
        name: "kubelet.conf",
        location: Location::Kubeconfig("kubelet.conf"),
        ca: Some("ca"),
        renewable: false,
    },
];

/// The certificate called `name`.
#[must_use]
pub fn by_name(name: &str) -> Option<&'static Cert> {
    ALL.iter().find(|c| c.name == name)
}

/// The names `kubeadm certs renew` accepts, for error messages.
#[must_use]
pub fn renewable_names() -> Vec<&'static str> {
    ALL.iter().filter(|c| c.renewable).map(|c| c.name).collect()
}

impl Cert {
    /// The absolute path of the file holding it.
    #[must_use]
    pub fn path(&self) -> String {
        match self.location {
            Location::Pki(p) => format!("{PKI_DIR}/{p}"),
            Location::Kubeconfig(p) => format!("{KUBERNETES_DIR}/{p}"),
        }
    }

    /// The path of the private key of this certificate's CA (`ca.key`, ...), which
    /// `kubeadm certs renew` needs to sign the renewed certificate.
    #[must_use]
    pub fn ca_key_path(&self) -> Option<String> {
        let ca = by_name(self.ca?)?;
        match ca.location {
            Location::Pki(file) => Some(format!("{PKI_DIR}/{}", file.replace(".crt", ".key"))),
            Location::Kubeconfig(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_signer_is_a_known_ca_with_a_key_path() {
        for c in ALL.iter().filter(|c| c.ca.is_some()) {
            let key = c.ca_key_path().unwrap();
            assert!(
                key.starts_with(PKI_DIR) && key.ends_with(".key"),
                "{}: {key}",
                c.name
            );
        }
        assert_eq!(
            by_name("etcd-server").unwrap().ca_key_path().unwrap(),
            "/etc/kubernetes/pki/etcd/ca.key"
        );
        assert_eq!(
            by_name("apiserver").unwrap().path(),
            "/etc/kubernetes/pki/apiserver.crt"
        );
        assert_eq!(
            by_name("admin.conf").unwrap().path(),
            "/etc/kubernetes/admin.conf"
        );
    }

    #[test]
    fn renewable_names_match_the_api() {
        // The Operation API's CertificateName lists these eleven (plus `all`).
        assert_eq!(renewable_names().len(), 11);
        assert!(!renewable_names().contains(&"ca"));
        assert!(!renewable_names().contains(&"kubelet.conf"));
    }
}
