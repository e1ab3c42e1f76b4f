//! Reading policies from files, for `kubectl-bosun policy eval` and other offline tools.
//!
//! Three shapes are accepted:
//! - a `.rego` file: one policy named after the file's stem, with the `data.json` beside it
//!   when there is one, enforcement `Deny`;
//! - a `.yaml`/`.yml`/`.json` file of `Policy` manifests (several YAML documents allowed):
//!   each manifest's `metadata.name`, `spec.rego`, `spec.data` and `spec.enforcement`,
//!   exactly what the cluster would compile;
//! - a directory: walked recursively in name order; every directory holding `.rego` files
//!   other than `*_test.rego` is one policy, named after the directory when it has one such
//!   module (else each module is a policy named after its file stem), with its
//!   `data.json` — the layout of `policies/` and of `kubectl-bosun policy test`.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::error::PolicyError;
use crate::set::{Enforcement, PolicySource};

/// Loads every policy at `path` (see the module docs for the shapes). Fails when a file
/// cannot be read or parsed, and when `path` holds no policy at all.
pub fn load_policies(path: &Path) -> Result<Vec<PolicySource>, PolicyError> {
    let mut out = Vec::new();
    if path.is_dir() {
        load_dir(path, &mut out)?;
    } else {
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        if name.ends_with(".rego") {
            let data = read_data(&path.with_file_name("data.json"))?;
            out.push(PolicySource {
                name: stem(path),
                rego: read(path)?,
                data,
                enforcement: Enforcement::Deny,
            });
        } else if [".yaml", ".yml", ".json"].iter().any(|s| name.ends_with(s)) {
            load_manifests(path, &mut out)?;
        } else {
            return Err(invalid(
                path,
                "expected a .rego file, a YAML/JSON file of Policy manifests, or a directory of policies",
            ));
        }
    }
    if out.is_empty() {
        return Err(invalid(
            path,
            "no policy found here (no .rego module other than *_test.rego, and no Policy manifest)",
        ));
    }
    Ok(out)
}

fn invalid(path: &Path, message: impl Into<String>) -> PolicyError {
    PolicyError::Invalid {
        path: path.display().to_string(),
        message: message.into(),
    }
}

fn read(path: &Path) -> Result<String, PolicyError> {
    std::fs::read_to_string(path).map_err(|source| PolicyError::Io {
        path: path.display().to_string(),
        source,
    })
}

fn stem(path: &Path) -> String {
    path.file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("policy")
        .to_owned()
}

fn read_data(path: &Path) -> Result<Option<serde_json::Value>, PolicyError> {
    if !path.is_file() {
        return Ok(None);
    }
    serde_json::from_str(&read(path)?)
        .map(Some)
        .map_err(|e| invalid(path, format!("not JSON: {e}")))
}

fn load_dir(dir: &Path, out: &mut Vec<PolicySource>) -> Result<(), PolicyError> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|source| PolicyError::Io {
            path: dir.display().to_string(),
            source,
        })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    entries.sort();
    let modules: Vec<&PathBuf> = entries
        .iter()
        .filter(|p| p.is_file())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.ends_with(".rego") && !n.ends_with("_test.rego"))
        })
        .collect();
    if !modules.is_empty() {
        let data = read_data(&dir.join("data.json"))?;
        for m in &modules {
            let name = if modules.len() == 1 {
                dir.file_name()
                    .and_then(|n| n.to_str())
                    .map_or_else(|| stem(m), str::to_owned)
            } else {
                stem(m)
            };
            out.push(PolicySource {
                name,
                rego: read(m)?,
                data: data.clone(),
                enforcement: Enforcement::Deny,
            });
        }
    }
    for e in entries.iter().filter(|p| p.is_dir()) {
        load_dir(e, out)?;
    }
    Ok(())
}

#[derive(Deserialize)]
struct Manifest {
    kind: String,
    metadata: Metadata,
    spec: Spec,
}

#[derive(Deserialize)]
struct Metadata {
    name: String,
}

#[derive(Deserialize)]
struct Spec {
    rego: String,
    #[serde(default)]
    data: Option<serde_json::Value>,
    #[serde(default)]
    enforcement: Enforcement,
}

fn load_manifests(path: &Path, out: &mut Vec<PolicySource>) -> Result<(), PolicyError> {
    let text = read(path)?;
    for (i, doc) in serde_yaml::Deserializer::from_str(&text).enumerate() {
        let value = serde_yaml::Value::deserialize(doc)
            .map_err(|e| invalid(path, format!("document {}: not YAML: {e}", i + 1)))?;
        if value.is_null() {
            continue;
        }
        // `kubectl get policies.bosun.dev -o yaml` writes a List of the objects.
        let kind = value
            .get("kind")
            .and_then(|k| k.as_str())
            .unwrap_or_default();
        if kind == "List" || kind == "PolicyList" {
            let items = value
                .get("items")
                .and_then(|i| i.as_sequence())
                .cloned()
                .unwrap_or_default();
            for (j, item) in items.into_iter().enumerate() {
                out.push(manifest(
                    path,
                    &format!("document {} item {}", i + 1, j + 1),
                    item,
                )?);
            }
            continue;
        }
        out.push(manifest(path, &format!("document {}", i + 1), value)?);
    }
    Ok(())
}

/// One Policy manifest (`what` says where it is in the file, for errors).
fn manifest(
    path: &Path,
    what: &str,
    value: serde_yaml::Value,
) -> Result<PolicySource, PolicyError> {
    let m: Manifest = serde_yaml::from_value(value).map_err(|e| {
        invalid(
            path,
            format!("{what}: not a Policy manifest (kind, metadata.name, spec.rego): {e}"),
        )
    })?;
    if m.kind != "Policy" {
        return Err(invalid(
            path,
            format!("{what} is a {}, not a Policy", m.kind),
        ));
    }
    Ok(PolicySource {
        name: m.metadata.name,
        rego: m.spec.rego,
        data: m.spec.data,
        enforcement: m.spec.enforcement,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifests_files_and_directories_load() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::create_dir_all(d.join("lib/freeze")).unwrap();
        std::fs::write(
            d.join("lib/freeze/policy.rego"),
            "package bosun.step.freeze\n\ndeny contains \"x\" if false\n",
        )
        .unwrap();
        std::fs::write(
            d.join("lib/freeze/policy_test.rego"),
            "package bosun.step.freeze_test\n\ntest_x if true\n",
        )
        .unwrap();
        std::fs::write(
            d.join("lib/freeze/data.json"),
            "{\"freeze\": {\"on\": true}}",
        )
        .unwrap();
        let loaded = load_policies(&d.join("lib")).unwrap();
        assert_eq!(loaded.len(), 1);
        assert_eq!(loaded[0].name, "freeze");
        assert_eq!(
            loaded[0].data,
            Some(serde_json::json!({"freeze": {"on": true}}))
        );

        let single = load_policies(&d.join("lib/freeze/policy.rego")).unwrap();
        assert_eq!(single[0].name, "policy");
        assert!(single[0].data.is_some());

        std::fs::write(
            d.join("p.yaml"),
            "apiVersion: bosun.dev/v1alpha1\nkind: Policy\nmetadata: {name: a}\nspec:\n  enforcement: Warn\n  rego: |\n    package bosun.step\n    deny contains \"w\" if true\n---\napiVersion: bosun.dev/v1alpha1\nkind: Policy\nmetadata: {name: b}\nspec: {rego: \"package bosun.operation\\ndeny contains 1 if false\"}\n",
        )
        .unwrap();
        let m = load_policies(&d.join("p.yaml")).unwrap();
        assert_eq!(
            m.iter()
                .map(|p| (p.name.as_str(), p.enforcement))
                .collect::<Vec<_>>(),
            vec![("a", Enforcement::Warn), ("b", Enforcement::Deny)]
        );

        // What `kubectl get policies.bosun.dev -o yaml` writes: a List.
        std::fs::write(
            d.join("list.yaml"),
            "apiVersion: v1\nkind: List\nmetadata: {}\nitems:\n- apiVersion: bosun.dev/v1alpha1\n  kind: Policy\n  metadata: {name: c, uid: x}\n  spec: {enforcement: Audit, rego: \"package bosun.step\"}\n  status: {compiled: true}\n",
        )
        .unwrap();
        let listed = load_policies(&d.join("list.yaml")).unwrap();
        assert_eq!(
            listed
                .iter()
                .map(|p| (p.name.as_str(), p.enforcement))
                .collect::<Vec<_>>(),
            vec![("c", Enforcement::Audit)]
        );

        std::fs::write(
            d.join("cm.yaml"),
            "kind: ConfigMap\nmetadata: {name: x}\nspec: {rego: y}\n",
        )
        .unwrap();
        assert!(
            load_policies(&d.join("cm.yaml"))
                .unwrap_err()
                .to_string()
                .contains("not a Policy")
        );
        std::fs::create_dir_all(d.join("empty")).unwrap();
        assert!(
            load_policies(&d.join("empty"))
                .unwrap_err()
                .to_string()
                .contains("no policy found")
        );
    }
}
