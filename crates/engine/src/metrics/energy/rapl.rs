//! Linux RAPL through the powercap tree: the `energy_uj` counter of every
//! package domain `intel-rapl:N` directly under the root (their subzones,
//! core and uncore, are parts of the package and are not added again).

use std::path::{Path, PathBuf};

/// Where Linux exposes the powercap tree.
pub const DEFAULT_ROOT: &str = "/sys/class/powercap";

/// The package domains of one powercap tree.
#[derive(Clone, Debug)]
pub struct Rapl {
    domains: Vec<Domain>,
}

#[derive(Clone, Debug)]
struct Domain {
    dir: PathBuf,
    /// The counter wraps to 0 after this many microjoules.
    range_uj: u64,
}

fn read_u64(path: &Path) -> Result<u64, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    text.trim()
        .parse()
        .map_err(|_| format!("{}: not a whole number: '{}'", path.display(), text.trim()))
}

impl Rapl {
    /// The package domains under `root` whose counters can be read.
    pub fn open(root: &Path) -> Result<Self, String> {
        let entries = std::fs::read_dir(root)
            .map_err(|e| format!("no RAPL energy counter: {}: {e}", root.display()))?;
        let mut dirs: Vec<PathBuf> = entries
            .filter_map(|e| e.ok())
            .filter(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                name.strip_prefix("intel-rapl:")
                    .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
            })
            .map(|e| e.path())
            .collect();
        dirs.sort();
        if dirs.is_empty() {
            return Err(format!(
                "no RAPL energy counter: no intel-rapl:N domain under {}",
                root.display()
            ));
        }
        let domains = dirs
            .into_iter()
            .map(|dir| {
                read_u64(&dir.join("energy_uj"))
                    .map_err(|e| format!("no readable RAPL energy counter: {e}"))?;
                let range_uj = read_u64(&dir.join("max_energy_range_uj"))
                    .map_err(|e| format!("no RAPL counter range: {e}"))?;
                Ok(Domain { dir, range_uj })
            })
            .collect::<Result<_, String>>()?;
        Ok(Self { domains })
    }

    /// Every domain's counter, microjoules.
    pub fn read(&self) -> Result<Vec<u64>, String> {
        self.domains
            .iter()
            .map(|d| read_u64(&d.dir.join("energy_uj")))
            .collect()
    }

    /// Joules between two readings of [`Rapl::read`], each counter assumed
    /// to wrap at most once in between.
    pub fn joules_between(&self, before: &[u64], after: &[u64]) -> f64 {
        let uj: u64 = self
            .domains
            .iter()
            .zip(before.iter().zip(after))
            .map(
                |(d, (&b, &a))| {
                    if a >= b {
                        a - b
                    } else {
                        d.range_uj - b + a
                    }
                },
            )
            .sum();
        uj as f64 * 1e-6
    }

    /// The domains read, e.g. `intel-rapl:0, intel-rapl:1`.
    pub fn describe(&self) -> String {
        let names: Vec<String> = self
            .domains
            .iter()
            .map(|d| {
                d.dir
                    .file_name()
                    .unwrap_or_default()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        names.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn domain(root: &Path, name: &str, uj: u64, range: u64) {
        let d = root.join(name);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("energy_uj"), format!("{uj}\n")).unwrap();
        std::fs::write(d.join("max_energy_range_uj"), format!("{range}\n")).unwrap();
    }

    #[test]
    fn packages_are_summed_subzones_skipped_and_wraps_unwrapped() {
        let root = std::env::temp_dir().join(format!("ferrotron-rapl-unit-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        domain(&root, "intel-rapl:0", 1_000_000, 10_000_000);
        domain(&root, "intel-rapl:1", 9_500_000, 10_000_000);
        // A subzone (core) of package 0: part of it, never added again.
        domain(&root, "intel-rapl:0:0", 5, 10_000_000);
        let rapl = Rapl::open(&root).unwrap();
        assert_eq!(rapl.describe(), "intel-rapl:0, intel-rapl:1");
        let before = rapl.read().unwrap();
        domain(&root, "intel-rapl:0", 3_000_000, 10_000_000);
        domain(&root, "intel-rapl:1", 500_000, 10_000_000); // wrapped
        let after = rapl.read().unwrap();
        // 2 J on package 0, (10 - 9.5 + 0.5) = 1 J on package 1.
        assert!((rapl.joules_between(&before, &after) - 3.0).abs() < 1e-12);
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn an_empty_tree_names_what_is_missing() {
        let root =
            std::env::temp_dir().join(format!("ferrotron-rapl-empty-{}", std::process::id()));
        std::fs::create_dir_all(&root).unwrap();
        let e = Rapl::open(&root).unwrap_err();
        assert!(e.contains("no intel-rapl:N domain under"), "{e}");
        std::fs::remove_dir_all(&root).unwrap();
    }
}
