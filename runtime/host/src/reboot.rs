//! Whether a node needs a reboot, read as data from its root: no command runs.
//!
//! Two signs, each the one its distribution family uses itself:
//!
//! - **The Debian family** (`/run/reboot-required`): package maintainer scripts (a new kernel,
//!   libc, systemd) touch `/run/reboot-required` and append their package's name to
//!   `/run/reboot-required.pkgs`; `/var/run` is a symlink to `/run` there. `/run` is a tmpfs,
//!   so a reboot clears both. Both files are read without following a symlink: a symlink
//!   there was not made by a package script.
//! - **Installed kernels** (the RHEL family, Fedora, SUSE): the kernel package installs
//!   `/usr/lib/modules/<release>/vmlinuz`, and the running kernel's release is
//!   `/proc/sys/kernel/osrelease`. The node needs a reboot when a newer release than the
//!   running one is installed, **and the running release is itself installed there**. The
//!   second condition keeps a node container (which runs its host's kernel, never one of its
//!   own) from needing a reboot forever, and costs nothing on a real machine: dnf never
//!   removes the running kernel. Releases are ordered as rpm orders versions.
//!
//! **The boot identity** ([`boot_identity`]) tells one boot from the next, so that a reboot
//! step can prove the node came back: the kernel's `boot_id` and the start time of PID 1 in
//! the agent's PID namespace (the node's, as the agent runs with `hostPID`). Inside a node
//! container `boot_id` is its host's and does not change when the container restarts, but
//! its PID 1 (systemd) starts again; on a real reboot both change. Both are kept by the
//! kernel in `/proc`, which no plugin can write.
//!
//! A plugin with a write grant on `/run` or `/usr/lib/modules` can make this fact lie (say a
//! reboot is needed, or hide one). It cannot make the host run anything by it: the fact only
//! feeds the NodeReport, and a reboot it leads to is an Operation that policy gates like any
//! other (docs/reboots.md).

use std::cmp::Ordering;
use std::path::Path;

use bosun_api::node_task::RebootNeed;
use cap_std::fs::Dir;

use crate::facts::{open_dir_nofollow, read_root_bytes};

/// The Debian family's sentinel and its package list, relative to the root.
pub const SENTINEL: &str = "run/reboot-required";
pub const SENTINEL_PACKAGES: &str = "run/reboot-required.pkgs";
/// Where kernel packages install their modules and image.
pub const MODULES_DIR: &str = "usr/lib/modules";

/// The most package names reported.
pub const MAX_PACKAGES: usize = 16;
/// The longest package name kept: sixteen of them still fit the API's 2,048-byte reason.
const MAX_NAME: usize = 100;
/// The longest kernel release kept: `kernel <release>` fits the API's 160-byte package entry.
const MAX_RELEASE: usize = 128;
/// The most `/usr/lib/modules` entries looked at (a node keeps a handful of kernels).
const MAX_MODULE_DIRS: usize = 64;
/// The most bytes read from the sentinel files.
const MAX_SENTINEL_BYTES: u64 = 16 << 10;

/// This boot's identity, `<boot_id>/<PID 1 start time in clock ticks since the kernel
/// booted>`, for example `8d0c4e6a-…/123`; `None` when `/proc` cannot be read or does not
/// read as expected.
pub fn boot_identity() -> Option<String> {
    boot_identity_from(
        &std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?,
        &std::fs::read_to_string("/proc/1/stat").ok()?,
    )
}

/// [`boot_identity`] from the two files' contents.
pub fn boot_identity_from(boot_id: &str, init_stat: &str) -> Option<String> {
    let id = boot_id.trim();
    let well_formed = id.len() == 36 && id.chars().all(|c| c.is_ascii_hexdigit() || c == '-');
    // `pid (comm) state ppid …`: comm may hold spaces and parentheses, so the fields are
    // counted from the last `)`; the start time is field 22, the 20th after it.
    let after_comm = &init_stat[init_stat.rfind(')')? + 1..];
    let start: u64 = after_comm.split_whitespace().nth(19)?.parse().ok()?;
    well_formed.then(|| format!("{id}/{start}"))
}

/// Reads both signs under `root`; `running` is the running kernel's release. The reasons
/// hold one sentence per sign found; the packages are those that asked for the reboot
/// (`reboot-required.pkgs`, in order, each once) or the newer kernel, at most
/// [`MAX_PACKAGES`].
pub fn reboot_need(root: &Path, running: &str) -> RebootNeed {
    let mut need = RebootNeed::default();
    if read_root_bytes(root, SENTINEL, MAX_SENTINEL_BYTES, true).is_some() {
        let listed = read_root_bytes(root, SENTINEL_PACKAGES, MAX_SENTINEL_BYTES, true)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default();
        need.packages = sentinel_packages(&listed);
        need.reasons.push(if need.packages.is_empty() {
            format!("/{SENTINEL} is present")
        } else {
            format!(
                "/{SENTINEL} is present (asked for by {})",
                need.packages.join(", ")
            )
        });
    }
    if let Some((newest, reason)) = newer_kernel(&installed_kernels(root), running) {
        need.reasons.push(reason);
        if need.packages.len() < MAX_PACKAGES {
            need.packages.push(format!("kernel {newest}"));
        }
    }
    need.required = !need.reasons.is_empty();
    need
}

/// Whether `s` could be a package name or a kernel release of at most `max` bytes: letters,
/// digits and `+-.:_~`. Anything else was made up by something other than a package, and is
/// left out, so that no report the API server would refuse (an entry over its length) is
/// built from it.
fn plausible(s: &str, max: usize) -> bool {
    !s.is_empty()
        && s.len() <= max
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "+-.:_~".contains(c))
}

/// The package names of `reboot-required.pkgs`: one per line, in order, each once, only
/// names a package could have (others are dropped), at most [`MAX_PACKAGES`].
pub fn sentinel_packages(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for line in text.lines().map(str::trim) {
        if plausible(line, MAX_NAME) && !out.iter().any(|p| p == line) {
            out.push(line.to_owned());
            if out.len() == MAX_PACKAGES {
                break;
            }
        }
    }
    out
}

/// The releases under `/usr/lib/modules` that hold a kernel image (`vmlinuz`, a regular
/// file) and read as a release could; the directory is entered without following a
/// symlink on the way.
pub fn installed_kernels(root: &Path) -> Vec<String> {
    let Ok(dir) = Dir::open_ambient_dir(root, cap_std::ambient_authority()) else {
        return Vec::new();
    };
    let Ok(modules) = open_dir_nofollow(&dir, Path::new(MODULES_DIR), false) else {
        return Vec::new();
    };
    let Ok(entries) = modules.entries() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for entry in entries.flatten().take(MAX_MODULE_DIRS) {
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        if !plausible(&name, MAX_RELEASE) {
            continue;
        }
        let has_image = open_dir_nofollow(&modules, Path::new(&name), false)
            .and_then(|d| d.symlink_metadata("vmlinuz"))
            .is_ok_and(|m| m.is_file());
        if has_image {
            out.push(name);
        }
    }
    out.sort();
    out
}

/// The newest of `installed` when it is newer than `running` and `running` is installed
/// too, with the sentence saying so.
pub fn newer_kernel(installed: &[String], running: &str) -> Option<(String, String)> {
    if running.is_empty() || !installed.iter().any(|k| k == running) {
        return None;
    }
    let newest = installed.iter().max_by(|a, b| rpm_cmp(a, b))?;
    (rpm_cmp(newest, running) == Ordering::Greater).then(|| {
        (
            newest.clone(),
            format!("kernel {newest} is installed, newer than the running {running}"),
        )
    })
}

/// Orders two versions as rpm does (`rpmvercmp`): split into runs of digits and runs of
/// letters, other characters only separate; digit runs compare as numbers and beat letter
/// runs; `~` sorts before anything (even the end), `^` after the end but before anything
/// else; with all runs equal, the one with runs left is newer.
pub fn rpm_cmp(a: &str, b: &str) -> Ordering {
    if a == b {
        return Ordering::Equal;
    }
    let (mut a, mut b) = (a.as_bytes(), b.as_bytes());
    let separator = |c: u8| !c.is_ascii_alphanumeric() && c != b'~' && c != b'^';
    loop {
        while a.first().is_some_and(|&c| separator(c)) {
            a = &a[1..];
        }
        while b.first().is_some_and(|&c| separator(c)) {
            b = &b[1..];
        }
        // Tilde: older than anything, the end included.
        match (a.first() == Some(&b'~'), b.first() == Some(&b'~')) {
            (true, true) => {
                a = &a[1..];
                b = &b[1..];
                continue;
            }
            (true, false) => return Ordering::Less,
            (false, true) => return Ordering::Greater,
            (false, false) => {}
        }
        // Caret: newer than the end, older than anything else.
        match (a.first() == Some(&b'^'), b.first() == Some(&b'^')) {
            (true, true) => {
                a = &a[1..];
                b = &b[1..];
                continue;
            }
            (true, false) => {
                return if b.is_empty() {
                    Ordering::Greater
                } else {
                    Ordering::Less
                };
            }
            (false, true) => {
                return if a.is_empty() {
                    Ordering::Less
                } else {
                    Ordering::Greater
                };
            }
            (false, false) => {}
        }
        if a.is_empty() || b.is_empty() {
            return a.len().cmp(&b.len());
        }
        let numeric = a[0].is_ascii_digit();
        let run = |s: &[u8]| {
            s.iter()
                .take_while(|c| {
                    if numeric {
                        c.is_ascii_digit()
                    } else {
                        c.is_ascii_alphabetic()
                    }
                })
                .count()
        };
        let (la, lb) = (run(a), run(b));
        if lb == 0 {
            // b's run is of the other kind: a digit run beats a letter run.
            return if numeric {
                Ordering::Greater
            } else {
                Ordering::Less
            };
        }
        let (ra, rb) = (&a[..la], &b[..lb]);
        let order = if numeric {
            let trim = |s: &'_ [u8]| -> usize { s.iter().take_while(|&&c| c == b'0').count() };
            let (ra, rb) = (&ra[trim(ra)..], &rb[trim(rb)..]);
            ra.len().cmp(&rb.len()).then_with(|| ra.cmp(rb))
        } else {
            ra.cmp(rb)
        };
        if order != Ordering::Equal {
            return order;
        }
        a = &a[la..];
        b = &b[lb..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_order_as_rpm_orders_them() {
        use Ordering::*;
        // (a, b, a against b): rpm's own test cases for rpmvercmp, and kernel releases.
        let cases = [
            ("1.0", "1.0", Equal),
            ("1.0", "2.0", Less),
            ("2.0.1", "2.0", Greater),
            ("2.0.1a", "2.0.1", Greater),
            ("5.5p1", "5.5p2", Less),
            ("5.5p10", "5.5p1", Greater),
            ("10xyz", "10.1xyz", Less),
            ("xyz10", "xyz10.1", Less),
            ("1.0aa", "1.0a", Greater),
            ("10a2", "10b2", Less),
            ("1b.fc17", "1.fc17", Less),
            ("1.0~rc1", "1.0", Less),
            ("1.0~rc1", "1.0~rc2", Less),
            ("1.0~rc1~git123", "1.0~rc1", Less),
            ("1.0^", "1.0", Greater),
            ("1.0^git1", "1.0.1", Less),
            ("1.0^git1", "1.0^git2", Less),
            ("001", "1", Equal),
            ("1.01", "1.1", Equal),
            (
                "5.14.0-503.el9.x86_64",
                "5.14.0-427.13.1.el9_4.x86_64",
                Greater,
            ),
            (
                "5.14.0-427.13.1.el9_4.x86_64",
                "5.14.0-427.el9.x86_64",
                Greater,
            ),
            ("6.12.0-55.el10.x86_64", "5.14.0-570.el9.x86_64", Greater),
            ("6.1.0-28-amd64", "6.1.0-9-amd64", Greater),
        ];
        for (a, b, want) in cases {
            assert_eq!(rpm_cmp(a, b), want, "{a} against {b}");
            assert_eq!(rpm_cmp(b, a), want.reverse(), "{b} against {a}");
        }
    }

    #[test]
    fn the_boot_identity_is_the_boot_id_and_init_start_time() {
        let id = "8d0c4e6a-3f0e-4b9e-9a57-2f3c3b1f0c11\n";
        // Fields 1..22 of /proc/1/stat, comm with a space and a parenthesis.
        let stat = |comm: &str, start: &str| {
            format!(
                "1 ({comm}) S 0 1 1 0 -1 4194560 1 2 3 4 5 6 7 8 20 0 1 0 {start} 1000 200 18446744073709551615"
            )
        };
        // (boot_id, stat, identity)
        let cases = [
            (
                id,
                stat("systemd", "42"),
                Some("8d0c4e6a-3f0e-4b9e-9a57-2f3c3b1f0c11/42"),
            ),
            (
                id,
                stat("a) b (c", "7"),
                Some("8d0c4e6a-3f0e-4b9e-9a57-2f3c3b1f0c11/7"),
            ),
            (id, stat("init", "x"), None),
            (id, "1 (init) S 0".to_string(), None),
            ("not-a-boot-id", stat("init", "1"), None),
        ];
        for (boot_id, stat, want) in cases {
            assert_eq!(
                boot_identity_from(boot_id, &stat).as_deref(),
                want,
                "{stat}"
            );
        }
        // This machine's reads the same twice, in the documented form.
        let here = boot_identity().expect("/proc is readable here");
        assert_eq!(boot_identity(), Some(here.clone()));
        assert!(here.len() > 37 && here.as_bytes()[36] == b'/', "{here}");
    }

    #[test]
    fn a_newer_kernel_counts_only_beside_the_running_one() {
        let k = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let old = "5.14.0-427.el9.x86_64";
        let new = "5.14.0-503.el9.x86_64";
        // (installed, running, newest reported)
        let cases: [(Vec<String>, &str, Option<&str>); 6] = [
            (k(&[old, new]), old, Some(new)),
            (k(&[new, old]), new, None),
            (k(&[old]), old, None),
            // A node container: the host's kernel is running, the node has its own.
            (k(&[old, new]), "6.1.0-28-amd64", None),
            (k(&[]), old, None),
            (k(&[old, new]), "", None),
        ];
        for (installed, running, want) in cases {
            let got = newer_kernel(&installed, running);
            assert_eq!(
                got.as_ref().map(|(n, _)| n.as_str()),
                want,
                "{installed:?} running {running}"
            );
            if let Some((_, reason)) = got {
                assert_eq!(
                    reason,
                    format!("kernel {new} is installed, newer than the running {old}")
                );
            }
        }
    }

    #[test]
    fn the_package_list_keeps_names_once_in_order() {
        let text = "linux-image-6.1.0-28-amd64\nlibc6\n\nlinux-image-6.1.0-28-amd64\n  dbus  \n$(reboot)\n../../x\n";
        assert_eq!(
            sentinel_packages(text),
            ["linux-image-6.1.0-28-amd64", "libc6", "dbus"]
        );
        let many: String = (0..40).map(|i| format!("pkg{i}\n")).collect();
        assert_eq!(sentinel_packages(&many).len(), MAX_PACKAGES);
        // At most MAX_NAME bytes a name: one longer is dropped.
        let (longest, over) = ("p".repeat(MAX_NAME), "p".repeat(MAX_NAME + 1));
        assert_eq!(
            sentinel_packages(&format!("{over}\n{longest}\n")),
            std::slice::from_ref(&longest)
        );
        // The worst a package list can make still fits the API's bounds (reasons of at most
        // 2,048 bytes, package entries of at most 160), so the report is never refused.
        let worst: String = (0..MAX_PACKAGES)
            .map(|i| format!("{i:02}{}\n", &longest[2..]))
            .collect();
        let dir = root(&[(SENTINEL, ""), (SENTINEL_PACKAGES, &worst)], &[]);
        let need = reboot_need(dir.path(), "6.1.0-9-amd64");
        assert_eq!(need.packages.len(), MAX_PACKAGES);
        assert!(need.reasons[0].len() <= 2048, "{}", need.reasons[0].len());
        assert!(format!("kernel {}", "9".repeat(MAX_RELEASE)).len() <= 160);
    }

    /// A root with `files` (relative path, contents) and `links` (relative path, target).
    fn root(files: &[(&str, &str)], links: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (rel, body) in files {
            let p = dir.path().join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, body).unwrap();
        }
        for (rel, target) in links {
            let p = dir.path().join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::os::unix::fs::symlink(target, p).unwrap();
        }
        dir
    }

    #[test]
    fn the_need_is_read_from_the_roots_of_each_family() {
        let old = "5.14.0-427.el9.x86_64";
        let new = "5.14.0-503.el9.x86_64";
        let vmlinuz = |k: &str| format!("usr/lib/modules/{k}/vmlinuz");
        let (vm_old, vm_new) = (vmlinuz(old), vmlinuz(new));
        // Newer than `old` by rpm's order, were they read.
        let odd_new = vmlinuz("9.0.0\nx");
        let long_new = vmlinuz(&format!("9.{}", "1".repeat(MAX_RELEASE)));
        let (opt_old, opt_new) = (
            format!("opt/k/{old}/vmlinuz"),
            format!("opt/k/{new}/vmlinuz"),
        );
        // (name, files, links, running kernel, reasons, packages)
        type Case<'a> = (
            &'a str,
            Vec<(&'a str, &'a str)>,
            Vec<(&'a str, &'a str)>,
            &'a str,
            Vec<String>,
            Vec<&'a str>,
        );
        let cases: Vec<Case> = vec![
            (
                "Debian after a kernel and libc upgrade",
                vec![
                    (SENTINEL, "*** System restart required ***\n"),
                    (SENTINEL_PACKAGES, "linux-image-6.1.0-28-amd64\nlibc6\n"),
                ],
                vec![],
                "6.1.0-9-amd64",
                vec![format!(
                    "/{SENTINEL} is present (asked for by linux-image-6.1.0-28-amd64, libc6)"
                )],
                vec!["linux-image-6.1.0-28-amd64", "libc6"],
            ),
            (
                "Debian, a sentinel without a package list",
                vec![(SENTINEL, "")],
                vec![],
                "6.1.0-9-amd64",
                vec![format!("/{SENTINEL} is present")],
                vec![],
            ),
            (
                "Debian with nothing to do",
                vec![("run/motd.dynamic", "hi")],
                vec![],
                "6.1.0-9-amd64",
                vec![],
                vec![],
            ),
            (
                "a sentinel that is a symlink was not made by a package script",
                vec![("etc/hostname", "x")],
                vec![(SENTINEL, "/etc/hostname")],
                "6.1.0-9-amd64",
                vec![],
                vec![],
            ),
            (
                "Rocky with a newer kernel installed",
                vec![(vm_old.as_str(), "image"), (vm_new.as_str(), "image")],
                vec![("lib", "usr/lib")],
                old,
                vec![format!(
                    "kernel {new} is installed, newer than the running {old}"
                )],
                vec!["kernel 5.14.0-503.el9.x86_64"],
            ),
            (
                "Rocky running its newest kernel",
                vec![(vm_old.as_str(), "image"), (vm_new.as_str(), "image")],
                vec![],
                new,
                vec![],
                vec![],
            ),
            (
                "a modules directory without an image is not an installed kernel",
                vec![
                    (vm_old.as_str(), "image"),
                    ("usr/lib/modules/9.9.9/modules.dep", ""),
                ],
                vec![],
                old,
                vec![],
                vec![],
            ),
            (
                "a release no kernel has (a newline, over-long) is not an installed kernel",
                vec![
                    (vm_old.as_str(), "image"),
                    (odd_new.as_str(), "image"),
                    (long_new.as_str(), "image"),
                ],
                vec![],
                old,
                vec![],
                vec![],
            ),
            (
                "a modules tree reached through a symlink is not read",
                vec![(opt_old.as_str(), "image"), (opt_new.as_str(), "image")],
                vec![(MODULES_DIR, "../../opt/k")],
                old,
                vec![],
                vec![],
            ),
        ];
        for (name, files, links, running, reasons, packages) in cases {
            let dir = root(&files, &links);
            let need = reboot_need(dir.path(), running);
            assert_eq!(need.reasons, reasons, "{name}");
            assert_eq!(need.packages, packages, "{name}");
            assert_eq!(need.required, !reasons.is_empty(), "{name}");
        }
    }
}
