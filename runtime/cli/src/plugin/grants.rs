//! The grants file `plugin run` and `plugin publish` read.

use std::path::PathBuf;

use anyhow::{Context as _, Result, bail};
use bosun_api::grants::Grants;

/// Reads a grants file, or the `spec.grants` of a Plugin manifest (such as
/// deploy/examples/plugins/certs.yaml); absent means nothing granted. `plugin run` and
/// `plugin publish` both read grants through this.
pub fn read_grants(path: Option<&PathBuf>) -> Result<Grants> {
    let Some(path) = path else {
        return Ok(Grants::default());
    };
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading grants file {}", path.display()))?;
    if text.trim().is_empty() {
        bail!(
            "grants file {} is empty; write `{{}}` to grant nothing",
            path.display()
        );
    }
    if let Ok(doc) = serde_yaml::from_str::<serde_yaml::Value>(&text)
        && doc.get("kind").and_then(|k| k.as_str()) == Some("Plugin")
    {
        let grants = doc
            .get("spec")
            .and_then(|s| s.get("grants"))
            .cloned()
            .unwrap_or(serde_yaml::Value::Mapping(Default::default()));
        return serde_yaml::from_value(grants).with_context(|| {
            format!(
                "the Plugin manifest {} has spec.grants that are not a Plugin's grants (filesystem, exec, services, http)",
                path.display()
            )
        });
    }
    serde_yaml::from_str(&text).with_context(|| {
        format!(
            "grants file {} is not a Plugin's grants (filesystem, exec, services, http)",
            path.display()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grants_files_are_strict() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("g.yaml");
        std::fs::write(&path, "filesytem: [{path: /etc, access: ReadOnly}]\n").unwrap();
        let e = read_grants(Some(&path)).unwrap_err();
        assert!(format!("{e:#}").contains("filesytem"), "{e:#}");
        std::fs::write(&path, "  \n").unwrap();
        assert!(
            read_grants(Some(&path))
                .unwrap_err()
                .to_string()
                .contains("is empty")
        );
        assert_eq!(read_grants(None).unwrap(), Grants::default());
    }
}
